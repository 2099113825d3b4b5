"""Issue 23 defect 2: a job released on drain gets a message of its own.

Worker A holds a job (paused after its S3 writes, before the commit). A broker connection loss (what a node loss
does to A; here the broker's proxy is cut for a second) returns A's unacked delivery to the queue, and worker B,
started after it, takes that copy while A still holds the job: B acks it as ``busy``. Then A is stopped (SIGTERM):
its drain releases the job ``processing → queued`` with the same attempt. The unfixed release wrote no outbox row,
assuming A's unacked delivery would come back — but that copy was already acked by B, so the job had no message
at all and waited for the lost-message safety net, which fires only while the work queue holds nothing ready
(under a steady backlog never; here STALE_QUEUED_SECONDS keeps its default of 300 s, so it does not fire within
the test either) — the job would expire. Fixed: the release writes an outbox row in the same transaction; the
job becomes ready on the same attempt. A second copy (the delivery coming back as well, where it does) is a
no-op for whoever gets it: ``busy`` or ``noop_ready``."""

from __future__ import annotations

import signal
import time

import pytest

from reference_support import roles_from, sample_jpeg, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.timeout(150)
def test_a_job_released_on_drain_after_its_copy_was_acked_elsewhere_gets_a_message(pipeline, stack, monkeypatch):
    roles_from(pipeline, monkeypatch)  # REFERENCE_UNDER_TEST=<a checkout>: the roles of another commit
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {what}")

    pipeline.start_all(roles=("api", "relay", "sweeper", "worker"), worker={
        "SHUTDOWN_GRACE_SECONDS": "2", "FAILPOINTS": "after_s3_write_before_commit=1*pause(20000)"})
    worker_a = pipeline.roles["worker"]
    phase("roles ready")
    attachment_id = pipeline.upload(sample_jpeg(82, size=(320, 240))).json()["attachment_id"]
    wait_for(lambda: "FAILPOINT after_s3_write_before_commit fired" in worker_a.log(), 30,
             what="worker A holding the job before its commit")
    phase("worker A holds the job")

    stack.toxiproxy.cut("rabbitmq")  # A's broker connection drops: its unacked delivery goes back to the queue
    time.sleep(1.0)
    stack.toxiproxy.restore("rabbitmq")
    # A consumes again only once the job it holds is done (a new session waits for the deliveries of the old one):
    # B, started now, takes the copy.
    worker_b = pipeline.start("worker", name="worker-b")
    wait_for(lambda: ": busy (state processing" in worker_b.log(), 20, what="worker B acking the copy as busy")
    phase("the copy acked as busy")

    worker_a.signal_group(signal.SIGTERM)
    assert worker_a.wait_exit(20) == 0, worker_a.log()[-2000:]
    assert "released without spending an attempt" in worker_a.log(), worker_a.log()[-2000:]
    phase("worker A stopped, the job released")
    released = time.monotonic()
    try:
        status = pipeline.wait_state(attachment_id, ("ready", "failed"), timeout=20)
    finally:
        print("job after the release:", pipeline.sql(
            "SELECT j.state, j.attempt, (SELECT count(*) FROM outbox o WHERE o.job_id = j.job_id) AS outbox_rows "
            "FROM jobs j WHERE j.attachment_id = %s", (attachment_id,)), f"{time.monotonic() - released:.1f}s")
    phase("terminal")
    assert status["state"] == "ready" and status["attempt"] == 1, status
    pipeline.assert_exactly_once(attachment_id)
