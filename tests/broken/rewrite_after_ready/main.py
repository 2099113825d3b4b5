"""Broken on purpose: a second after a job is committed ``ready``, the worker writes its variants once more.

The reference writes each variant object once, before its fenced commit, and never touches an object a ``ready``
result names again. This variant adds a "make sure it landed" re-upload: 1.1 s after a commit to ``ready`` it PUTs
every variant of that result again — the same bytes, under the same keys. The bytes still match the recorded
sha256, and the new Last-Modified is less than 1.5 s after ``ready`` (S3 keeps whole seconds), so a comparison of
Last-Modified with a slack sees nothing; a snapshot of the objects taken when ``ready`` was first seen does (the
object's Last-Modified moved to another second: a new write).

Everything else is the reference.
"""

import asyncio
import sys

from reference import storage as storage_mod
from reference import worker as worker_mod
from reference.cli import main

REWRITE_AFTER_SECONDS = 1.1
_put_bytes = storage_mod.ObjectStore.put_bytes
_commit = worker_mod.Worker._commit
WRITTEN: dict[str, tuple] = {}  # object key -> the arguments of its last PUT by this process


def _put_bytes_remembered(self, key, data, content_type, sha256=None):
    WRITTEN[key] = (data, content_type, sha256)
    return _put_bytes(self, key, data, content_type, sha256)


async def _commit_then_rewrite(self, claim, results, lease=None):
    outcome = await _commit(self, claim, results, lease)
    if outcome == "ready":
        # THE BUG: the published variants are written again after ready.
        asyncio.get_running_loop().create_task(_rewrite(self, [r["object_key"] for r in results]))
    return outcome


async def _rewrite(worker, keys):
    await asyncio.sleep(REWRITE_AFTER_SECONDS)
    for key in keys:
        if key in WRITTEN:
            data, content_type, sha256 = WRITTEN.pop(key)
            await asyncio.to_thread(_put_bytes, worker.store, key, data, content_type, sha256)


storage_mod.ObjectStore.put_bytes = _put_bytes_remembered
worker_mod.Worker._commit = _commit_then_rewrite

if __name__ == "__main__":
    sys.exit(main())
