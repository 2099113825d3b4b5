"""Delivery accounting (BE-JOB-001, BE-JOB-003) and the ack-after-commit peek, over hand-made histories.

Each blind spot here was graded wrong before the checker learnt it (the test failed on the checkers of that day):
a requeue loop with no new attempt passed every checker; a message left in the work queue after the drain, seen
once every consumer was stopped, passed; a look into the queue while a second consumer instance was running made a
correct implementation invalid (the survivor had taken the returned delivery); and a message of another attempt of
the job, found by the look, was taken as the crashed delivery come back.
"""

from __future__ import annotations

from harness.checkers import CHECKERS, ack_after_commit, run_checks
from harness.checkers.base import INVALID, UNKNOWN, VALID, combine
from harness_histories import ATT, JOB, Builder, happy, job_message

QUEUE = "attachments.jobs.process"


def traced(b, at=0.01):
    b.add(at, "observe", source="firehose", deliveries=True, routing_key=f"deliver.{QUEUE}", queue=QUEUE)


def delivery(b, at, redelivered, attempt=1, job_id=JOB, attachment_id=ATT):
    return b.add(at, "delivery", queue=QUEUE, redelivered=int(redelivered), message_id=job_id, sha256="ef" * 32,
                 job_id=job_id, attachment_id=attachment_id, attempt=attempt)


def statuses(b) -> dict:
    return {v.invariant: v for v in run_checks(b.history(), b.final, b.run)}


# --- requeue loop ---------------------------------------------------------------------------------------------

def test_a_requeue_loop_without_a_new_attempt_is_invalid():
    b = happy()
    traced(b)
    delivery(b, 0.9, False)
    for n in range(14):  # handed out again and again, always attempt 1, no fault to explain it
        delivery(b, 0.92 + 0.005 * n, True)
    found = statuses(b)
    assert combine([v.status for v in found.values()]) == INVALID
    verdict = found["delivery_accounting"]
    assert verdict.status == INVALID and verdict.exercised
    ev = verdict.evidence[0]
    assert ev["job_id"] == JOB and ev["attempt"] == 1 and ev["redeliveries"] == 14 and ev["lines"]


def test_redeliveries_explained_by_faults_are_not_a_loop():
    b = happy()
    traced(b)
    delivery(b, 0.9, False)
    for n in range(3):  # three consumer crashes, each returning the delivery once
        b.add(1.0 + n, "fault", action="sigkill", phase="start", role="worker")
        b.add(1.01 + n, "role", role="worker", action="exit", returncode=-9, expected=True)
        delivery(b, 1.5 + n, True)
    verdict = CHECKERS["delivery_accounting"].check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised


def test_no_traced_deliveries_is_not_exercised():
    b = happy()
    verdict = CHECKERS["delivery_accounting"].check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised
    b.run["scenario"]["checks"] = ["delivery_accounting"]
    assert CHECKERS["delivery_accounting"].check(b.history(), b.final, b.run).status == UNKNOWN


# --- left in the queue after the drain ------------------------------------------------------------------------

def test_a_message_left_ready_once_every_consumer_stopped_is_invalid():
    b = happy()
    b.add(20, "queue", kind="after_consumers_stopped", queue=QUEUE, dead_letter=False, ready=1, consumers=0,
          stopped=["worker"], messages=[{"job_id": JOB, "attempt": 1, "redelivered": True}])
    found = statuses(b)
    assert combine([v.status for v in found.values()]) == INVALID
    verdict = found["delivery_accounting"]
    assert verdict.status == INVALID and "left" in verdict.summary
    assert verdict.evidence[0]["ready"] == 1 and verdict.evidence[0]["lines"]


def test_an_empty_queue_once_every_consumer_stopped_is_valid_and_exercised():
    b = happy()
    b.add(20, "queue", kind="after_consumers_stopped", queue=QUEUE, dead_letter=False, ready=0, consumers=0,
          stopped=["worker"])
    verdict = CHECKERS["delivery_accounting"].check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised


def test_a_consumer_still_attached_after_the_stop_cannot_tell():
    b = happy()
    b.run["scenario"]["checks"] = ["delivery_accounting"]
    b.add(20, "queue", kind="after_consumers_stopped", queue=QUEUE, dead_letter=False, ready=0, consumers=1,
          stopped=["worker"])
    assert CHECKERS["delivery_accounting"].check(b.history(), b.final, b.run).status == UNKNOWN


# --- ack after commit: the look into the queue ----------------------------------------------------------------

def two_workers() -> Builder:
    b = Builder(roles={"api": 1, "relay": 1, "worker": 2, "sweeper": 1})
    for name in ("api", "relay", "worker", "worker#2"):
        b.add(0.0, "role", role=name, action="start", pid=100)
    b.upload(0)
    b.add(0.15, "message", body=job_message(), properties={})
    return b


def crash_of_the_first_worker(b, peeks, running_peer: bool):
    b.add(0.5, "phase", name="hold_start", roles=["sweeper"], instances=["sweeper"])
    if not running_peer:
        b.add(0.6, "role", role="worker#2", action="exit", returncode=0, expected=True)
    b.add(1.5, "role", role="worker", action="exit", returncode=137, expected=False)
    b.add(1.51, "fault", action="crash", phase="hit", role="worker", window="after_s3_write_before_commit")
    for at, fields in peeks:
        b.add(at, "queue", kind="peek", queue=QUEUE, **fields)
    b.add(4.5, "role", role="worker", action="start", pid=101)
    b.add(8.5, "phase", name="hold_end", roles=["sweeper"], instances=["sweeper"])


def test_a_look_while_a_second_consumer_runs_proves_nothing_the_trace_does():
    """The reference with two workers: the survivor takes the returned delivery at once, so the look finds nothing
    — that is no early ack. The traced redelivery (same job and attempt, redelivered set) proves the delivery came
    back."""
    b = two_workers()
    traced(b)
    delivery(b, 1.0, False)
    crash_of_the_first_worker(b, [(2.0, {"messages": [], "ready": 0}), (2.6, {"messages": [], "ready": 0})],
                              running_peer=True)
    delivery(b, 1.6, True)  # worker#2 took it back
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2.2, "processing", "ready", 1, "worker#2")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict
    assert "redelivered" in verdict.evidence[0]["message"]


def test_a_look_while_a_second_consumer_runs_without_a_trace_cannot_tell():
    b = two_workers()
    b.run["scenario"]["checks"] = ["ack_after_commit"]
    crash_of_the_first_worker(b, [(2.0, {"messages": [], "ready": 0}), (2.6, {"messages": [], "ready": 0})],
                              running_peer=True)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2.2, "processing", "ready", 1, "worker#2")])
    assert ack_after_commit.check(b.history(), b.final, b.run).status != INVALID


def test_a_message_of_another_attempt_is_not_the_crashed_delivery():
    """Every consumer down, the look finds a message of the job — but a fresh one of attempt 2 (not redelivered),
    while attempt 1 was in flight: the crashed delivery itself is gone."""
    b = two_workers()
    other = {"job_id": JOB, "attachment_id": ATT, "attempt": 2, "redelivered": False}
    crash_of_the_first_worker(b, [(2.0, {"messages": [other], "ready": 1}), (2.6, {"messages": [other], "ready": 1})],
                              running_peer=False)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (9, "processing", "queued", 2, "sweeper"), (9.5, "queued", "processing", 2, "worker"),
                        (10, "processing", "ready", 2, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID, verdict


def test_exact_count_and_traced_redelivery_prove_the_delivery_came_back():
    b = two_workers()
    traced(b)
    delivery(b, 1.0, False)
    crash_of_the_first_worker(b, [(2.0, {"ready": 1, "consumers": 0, "source": "amqp"})], running_peer=False)
    delivery(b, 4.7, True)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (5, "processing", "ready", 1, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised


def test_traced_deliveries_without_the_redelivery_prove_an_early_ack():
    b = two_workers()
    traced(b)
    delivery(b, 1.0, False)
    crash_of_the_first_worker(b, [(2.0, {"ready": 0, "consumers": 0, "source": "amqp"})], running_peer=False)
    delivery(b, 9.6, False, attempt=2)  # only lease recovery's new message, after the hold
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (9, "processing", "queued", 2, "sweeper"), (9.5, "queued", "processing", 2, "worker"),
                        (10, "processing", "ready", 2, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "redelivered" in verdict.evidence[0]["message"]
