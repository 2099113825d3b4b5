"""Idempotent redelivery (BE-JOB-002) and lease ownership with fencing (BE-JOB-006)."""

from __future__ import annotations

import signal
import time

import pytest

from reference_support import assert_event_path, sample_jpeg, wait_for

pytestmark = pytest.mark.integration


def republish(pipeline, attachment_id: str) -> None:
    """A duplicate of the job's current message, through the outbox and relay."""
    pipeline.sql("INSERT INTO outbox (job_id, attempt) SELECT job_id, attempt FROM jobs WHERE attachment_id = %s",
                 (attachment_id,))


def test_redelivery_of_a_ready_job_is_acked_and_rewrites_nothing(pipeline):
    pipeline.start_all()
    attachment_id = pipeline.upload(sample_jpeg(10)).json()["attachment_id"]
    pipeline.wait_state(attachment_id)
    before_rows = pipeline.sql("SELECT variant, created_at, fencing_token FROM results WHERE attachment_id = %s "
                               "ORDER BY variant", (attachment_id,))
    before_objects = {o.key: o.last_modified for o in pipeline.store.list_prefix(f"variants/{attachment_id}/")}
    before_events = pipeline.events(attachment_id)
    time.sleep(1.2)  # any rewrite would now carry a later Last-Modified

    republish(pipeline, attachment_id)
    worker = pipeline.roles["worker"]
    wait_for(lambda: "noop_ready" in worker.log(), 15, what="no-op redelivery")
    wait_for(lambda: pipeline.queue_depths()["attachments.jobs.process"] == 0, 15, what="duplicate acked")

    assert pipeline.sql("SELECT variant, created_at, fencing_token FROM results WHERE attachment_id = %s "
                        "ORDER BY variant", (attachment_id,)) == before_rows
    assert {o.key: o.last_modified for o in pipeline.store.list_prefix(f"variants/{attachment_id}/")} == before_objects
    assert pipeline.events(attachment_id) == before_events
    pipeline.assert_exactly_once(attachment_id)


def test_the_same_job_delivered_to_two_workers_at_once_has_one_effect(pipeline):
    pipeline.start_all(roles=("api", "sweeper"))
    attachment_id = pipeline.upload(sample_jpeg(11)).json()["attachment_id"]
    republish(pipeline, attachment_id)  # two outbox rows: the relay publishes both in one batch
    twins = [pipeline.start("worker", name=name, wait=False, PREFETCH="1", WORKER_CONCURRENCY="1")
             for name in ("worker-a", "worker-b")]
    for twin in twins:
        pipeline.wait_ready(twin)
    pipeline.start("relay")  # both copies now reach the two idle workers at once
    pipeline.wait_state(attachment_id)
    wait_for(lambda: pipeline.queue_depths()["attachments.jobs.process"] == 0, 20, what="both copies acked")

    pipeline.assert_exactly_once(attachment_id)
    events = pipeline.events(attachment_id)
    assert [e["to"] for e in events] == ["queued", "processing", "ready"]
    logs = [twin.log() for twin in twins]
    assert sum(log.count("claimed job") for log in logs) == 1
    # each worker got one copy: the loser saw the job owned (busy) or already ready (no-op)
    assert all("claimed job" in log or ": busy (" in log or ": noop_ready (" in log for log in logs), logs


def test_worker_paused_longer_than_its_lease_is_fenced_and_does_not_ack(pipeline):
    pipeline.start_all(roles=("api", "relay", "sweeper"))
    # PREFETCH=1: the stopped worker holds no second delivery while paused
    first = pipeline.start("worker", name="worker-a", PREFETCH="1",
                           FAILPOINTS="after_s3_write_before_commit=1*pause(1500)")
    attachment_id = pipeline.upload(sample_jpeg(12)).json()["attachment_id"]
    wait_for(lambda: "FAILPOINT after_s3_write_before_commit fired" in first.log(), 20, what="worker A in window")

    first.signal_group(signal.SIGSTOP)  # longer than LEASE_SECONDS=4
    try:
        second = pipeline.start("worker", name="worker-b")
        status = pipeline.wait_state(attachment_id, timeout=30)
        assert status["attempt"] == 2
    finally:
        first.signal_group(signal.SIGCONT)

    wait_for(lambda: "commit rejected by the fence" in first.log(), 20, what="worker A fenced")
    assert first.alive()
    log_a = first.log()
    assert f"job {status['job_id']} ready" not in log_a  # A never published nor acked
    assert "not acking" in log_a
    wait_for(lambda: pipeline.queue_depths()["attachments.jobs.process"] == 0, 20, what="A's delivery settled")

    pipeline.assert_exactly_once(attachment_id)
    events = pipeline.events(attachment_id)
    assert [(e["from"], e["to"], e["attempt"]) for e in events] == [
        (None, "queued", 1), ("queued", "processing", 1), ("processing", "queued", 2),
        ("queued", "processing", 2), ("processing", "ready", 2)]
    assert events[2]["actor"] == "sweeper" and events[2]["reason"] == "lease expired"
    assert events[1]["actor"] != events[3]["actor"] == events[4]["actor"]
    rows = pipeline.sql("SELECT DISTINCT attempt, fencing_token FROM results WHERE attachment_id = %s",
                        (attachment_id,))
    assert rows == [{"attempt": 2, "fencing_token": 2}]
    assert_event_path(events)
    assert second.alive()
