"""Issue 23, "a deadline per execution" and "health of every role", the worker's side.

A claim that runs past EXECUTION_TIMEOUT_SECONDS is abandoned by its own worker — its work cancelled, the slot freed,
the attempt recorded as a retry with the reason ``execution deadline passed`` — whatever its lease renewal says
(the renewal keeps succeeding here). The sweeper recovers such a claim from the database too
(tests/integration/reference/test_reference_sweeper_production.py). Before: a render that never returned held the
job and the slot for as long as it hung, its lease renewed all along (the worker committed it 8 s later, here).

Liveness: a worker holding an execution past its deadline plus a lease (it failed to abandon it) is not live;
readiness: a worker that is not consuming is not ready."""

from __future__ import annotations

import time

from test_worker_decisions import Harness, claim_row

from reference.health import time as health_time


def deadline_harness(monkeypatch) -> Harness:
    return Harness(monkeypatch, lease_seconds=1.0, lease_renew_seconds=0.3, decode_timeout_seconds=0.5,
                   execution_timeout_seconds=2.0)


def test_a_render_that_hangs_past_the_execution_deadline_is_abandoned_and_retried(monkeypatch):
    harness = deadline_harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row(attempt=1)
    harness.render_pool.delay = 8.0  # a render that does not come back (defect 1's shape), its lease renewed

    started = time.monotonic()
    harness.handle()
    took = time.monotonic() - started

    assert took < 6.0, took
    assert not harness.ran("commit_result")
    assert harness.journal[-2:] == ["db:retry_job", "ack"], harness.journal
    assert harness.db.params("retry_job")["reason"] == "execution deadline passed"
    assert harness.ran("renew_lease")  # the lease was renewed all along: the deadline decided, not the lease
    assert harness.worker.executions == {}


def test_work_within_the_deadline_is_untouched(monkeypatch):
    harness = deadline_harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row(attempt=1)
    harness.render_pool.delay = 0.2

    harness.handle()

    assert harness.journal[-2:] == ["db:commit_result", "ack"], harness.journal


def test_a_worker_holding_an_execution_past_its_deadline_is_not_live_and_one_not_consuming_not_ready(monkeypatch):
    harness = deadline_harness(monkeypatch)
    worker = harness.worker
    worker.health.beat()
    assert worker.health.live()[0]
    ok, body = worker.health.ready()
    assert not ok and body["checks"]["consuming"]["ok"] is False
    worker.consuming = True
    assert worker.health.ready()[0]

    worker.executions["job-a/7"] = health_time.monotonic() - 1.0  # within the deadline
    assert worker.health.live()[0]
    worker.executions["job-b/3"] = health_time.monotonic() - 3.5  # past 2 s + one lease: not abandoned, stuck
    ok, body = worker.health.live()
    assert not ok and "job-b/3" in body["checks"]["executions"]["detail"]
    assert not worker.health.ready()[0]


def test_a_jobs_log_lines_carry_its_ids_and_the_messages_trace(monkeypatch, caplog):
    import dataclasses
    import logging

    from test_worker_decisions import job_message

    harness = deadline_harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row(attempt=1)
    job = dataclasses.replace(job_message(), traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    with caplog.at_level(logging.INFO, logger="reference.worker"):
        harness.handle(harness.delivery(job))
    ready = [r for r in caplog.records if getattr(r, "outcome", None) == "ready"]
    assert len(ready) == 1, [r.getMessage() for r in caplog.records]
    record = ready[0]
    assert (str(record.job_id), str(record.attachment_id), record.attempt) == (str(job.job_id),
                                                                                str(job.attachment_id), 1)
    assert record.trace_id == "0af7651916cd43dd8448eb211c80319c"
