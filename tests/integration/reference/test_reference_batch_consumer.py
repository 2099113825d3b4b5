"""Batch consumer mode (WORKER_BATCH_SIZE > 1, BE-JOB-007) on real services: every item of a batch is acked on its
own right after its own commit, and a poison item (an undecodable upload, an unparseable message) is isolated
without holding or settling its neighbours."""
from __future__ import annotations

import io
import uuid

import pytest
from PIL import Image

from reference_support import sample_jpeg, wait_for

pytestmark = pytest.mark.integration
QUEUE = "attachments.jobs.process"


def corrupt_png() -> bytes:
    """Valid signature, header and trailer; the pixel data does not decompress (fails at render, permanently)."""
    buffer = io.BytesIO()
    Image.effect_noise((200, 200), 50).convert("RGB").save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    start = data.index(b"IDAT") + 4
    data[start:start + 64] = b"\x00" * 64
    return bytes(data)


def upload_backlog(pipeline, files: list[tuple[bytes, str]]) -> list[str]:
    ids = []
    for data, name in files:
        response = pipeline.upload(data, filename=name)
        assert response.status_code == 202, response.text
        ids.append(response.json()["attachment_id"])
    wait_for(lambda: pipeline.queue_depths()[QUEUE] == len(files), 30, what="the backlog published")
    return ids


def states(pipeline, ids: list[str]) -> dict[str, str]:
    rows = pipeline.sql("SELECT attachment_id::text AS a, state FROM jobs WHERE attachment_id = ANY(%s::uuid[])",
                        (ids,))
    return {row["a"]: row["state"] for row in rows}


def test_each_item_of_a_batch_is_acked_on_its_own_after_its_own_commit(pipeline):
    # No worker yet: the whole batch waits in the queue, so the worker takes all four at once.
    pipeline.start_all(roles=("api", "relay"))
    ids = upload_backlog(pipeline, [(sample_jpeg(seed, size=(1800, 1400)), f"p{seed}.jpg") for seed in range(4)])
    # One Pillow process: the batch's items render one after another, so they commit at different times.
    worker = pipeline.start("worker", WORKER_BATCH_SIZE=4, PREFETCH=4, WORKER_CONCURRENCY=4, IMAGE_WORKERS=1,
                            WORKER_BATCH_WAIT_MS=2000)
    wait_for(lambda: "ready" in states(pipeline, ids).values(), 60, interval=0.05, what="the first item ready")
    worker.kill()  # no cleanup, no nack: what the broker gets back is exactly what was never acked
    seen = states(pipeline, ids)
    ready = [a for a, s in seen.items() if s == "ready"]
    unfinished = [a for a, s in seen.items() if s != "ready"]
    assert ready and unfinished, seen  # the kill landed mid-batch
    # Each committed item was acked when it committed (not at the end of the batch: the queue would hold all four),
    # and no ack covered an unfinished item (multiple=true: the queue would hold fewer than the unfinished).
    wait_for(lambda: pipeline.queue_depths()[QUEUE] == len(unfinished), 15,
             what=f"{len(unfinished)} unfinished deliveries back in the queue (got {pipeline.queue_depths()})")
    assert "batch=4" in worker.log()

    # The redelivered rest completes; the committed items are not redone.
    pipeline.start("worker", name="worker-2", WORKER_BATCH_SIZE=4, PREFETCH=4, WORKER_CONCURRENCY=4,
                   IMAGE_WORKERS=1)
    pipeline.start("sweeper")  # the killed worker's claims come back through lease recovery
    wait_for(lambda: set(states(pipeline, ids).values()) == {"ready"}, 90, what="every item ready")
    for attachment_id in ids:
        pipeline.assert_exactly_once(attachment_id)


def test_a_poison_item_in_a_batch_is_isolated_and_holds_no_neighbour(pipeline):
    pipeline.start_all(roles=("api", "relay"))
    files = [(sample_jpeg(1, size=(900, 700)), "a.jpg"), (corrupt_png(), "broken.png"),
             (sample_jpeg(2, size=(900, 700)), "b.jpg"), (sample_jpeg(3, size=(900, 700)), "c.jpg")]
    ids = upload_backlog(pipeline, files)
    pipeline.publish_raw(b"{not json", message_id=f"garbage-{uuid.uuid4().hex[:6]}")
    wait_for(lambda: pipeline.queue_depths()[QUEUE] == 5, 15, what="five messages waiting")
    worker = pipeline.start("worker", WORKER_BATCH_SIZE=5, PREFETCH=5, WORKER_CONCURRENCY=5, IMAGE_WORKERS=1,
                            WORKER_BATCH_WAIT_MS=2000)
    poison = ids[1]
    wait_for(lambda: pipeline.status(poison)["state"] == "failed", 60, what="the poison item failed")
    good = [ids[0], ids[2], ids[3]]
    wait_for(lambda: all(pipeline.status(a)["state"] == "ready" for a in good), 60, what="its neighbours ready")
    for attachment_id in good:
        pipeline.assert_exactly_once(attachment_id)
    status = pipeline.status(poison)
    assert status["error_code"] == "decode_failed" and status["variants"] == [] and status["attempt"] == 1
    # Every delivery settled on its own: nothing left unacked or requeued, the garbage dead-lettered once.
    wait_for(lambda: pipeline.queue_depths() == {QUEUE: 0, "attachments.jobs.dead": 1}, 15,
             what="work queue empty, one dead letter")
    log = worker.log()
    assert "batch=5" in log and log.count("dead-lettering message") == 1
    assert log.count(" ready (attempt 1)") == 3
