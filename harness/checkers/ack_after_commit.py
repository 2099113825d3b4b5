"""Invariant 5 — ack after commit (BE-JOB-001).

A consumer that dies before committing its result must see the job redelivered:
the broker still holds the unacked message, so redelivery alone — without
lease recovery by a sweeper — brings the job to a terminal state. Scenarios
that probe this keep the sweeper stopped (a ``hold`` phase) for a while after
the crash, so an implementation that acked early is left with a job stuck in
``processing`` and an empty queue: that is the evidence.
"""

from __future__ import annotations

from .base import (CONSUMER_ROLES, INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, evidence, seed_of, timings_of,
                   transitions_of)

NAME = "ack_after_commit"
REQUIREMENTS = ["BE-JOB-001"]


def role_kind(role: str | None) -> str:
    return (role or "").split("#", 1)[0]


def consumer_crashes(history) -> list[dict]:
    """Faults that killed a consumer without cleanup: failpoint crashes seen to hit, and SIGKILLs."""
    out = []
    for e in history.of_type("fault"):
        if role_kind(e.get("role")) not in CONSUMER_ROLES:
            continue
        if (e.get("action") == "crash" and e.get("phase") == "hit") or (e.get("action") == "sigkill" and e.get("phase") == "start"):
            out.append(e)
    return out


def hold_intervals(history, role: str) -> list[tuple[float, float | None, dict]]:
    """(start wall, end wall or None, start event) for every phase that kept ``role`` stopped."""
    out, open_ = [], {}
    for e in history.of_type("phase"):
        if role not in (e.get("roles") or []):
            continue
        if e.get("name") == "hold_start":
            open_[role] = e
        elif e.get("name") == "hold_end" and role in open_:
            start = open_.pop(role)
            out.append((start["wall"], e["wall"], start))
    for start in open_.values():
        out.append((start["wall"], None, start))
    return out


def in_flight_at(trans: list[dict], wall: float) -> dict | None:
    """The →processing transition that was current at ``wall`` (None if the job was not being processed)."""
    current = None
    for t in trans:
        if t["at"] is None or t["at"] > wall:
            break
        current = t
    return current if current and current["to"] == "processing" else None


def is_lease_recovery(t: dict) -> bool:
    return "sweep" in (t.get("actor") or "") or "lease" in (t.get("reason") or "")


def others_in_flight(history, final, attachment_ids, target: str, wall: float) -> int:
    """How many other attachments were queued or processing at ``wall`` (their messages explain queue depth)."""
    count = 0
    for attachment_id in attachment_ids:
        if attachment_id == target:
            continue
        trans = [t for t in transitions_of(history, final or {}, attachment_id) if t["at"] is not None]
        current = None
        for t in trans:
            if t["at"] > wall:
                break
            current = t["to"]
        if current in ("queued", "processing"):
            count += 1
    return count


def check(history, final, run) -> Verdict:
    timings = timings_of(run)
    lease = float(timings.get("lease_seconds", 30))
    checks = (run.get("scenario") or {}).get("check_options") or {}
    deadline_after = float(checks.get("redelivery_deadline_seconds", lease * 2 + 8))
    # RabbitMQ's management API refreshes queue counts every few seconds: ignore samples taken before that.
    stats_lag = float(checks.get("queue_stats_lag_seconds", 5.5))
    has_sweeper = "sweeper" in (run.get("adapter", {}).get("roles") or {"sweeper": 1})
    holds = hold_intervals(history, "sweeper")
    crashes = consumer_crashes(history)
    attachment_ids = sorted(set((final or {}).get("attachments", {})) |
                            {e["attachment_id"] for e in history.of_type("transition") if e.get("attachment_id")})
    problems, proven, notes, unknowns = [], [], [], []
    for crash in crashes:
        crash_wall = crash["wall"]
        hold = next((h for h in holds if h[0] <= crash_wall and (h[1] is None or h[1] > crash_wall)), None)
        if has_sweeper and hold is None:
            notes.append(f"crash at line {crash['line']} not probed: sweeper was running (lease recovery could mask)")
            continue
        deadline = crash_wall + deadline_after
        if hold and hold[1] is not None:
            deadline = min(deadline, hold[1])
        for attachment_id in attachment_ids:
            trans = transitions_of(history, final or {}, attachment_id)
            flight = in_flight_at(trans, crash_wall)
            if flight is None:
                continue
            later = [t for t in trans if t["seq"] is not None and flight["seq"] is not None and t["seq"] > flight["seq"]]
            terminal = next((t for t in later if t["to"] in TERMINAL_STATES), None)
            recovered_by_sweeper = next((t for t in later if is_lease_recovery(t)), None)
            samples = [
                {"t": q["t"], "queue": q.get("queue"), "ready": q.get("ready"), "unacked": q.get("unacked")}
                for q in history.of_type("queue")
                if crash_wall <= q["wall"] <= deadline and not q.get("dead_letter")
            ][:12]
            samples_full = [
                {"wall": q["wall"], "depth": (q.get("ready") or 0) + (q.get("unacked") or 0)}
                for q in history.of_type("queue")
                if crash_wall + stats_lag <= q["wall"] <= deadline and not q.get("dead_letter")
            ]
            base = dict(attachment_id=attachment_id, events=[crash], crash_wall=crash_wall,
                        processing_since=flight["at_text"], attempt=flight["attempt"],
                        deadline_seconds=round(deadline - crash_wall, 2), queue_samples=samples)
            peeks = [q for q in history.of_type("queue")
                     if q.get("kind") == "peek" and crash_wall <= q["wall"] <= deadline]
            seen_in = [q for q in peeks if any(m.get("attachment_id") == attachment_id for m in q.get("messages") or [])]
            if peeks:
                peek_evidence = dict(base, events=[crash] + peeks[:3],
                                     peeked=[{"t": q["t"], "jobs": [m.get("job_id") for m in q.get("messages") or []]}
                                             for q in peeks[:5]])
                if seen_in:
                    proven.append(evidence("the broker returned the unacked delivery: its message was back in the "
                                           "work queue while the consumer was down", **dict(peek_evidence,
                                                                                            events=[crash, seen_in[0]])))
                else:
                    problems.append(evidence(
                        f"consumer died before commit and its delivery was gone: {len(peeks)} looks into the work "
                        "queue while the consumer was down did not find the job's message — it was acked before "
                        "its effect was durable", **peek_evidence))
                continue
            retained = [q for q in samples_full if q["depth"] > others_in_flight(history, final, attachment_ids,
                                                                                  attachment_id, q["wall"])]
            if terminal and terminal["at"] is not None and terminal["at"] <= deadline and (
                    recovered_by_sweeper is None or recovered_by_sweeper["seq"] > terminal["seq"]):
                proven.append(evidence("redelivered after the crash and finished without lease recovery",
                                       reached=terminal["to"], at=terminal["at_text"], **base))
            elif recovered_by_sweeper and recovered_by_sweeper["at"] is not None and recovered_by_sweeper["at"] <= deadline:
                notes.append(f"{attachment_id}: recovered by the sweeper inside the probe window")
            elif retained:
                proven.append(evidence("the broker kept the unacked delivery after the crash (queue depth above the "
                                       "other jobs in flight) until lease recovery", **base))
            elif not samples_full:
                unknowns.append(evidence("no queue samples after the crash to tell whether the delivery survived",
                                         **base))
            else:
                problems.append(evidence(
                    "consumer died before commit and the delivery did not survive: the job stayed "
                    f"'processing' for {deadline - crash_wall:.1f}s with the sweeper held and the work queue "
                    "held nothing for it — the message was acked before its effect was durable", **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} jobs lost their delivery at a consumer crash",
                       evidence=problems, seed=seed_of(run))
    if unknowns:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unknowns)} crashed deliveries could not be judged",
                       evidence=unknowns, seed=seed_of(run))
    if proven:
        return Verdict(NAME, VALID, REQUIREMENTS, f"{len(proven)} in-flight jobs redelivered after consumer crashes",
                       evidence=proven, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, "no consumer crash while a job was in flight; not exercised",
                   exercised=False, evidence=[{"message": n} for n in notes], seed=seed_of(run))
