"""Issue 23 defect 8: an object-store outage costs no attempt — it is waited out as a database outage is.

The job is accepted while the store is up (the worker, MAX_ATTEMPTS=3 with backoff 0.2 s .. 2 s, stopped by
SIGSTOP meanwhile); then the store is cut (Toxiproxy) and the worker resumed. The outage lasts longer after the
claim than three attempts with their backoff take. The unfixed
worker treated each failed S3 call as a transient error of the job: the job ended ``failed/attempts_exhausted``
during the outage (with production defaults, 20 attempts, an outage of about an hour did the same). Fixed: the
worker holds its claim (the lease renews: the database is up) and waits the store out with backoff; the job
becomes ready on its first attempt once the store is back. The wait is bounded by the job's TTL (its deadline is
checked between tries) and by a stop (the job is released, no attempt spent)."""

from __future__ import annotations

import signal
import time

import pytest

from reference_support import roles_from, sample_jpeg, wait_for

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 6.0  # after the claim: three attempts with their backoff took ~2 s unfixed


@pytest.mark.timeout(120)
def test_an_object_store_outage_is_waited_out_without_spending_attempts(pipeline, stack, monkeypatch):
    roles_from(pipeline, monkeypatch)  # REFERENCE_UNDER_TEST=<a checkout>: the roles of another commit
    pipeline.start_all(worker={"MAX_ATTEMPTS": "3"})
    worker = pipeline.roles["worker"]
    worker.signal_group(signal.SIGSTOP)  # the job is claimed only once the store is cut
    try:
        try:
            attachment_id = pipeline.upload(sample_jpeg(81, size=(320, 240))).json()["attachment_id"]
            stack.toxiproxy.cut("s3")
        finally:
            worker.signal_group(signal.SIGCONT)
        wait_for(lambda: pipeline.sql("SELECT count(*) AS n FROM attachment_events WHERE attachment_id = %s "
                                      "AND to_state = 'processing'", (attachment_id,))[0]["n"] >= 1,
                 20, what="the job claimed during the outage")
        time.sleep(OUTAGE_SECONDS)
        during = pipeline.sql("SELECT state, attempt, error_code FROM jobs WHERE attachment_id = %s",
                              (attachment_id,))[0]
        print("at the end of the outage:", during)
    finally:
        stack.toxiproxy.restore("s3")
    status = pipeline.wait_state(attachment_id, ("ready", "failed"), timeout=40)
    assert during["state"] != "failed", f"the outage failed the job: {during}"
    assert status["state"] == "ready", status
    assert status["attempt"] == 1, status  # the outage spent no attempt
    pipeline.assert_exactly_once(attachment_id)
