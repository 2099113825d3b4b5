"""Issue 23 defect 7: a job whose delivery is dead-lettered is recorded as such, not left ``queued``.

A trigger refuses every claim (queued -> processing) with an error that is neither an outage nor a verdict on the
job (SQLSTATE P0001): the worker backs off, and after MAX_ATTEMPTS deliveries dead-letters the message. The
unfixed worker left the job ``queued``, and the sweeper's lost-message safety net republished it again and again
until its TTL. Fixed: the job ends ``failed`` with ``error_code = dead_lettered`` along a CONTRACT §5 path, the
safety net leaves it alone, and an operator's dead-letter replay revives it once the cause is gone."""

from __future__ import annotations

import json
import time

import pytest

from reference_support import assert_event_path, sample_jpeg, wait_for

pytestmark = pytest.mark.integration

REFUSE_CLAIMS = """
CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'queued' AND NEW.state = 'processing' THEN
        RAISE EXCEPTION 'claims refused by a trigger';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_claims BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_claims();
"""


def test_a_dead_lettered_job_ends_failed_and_is_not_republished_until_its_ttl(pipeline):
    pipeline.sql(REFUSE_CLAIMS)
    pipeline.start_all(sweeper={"STALE_QUEUED_SECONDS": "2"})
    attachment_id = pipeline.upload(sample_jpeg(77)).json()["attachment_id"]

    def settled():
        rows = pipeline.sql("SELECT state, error_code, job_id FROM jobs WHERE attachment_id = %s", (attachment_id,))
        return rows[0] if rows and rows[0]["state"] == "failed" else None

    try:
        row = wait_for(settled, 45, interval=0.5, what="the dead-lettered job recorded failed")
    finally:
        republished = pipeline.sql("SELECT count(*) AS n FROM outbox o JOIN jobs j USING (job_id) "
                                   "WHERE j.attachment_id = %s", (attachment_id,))[0]["n"]
        print("outbox rows of the job:", republished)
    assert row["error_code"] == "dead_lettered", row
    assert pipeline.queue_depths()["attachments.jobs.dead"] >= 1
    # While the claims were refused the job stayed queued, and a 2 s safety net may have republished it once
    # already (a lost message looks just like that): what must hold is that, once failed, it gets no new row.
    time.sleep(4)  # two safety-net periods
    assert pipeline.sql("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (row["job_id"],))[0]["n"] == republished
    events = pipeline.events(attachment_id)
    assert_event_path(events)
    assert [(e["from"], e["to"]) for e in events][-2:] == [("queued", "processing"), ("processing", "failed")]

    pipeline.sql("DROP TRIGGER refuse_claims ON jobs")
    replayed = pipeline.command("dlq", "replay", "--job-id", str(row["job_id"]), "--reason", "trigger removed",
                                "--operator", "alice")
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert json.loads(replayed.stdout)["counts"].get("replayed", 0) >= 1, replayed.stdout
    status = pipeline.wait_state(attachment_id, timeout=45)
    assert status["state"] == "ready" and status["attempt"] == 2, status
    assert_event_path(pipeline.events(attachment_id))
