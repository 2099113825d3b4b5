"""retry_exhaustion (BE-JOB-003.2) over hand-made histories: a transient error on every attempt must end each job
failed at max_attempts with an error_code, and the retry delays must grow and spread across jobs."""

from __future__ import annotations

import random
import uuid

import pytest
from harness_histories import Builder

from harness.checkers import fault_coverage, lost_accepted_work, retry_exhaustion
from harness.checkers.base import INVALID, UNKNOWN, VALID

MAX = 6
BASE, CAP = 0.2, 2.0


def full_jitter(rng, k, overhead=0.3):
    return rng.uniform(0, min(CAP, BASE * 2 ** (k - 1))) + rng.uniform(0, overhead)


def scenario(delay=full_jitter, jobs=8, seed=1, final_state="failed", final_attempt=MAX, error_code="attempts_exhausted",
             claims=MAX, asked=True, spec="error", arm=True, timings=None):
    b = Builder(level=3, max_attempts=MAX, scenario={"name": "retry-budget-exhausted",
                                                     "checks": ["retry_exhaustion"] if asked else []})
    b.run["adapter"]["timings"].update({"retry_base_seconds": BASE, "retry_cap_seconds": CAP, **(timings or {})})
    rng = random.Random(seed)
    if arm:
        b.add(0.5, "fault", action="failpoint", phase="arm", role="worker", window="after_s3_write_before_commit",
              spec=spec)
    ids = []
    for j in range(jobs):
        att, job = str(uuid.UUID(int=1000 + j)), str(uuid.UUID(int=2000 + j))
        ids.append(att)
        at = 1.0 + 0.1 * j
        b.upload(at, attachment_id=att, job_id=job)
        steps = [(at + 0.1, None, "queued", 1, "api")]
        t = at + 0.3
        for attempt in range(1, claims + 1):
            steps.append((t, "queued", "processing", attempt, "worker"))
            t += 0.1
            if attempt == claims:
                break
            steps.append((t, "processing", "queued", attempt, "worker"))
            t += delay(rng, attempt)
        if final_state in ("ready", "failed"):
            steps.append((t, "processing", final_state, claims, "worker"))
        body = b.transitions(att, steps, error_code=error_code if final_state == "failed" else None)
        body["attempt"] = final_attempt
    b.add(40.0, "fault", action="failpoint", phase="end", role="worker", window="after_s3_write_before_commit",
          spec=spec, reason="idle")
    return b, ids


def check(b):
    return retry_exhaustion.check(b.history(), b.final, b.run)


def test_full_jitter_ending_failed_at_the_limit_is_valid():
    v = check(scenario()[0])
    assert v.status == VALID and v.exercised, v.summary
    assert "grow" in v.summary


@pytest.mark.parametrize("fixed", [0.0, 0.05, 0.2, 1.0])
def test_a_zero_or_fixed_delay_is_invalid(fixed):
    v = check(scenario(delay=lambda rng, k: fixed + rng.uniform(0, 0.05))[0])
    assert v.status == INVALID, v.summary
    assert "do not grow" in v.summary
    assert any(e.get("attachment_id") and e.get("delays") for e in v.evidence)


def test_exponential_delays_without_jitter_are_invalid():
    v = check(scenario(delay=lambda rng, k: BASE * 2 ** (k - 1))[0])
    assert v.status == INVALID and "no jitter" in v.summary, v.summary


def test_retrying_past_the_limit_is_invalid():
    v = check(scenario(claims=9, final_attempt=9)[0])
    assert v.status == INVALID and "beyond the budget" in v.summary, v.summary


def test_ready_despite_an_error_on_every_attempt_is_invalid():
    v = check(scenario(final_state="ready", error_code=None)[0])
    assert v.status == INVALID and "ready although" in v.summary, v.summary


def test_a_job_left_queued_is_invalid():
    v = check(scenario(final_state="queued", claims=3, final_attempt=3)[0])
    assert v.status == INVALID and "not terminal" in v.summary, v.summary


def test_failing_before_the_attempts_are_spent_is_invalid():
    v = check(scenario(claims=2, final_attempt=2)[0])
    assert v.status == INVALID and "attempts not spent" in v.summary, v.summary


def test_failed_without_an_error_code_is_invalid():
    v = check(scenario(error_code=None)[0])
    assert v.status == INVALID and "error_code" in v.summary, v.summary


def test_too_few_jobs_to_judge_growth_is_unknown():
    v = check(scenario(jobs=2)[0])
    assert v.status == UNKNOWN and "too few" in v.summary, v.summary


def test_no_declared_backoff_timings_is_unknown():
    b, _ = scenario()
    del b.run["adapter"]["timings"]["retry_base_seconds"]
    v = check(b)
    assert v.status == UNKNOWN and "retry_base_seconds" in v.summary, v.summary


def test_a_cap_with_no_room_to_grow_is_unknown():
    v = check(scenario(delay=lambda rng, k: rng.uniform(0, 0.2), timings={"retry_cap_seconds": 0.2})[0])
    assert v.status == UNKNOWN and "no room" in v.summary, v.summary


def test_without_an_exhausting_fault_it_is_not_exercised():
    b, _ = scenario(arm=False, asked=False)
    v = check(b)
    assert v.status == VALID and not v.exercised
    assert check(scenario(arm=False)[0]).status == UNKNOWN
    # N*error with fewer hits than the budgets of all jobs: some jobs may succeed, not this checker's case
    b, _ = scenario(spec="3*error", asked=False)
    assert not check(b).exercised
    b, _ = scenario(spec=f"{8 * MAX}*error")
    assert check(b).status == VALID


def test_growth_judgement_has_no_false_alarm_and_catches_fixed_delays_over_many_seeds():
    """Full jitter under queue-wait noise is never invalid and rarely unknown; a fixed delay is never valid."""
    verdicts = {"jitter": [], "fixed": []}
    for seed in range(100):
        verdicts["jitter"].append(check(scenario(seed=seed, delay=lambda rng, k: full_jitter(rng, k, 0.6))[0]).status)
        verdicts["fixed"].append(check(scenario(seed=seed, delay=lambda rng, k: 0.2 + rng.uniform(0, 0.6))[0]).status)
    assert INVALID not in verdicts["jitter"]
    assert verdicts["jitter"].count(UNKNOWN) <= 2, verdicts["jitter"].count(UNKNOWN)
    assert VALID not in verdicts["fixed"]
    assert verdicts["fixed"].count(INVALID) >= 90, verdicts["fixed"].count(UNKNOWN)


def test_jobs_failed_by_the_exhausting_fault_are_not_lost_work():
    b, _ = scenario()
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == VALID
    b, _ = scenario(arm=False)
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == INVALID


def test_an_error_failpoint_is_covered_when_attempts_were_given_back():
    b, _ = scenario()
    b.run["schedule"] = [{"index": 0, "action": "failpoint", "window": "after_s3_write_before_commit",
                          "spec": "error"}]
    ok, why = fault_coverage._happened(b.run["schedule"][0], b.history())
    assert ok and "given back" in why
    b, _ = scenario(claims=1, final_attempt=1)
    ok, _ = fault_coverage._happened({"action": "failpoint", "window": "after_s3_write_before_commit",
                                      "spec": "error"}, b.history())
    assert not ok


def test_ready_after_the_armed_role_crashed_is_unknown_not_invalid():
    b, _ = scenario(final_state="ready", error_code=None)
    b.add(1.2, "role", action="exit", role="worker", pid=1, returncode=1, expected=False)
    v = check(b)
    assert v.status == UNKNOWN and "could not be judged" in v.summary, v.summary
    b, _ = scenario(final_state="ready", error_code=None)
    b.add(0.6, "role", action="exit", role="worker", pid=1, returncode=0, expected=True)  # the arming restart
    assert check(b).status == INVALID


def exact_polled(rng, k, poll=1.0):
    """Exact exponential backoff (no jitter) picked up by a poller ticking every ``poll`` seconds: each requeue
    falls at a random phase of the tick, so each delay gets up to one period of noise on top of the one it chose."""
    return min(CAP, BASE * 2 ** (k - 1)) + rng.uniform(0, poll) + rng.uniform(0, 0.05)


def test_exact_backoff_on_a_one_second_poller_is_invalid_whether_or_not_the_poll_is_declared():
    """Issue 20, item 3: the poller's noise is not jitter. Before, this graded valid on most seeds (151 of 200)."""
    declared = [check(scenario(seed=seed, delay=exact_polled, timings={"retry_poll_seconds": 1.0})[0])
                for seed in range(60)]
    assert {v.status for v in declared} == {INVALID}, [v.summary for v in declared if v.status != INVALID][:2]
    assert "scheduling alone explains" in declared[0].summary
    noise = next(e["scheduling_noise"] for e in declared[0].evidence if "scheduling_noise" in e)
    assert noise["declared_retry_poll_seconds"] == 1.0 and noise["discounted"] >= 1.0
    # Undeclared, the spread measured at the early retry numbers (where full jitter has little room) stands for it.
    undeclared = [check(scenario(seed=seed, delay=exact_polled)[0]).status for seed in range(60)]
    assert VALID not in undeclared and undeclared.count(INVALID) >= 40, undeclared


def test_full_jitter_on_a_declared_poller_is_still_valid():
    def polled_jitter(rng, k):
        return full_jitter(rng, k, 0.1) + rng.uniform(0, 0.5)
    statuses = [check(scenario(seed=seed, delay=polled_jitter, timings={"retry_poll_seconds": 0.5})[0]).status
                for seed in range(100)]
    assert INVALID not in statuses and statuses.count(UNKNOWN) <= 6, statuses.count(UNKNOWN)  # 5 of 100


BROKER = {"exchange": "attachments.jobs", "routing_key": "jobs.process", "work_queue": "attachments.jobs.process"}


def crowded(early_wait=1.2, jobs=8, seed=20261202, delay=None, tapped=True, exchange=BROKER["exchange"],
            headers=None):
    """The reference's production shape under load (issue 23, stored level-5 run at seed 20261202): every attempt
    fails at once, so the early retries of all jobs come back together and their messages sit ready in the work
    queue while the worker's slots are busy (the harness sees the publish and the delivery itself); the late
    retries, spread by jitter, are delivered at once. ``early_wait``: seconds the retries 1 and 2 wait there."""
    rng = random.Random(seed)
    delay = delay or (lambda rng, k: rng.uniform(0, min(CAP, BASE * 2 ** (k - 1))) + rng.uniform(0, 0.3))
    b = Builder(level=5, max_attempts=MAX, scenario={"name": "retry-budget-exhausted", "checks": ["retry_exhaustion"]})
    b.run["adapter"]["timings"].update({"retry_base_seconds": BASE, "retry_cap_seconds": CAP})
    b.run["adapter"]["broker"] = dict(BROKER)
    b.add(0.05, "fault", action="failpoint", phase="arm", role="worker", window="after_s3_write_before_commit",
          spec="error")
    for j in range(jobs):
        att, job = str(uuid.UUID(int=3000 + j)), str(uuid.UUID(int=4000 + j))
        at = 1.0 + 0.3 * j
        b.upload(at, attachment_id=att, job_id=job)
        steps = [(at + 0.05, None, "queued", 1, "api")]
        t = at + 0.1
        for attempt in range(1, MAX + 1):
            wait = rng.uniform(0.5 * early_wait, 1.5 * early_wait) if attempt in (2, 3) else 0.0
            if tapped:
                b.add(t, "message", exchange=exchange, routing_key=BROKER["routing_key"],
                      body={"attachment_id": att, "job_id": job, "attempt": attempt},
                      properties={"headers": dict(headers or {})})
                b.add(t + wait, "delivery", queue=BROKER["work_queue"], attachment_id=att, job_id=job,
                      attempt=attempt, message_id=job, redelivered=0)
            t += wait + 0.05
            steps.append((t, "queued", "processing", attempt, "worker"))
            t += 0.4
            if attempt == MAX:
                break
            steps.append((t, "processing", "queued", attempt + 1, "worker"))
            t += delay(rng, attempt)  # the delay the implementation chose, to the publish of the next attempt
        steps.append((t, "processing", "failed", MAX, "worker"))
        b.transitions(att, steps, error_code="attempts_exhausted")["attempt"] = MAX
    b.add(60.0, "fault", action="failpoint", phase="end", role="worker", window="after_s3_write_before_commit",
          spec="error", reason="idle")
    return b


def test_full_jitter_behind_a_crowded_work_queue_is_not_called_flat():
    """Issue 23: full jitter whose early retries waited seconds in the work queue (the broker's publish → delivery,
    seen by the harness) was judged "delays do not grow" (before the fix: INVALID on every one of these seeds)."""
    statuses = [check(crowded(seed=seed)).status for seed in range(20261202, 20261222)]
    assert INVALID not in statuses, statuses
    assert statuses.count(VALID) >= 15, statuses
    verdict = check(crowded())
    queue = next(e["work_queue_wait"] for e in verdict.evidence if "work_queue_wait" in e)
    assert queue["observed"] == queue["samples"] and queue["early_mean"] > 0.5 and queue["late_mean"] == 0


def test_a_fixed_delay_behind_a_crowded_work_queue_stays_invalid():
    """The queue-wait credit takes away only what the harness saw the message wait in the work queue: a fixed
    delay is still flat after it, and a zero delay too."""
    for fixed in (lambda rng, k: 0.4 + rng.uniform(0, 0.1), lambda rng, k: 0.0):
        for wait in (1.2, 2.0):
            statuses = [check(crowded(seed=seed, delay=fixed, early_wait=wait)).status for seed in range(20)]
            assert set(statuses) == {INVALID}, (wait, statuses)


def test_without_a_tap_noise_as_large_as_the_promised_gain_makes_growth_unknown():
    """Unseen by the tap, early retries that queued together spread their delays by more than full jitter can
    there; when that excess is as large as the gain full jitter promises, "delays do not grow" is not said."""
    verdict = check(crowded(tapped=False, early_wait=2.0))
    assert verdict.status == UNKNOWN and "growth cannot be judged" in verdict.summary, verdict.summary
    statuses = [check(crowded(seed=seed, tapped=False, early_wait=2.0)).status for seed in range(100)]
    assert statuses.count(UNKNOWN) >= 80 and VALID not in statuses, statuses.count(UNKNOWN)
    fixed = [check(crowded(seed=seed, tapped=False, delay=lambda rng, k: 0.4)).status for seed in range(20)]
    assert set(fixed) == {INVALID}, fixed  # a queue that did not crowd hides nothing


def test_without_a_tap_the_queue_wait_is_not_credited():
    """Without the broker's publish and delivery in the history, nothing is credited: the raw delays are judged."""
    verdict = check(crowded(tapped=False))
    queue = next(e["work_queue_wait"] for e in verdict.evidence if "work_queue_wait" in e)
    assert queue["observed"] == 0


def test_a_publish_to_another_exchange_is_never_credited_as_queue_wait():
    """A message published elsewhere first (a delay exchange whose queue dead-letters into the work queue), or held
    back by a delayed-message exchange (an x-delay header), may be waiting out the backoff itself: not credited."""
    for verdict in (check(crowded(exchange="attachments.delay")), check(crowded(headers={"x-delay": 800}))):
        queue = next(e["work_queue_wait"] for e in verdict.evidence if "work_queue_wait" in e)
        assert queue["observed"] == 0
        assert verdict.summary == check(crowded(tapped=False)).summary  # judged as measured, as with no tap at all
