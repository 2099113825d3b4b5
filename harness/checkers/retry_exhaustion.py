"""Retry exhaustion and backoff (BE-JOB-003.2): a transient fault that outlasts the whole retry budget.

Provoked by a failpoint ``error`` (docs/CONTRACT.md §7: a transient error) armed on every hit, or on more hits
than the budget of every accepted job (``N*error`` with N ≥ jobs × max_attempts): no attempt can ever commit. Every
affected job must end ``failed`` at attempt == max_attempts (one budget per operator replay) with an
error_code — never ``ready``, never left ``queued``/``processing``, never claimed for more attempts than the
budget. An S3 or database outage is not used: the contract lets an implementation wait an outage out without
spending attempts.

The backoff is judged from outside, from the events API: the delay of the k-th retry of a job is the time from its
k-th ``processing → queued`` to the next ``queued → processing`` (the implementation's own timestamps). Full jitter
(``rand(0, min(cap, base·2^n))``) makes a single delay small at any retry number, so growth is judged on the
delays of many jobs: the mean delay of the late half of the retry numbers against the early half's (queue wait and
load add to every delay alike, so the gain in seconds is measured against the gain full jitter promises), and
spread on the late retry numbers (delays of one retry number not all alike). Each test has a clear
"yes", a clear "no" (a zero, fixed or unjittered delay: invalid) and a band between them that says ``unknown``;
too few samples, or a declared cap that leaves no room to grow over the observed retries, is ``unknown`` too.
Queue wait does not add to every delay alike when every attempt fails at once: the early retries of all jobs come
back together and wait for the worker's slots, the late ones (spread by jitter) do not, so a correct full jitter can
look flat or shrinking. The harness sees that wait itself, from its tap on the broker: the time a retried job's
message sat in the work queue (its publish to the declared work exchange and routing key, to its first delivery
from the work queue; never the implementation's own report, such as an outbox row's available_at). Each delay is
judged both as measured and less that wait; a violation stands only when both show it. Noise the tap cannot see
(a worker's own buffer): when the early retry numbers' delays spread beyond what full jitter can spread there by as
much as the gain it promises, "delays do not grow" is not said (``unknown``, the reason given).
The thresholds scale with the adapter's declared ``retry_base_seconds`` and ``retry_cap_seconds`` (none declared:
``unknown``), never with one implementation's constants.
"""

from __future__ import annotations

from typing import Any, Iterable

import re
from statistics import mean

from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, final_read_ok, missing_timings,
                   operator_replays, seed_of, timing, transitions_of, undecided, FinalState, RunInfo, declared_timing)

NAME = "retry_exhaustion"
REQUIREMENTS = ["BE-JOB-003"]
TIMINGS = ("retry_base_seconds", "retry_cap_seconds")

_ERROR_SPEC = re.compile(r"^\s*(?:(?P<count>\d+)\s*\*)?\s*error\s*$")
MIN_SAMPLES = 4  # delays per retry number before that retry number is judged
MIN_JOBS = 3  # jobs whose retries were seen before growth across jobs is judged
# Growth of the mean delay from the early to the late retry numbers, as a share of what full jitter promises
# under the declared base and cap (queue wait and load add to every delay alike, so the gain, not the ratio, is
# the measure; the ratio guards against a gain that is all noise).
CLEAR_SHARE, FLAT_SHARE = 0.4, 0.15
GROWTH_CLEAR, GROWTH_FLAT = 1.25, 1.1
# Spread of one late retry number's delays across jobs, beyond what scheduling alone explains, as a share of the
# lowest ceiling full jitter allows there (min(cap, base·2^(k-1))). Scheduling noise (a retry poller's tick, queue
# wait, load) is the same at every retry number, so it is measured where full jitter has almost no room (the early
# retry numbers' own spread, their mean) and taken at least as the declared ``retry_poll_seconds``: a poller only
# ever adds up to one period to the delay the implementation chose, so exact delays picked up by a poller spread by
# at most that much, whatever the retry number. Full jitter spreads a late retry number's delays over its ceiling.
SPREAD_JITTER = 0.3  # at or above this at some late retry number: jittered
SPREAD_FLAT = 0.1  # below this on average over the late retry numbers: one delay for every job (no jitter)


def _exhausting_arms(history: History, budget_jobs: int, max_attempts: int) -> list[dict[str, Any]]:
    """Failpoint arms whose action is ``error`` on more hits than every accepted job's whole budget."""
    arms = []
    for e in history.of_type("fault"):
        if e.get("action") != "failpoint" or e.get("phase") != "arm":
            continue
        m = _ERROR_SPEC.match(str(e.get("spec") or ""))
        if not m:
            continue
        count = m.group("count")
        if count is None or int(count) >= max(1, budget_jobs) * max_attempts:
            arms.append(e)
    return arms


def exhausting_arms_of(history: History, run: RunInfo, accepted: int) -> list[dict[str, Any]]:
    """The exhausting failpoint arms of a run (none when the adapter declares no max_attempts)."""
    max_attempts = timing(run, "max_attempts")
    return [] if max_attempts is None else _exhausting_arms(history, accepted, int(max_attempts))


def _fault_window(history: History, arms: list[dict[str, Any]]) -> tuple[float, float | None, str | None]:
    """(armed at, lifted at or None, why lifted) in run time: the harness records the end of a failpoint kept armed
    until idle (``until = "idle"``) with the reason ``idle`` or ``timeout``; otherwise the heal lifts it."""
    start = min(a.get("t") or 0 for a in arms)
    roles = {a.get("role") for a in arms}
    ends = [e for e in history.of_type("fault") if e.get("action") == "failpoint" and e.get("phase") == "end"
            and e.get("role") in roles and (e.get("t") or 0) >= start]
    if ends:
        return start, ends[0].get("t"), ends[0].get("reason")
    healed = [e for e in history.of_type("phase") if e.get("name") == "heal_start" and (e.get("t") or 0) >= start]
    return start, (healed[0].get("t") if healed else None), "heal"


def _interruptions(history: History, arms: list[dict[str, Any]], until: float | None) -> list[dict[str, Any]]:
    """While the fault should hold, anything that may have taken the armed failpoint away: a disarm, or an
    unexpected exit of the armed instance (the restart after it comes back without failpoints). The harness's own
    restart that arms it is an expected exit."""
    roles = {a.get("role") for a in arms}
    start = min(a.get("t") or 0 for a in arms)
    out = []
    for e in history.of_type("fault"):
        if e.get("phase") == "disarm" and e.get("role") in roles:
            out.append(e)
    for e in history.of_type("role"):
        if e.get("action") == "exit" and e.get("role") in roles and not e.get("expected"):
            out.append(e)
    return [e for e in out if (e.get("t") or 0) >= start and (until is None or (e.get("t") or 0) < until)]


def budget_seconds(run: RunInfo, max_attempts: int) -> float | None:
    """A generous bound on how long one job can take to spend its whole budget: every backoff at its ceiling (the
    later-capping reading, n = k) plus a whole lease per attempt. None when the adapter lacks a timing."""
    base, cap, lease = (timing(run, n) for n in ("retry_base_seconds", "retry_cap_seconds", "lease_seconds"))
    if base is None or cap is None or lease is None:
        return None
    return sum(min(cap, base * 2.0 ** min(k, 60)) for k in range(1, max_attempts)) + max_attempts * (lease + 1)


def retry_samples(trans: list[dict[str, Any]]) -> list[tuple[int, float, Any]]:
    """(retry number k, seconds, attempt of the next claim) for each requeue followed by a claim; k counts requeues
    within one budget (an operator replay, ``failed → queued``, starts a new budget)."""
    out, k = [], 0
    for prev, nxt in zip(trans, trans[1:]):
        if prev["from"] == "failed" and prev["to"] == "queued":
            k = 0
        if prev["from"] == "processing" and prev["to"] == "queued":
            k += 1
            if nxt["to"] == "processing" and prev["at"] is not None and nxt["at"] is not None:
                out.append((k, max(0.0, round(nxt["at"] - prev["at"], 3)), nxt.get("attempt")))
    return out


def retry_delays(trans: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(retry number k, seconds) for each requeue followed by a claim (see ``retry_samples``)."""
    return [(k, d) for k, d, _ in retry_samples(trans)]


def work_queue_waits(history: History, run: RunInfo) -> dict[tuple[str, int], float]:
    """(attachment_id, attempt) -> seconds its message sat in the work queue before the broker first delivered it,
    from the harness's own tap: the last publish of that job's message for that attempt to the declared work
    exchange and routing key (a message that reaches the work queue through a delay queue is published there again
    when it is dead-lettered in) up to its first delivery from the declared work queue. Both times are the
    harness's, on one clock. A publish with an ``x-delay`` header (a delayed-message exchange holds it back) is not
    counted. Nothing is returned when the adapter declares no exchange, routing key or work queue:
    a publish elsewhere (a delay exchange) may be the backoff itself, never queue wait."""
    broker = (run.get("adapter") or {}).get("broker") or {}
    exchange, key, queue = broker.get("exchange"), broker.get("routing_key"), broker.get("work_queue")
    if not (exchange and key and queue):
        return {}
    published: dict[tuple[str, int], list[float]] = {}
    for e in history.of_type("message"):
        body = e.get("body")
        if not isinstance(body, dict) or e.get("exchange") != exchange or e.get("routing_key") != key:
            continue
        properties = e.get("properties")
        headers = properties.get("headers") if isinstance(properties, dict) else None
        if isinstance(headers, dict) and any(str(h).lower() == "x-delay" for h in headers):
            continue  # a delayed-message exchange holds it for its x-delay: that wait may be the backoff itself
        attachment_id, attempt = body.get("attachment_id"), body.get("attempt")
        if isinstance(attachment_id, str) and isinstance(attempt, int) and e.get("t") is not None:
            published.setdefault((attachment_id, attempt), []).append(float(e["t"]))
    out: dict[tuple[str, int], float] = {}
    for d in history.of_type("delivery"):
        attachment_id, attempt = d.get("attachment_id"), d.get("attempt")
        if d.get("queue") != queue or d.get("t") is None or not isinstance(attachment_id, str) \
                or not isinstance(attempt, int) or (attachment_id, attempt) in out:
            continue
        at = float(d["t"])
        before = [t for t in published.get((attachment_id, attempt), ()) if t <= at]
        if before:
            out[(attachment_id, attempt)] = round(at - max(before), 3)
    return out


def judge_backoff(by_retry: dict[int, list[float]], jobs: int, base: float, cap: float,
                  poll: float | None = None,
                  waits: dict[int, list[float | None]] | None = None) -> tuple[str, str, dict[str, Any]]:
    """Growth and spread of the delays per retry number: (status, why, facts). ``poll``: the adapter's declared
    ``retry_poll_seconds`` (None: undeclared; the measured scheduling noise alone is discounted). ``waits``: for
    each delay (same order as ``by_retry``), the seconds the harness saw its message wait in the work queue before
    delivery (None: not seen). Each delay is also judged less that wait (the delay the implementation chose plus
    what the harness could not see); a violation stands only if the delays as measured and the delays less the
    seen queue wait both show it, so the credit can take a false alarm away but never make one."""
    if waits:
        credited = {k: [max(0.0, round(d - (w or 0.0), 3)) for d, w in zip(ds, waits.get(k) or [None] * len(ds))]
                    for k, ds in by_retry.items()}
        seen = sum(1 for ws in waits.values() for w in ws if w is not None)
    else:
        credited, seen = by_retry, 0
    raw = _judge_backoff(by_retry, jobs, base, cap, poll)
    queue: dict[str, Any] = {"samples": sum(len(ds) for ds in by_retry.values()), "observed": seen}
    if not seen:
        raw[2]["work_queue_wait"] = {**queue, "note": "no publish and delivery of the retried messages seen in the "
                                                       "work queue: nothing credited"}
        return raw
    net = _judge_backoff(credited, jobs, base, cap, poll)
    early_ks, late_ks = net[2].get("early_retries") or [], net[2].get("late_retries") or []

    def mean_wait(ks: list[int]) -> float | None:
        ws = [w for k in ks for w in (waits or {}).get(k, []) if w is not None]
        return round(mean(ws), 3) if ws else None

    queue.update({"early_mean": mean_wait(early_ks), "late_mean": mean_wait(late_ks)})
    if net[0] == INVALID and (raw[0] == INVALID or raw[2].get("noise_hides_growth")):
        # Also flat as measured, or hidden there only by noise the seen queue wait accounts for.
        net[2]["work_queue_wait"] = {**queue, "as_measured": raw[1]}
        return net[0], net[1], net[2]
    if raw[0] == INVALID:  # a violation as measured, gone once the queue wait the harness saw is taken off
        status, facts = net[0], net[2]
        why = (f"{net[1]} (judged on the delays less the {queue['early_mean']}s / {queue['late_mean']}s mean "
               f"work-queue wait the harness saw at retries {early_ks} / {late_ks}; as measured: {raw[1]})")
    elif net[0] == INVALID:  # fine as measured, a violation only less the queue wait: neither view is sure
        status, facts = UNKNOWN, net[2]
        why = f"as measured: {raw[1]}; but less the work-queue wait the harness saw: {net[1]}"
    else:
        status, why, facts = next((v for v in (raw, net) if v[0] == VALID), net)
    facts = {**facts, "work_queue_wait": queue, "as_measured": {"status": raw[0], "why": raw[1],
                                                                 **{k: raw[2].get(k) for k in ("early", "late",
                                                                                               "mean_gain",
                                                                                               "mean_ratio")}}}
    return status, why, facts


def _judge_backoff(by_retry: dict[int, list[float]], jobs: int, base: float, cap: float,
                   poll: float | None = None) -> tuple[str, str, dict[str, Any]]:
    judged = sorted(k for k, ds in by_retry.items() if len(ds) >= MIN_SAMPLES)
    facts: dict[str, Any] = {"samples_per_retry": {str(k): len(by_retry[k]) for k in sorted(by_retry)}}
    if jobs < MIN_JOBS or len(judged) < 2:
        return UNKNOWN, (f"too few delays to judge growth: {jobs} jobs retried, {len(judged)} retry numbers with "
                         f"≥ {MIN_SAMPLES} delays (need {MIN_JOBS} jobs and 2 retry numbers)"), facts
    half = len(judged) // 2
    early_ks, late_ks = judged[:half], judged[-half:]
    early = [d for k in early_ks for d in by_retry[k]]
    late = [d for k in late_ks for d in by_retry[k]]

    # The growth full jitter promises between these retry numbers under the declared base and cap: the gain of
    # the mean delay (half the gain of the ceilings), under whichever reading of n (k - 1 or k) promises less.
    def gain(offset: int) -> float:
        def ceiling(k: int) -> float:
            return min(cap, base * 2.0 ** min(k - 1 + offset, 60))
        return (mean(ceiling(k) for k in late_ks) - mean(ceiling(k) for k in early_ks)) / 2

    promised = min(gain(0), gain(1))
    facts.update({"early_retries": early_ks, "late_retries": late_ks, "promised_mean_gain": round(promised, 3),
                  "early": {"mean": round(mean(early), 3), "max": round(max(early), 3)},
                  "late": {"mean": round(mean(late), 3), "max": round(max(late), 3)}})
    if promised < base / 2:
        return UNKNOWN, (f"the declared cap {cap}s over base {base}s leaves no room to see growth between retries "
                         f"{early_ks} and {late_ks}"), facts

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else (float("inf") if a > 0 else 1.0)

    r_mean = ratio(mean(late), mean(early))
    gain_mean = mean(late) - mean(early)
    facts.update({"mean_ratio": round(r_mean, 2), "mean_gain": round(gain_mean, 3)})

    def width(k: int) -> float:
        return max(by_retry[k]) - min(by_retry[k])

    measured_noise = mean(width(k) for k in early_ks)
    noise = max(measured_noise, poll or 0.0)
    spreads = {}
    for k in late_ks:
        ceiling = min(cap, base * 2 ** min(k - 1, 60))  # the lower reading of n (k - 1 or k)
        spreads[str(k)] = round(max(0.0, width(k) - noise) / ceiling, 2) if ceiling > 0 else 0.0
    facts.update({"late_spread": spreads, "late_width": {str(k): round(width(k), 3) for k in late_ks},
                  "scheduling_noise": {"measured_at_early_retries": round(measured_noise, 3),
                                       "declared_retry_poll_seconds": poll, "discounted": round(noise, 3)}})
    # Scheduling noise beyond what full jitter can spread at the early retry numbers (the higher reading of their
    # ceilings): as large as the gain promised, it alone can hide the growth (early retries that queued together).
    unexplained = measured_noise - mean(min(cap, base * 2.0 ** min(k, 60)) for k in early_ks)
    facts["scheduling_noise"]["beyond_early_jitter"] = round(unexplained, 3)
    if (r_mean < GROWTH_FLAT or gain_mean < promised * FLAT_SHARE) and unexplained >= promised:
        facts["noise_hides_growth"] = True
        return UNKNOWN, (f"growth cannot be judged: the delays of retries {early_ks} spread {measured_noise:.3f}s, "
                         f"{unexplained:.3f}s beyond what full jitter spreads there, as much as the {promised:.3f}s "
                         f"gain full jitter promises (mean {mean(early):.3f}s at {early_ks}, {mean(late):.3f}s at "
                         f"{late_ks}): scheduling noise, such as early retries queued together, can hide it"), facts
    if r_mean < GROWTH_FLAT or gain_mean < promised * FLAT_SHARE:
        return INVALID, (f"delays do not grow: mean {mean(early):.3f}s at retries {early_ks}, {mean(late):.3f}s at "
                         f"{late_ks} (gain {gain_mean:.3f}s, ratio {r_mean:.2f}; full jitter under the declared "
                         f"base and cap promises a gain of {promised:.3f}s): a zero or fixed delay"), facts
    grows = r_mean >= GROWTH_CLEAR and gain_mean >= promised * CLEAR_SHARE
    if mean(spreads.values()) < SPREAD_FLAT:
        return INVALID, (f"no jitter: the delays of each late retry number are alike across jobs beyond the "
                         f"{noise:.3f}s that scheduling alone explains (spread beyond it, as a share of the "
                         f"ceiling: {spreads}; full jitter draws each from [0, ceiling])"), facts
    jittered = max(spreads.values()) >= SPREAD_JITTER
    if not grows:
        return UNKNOWN, (f"growth not clear: mean gain {gain_mean:.3f}s (ratio {r_mean:.2f}) between retries "
                         f"{early_ks} and {late_ks}; clear from {promised * CLEAR_SHARE:.3f}s, flat below "
                         f"{promised * FLAT_SHARE:.3f}s"), facts
    if not jittered:
        return UNKNOWN, (f"spread not clear at retries {late_ks}: {spreads} beyond {noise:.3f}s of scheduling "
                         f"noise (need {SPREAD_JITTER} of the ceiling)"), facts
    return VALID, (f"delays grow (mean +{gain_mean:.3f}s, ×{r_mean:.2f} from retries {early_ks} to {late_ks}) and "
                   f"spread across jobs ({spreads})"), facts


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    scenario = run.get("scenario") or {}
    asked = NAME in (scenario.get("checks") or [])
    seed = seed_of(run)

    def not_judged(reason: str, facts: Iterable[dict[str, Any]] = ()) -> Verdict:
        return undecided(NAME, REQUIREMENTS, reason, asked, seed, facts)

    if missing_timings(run, "max_attempts"):
        return not_judged("the adapter declares no max_attempts")
    max_attempts = int(declared_timing(run, "max_attempts"))
    accepted = accepted_attachments(history)
    arms = _exhausting_arms(history, len(accepted), max_attempts)
    if not arms:
        return not_judged("no transient fault outlasting the retry budget was armed (failpoint error on every hit)")
    if not final_read_ok(final):
        return not_judged("final state could not be read")
    if not accepted:
        return not_judged("no upload was accepted")
    arm_t, lift_t, lifted_by = _fault_window(history, arms)
    cut_short = _interruptions(history, arms, lift_t)
    bound = budget_seconds(run, max_attempts)
    held = None if lift_t is None else round(lift_t - arm_t, 1)
    problems, unjudged, failed_ok = [], [], []
    by_retry: dict[int, list[float]] = {}
    waits_by_retry: dict[int, list[float | None]] = {}  # the work-queue wait the harness saw, per delay
    queue_waits = work_queue_waits(history, run)
    retried_jobs = 0
    per_job: dict[str, list[tuple[int, float]]] = {}
    attachments = final.get("attachments") or {}
    seen_at = _observed_terminal(history)
    for attachment_id in sorted(accepted):
        acceptance = accepted[attachment_id]["ok"]
        record = attachments.get(attachment_id) or {}
        body = record.get("body") or {}
        ended = seen_at.get(attachment_id)
        if ended is not None and ended < arm_t:
            continue  # finished before the fault was armed: not affected
        trans = transitions_of(history, final, attachment_id)
        replays = len(operator_replays(history, attachment_id))
        budget = max_attempts * (1 + replays)
        state, attempt, code = body.get("state"), body.get("attempt"), body.get("error_code")
        samples = retry_samples(trans)
        delays = [(k, d) for k, d, _ in samples]
        if delays:
            retried_jobs += 1
            per_job[attachment_id] = delays
        for k, d, next_attempt in samples:
            by_retry.setdefault(k, []).append(d)
            waits_by_retry.setdefault(k, []).append(queue_waits.get((attachment_id, next_attempt)))
        claims = sorted({t["attempt"] for t in trans if t["to"] == "processing" and isinstance(t["attempt"], int)})
        where: dict[str, Any] = {"attachment_id": attachment_id, "job_id": acceptance.get("job_id")}
        late = lift_t is not None and (ended is None or ended > lift_t)
        if len(claims) > budget or (isinstance(attempt, int) and attempt > budget):
            problems.append(evidence(f"claimed for {len(claims)} attempts (attempt {attempt}), beyond the budget of "
                                     f"{budget}: retried without end", attempts=claims[-10:], state=state, **where))
        elif not body:
            unjudged.append(evidence("final state not read", **where))
        elif state not in ("ready", "failed"):
            problems.append(evidence(f"not terminal after draining ({state!r}, attempt {attempt}): stuck",
                                     state=state, attempt=attempt, **where))
        elif state == "ready" and late:
            if bound is not None and held is not None and held >= bound and not cut_short:
                problems.append(evidence(f"not terminal after {held}s of a transient error on every attempt (a whole "
                                         f"budget takes at most {bound:.1f}s): stuck or waiting instead of spending "
                                         "attempts; ready only once the fault was lifted", attempt=attempt, **where))
            else:
                unjudged.append(evidence(f"ready only after the fault was lifted ({lifted_by}, after {held}s)",
                                         attempt=attempt, **where))
        elif state == "ready":
            if cut_short:
                unjudged.append(evidence("ready after the armed failpoint may have been lost (its role exited or "
                                         "was disarmed)", **where))
            else:
                problems.append(evidence("ready although every attempt met the armed transient error", state=state,
                                         attempt=attempt, **where))
        elif not code:
            problems.append(evidence("failed without an error_code", attempt=attempt, **where))
        elif not isinstance(attempt, int) or attempt != budget:
            problems.append(evidence(f"failed at attempt {attempt}, not at max_attempts {max_attempts}"
                                     + (f" × {1 + replays} budgets" if replays else "")
                                     + (": attempts not spent" if isinstance(attempt, int) and attempt < budget
                                        else ""), attempt=attempt, error_code=code, **where))
        else:
            failed_ok.append(attachment_id)
    facts = [evidence(f"{len(failed_ok)} of {len(accepted)} jobs failed at attempt {max_attempts} with an "
                      "error_code", attachments=failed_ok[:20], armed=[{"role": a.get("role"), "window":
                                                                       a.get("window"), "spec": a.get("spec"),
                                                                       "line": a.get("line")} for a in arms])]
    facts.append(evidence(f"fault held {held}s (lifted by {lifted_by}); a whole budget takes at most "
                          f"{bound if bound is None else round(bound, 1)}s"))
    if cut_short:
        facts.append(evidence("the armed failpoint may have been lost while it should hold (disarm or exit of its "
                              "role)", events=cut_short[:3]))
    # Backoff, from the events.
    lacking = missing_timings(run, "retry_base_seconds", "retry_cap_seconds")
    backoff: tuple[str, str, dict[str, Any]]
    if lacking:
        backoff = (UNKNOWN, "the adapter declares no " + " / ".join(lacking) + ": backoff growth cannot be scaled",
                   {})
    elif not by_retry:
        backoff = (UNKNOWN, "no retry delay observed (no processing → queued → processing in the events)", {})
    else:
        backoff = judge_backoff(by_retry, retried_jobs, declared_timing(run, "retry_base_seconds"),
                                declared_timing(run, "retry_cap_seconds"), timing(run, "retry_poll_seconds"),
                                waits_by_retry)
    b_status, b_why, b_facts = backoff
    shown: list[dict[str, Any]] = []  # per-job delays shown with a backoff violation
    facts.append(evidence(f"backoff: {b_why}", delays={str(k): v[:20] for k, v in sorted(by_retry.items())},
                          **b_facts))
    if b_status == INVALID:
        problems.append(evidence(f"backoff: {b_why}", **b_facts))
        for attachment_id, delays in list(per_job.items())[:4]:
            shown.append(evidence("its retry delays (retry number, seconds from requeue to the next claim)",
                                     attachment_id=attachment_id, job_id=accepted[attachment_id]["ok"].get("job_id"),
                                     delays=delays))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} violations: " + problems[0]["message"],
                       evidence=problems[:40] + shown + facts, seed=seed)
    if unjudged:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unjudged)} jobs could not be judged",
                       evidence=unjudged[:20] + facts, seed=seed)
    if not failed_ok:
        return not_judged("no accepted job was affected by the fault", facts)
    if b_status != VALID:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"exhaustion valid; backoff cannot be judged: {b_why}",
                       evidence=facts, seed=seed)
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(failed_ok)} jobs failed at attempt {max_attempts} with an error_code; {b_why}",
                   evidence=facts, seed=seed)


def _observed_terminal(history: History) -> dict[str, float]:
    """attachment_id -> the run time the harness first saw it ready or failed."""
    out: dict[str, float] = {}
    for e in history.of_type("transition"):
        if e.get("to") in ("ready", "failed") and e.get("attachment_id") and e.get("t") is not None:
            out.setdefault(e["attachment_id"], e["t"])
    return out
