"""Issue 23, "What production users expect", the sweeper's part — on the real database, the sweeper run in-process
(no role started: each test costs the migration and a few statements).

* A deadline per execution: a claim that has run past EXECUTION_TIMEOUT_SECONDS is abandoned and recovered (a new
  attempt with its own message) whatever its lease says — here a lease renewed an hour ahead, as a worker that
  renews but never finishes keeps it. Before (claimed, then 2.5 s past a 2 s deadline): the job stayed
  ``processing`` under its live lease.
* Retention: the events of a job terminal for longer than EVENTS_RETENTION_SECONDS (its whole path at once) and
  audit rows older than AUDIT_RETENTION_SECONDS are pruned; a live job's events and young rows stay. Before: kept
  for ever.
* Gauges: jobs per state, the oldest queued job, the outbox lag, the work and dead-letter queues' depth, read by the
  sweeper each sweep. Before: none of them existed."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest
from prometheus_client import REGISTRY

from reference.db.pool import open_pool
from reference.db.queries import queries
from reference.settings import Settings
from reference.sweeper import Sweeper

pytestmark = pytest.mark.integration

DAY = 24 * 3600.0


def settings_of(pipeline, **overrides) -> Settings:
    values = {"database_url": pipeline.tenant.direct.database_url, "amqp_url": pipeline.tenant.direct.amqp_url,
              "s3_endpoint_url": pipeline.tenant.direct.s3_endpoint_url, "s3_bucket": pipeline.tenant.bucket,
              "s3_access_key": pipeline.env["S3_ACCESS_KEY"], "s3_secret_key": pipeline.env["S3_SECRET_KEY"],
              "lease_seconds": 1.0, "lease_renew_seconds": 0.3, "sweep_interval_seconds": 1.0,
              "decode_timeout_seconds": 0.5, "max_attempts": 5}
    values.update(overrides)
    return Settings(**values)


def add_job(pipeline, state: str = "queued", age_days: float = 0.0) -> dict:
    attachment_id, job_id = uuid.uuid4(), uuid.uuid4()
    pipeline.sql("INSERT INTO attachments (attachment_id, original_key, original_sha256, original_size, content_type,"
                 " width, height) VALUES (%s, %s, %s, 1, 'image/jpeg', 8, 8)",
                 (attachment_id, f"staging/{attachment_id}", hashlib.sha256(attachment_id.bytes).hexdigest()))
    pipeline.sql("INSERT INTO jobs (job_id, attachment_id, pipeline_version, variants, state, expires_at,"
                 " error_code, created_at, updated_at, next_attempt_at)"
                 " VALUES (%s, %s, 1, ARRAY['thumbnail'], %s, now() + interval '1 day', %s,"
                 "         now() - make_interval(secs => %s), now() - make_interval(secs => %s),"
                 "         now() - make_interval(secs => %s))",
                 (job_id, attachment_id, state, "decode_failed" if state == "failed" else None,
                  age_days * DAY, age_days * DAY, age_days * DAY))
    pipeline.sql("INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, actor, at)"
                 " VALUES (%s, %s, NULL, 'queued', 1, 'test', now() - make_interval(secs => %s))",
                 (attachment_id, job_id, age_days * DAY))
    return {"attachment_id": attachment_id, "job_id": job_id}


def sweep(settings: Settings) -> dict:
    async def run():
        sweeper = Sweeper(settings)
        sweeper.db = await open_pool(settings, "test-sweeper", min_size=1, max_size=2)
        try:
            return await sweeper.sweep_once()
        finally:
            await sweeper._close_amqp()
            await sweeper.db.close(timeout=2)

    return asyncio.run(run())


def test_a_claim_past_its_execution_deadline_is_recovered_whatever_its_lease(pipeline):
    job = add_job(pipeline)
    claimed = pipeline.sql(queries().claim_job, {
        "owner": "worker-renewing-for-ever", "lease_seconds": 3600, "job_id": job["job_id"], "attempt": 1,
        "pipeline_version": 1, "actor": "worker-renewing-for-ever"})
    assert claimed and claimed[0]["fencing_token"] == 1
    # claimed 20 minutes ago, its lease renewed all along (an hour ahead): past a 10-minute deadline
    pipeline.sql("UPDATE jobs SET claimed_at = now() - interval '20 minutes' WHERE job_id = %s", (job["job_id"],))
    young = add_job(pipeline)  # claimed within its deadline: left alone
    pipeline.sql(queries().claim_job, {"owner": "w2", "lease_seconds": 3600, "job_id": young["job_id"], "attempt": 1,
                                       "pipeline_version": 1, "actor": "w2"})
    counts = sweep(settings_of(pipeline, execution_timeout_seconds=600.0))

    row = pipeline.sql("SELECT state, attempt, last_error, lease_owner FROM jobs WHERE job_id = %s",
                       (job["job_id"],))[0]
    print("after the sweep:", row, counts)
    assert row["state"] == "queued" and row["attempt"] == 2, row
    assert row["last_error"] == "execution deadline passed" and row["lease_owner"] is None
    assert pipeline.sql("SELECT count(*) AS n FROM outbox WHERE job_id = %s AND attempt = 2",
                        (job["job_id"],))[0]["n"] == 1
    event = pipeline.sql("SELECT from_state, to_state, reason, actor FROM attachment_events WHERE job_id = %s "
                         "ORDER BY seq DESC LIMIT 1", (job["job_id"],))[0]
    assert event == {"from_state": "processing", "to_state": "queued", "reason": "execution deadline passed",
                     "actor": "sweeper"}
    # the abandoned owner's renewal is refused from now on: its lease is lost, its commit fenced
    renewed = pipeline.sql(queries().renew_lease, {"job_id": job["job_id"], "fencing_token": 1, "lease_seconds": 30})
    assert renewed == []
    assert pipeline.sql("SELECT state FROM jobs WHERE job_id = %s", (young["job_id"],))[0]["state"] == "processing"


def test_events_of_long_finished_jobs_and_old_audit_rows_are_pruned(pipeline):
    old_ready = add_job(pipeline, "ready", age_days=40)
    old_failed = add_job(pipeline, "failed", age_days=40)
    young_ready = add_job(pipeline, "ready", age_days=1)
    old_queued = add_job(pipeline, "queued", age_days=40)  # live work keeps its history, however old
    for table, columns, values in (
            ("replay_audit", "attachment_id, job_id, operator, reason, from_attempt, to_attempt",
             "%(a)s, %(j)s, 'alice', 'test', 1, 2"),
            ("dlq_replays", "request_id, message_key, job_id, attachment_id, outcome, operator, reason",
             "gen_random_uuid(), 'k', %(j)s, %(a)s, 'in_progress', 'alice', 'test'"),
            ("operator_audit", "operator, action, attachment_id, job_id, outcome, status",
             "'api:alice', 'replay', %(a)s, %(j)s, 'accepted', 202")):
        for age_days in (400, 10):
            pipeline.sql(f"INSERT INTO {table} ({columns}, at) VALUES ({values}, now() - make_interval(secs => %(s)s))",
                         {"a": old_failed["attachment_id"], "j": old_failed["job_id"], "s": age_days * DAY})
    sweep(settings_of(pipeline, events_retention_seconds=30 * DAY, audit_retention_seconds=365 * DAY))

    def events(job):
        return pipeline.sql("SELECT count(*) AS n FROM attachment_events WHERE job_id = %s", (job["job_id"],))[0]["n"]

    assert (events(old_ready), events(old_failed)) == (0, 0)
    assert (events(young_ready), events(old_queued)) == (1, 1)
    for table in ("replay_audit", "dlq_replays", "operator_audit"):
        ages = pipeline.sql(f"SELECT round(EXTRACT(EPOCH FROM now() - at) / 86400) AS days FROM {table}")
        assert [row["days"] for row in ages] == [10], (table, ages)


def test_the_sweeper_reports_jobs_per_state_oldest_queued_outbox_lag_and_queue_depths(pipeline):
    for state in ("queued", "queued", "ready", "failed"):
        add_job(pipeline, state, age_days=0.001)  # ~86 s old
    pipeline.sql("INSERT INTO outbox (job_id, attempt, available_at) SELECT job_id, 1, now() - interval '42 seconds' "
                 "FROM jobs WHERE state = 'queued' LIMIT 1")
    sweep(settings_of(pipeline))

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels)

    assert value("reference_jobs_by_state", state="queued") == 2
    assert value("reference_jobs_by_state", state="ready") == 1 and value("reference_jobs_by_state", state="failed") == 1
    assert value("reference_jobs_by_state", state="processing") == 0
    assert 80 <= value("reference_oldest_queued_job_seconds") < 200
    assert 40 <= value("reference_outbox_lag_seconds") < 150
    assert value("reference_outbox_pending") == 1
    assert value("reference_queue_messages", queue="attachments.jobs.process") == 0
    assert value("reference_queue_messages", queue="attachments.jobs.dead") == 0
