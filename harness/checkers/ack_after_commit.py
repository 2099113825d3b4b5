"""Invariant 5 — ack after commit (BE-JOB-001).

A consumer that dies before committing its result must see the job redelivered:
the broker still holds the unacked message, so redelivery alone — without
lease recovery — brings the job to a terminal state. Scenarios that probe this
keep every role that recovers work (the adapter's ``recovers_work`` roles)
stopped for a while after the crash, so an implementation that acked early is
left with a job stuck in ``processing`` and an empty queue: that is the evidence.
Consumers are the adapter's ``consumer`` roles; a lease recovery is any
``processing → queued`` after the crash (whatever its actor or reason says).
"""

from __future__ import annotations

from typing import Any, Iterable

from ..history import History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, consumer_roles, evidence, missing_timings,
                   recovering_roles, role_kind, seed_of, timing, transitions_of, FinalState, RunInfo)

NAME = "ack_after_commit"
REQUIREMENTS = ["BE-JOB-001"]
TIMINGS = ("lease_seconds",)  # unknown without it where it is asked (a consumer crash)
PROVES = ("ack_vs_commit",)


def consumer_crashes(history: History, consumers: frozenset[str]) -> list[dict[str, Any]]:
    """Faults that killed a consumer without cleanup: failpoint crashes seen to hit, and SIGKILLs."""
    out = []
    for e in history.of_type("fault"):
        if role_kind(e.get("role")) not in consumers:
            continue
        if (e.get("action") == "crash" and e.get("phase") == "hit") or (e.get("action") == "sigkill" and e.get("phase") == "start"):
            out.append(e)
    return out


def hold_intervals(history: History, roles: frozenset[str]) -> list[tuple[float, float | None, dict[str, Any]]]:
    """(start wall, end wall or None, start event) for every phase that kept all of ``roles`` stopped."""
    out, open_ = [], None
    for e in history.of_type("phase"):
        if not roles or not roles <= set(e.get("roles") or []):
            continue
        if e.get("name") == "hold_start":
            open_ = e
        elif e.get("name") == "hold_end" and open_ is not None:
            out.append((open_["wall"], e["wall"], open_))
            open_ = None
    if open_ is not None:
        out.append((open_["wall"], None, open_))
    return out


def in_flight_at(trans: list[dict[str, Any]], wall: float) -> dict[str, Any] | None:
    """The →processing transition that was current at ``wall`` (None if the job was not being processed)."""
    current = None
    for t in trans:
        if t["at"] is None or t["at"] > wall:
            break
        current = t
    return current if current and current["to"] == "processing" else None


def is_lease_recovery(t: dict[str, Any]) -> bool:
    """After a consumer crash, a job it held can only go back to queued by recovery (never by its dead owner)."""
    return (t.get("from"), t.get("to")) == ("processing", "queued")


def others_in_flight(history: History, final: FinalState, attachment_ids: Iterable[str], target: str,
                     wall: float) -> int:
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


def consumers_running_at(history: History, consumers: frozenset[str], wall: float) -> list[str]:
    """Instances of consumer roles that were running at ``wall``, from the supervisor's start and exit lines."""
    state: dict[str, bool] = {}
    for e in history.of_type("role"):
        if e["wall"] > wall:
            break
        if role_kind(e.get("role")) in consumers and e.get("action") in ("start", "exit"):
            state[e["role"]] = e["action"] == "start"
    return sorted(name for name, up in state.items() if up)


def job_ids_of(history: History, attachment_id: str) -> set[str]:
    """The job ids the run saw for an attachment: from the 202 and from the tapped messages."""
    ids: set[str] = {e["job_id"] for e in history.of_type("ok")
                     if e.get("attachment_id") == attachment_id and e.get("job_id")}
    for m in history.of_type("message"):
        body: dict[str, Any] = m["body"] if isinstance(m.get("body"), dict) else {}
        if body.get("attachment_id") == attachment_id and body.get("job_id"):
            ids.add(body["job_id"])
    return ids


def deliveries_traced_before(history: History, wall: float) -> bool:
    """Whether every delivery from the work queue was traced (firehose) from before ``wall`` on: tracing was on
    before it, and no broker restart turned it off after it (trace_gaps)."""
    from .delivery_accounting import trace_gaps

    if any(end is None or end > wall for _, end in trace_gaps(history)):
        return False
    return any(e.get("source") == "firehose" and e.get("deliveries") and e["wall"] <= wall
               for e in history.of_type("observe"))


def crashed_attempt(history: History, job_ids: set[str], crash_line: int) -> Any:
    """The attempt of the delivery in flight at the crash: the job's last traced delivery before it, else the last
    message of the job the tap saw published before it (None when neither says)."""
    before = [d for d in history.of_type("delivery") if d.get("job_id") in job_ids and d["line"] < crash_line]
    if before:
        return before[-1].get("attempt")
    published = [m for m in history.of_type("message") if m["line"] < crash_line
                 and isinstance(m.get("body"), dict) and m["body"].get("job_id") in job_ids]
    return published[-1]["body"].get("attempt") if published else None


def same_delivery(item: dict[str, Any], job_ids: set[str], attachment_id: str, attempt: Any) -> bool:
    """A message or delivery that is the crashed one given back: same job, same attempt, redelivered set."""
    if item.get("job_id") not in job_ids and item.get("attachment_id") != attachment_id:
        return False
    if attempt is not None and item.get("attempt") is not None and item.get("attempt") != attempt:
        return False
    return item.get("redelivered") is None or bool(item.get("redelivered"))


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    consumers, recovering = consumer_roles(run), recovering_roles(run)
    crashes = consumer_crashes(history, consumers)
    if crashes and missing_timings(run, "lease_seconds"):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "consumer crashed, but the adapter declares no lease_seconds: "
                       "cannot tell redelivery from lease recovery", seed=seed_of(run))
    lease = timing(run, "lease_seconds") or 0.0
    checks = (run.get("scenario") or {}).get("check_options") or {}
    deadline_after = float(checks.get("redelivery_deadline_seconds", lease * 2 + 8))
    # RabbitMQ's management API refreshes queue counts every few seconds: ignore samples taken before that.
    stats_lag = float(checks.get("queue_stats_lag_seconds", 5.5))
    holds = hold_intervals(history, recovering)
    attachment_ids = sorted(set((final or {}).get("attachments", {})) |
                            {e["attachment_id"] for e in history.of_type("transition") if e.get("attachment_id")})
    problems, proven, notes, unknowns = [], [], [], []
    for crash in crashes:
        crash_wall = crash["wall"]
        hold = next((h for h in holds if h[0] <= crash_wall and (h[1] is None or h[1] > crash_wall)), None)
        if recovering and hold is None:
            notes.append(f"crash at line {crash['line']} not probed: {', '.join(sorted(recovering))} kept running "
                         "(lease recovery could mask a lost delivery)")
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
            recovered = next((t for t in later if is_lease_recovery(t)), None)
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
            base: dict[str, Any] = dict(attachment_id=attachment_id, events=[crash], crash_wall=crash_wall,
                        processing_since=flight["at_text"], attempt=flight["attempt"],
                        deadline_seconds=round(deadline - crash_wall, 2), queue_samples=samples)
            all_peeks = [q for q in history.of_type("queue")
                         if q.get("kind") == "peek" and crash_wall <= q["wall"] <= deadline]
            # A look counts only while every consumer instance was down: a running one (a second instance, say)
            # takes the returned delivery at once, and an empty queue then proves nothing.
            down = [q for q in all_peeks if not (q.get("running") if "running" in q
                                                 else consumers_running_at(history, consumers, q["wall"]))]
            peeks = [q for q in down if "messages" in q]  # looks that listed the queue's messages
            job_ids = job_ids_of(history, attachment_id)
            attempt = crashed_attempt(history, job_ids, crash["line"])
            base["crashed_attempt"] = attempt
            seen_in = [q for q in peeks if any(same_delivery(m, job_ids, attachment_id, attempt)
                                               for m in q.get("messages") or [])]
            first_look = (all_peeks[0]["wall"] if all_peeks else None)
            if first_look and terminal and terminal["at"] is not None and terminal["at"] <= first_look:
                # The fault line is written just before the signal lands: a job may commit (and ack) in between.
                # Finished before the first look, it had no delivery left to return (as batch_independence reads it).
                notes.append(f"{attachment_id}: reached {terminal['to']} before the first look into the work queue "
                             "(committed before the kill landed)")
                continue
            exact = [{"t": q["t"], "ready": q.get("ready"), "consumers": q.get("consumers")} for q in down
                     if "messages" not in q][:6]
            if exact:
                base["exact_counts_while_every_consumer_was_down"] = exact
            if deliveries_traced_before(history, crash_wall):
                again = next((d for d in history.of_type("delivery") if d["line"] > crash["line"]
                              and d.get("job_id") in job_ids and bool(d.get("redelivered"))
                              and (attempt is None or d.get("attempt") == attempt)), None)
                if again is not None:
                    proven.append(evidence(
                        f"the broker redelivered the crashed delivery: job {again.get('job_id')} attempt "
                        f"{again.get('attempt')} handed out again with redelivered set", **dict(
                            base, job_id=again.get("job_id"), events=[crash] + down[:1] + [again])))
                elif terminal and (recovered is None or recovered["seq"] > terminal["seq"]):
                    notes.append(f"{attachment_id}: reached {terminal['to']} with no redelivery and no lease "
                                 "recovery (it was committed before the kill landed)")
                else:
                    problems.append(evidence(
                        f"consumer died before commit and its delivery was gone: every delivery from the work queue "
                        f"was traced, and the job's attempt-{attempt} delivery was never redelivered (no delivery "
                        "with redelivered set) — it was acked before its effect was durable; "
                        + ("lease recovery brought the job back" if recovered else "the job never finished"),
                        **dict(base, events=[crash] + down[:2])))
                continue
            if peeks:
                peek_evidence: dict[str, Any] = dict(base, events=[crash] + peeks[:3],
                                     peeked=[{"t": q["t"], "jobs": [m.get("job_id") for m in q.get("messages") or []],
                                              "attempts": [m.get("attempt") for m in q.get("messages") or []]}
                                             for q in peeks[:5]])
                if seen_in:
                    proven.append(evidence("the broker returned the unacked delivery: its message was back in the "
                                           "work queue while the consumer was down", **dict(peek_evidence,
                                                                                            events=[crash, seen_in[0]])))
                else:
                    problems.append(evidence(
                        f"consumer died before commit and its delivery was gone: {len(peeks)} looks into the work "
                        "queue while every consumer instance was down did not find the job's message of the crashed "
                        f"attempt ({attempt}) given back (redelivered) — it was acked before its effect was durable",
                        **peek_evidence))
                continue
            retained = [q for q in samples_full if q["depth"] > others_in_flight(history, final, attachment_ids,
                                                                                  attachment_id, q["wall"])]
            if terminal and terminal["at"] is not None and terminal["at"] <= deadline and (
                    recovered is None or recovered["seq"] > terminal["seq"]):
                proven.append(evidence("redelivered after the crash and finished without lease recovery",
                                       reached=terminal["to"], at=terminal["at_text"], **base))
            elif recovered and recovered["at"] is not None and recovered["at"] <= deadline:
                notes.append(f"{attachment_id}: recovered by lease recovery inside the probe window")
            elif retained:
                proven.append(evidence("the broker kept the unacked delivery after the crash (queue depth above the "
                                       "other jobs in flight) until lease recovery", **base))
            elif not samples_full:
                unknowns.append(evidence("no queue samples after the crash to tell whether the delivery survived",
                                         **base))
            else:
                problems.append(evidence(
                    "consumer died before commit and the delivery did not survive: the job stayed "
                    f"'processing' for {deadline - crash_wall:.1f}s with lease recovery held and the work queue "
                    "held nothing for it — the message was acked before its effect was durable", **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} jobs lost their delivery at a consumer crash",
                       evidence=problems, seed=seed_of(run))
    if unknowns:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unknowns)} crashed deliveries could not be judged",
                       evidence=unknowns, seed=seed_of(run))
    if proven:
        # Each proven job compared the ack with the commit: a consumer died before its commit and the broker was
        # seen to keep (or hand out again) its delivery (checklist row BE-JOB-001.3).
        return Verdict(NAME, VALID, REQUIREMENTS, f"{len(proven)} in-flight jobs redelivered after consumer crashes",
                       evidence=proven, seed=seed_of(run), proves=["ack_vs_commit"])
    return Verdict(NAME, VALID, REQUIREMENTS, "no consumer crash while a job was in flight; not exercised",
                   exercised=False, evidence=[{"message": n} for n in notes], seed=seed_of(run))
