"""A failpoint is placed by the implementation: a crash while armed does not show it sat in its window. The
``failpoint`` kind's ``happened`` (asked by fault_coverage) demands the window's own evidence, observed by the
harness. Hand-built histories in the shapes the real runs left (tests/broken/failpoint_after_ack, seed 4242)."""

from __future__ import annotations

from harness_histories import ATT, JOB, Builder, job_message

from harness.checkers import fault_coverage
from harness.checkers.base import UNKNOWN, VALID

STEP = {"index": 0, "action": "failpoint", "window": "after_commit_before_ack", "spec": "1*crash"}
OTHER_ATT, OTHER_JOB = "6a2e3d4c-9b0f-4c8d-8e1f-2a3b4c5d6e7f", "1c8f8d63-4f1f-4b63-8b68-7e3c8d2f0a12"


def crashed(peers=()):
    """Two jobs in flight on one worker; it crashes at after_commit_before_ack (hit line as the harness writes it);
    the harness reads the unfinished jobs while it is down; the worker starts again 0.5 s later."""
    b = Builder()
    b.run["schedule"] = [STEP]
    b.add(0.0, "fault", action="failpoint", phase="arm", role="worker", window=STEP["window"], spec="1*crash")
    b.upload(0.1, ATT, JOB)
    b.upload(0.2, OTHER_ATT, OTHER_JOB)
    b.add(0.3, "message", body=job_message(JOB, ATT), properties={})
    b.add(0.35, "message", body=job_message(OTHER_JOB, OTHER_ATT), properties={})
    b.add(0.5, "state", attachment_id=ATT, state="processing")
    b.add(0.5, "state", attachment_id=OTHER_ATT, state="processing")
    b.add(1.0, "role", role="worker", action="exit", returncode=137, expected=False)
    b.add(1.0, "fault", action="crash", phase="hit", role="worker", window=STEP["window"], returncode=137,
          consumers_running=list(peers))
    b.add(1.05, "delivery", queue="q", redelivered=False, job_id=JOB, attachment_id=ATT)  # the tap lags
    b.add(1.05, "delivery", queue="q", redelivered=False, job_id=OTHER_JOB, attachment_id=OTHER_ATT)
    b.add(1.1, "state", attachment_id=ATT, state="ready")  # the look while the worker is down
    b.add(1.1, "observe", source="look_while_down", role="worker", read=2, ready=[ATT])
    b.add(1.5, "role", role="worker", action="start")
    return b


def verdict(b):
    return fault_coverage.check(b.history(), b.final, b.run)


def test_a_crash_after_the_ack_is_not_the_window():
    """tests/broken/failpoint_after_ack: the job committed before the crash was acked before it — never delivered
    again. Only the job that was not committed yet comes back. Before: `valid` (a hit was enough)."""
    b = crashed()
    b.add(3.0, "delivery", queue="q", redelivered=True, job_id=OTHER_JOB, attachment_id=OTHER_ATT)
    b.add(3.3, "state", attachment_id=OTHER_ATT, state="ready")
    got = verdict(b)
    assert got.status == UNKNOWN
    assert "fired 1 times but its window was not shown" in got.evidence[0]["message"]


def test_the_committed_job_delivered_again_shows_the_window():
    b = crashed()
    b.add(3.0, "delivery", queue="q", redelivered=True, job_id=JOB, attachment_id=ATT)
    got = verdict(b)
    assert got.status == VALID and f"job {JOB} (ready before the crash) redelivered" in got.evidence[0]["message"]


def test_ready_seen_only_after_the_restart_does_not_count():
    b = crashed()
    b.events = [e for e in b.events if not (e["type"] == "state" and e.get("state") == "ready")]
    b.add(2.0, "state", attachment_id=ATT, state="ready")  # after the restart: anyone could have committed it
    b.add(3.0, "delivery", queue="q", redelivered=True, job_id=JOB, attachment_id=ATT)
    assert verdict(b).status == UNKNOWN


def test_with_another_consumer_running_only_ready_seen_before_the_crash_counts():
    """Another instance could take the returned delivery and commit it while the crashed one is down."""
    b = crashed(peers=["worker#2"])
    b.add(3.0, "delivery", queue="q", redelivered=True, job_id=JOB, attachment_id=ATT)
    assert verdict(b).status == UNKNOWN
    early = crashed(peers=["worker#2"])
    early.events.insert(8, {**early.events[8], "type": "state", "attachment_id": ATT, "state": "ready"})
    for seq, e in enumerate(early.events, start=1):
        e["seq"] = e["line"] = seq
    early.add(3.0, "delivery", queue="q", redelivered=True, job_id=JOB, attachment_id=ATT)
    assert verdict(early).status == VALID


def api_crash(window, transport_error_before_line=True):
    b = Builder()
    b.run["schedule"] = [{"index": 0, "action": "failpoint", "window": window, "spec": "1*crash"}]
    b.add(0.0, "fault", action="failpoint", phase="arm", role="api", window=window, spec="1*crash")
    b.add(1.0, "invoke", op="u0001", f="upload", kind="good", retry_of=None)
    if transport_error_before_line:  # the client saw its connection break before the harness saw the exit
        b.add(1.45, "info", op="u0001", f="upload", error="RemoteProtocolError")
    b.add(1.5, "role", role="api", action="exit", returncode=137, expected=False)
    b.add(1.5, "fault", action="crash", phase="hit", role="api", window=window, returncode=137)
    b.add(2.0, "role", role="api", action="start")
    return b


def test_an_upload_broken_by_the_crash_a_moment_before_its_line_was_in_flight():
    b = api_crash("after_staging_before_record")
    got = verdict(b)
    assert got.status == VALID and "upload u0001 in flight at the crash" in got.evidence[0]["message"]
    idle = Builder()
    idle.run["schedule"] = b.run["schedule"]
    idle.events = [e for e in b.events if e["type"] not in ("invoke", "info")]
    assert verdict(idle).status == UNKNOWN  # nothing was in flight: the crash shows no window


def test_a_retried_upload_counts_for_commit_before_publish_only_if_its_record_predates_the_crash():
    def case(created_at):
        b = api_crash("after_commit_before_publish")
        b.add(2.5, "invoke", op="u0001.r1", f="upload", kind="good", retry_of="u0001")
        b.add(2.6, "ok", op="u0001.r1", f="upload", status=202, attachment_id=ATT, job_id=JOB)
        b.add(2.7, "message", body=job_message(JOB, ATT), properties={})
        b.transitions(ATT, [(created_at, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                            (3.5, "processing", "ready", 1, "worker")])
        return verdict(b)

    before = case(1.2)  # committed before the crash, published only after the restart: the window
    assert before.status == VALID and "its record created before it" in before.evidence[0]["message"]
    assert case(2.55).status == UNKNOWN  # created afresh by the retry: the crash came before the commit


def test_a_job_committed_before_the_crash_and_never_published_shows_the_window():
    """tests/broken/no_outbox: the API publishes after its commit itself; the crash between the two leaves the job
    queued with no message, ever. Before: the window was `not shown` (only a late publish counted), so the
    scenario's coverage was unknown although the variant lost the job in that very window."""
    def case(created_at, claimed=False):
        b = api_crash("after_commit_before_publish")
        b.add(2.5, "invoke", op="u0001.r1", f="upload", kind="good", retry_of="u0001")
        b.add(2.6, "ok", op="u0001.r1", f="upload", status=202, attachment_id=ATT, job_id=JOB)
        steps = [(created_at, None, "queued", 1, "api")]
        if claimed:  # processed: its message was published, the tap just did not see it — nothing shown
            steps += [(3.0, "queued", "processing", 1, "worker"), (3.5, "processing", "ready", 1, "worker")]
        b.transitions(ATT, steps)
        return verdict(b)

    lost = case(1.2)
    assert lost.status == VALID and "never published, nor claimed" in lost.evidence[0]["message"]
    assert case(2.55).status == UNKNOWN  # created by the retry after the restart: not the window
    assert case(1.2, claimed=True).status == UNKNOWN
