"""Invariant 4 — bounded retries (BE-JOB-003).

Attempts never exceed the adapter's max_attempts — per attempt budget: an operator
replay (one the harness asked for) starts a new budget, so an attachment replayed r
times may reach max_attempts × (1 + r); poison input reaches a
terminal, observable state (``failed`` with an error_code); the work queue is
empty after draining and no job is delivered without end. Retry delays beyond the
declared cap are noted, not judged: queue wait and load look the same.
"""

from __future__ import annotations

from collections import Counter

from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, final_read_ok, missing_timings,
                   operator_replays, seed_of, timing, transitions_of, FinalState, RunInfo, declared_timing)

NAME = "bounded_retries"
REQUIREMENTS = ["BE-JOB-003"]
TIMINGS = ("max_attempts",)
TIMINGS_IN_EVERY_SCENARIO = True  # runs, and needs its timing, in every scenario


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
    lacking = missing_timings(run, "max_attempts")
    if lacking:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "the adapter declares no max_attempts: the retry bound cannot be "
                       "checked", seed=seed_of(run))
    max_attempts = int(declared_timing(run, "max_attempts"))
    problems, retry_delays = [], []
    accepted = accepted_attachments(history)
    faults = len([e for e in history.of_type("fault") if e.get("phase") in ("start", "hit")])
    replays = len([e for e in history.of_type("ok") if e.get("f") == "replay"])
    for attachment_id, record in sorted(final.get("attachments", {}).items()):
        body = record.get("body") or {}
        attempt = body.get("attempt")
        replayed = len(operator_replays(history, attachment_id))
        bound = max_attempts * (1 + replayed)  # an operator replay runs a new attempt budget (as the reference does)
        if isinstance(attempt, int) and attempt > bound:
            problems.append(evidence(f"attempt {attempt} exceeds max_attempts {max_attempts}"
                                     + (f" × {1 + replayed} budgets ({replayed} replays)" if replayed else ""),
                                     attachment_id=attachment_id))
        trans = transitions_of(history, final, attachment_id)
        for t in trans:
            if isinstance(t["attempt"], int) and t["attempt"] > bound:
                problems.append(evidence(f"transition with attempt {t['attempt']} > max_attempts {max_attempts}"
                                         + (f" × {1 + replayed} budgets" if replayed else ""),
                                         attachment_id=attachment_id, seq=t["seq"], at=t["at_text"]))
                break
        for prev, nxt in zip(trans, trans[1:]):
            if prev["to"] == "queued" and prev["from"] == "processing" and nxt["to"] == "processing":
                if prev["at"] is not None and nxt["at"] is not None:
                    retry_delays.append(round(nxt["at"] - prev["at"], 3))
        invoke = accepted.get(attachment_id, {}).get("invoke") or {}
        if invoke.get("kind") == "poison" and body.get("state") not in ("failed", "ready"):
            problems.append(evidence(f"poison input not terminal: {body.get('state')!r}", attachment_id=attachment_id,
                                     events=[invoke]))
        if body.get("state") == "failed" and not body.get("error_code"):
            problems.append(evidence("failed without an observable error_code", attachment_id=attachment_id))
    per_job = Counter(
        (e.get("body") or {}).get("job_id") for e in history.of_type("message") if isinstance(e.get("body"), dict))
    per_job.pop(None, None)
    bound = 2 * max_attempts + faults + replays + 2
    for job_id, count in per_job.items():
        if count > bound:
            problems.append(evidence(f"job delivered {count} times (bound {bound}): endless redelivery loop",
                                     job_id=job_id))
    work = (final.get("queues") or {}).get("work") or {}
    if work and (work.get("ready") or 0) + (work.get("unacked") or 0) > 0:
        problems.append(evidence("work queue not empty after draining", queue=work))
    cap, lease = timing(run, "retry_cap_seconds"), timing(run, "lease_seconds")
    notes = []
    if cap is None or lease is None:
        notes.append(evidence("retry delays not compared with a cap: the adapter declares no "
                              + " / ".join(missing_timings(run, "retry_cap_seconds", "lease_seconds"))))
    else:
        # Noted, never a violation: the seed asks for finite retries with backoff, not for a deadline, and a late
        # claim cannot be told apart from queue wait behind a backlog or a loaded machine.
        slow = [d for d in retry_delays if d > cap + max(5.0, lease * 2)]
        if slow:
            notes.append(evidence(f"retry delays beyond the cap {cap}s plus slack (queue wait or load)", delays=slow))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} retry bounds violated", evidence=problems,
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"attempts ≤ {max_attempts}, queue drained, {len(retry_delays)} retries observed",
                   exercised=bool(final.get("attachments")),
                   evidence=([{"message": "retry delays (s)", "delays": retry_delays[:50]}] if retry_delays else [])
                   + notes,
                   seed=seed_of(run))
