"""Issue 10, defects 2 and 8: the worker's broker sessions.

Defect 2 — a session that can no longer deliver must end, whatever ended it: not only a closed connection, but a
channel closed by the broker (a consumer timeout while the database is down) or a consumer cancelled by the
broker (its queue deleted). The worker must open a new session and consume again, so later work finishes.

Defect 8 — in-flight work is bounded per process, not per session: while deliveries of a dead session are still
being processed, the next session may not take ``prefetch`` more on top of them.

Real services, the reference's own roles. The broker-side faults (a consumer timeout, a deleted queue) cannot be
provoked by a harness scenario without changing the broker that every scenario of a grade shares, hence tests.

RED on the unfixed reference: ``REFERENCE_UNDER_TEST=/work/base .venv/bin/pytest <this file>`` runs the roles
from that checkout (see ``reference_support.roles_from``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from harness.stack.tools import rabbitmq_bindir
from reference import topology
from reference_support import assert_event_path, roles_from, sample_jpeg, wait_for

pytestmark = pytest.mark.integration
QUEUE = topology.QUEUE


def rabbit_eval(stack, expression: str) -> str:
    """Evaluate an Erlang expression on the test session's private RabbitMQ node."""
    node = stack.rabbitmq
    done = subprocess.run([str(rabbitmq_bindir() / "rabbitmqctl"), "-n", f"harness-{node.amqp_port}@localhost",
                           "eval", expression], env=node._env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout.strip()


def consumers(pipeline) -> int:
    async def count(channel):
        queue = await channel.declare_queue(QUEUE, passive=True)
        return queue.declaration_result.consumer_count
    return pipeline.amqp(count)


def ready_messages(pipeline) -> int:
    async def count(channel):
        queue = await channel.declare_queue(QUEUE, passive=True)
        return queue.declaration_result.message_count
    return pipeline.amqp(count)


def upload(pipeline, seed: int) -> str:
    response = pipeline.upload(sample_jpeg(seed, size=(160, 120)), filename=f"s{seed}.jpg")
    assert response.status_code == 202, response.text
    return response.json()["attachment_id"]


def assert_ready(pipeline, attachment_id: str, timeout: float) -> None:
    status = pipeline.wait_state(attachment_id, timeout=timeout)
    assert sorted(v["name"] for v in status["variants"]) == ["crop", "optimized", "thumbnail"], status
    assert_event_path(pipeline.events(attachment_id))


def job_message(job_id: str) -> bytes:
    now = datetime.now(timezone.utc)
    return json.dumps({"schema_version": 1, "job_id": job_id, "attempt": 1, "attachment_id": str(uuid.uuid4()),
                       "pipeline_version": 1, "variants": ["thumbnail", "crop", "optimized"],
                       "created_at": now.isoformat(), "expires_at": (now + timedelta(hours=1)).isoformat()}).encode()


# ----------------------------------------------------------------- defect 2


@pytest.mark.timeout(120)
def test_a_consumer_cancelled_by_the_broker_ends_the_session_and_consuming_resumes(pipeline, monkeypatch):
    roles_from(pipeline, monkeypatch)
    pipeline.start_all(("api", "relay", "worker"))
    assert_ready(pipeline, upload(pipeline, 1), timeout=30)
    wait_for(lambda: consumers(pipeline) == 1, 10, what="the worker consuming")

    async def delete_and_redeclare(channel):
        # Deleting the queue makes the broker send basic.cancel to its consumer. It comes back (empty) a second
        # later: a queue re-created at once may meet the consumer's channel before it handled the deletion.
        await channel.queue_delete(QUEUE)
        await asyncio.sleep(1.0)
        await topology.declare(channel, topology.TopologyConfig())
    pipeline.amqp(delete_and_redeclare)
    attachment_id = upload(pipeline, 2)
    # A worker that noticed the cancel consumes again within a reconnect delay; one that did not never will.
    wait_for(lambda: consumers(pipeline) == 1, 15, what="the worker consuming again after the broker's cancel")
    assert_ready(pipeline, attachment_id, timeout=30)


@pytest.mark.timeout(150)
def test_a_channel_closed_by_a_consumer_timeout_during_a_database_outage_is_reopened(pipeline, stack, monkeypatch):
    roles_from(pipeline, monkeypatch)
    # RabbitMQ 3.10 has no per-queue consumer timeout: the node's own applies, checked on each channel's tick.
    # Shortened on this test session's private node only until the broker has closed the worker's channel.
    shortened = "application:set_env(rabbit, consumer_timeout, 1500), application:set_env(rabbit, channel_tick_interval, 500)."
    restored = "application:set_env(rabbit, consumer_timeout, 1800000), application:set_env(rabbit, channel_tick_interval, 60000)."
    pipeline.start_all(("api", "relay"))
    rabbit_eval(stack, shortened)
    try:
        pipeline.start("worker")
        wait_for(lambda: consumers(pipeline) == 1, 10, what="the worker consuming")
        worker = pipeline.roles["worker"]
        stack.toxiproxy.cut("postgres")
        try:
            # A delivery the worker cannot claim while the database is down: held unacked past the timeout.
            job_id = str(uuid.uuid4())
            pipeline.publish_raw(job_message(job_id), message_id=job_id)
            wait_for(lambda: consumers(pipeline) == 0, 20, interval=0.1,
                     what="the broker closing the worker's channel (consumer timeout)")
            rabbit_eval(stack, restored)
            time.sleep(2)  # the outage goes on: longer than the timeout
        finally:
            stack.toxiproxy.restore("postgres")
    finally:
        rabbit_eval(stack, restored)
    print(worker.log()[-3000:])

    attachment_id = wait_for(lambda: (r := pipeline.upload(sample_jpeg(3, size=(160, 120)))).status_code == 202
                             and r.json()["attachment_id"], 20, interval=0.5, what="the API back")
    wait_for(lambda: consumers(pipeline) == 1, 20, what="the worker consuming again after its channel closed")
    assert_ready(pipeline, attachment_id, timeout=30)


# ----------------------------------------------------------------- defect 8


@pytest.mark.timeout(150)
def test_deliveries_of_a_dead_session_count_against_the_process_bound(pipeline, stack, monkeypatch):
    """Prefetch 2 (= concurrency). Two deliveries are held in a 4 s pause after their S3 write when the broker
    connection is cut: the broker returns them, the worker reconnects. Until those two are done, the process may
    hold no further delivery: jobs it is processing + deliveries its new session holds <= 2 at every sample."""
    roles_from(pipeline, monkeypatch)
    pipeline.start_all(("api", "relay"))
    ids = [upload(pipeline, 10 + i) for i in range(4)]
    wait_for(lambda: ready_messages(pipeline) == 4, 20, what="4 job messages in the work queue")
    pipeline.start("worker", FAILPOINTS="after_s3_write_before_commit=2*pause(4000)")

    def processing() -> int:
        return pipeline.sql("SELECT count(*) AS n FROM jobs WHERE state = 'processing'")[0]["n"]

    wait_for(lambda: processing() == 2, 20, interval=0.05, what="two jobs held in the pause")
    time.sleep(0.3)
    stack.toxiproxy.cut("rabbitmq")
    time.sleep(0.5)
    stack.toxiproxy.restore("rabbitmq")

    samples = []
    deadline = time.monotonic() + 3.0  # inside the pause: nothing of the old session can have finished
    while time.monotonic() < deadline:
        in_process = processing()
        held_by_new_session = 4 - ready_messages(pipeline)  # nothing was acked yet: every other message is held
        samples.append((round(time.monotonic() - deadline + 3.0, 2), in_process, held_by_new_session))
        time.sleep(0.1)
    worst = max(p + h for _, p, h in samples)
    assert worst <= 2, f"the process held {worst} deliveries with prefetch 2 (t, processing, held): {samples}"
    for attachment_id in ids:
        assert_ready(pipeline, attachment_id, timeout=40)
