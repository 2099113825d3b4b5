"""Issue 10, defect 5: object writes are fenced, not only the commit.

The old owner checks its lease, then its PUT of a variant takes far longer than the lease (here: the process
is SIGSTOPped inside the PUT). Meanwhile the sweeper recovers the job and a second worker — whose renderer
produces different bytes, as during a Pillow upgrade — writes its variants and commits ``ready``. When the old
owner wakes, its PUT lands. Unfixed, it landed on the very key ``ready`` points at: the published object no
longer matches its recorded sha256. Fixed, every claim writes keys of its own fencing token, so the stale PUT
cannot change what ``ready`` points at.

Test-only knobs, outside the reference: a ``sitecustomize`` on the roles' PYTHONPATH salts the rendered bytes
per worker (TEST_RENDER_SALT) and, in the first worker only, marks and briefly holds its first variant PUT
(TEST_PUT_MARKER) so the test can stop the process inside it.

RED on the unfixed code: ``REFERENCE_PYTHONPATH=/work/base pytest <this file>``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from reference_support import sample_jpeg, wait_for

pytestmark = pytest.mark.integration

SHIM = '''
import os
if os.environ.get("TEST_RENDER_SALT") or os.environ.get("TEST_PUT_MARKER"):
    import dataclasses, time
    from reference import storage, worker
    salt = os.environ.get("TEST_RENDER_SALT", "").encode()
    marker = os.environ.get("TEST_PUT_MARKER")
    render = worker.RenderPool.render

    async def salted(self, data, variants, *args, **kwargs):
        out = await render(self, data, variants, *args, **kwargs)
        return [dataclasses.replace(v, data=v.data + salt) for v in out]  # trailing bytes: another "renderer"

    worker.RenderPool.render = salted
    put = storage.ObjectStore.put_bytes
    held = []

    def put_bytes(self, key, data, content_type, sha256=None):
        if marker and key.startswith("variants/") and not held:
            held.append(key)
            open(marker, "w").write(key)
            time.sleep(1.5)  # the test stops the whole process here: inside the PUT, after the lease check
        return put(self, key, data, content_type, sha256)

    storage.ObjectStore.put_bytes = put_bytes
'''


def test_a_stale_owners_late_put_cannot_change_what_ready_points_at(pipeline, tmp_path, monkeypatch):
    tree = os.environ.get("REFERENCE_PYTHONPATH")
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    if tree:
        import reference_support
        monkeypatch.setattr(reference_support, "REPO", Path(tree))
    pipeline.env["PYTHONPATH"] = os.pathsep.join([str(shim), tree or pipeline.env["PYTHONPATH"]])
    marker = tmp_path / "put-marker"

    pipeline.start_all(roles=("api", "relay", "sweeper"))
    old = pipeline.start("worker", name="worker-old", TEST_RENDER_SALT="old-renderer", TEST_PUT_MARKER=str(marker))
    response = pipeline.upload(sample_jpeg(11))
    assert response.status_code == 202, response.text
    attachment_id = response.json()["attachment_id"]

    wait_for(marker.exists, 30, what="the old owner inside its first variant PUT")
    old.signal_group(signal.SIGSTOP)
    try:
        pipeline.start("worker", name="worker-new", TEST_RENDER_SALT="new-renderer")
        ready = pipeline.wait_state(attachment_id, ("ready", "failed"), timeout=60)
        assert ready["state"] == "ready", ready
    finally:
        old.signal_group(signal.SIGCONT)
    time.sleep(4.0)  # the old owner's PUT lands now; its renewal is refused, it does not ack

    final = pipeline.status(attachment_id)
    assert final["state"] == "ready"
    store = pipeline.store
    for variant in final["variants"]:
        data = store.get_bytes(variant["key"])
        assert hashlib.sha256(data).hexdigest() == variant["sha256"], (
            f"{variant['key']}: ready points at bytes the committing owner did not write "
            f"(ends with {data[-16:]!r})")
        assert data.endswith(b"new-renderer")
