"""Delivery accounting (BE-JOB-001, BE-JOB-003): what the broker handed out, and what it still held at the end.

Two facts read from the broker itself, whatever the topology:

* **No requeue loop.** The run traces every delivery from the work queue (the firehose's ``deliver.<queue>``:
  ``delivery`` lines with the message's ``job_id``, ``attempt`` and the broker's ``redelivered`` flag). One message
  handed out again and again with no new attempt — a nack with requeue in a loop — never ends by itself (CONTRACT §11,
  invariant 4: no endless redelivery loop). Per ``(job_id, attempt)`` (per body hash for a message without a job_id), the
  redeliveries (``redelivered`` set) may not exceed, per message published with that key,
  ``max_attempts + 1 + returning faults``: an implementation may give a delivery back at most once per attempt it
  could spend (a bounded, counted requeue, as the dead-letter check allows), plus one lost ack, plus one per event of
  the run that returns unacked deliveries by itself (a consumer instance exiting — crash, SIGKILL, a stop of the
  harness — a broker restart, a network fault). Without traced deliveries this part is not exercised.
* **Nothing left in the work queue.** After the drain and the final read, the runner waits (bounded) for the work
  queue to be empty with the consumers running, then stops every consumer instance — which returns any unacked
  delivery to ready — and counts the queue exactly (passive declare): a ``queue`` line of kind
  ``after_consumers_stopped``. Any message left is work the implementation neither finished nor isolated (or a
  delivery it never settled). A consumer still attached after the stop (a role the adapter does not flag as a
  consumer) hides its unacked deliveries from that count: ``unknown``.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, consumer_roles, evidence, not_proven, role_kind, seed_of,
                   timing, FinalState, RunInfo)

NAME = "delivery_accounting"
REQUIREMENTS = ["BE-JOB-001", "BE-JOB-003"]
TIMINGS = ("max_attempts",)
AFTER_STOP = "after_consumers_stopped"
# Fault lines that can give unacked deliveries back to the queue by themselves (a consumer's own exit is counted
# from its ``role`` exit line).
RETURNING_FAULTS = frozenset({"toxic", "restart_service", "sigkill", "sigstop", "crash", "kill_broker_node",
                              "partition_broker_node"})


def deliveries_traced(history: History) -> bool:
    return any(e.get("source") == "firehose" and e.get("deliveries") for e in history.of_type("observe"))


def trace_gaps(history: History) -> list[tuple[float, float | None]]:
    """(start wall, end wall or None) of each stretch the firehose was off: a broker restart turns it off until the
    tap turns it on again (its ``tracing_restored`` line). Deliveries in a gap were not traced."""
    gaps = []
    restored = [e["wall"] for e in history.of_type("observe") if e.get("tracing_restored")]
    for e in history.of_type("fault"):
        # A broker restart, or one node of a cluster killed: its firehose is per node and off once it is back.
        if (e.get("action") == "restart_service" and e.get("service") == "rabbitmq" or
                e.get("action") == "kill_broker_node") and e.get("phase") == "start":
            gaps.append((e["wall"], next((w for w in restored if w > e["wall"]), None)))
    return gaps


def key_of(item: dict[str, Any]) -> tuple[Any, ...]:
    if item.get("job_id"):
        return ("job", str(item["job_id"]), item.get("attempt"))
    return ("bytes", item.get("sha256"), None)


def returning_events(history: History, consumers: frozenset[str]) -> list[dict[str, Any]]:
    """Events of the run that may return unacked deliveries: consumer exits, broker or network faults."""
    out = [e for e in history.of_type("role") if e.get("action") == "exit" and role_kind(e.get("role")) in consumers]
    out += [e for e in history.of_type("fault")
            if e.get("action") in RETURNING_FAULTS and e.get("phase") in ("start", "hit", None)]
    return out


def published_per_key(history: History) -> dict[tuple[Any, ...], int]:
    """How many messages the tap saw published per (job_id, attempt): each may be handed out on its own."""
    counts: dict[tuple[Any, ...], int] = {}
    for m in history.of_type("message"):
        body: dict[str, Any] = m["body"] if isinstance(m.get("body"), dict) else {}
        if body.get("job_id"):
            k = ("job", str(body["job_id"]), body.get("attempt"))
            counts[k] = counts.get(k, 0) + 1
    return counts


def requeue_loops(history: History, run: RunInfo) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(problems, unknowns, facts) of the per-message delivery count."""
    deliveries = history.of_type("delivery")
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for d in deliveries:
        by_key.setdefault(key_of(d), []).append(d)
    returning = returning_events(history, consumer_roles(run))
    explained = len(returning)
    max_attempts = timing(run, "max_attempts")
    published = published_per_key(history)
    problems, unknowns = [], []
    worst = 0
    for k, items in by_key.items():
        again = [d for d in items if d.get("redelivered")]
        worst = max(worst, len(again))
        copies = max(1, published.get(k, 0))
        if len(again) <= copies * (1 + explained):
            continue  # explained by the faults alone: no allowance for the implementation's own requeues needed
        if max_attempts is None:
            unknowns.append(evidence(
                f"{len(again)} redeliveries of one message, more than the run's {explained} returning faults explain; "
                "the adapter declares no max_attempts to bound the implementation's own requeues",
                job_id=k[1] if k[0] == "job" else None, events=again[:3], attempt=k[2], redeliveries=len(again)))
            continue
        allowed = copies * (int(max_attempts) + 1 + explained)
        if len(again) > allowed:
            problems.append(evidence(
                f"requeue loop: the broker handed out the same message {len(items)} times ({len(again)} "
                f"redeliveries, no new attempt), beyond {allowed} = {copies} message(s) × (max_attempts "
                f"{int(max_attempts)} + 1 lost ack + {explained} events of the run that return deliveries)",
                job_id=k[1] if k[0] == "job" else None, events=again[:6], attempt=k[2],
                sha256=None if k[0] == "job" else k[1], deliveries=len(items), redeliveries=len(again),
                allowed=allowed, returning_events=[e.get("line") for e in returning][:20]))
    facts = {"messages": len(by_key), "deliveries": len(deliveries), "most_redeliveries": worst,
             "returning_events": explained, "trace_gaps": len(trace_gaps(history)) or None}
    return problems, unknowns, facts


def left_after_stop(history: History) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(problems, unknowns, proven) of the count taken once every consumer instance was stopped."""
    samples = [q for q in history.of_type("queue") if q.get("kind") == AFTER_STOP]
    if not samples:
        return [], [], []
    last = samples[-1]
    facts: dict[str, Any] = dict(events=[last], ready=last.get("ready"), consumers=last.get("consumers"),
                 stopped=last.get("stopped"), settle=last.get("settle"), left=last.get("messages"))
    if last.get("ready") is None:
        return [], [evidence("the work queue could not be counted after the consumers stopped", **facts)], []
    if int(last.get("ready") or 0) > 0:
        return [evidence(f"{last['ready']} message(s) left in the work queue once every consumer instance was "
                         "stopped (unacked deliveries return to ready at the stop): work neither finished, "
                         "isolated nor settled", **facts)], [], []
    if last.get("consumers"):
        return [], [evidence(f"{last['consumers']} consumer(s) still attached after every declared consumer "
                             "instance stopped: their unacked deliveries are not in the count", **facts)], []
    return [], [], [evidence("the work queue was empty once every consumer instance was stopped", **facts)]


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    problems, unknowns, proven = [], [], []
    traced = deliveries_traced(history)
    facts: dict[str, Any] = {}
    if traced:
        loops, loop_unknowns, facts = requeue_loops(history, run)
        problems += loops
        unknowns += loop_unknowns
        if facts["deliveries"] and not loops and not loop_unknowns:
            gaps = (f" (the trace was off for {facts['trace_gaps']} broker restart(s): a lower bound)"
                    if facts["trace_gaps"] else "")
            proven.append(evidence(f"{facts['deliveries']} deliveries of {facts['messages']} messages traced; at most "
                                   f"{facts['most_redeliveries']} redeliveries of one message{gaps}", **facts))
    left, left_unknowns, left_proven = left_after_stop(history)
    problems += left
    unknowns += left_unknowns
    proven += left_proven
    if problems:
        what = []
        if any("requeue loop" in p["message"] for p in problems):
            what.append("a message looped through the work queue with no new attempt")
        if left:
            what.append(f"{left[0].get('ready')} message(s) left in the work queue after the drain")
        return Verdict(NAME, INVALID, REQUIREMENTS, "; ".join(what), evidence=problems + unknowns, seed=seed_of(run))
    if unknowns:
        asked = NAME in ((run.get("scenario") or {}).get("checks") or [])
        status = UNKNOWN if asked or not proven else VALID
        if not proven:
            return not_proven(NAME, REQUIREMENTS, "delivery accounting", unknowns[0]["message"], run, unknowns)
        return Verdict(NAME, status, REQUIREMENTS, f"cannot tell: {unknowns[0]['message']}",
                       evidence=unknowns + proven, seed=seed_of(run))
    if not proven:
        why = "no delivery traced from the work queue (no firehose) and no count after the consumers stopped"
        if traced:
            why = "no delivery from the work queue was traced, and no count after the consumers stopped"
        return not_proven(NAME, REQUIREMENTS, "delivery accounting", why, run, [])
    parts = [p["message"] for p in proven]
    return Verdict(NAME, VALID, REQUIREMENTS, "; ".join(parts), evidence=proven, seed=seed_of(run))
