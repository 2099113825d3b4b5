"""Issue 10, defect 7: an error that is neither transient nor permanent must not loop.

A read-only database (``default_transaction_read_only = on``, as after a failover or during maintenance)
refuses the claim with SQLSTATE 25006. The unfixed worker nacked such a delivery at once, hot, until the
queue's delivery limit dead-lettered it; the job then stayed ``queued`` with no message until the stale
republish, and looped again. Fixed: the claim waits the condition out with backoff (the delivery stays
unacked, nothing is spent), and the job is ready as soon as the database accepts writes again.

RED on the unfixed code: ``REFERENCE_PYTHONPATH=/work/base pytest <this file>`` runs the roles from that tree.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest

from reference_support import sample_jpeg, wait_for

pytestmark = pytest.mark.integration


def set_read_only(pipeline, on: bool) -> None:
    with psycopg.connect(pipeline.tenant.direct.database_url, autocommit=True) as conn:
        # This session itself starts read-only while the setting is on: lift it for the session first.
        conn.execute("SET default_transaction_read_only = off")
        name = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {"on" if on else "off"}')
        # Sessions read the setting when they start: end every other session so the roles reconnect under it.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def use_reference_under_test(pipeline, monkeypatch) -> None:
    """REFERENCE_PYTHONPATH=/path/to/tree: the roles run that tree's reference (``-m`` puts the cwd first)."""
    tree = os.environ.get("REFERENCE_PYTHONPATH")
    if tree:
        import reference_support
        pipeline.env["PYTHONPATH"] = tree
        monkeypatch.setattr(reference_support, "REPO", Path(tree))


def test_read_only_database_is_waited_out_not_requeued_hot(pipeline, monkeypatch):
    use_reference_under_test(pipeline, monkeypatch)
    pipeline.start_all(roles=("api", "relay", "sweeper"))
    response = pipeline.upload(sample_jpeg(7))
    assert response.status_code == 202, response.text
    attachment_id = response.json()["attachment_id"]
    wait_for(lambda: pipeline.queue_depths()["attachments.jobs.process"] >= 1, 15, what="the job's message queued")

    set_read_only(pipeline, True)
    try:
        pipeline.start("worker")
        time.sleep(4.0)  # a hot requeue reaches the delivery limit (20) in well under a second
        assert pipeline.queue_depths()["attachments.jobs.dead"] == 0, "the delivery was requeued hot until dead-lettered"
        log = pipeline.roles["worker"].log()
        assert log.count("unexpected error handling") == 0
        # Read in the database itself: the API's pool is reconnecting after the sessions were ended, and a GET may
        # meet that with a retryable 503 (Retry-After) on a busy machine — not what this test is about.
        rows = pipeline.sql("SELECT state FROM jobs WHERE attachment_id = %s", (attachment_id,))
        assert [r["state"] for r in rows] == ["queued"]
    finally:
        set_read_only(pipeline, False)

    final = pipeline.wait_state(attachment_id, ("ready", "failed"), timeout=30)
    assert final["state"] == "ready" and final["attempt"] == 1, final
    assert pipeline.queue_depths()["attachments.jobs.dead"] == 0


def test_a_read_only_database_answers_uploads_503_with_retry_after(pipeline, monkeypatch):
    """Issue 23 defect 9: the API's answer to a database that refuses writes for now is 503 with Retry-After (the
    client retries with the same Idempotency-Key), never a 500; reads still answer."""
    use_reference_under_test(pipeline, monkeypatch)
    pipeline.start_all(roles=("api",))
    accepted = pipeline.upload(sample_jpeg(8))
    assert accepted.status_code == 202, accepted.text
    set_read_only(pipeline, True)
    try:
        def refused():
            response = pipeline.upload(sample_jpeg(9), headers={"Idempotency-Key": "read-only-1"})
            return response if response.status_code != 202 else None

        response = wait_for(refused, 20, interval=0.5, what="an upload refused while read-only")
        assert response.status_code == 503, (response.status_code, response.text)
        assert response.headers.get("retry-after"), response.headers
        assert response.json()["error"]["code"] == "database_unavailable"
    finally:
        set_read_only(pipeline, False)
    retried = wait_for(lambda: (r := pipeline.upload(sample_jpeg(9), headers={"Idempotency-Key": "read-only-1"}))
                       .status_code == 202 and r, 20, interval=0.5, what="the retried upload accepted")
    assert retried.json()["attachment_id"]
