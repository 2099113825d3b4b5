"""False alarms the property tests (test_harness_checker_properties.py) found: each a minimal correct history that a
checker used to call invalid, next to the bug the rule must still catch."""

from __future__ import annotations

from harness.checkers import (ack_after_commit, bounded_retries, duplicate_effects, lease_ownership, replay_audit,
                              staging_safety, state_regression)
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, JOB, Builder, happy


def test_duplicate_effects_accepts_the_original_of_failed_work_released_by_retention():
    """CONTRACT §8: originals of failed uploads have a documented retention; staging_safety already agrees."""
    b = Builder()
    b.upload(0, kind="poison")
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "failed", 1, "worker")], error_code="decode_failed")
    b.final["attachments"][ATT]["objects"][f"staging/{ATT}"] = {"exists": False}
    assert duplicate_effects.check(b.history(), b.final, b.run).status == VALID
    assert staging_safety.check(b.history(), b.final, b.run).status == VALID
    b2 = happy()  # a published variant that is gone is still a broken effect
    key = b2.final["attachments"][ATT]["body"]["variants"][0]["key"]
    b2.final["attachments"][ATT]["objects"][key] = {"exists": False}
    assert duplicate_effects.check(b2.history(), b2.final, b2.run).status == INVALID


def sigkill_with_peeks(ready_at: float):
    """SIGKILL line at 1.5 (recovery held, peeks while the worker is down); the job's ready commit at ``ready_at``."""
    b = Builder()
    b.upload(0)
    b.add(0.5, "phase", name="hold_start", roles=["sweeper"])
    b.add(1.5, "fault", action="sigkill", phase="start", role="worker")
    for at in (2.0, 2.6):
        b.add(at, "queue", kind="peek", queue="jobs", messages=[], ready=0)
    b.add(6, "phase", name="hold_end", roles=["sweeper"])
    steps = [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker")]
    if ready_at < 6:
        steps.append((ready_at, "processing", "ready", 1, "worker"))
    else:
        steps += [(6.5, "processing", "queued", 2, "sweeper"), (7, "queued", "processing", 2, "worker"),
                  (ready_at, "processing", "ready", 2, "worker")]
    b.transitions(ATT, steps)
    return b


def test_ack_after_commit_accepts_a_job_that_committed_before_the_kill_landed():
    """The fault line is written just before the signal: the job committed and acked 2 ms later, so the queue
    rightly had nothing to give back (batch_independence already reads it so)."""
    b = sigkill_with_peeks(ready_at=1.502)
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID, verdict.evidence
    still_processing = sigkill_with_peeks(ready_at=8)  # processing at every peek and absent: acked before commit
    assert ack_after_commit.check(still_processing.history(), still_processing.final,
                                  still_processing.run).status == INVALID


def replayed_after_exhaustion(replay_call: bool):
    """max_attempts 2: transient errors spend the budget (failed at #2); the operator replays (#3, a fresh budget);
    one more transient error (#4), then ready."""
    b = Builder(max_attempts=2)
    b.upload(0)
    if replay_call:
        b.add(3, "invoke", op="r1", f="replay", attachment_id=ATT)
        b.add(3.1, "ok", op="r1", f="replay", attachment_id=ATT, status=202, unauthenticated_status=401, job_id=JOB,
              attempt=3)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (0.5, "queued", "processing", 1, "w"),
                        (0.8, "processing", "queued", 2, "w"), (1, "queued", "processing", 2, "w"),
                        (1.3, "processing", "failed", 2, "w"), (3.05, "failed", "queued", 3, "ops"),
                        (3.5, "queued", "processing", 3, "w"), (3.8, "processing", "queued", 4, "w"),
                        (4, "queued", "processing", 4, "w"), (4.5, "processing", "ready", 4, "w")])
    return b


def test_bounded_retries_gives_an_operator_replay_a_fresh_attempt_budget():
    b = replayed_after_exhaustion(replay_call=True)
    verdict = bounded_retries.check(b.history(), b.final, b.run)
    assert verdict.status == VALID, verdict.evidence
    assert replay_audit.check(b.history(), b.final, b.run).status == VALID
    assert state_regression.check(b.history(), b.final, b.run).status == VALID
    unasked = replayed_after_exhaustion(replay_call=False)  # no replay: attempt 4 > max_attempts 2
    assert bounded_retries.check(unasked.history(), unasked.final, unasked.run).status == INVALID


def paused_past_lease(new_owner_done: float, recovered: bool = True):
    """lease 4: the worker paused at 1.2 for 2.25 leases (SIGCONT at 10.2); the sweeper recovers the job at 6 and
    worker#2 claims it at 6.5 and commits at ``new_owner_done``."""
    b = Builder(lease=4)
    b.upload(0)
    b.add(1.2, "fault", action="sigstop", phase="start", role="worker")
    b.add(10.2, "fault", action="sigcont", phase="end", role="worker")
    steps = [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker")]
    if recovered:
        steps += [(6, "processing", "queued", 2, "sweeper"), (6.5, "queued", "processing", 2, "worker#2")]
    # The new owner commits under its own actor (the one on its claim): the old owner's actor would be a stale commit.
    b.transitions(ATT, steps + [(new_owner_done, "processing", "ready", 2 if recovered else 1,
                                 "worker#2" if recovered else "worker")])
    return b


def test_lease_ownership_accepts_a_new_owner_that_finishes_after_the_old_one_woke():
    """Recovered while its owner slept (processing→queued at 6, claimed by worker#2 at 6.5): a large image still
    rendering at SIGCONT is no ownership violation — the woken owner is fenced either way."""
    b = paused_past_lease(new_owner_done=12)
    verdict = lease_ownership.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.evidence
    never = paused_past_lease(new_owner_done=11, recovered=False)  # nobody took it over while the owner slept
    assert lease_ownership.check(never.history(), never.final, never.run).status == INVALID


def test_staging_safety_keeps_the_possible_original_of_an_upload_whose_outcome_stayed_unknown():
    """CONTRACT §11: an upload with an unknown outcome is neither lost nor successful. The server recorded it but
    every answer was lost and the client gave up: its original is live work the harness never read."""
    b = happy()
    b.add(3, "invoke", op="u9", f="upload", kind="good", sample="u9", filename="scan-1234abcd.png", size=4321)
    b.add(4, "info", op="u9", f="upload", error="ReadTimeout")
    b.add(5, "invoke", op="u9.r1", f="upload", kind="good", sample="u9", filename="scan-1234abcd.png", size=4321,
          retry_of="u9")
    b.add(6, "info", op="u9.r1", f="upload", status=503)
    b.final["bucket_objects"] = [{"key": f"staging/{ATT}", "size": 99, "last_modified": "2027-01-15T08:00:00Z"},
                                 {"key": "staging/0c1d", "size": 4321, "last_modified": "2027-01-15T08:00:03Z"}]
    verdict = staging_safety.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and "outcome stayed unknown" in verdict.evidence[0]["message"], verdict.evidence
    b.final["bucket_objects"].append({"key": "staging/dead", "size": 55, "last_modified": "2027-01-15T08:00:03Z"})
    verdict = staging_safety.check(b.history(), b.final, b.run)  # an orphan no unknown upload explains
    assert verdict.status == INVALID and verdict.evidence[0]["key"] == "staging/dead"
