"""Invariant 9 — batch independence (BE-JOB-007).

A consumer with prefetch > 1 holds several deliveries at once: they form a batch, whether the implementation
thinks of one or not. A failure of one item — a poison upload that cannot be decoded, or the consumer killed
after some items committed — must neither lose the others, nor re-execute the ones already committed, nor be
settled as a success. That is exactly what an ack with ``multiple=true`` or one shared outcome breaks.

What is a batch here, from what the harness can see:

* **failures** — a poison upload (the harness planted it) leaving ``processing``, and a consumer role
  (``run["adapter"]["consumers"]``) SIGKILLed or crashed at a failpoint, from the fault lines;
* **members** — the attachments whose ``processing`` interval overlapped the poison item's, or that were
  ``processing`` at the crash, plus those that committed ``ready`` while in flight together with them (the
  implementation's own event times);
* **several deliveries on one consumer**, in the broker's own words — either a ``consumer`` sample (the
  management API's count of unacknowledged deliveries per consumer, while a backlog drains) holding ≥ 2, or,
  for a crash, the first look into the work queue while the crashed consumer is down (``peek_queue``) finding
  ≥ 2 messages the broker returned from it (``redelivered``) — a look that only counts the queue (nothing
  consumed) names them from the firehose trace: the deliveries handed out again, redelivered, right after the
  restart. The broker never says *which* deliveries a channel
  holds, and its statistics are refreshed only every few seconds: so when every sample listed at most one
  consumer, the members — processed together — were on that consumer and one sample of it holding ≥ 2 proves
  the batch; with several consumers, the sample must fall between ``sample_window_seconds`` before the failure
  and ``stats_lag_seconds`` after it.

Invalid when a member is lost (a good upload not ``ready`` after draining, a failing one never terminal), when a
delivery in flight at a consumer crash was not back in the work queue while that consumer was down (it was
settled together with another item), when a member's effect repeats after the failure (second ``ready``, a
rewrite — what :mod:`duplicate_effects` finds, for the members), or when the failing poison item is reported
``ready``. Unknown, when the scenario asks for this checker and it cannot tell: nothing ever showed ≥ 2
deliveries on one consumer, or no failure happened while several were in flight.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import bisect

from . import duplicate_effects
from ..history import Event, History
from .base import (INVALID, TERMINAL_STATES, VALID, Verdict, accepted_attachments, evidence,
                   final_read_ok, role_kind, seed_of, state_at, transitions_of, undecided, FinalState, RunInfo)

NAME = "batch_independence"
REQUIREMENTS = ("BE-JOB-007",)
# With several consumers, a sample speaks for a failure from this long before it until the broker's statistics
# caught up with it (RabbitMQ 3.10's management counts were seen refreshed only every ~5 s on the CI machine).
SAMPLE_WINDOW_SECONDS = 1.5
STATS_LAG_SECONDS = 5.0


def _role_kind(instance: str | None) -> str:
    return (instance or "").split("#", 1)[0]


def _intervals(trans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every stay in ``processing``: {"start", "end" (None: never left), "to" (where it went), "claim", "leave"}."""
    out = []
    for i, t in enumerate(trans):
        if t["to"] != "processing" or t["at"] is None:
            continue
        leave = trans[i + 1] if i + 1 < len(trans) else None
        out.append({"start": t["at"], "end": leave["at"] if leave else None, "to": leave["to"] if leave else None,
                    "claim": t, "leave": leave})
    return out


def _lines(history: History, attachment_id: str, *, to: str | None = None) -> list[dict[str, Any]]:
    return [e for e in history.of_type("transition") if e.get("attachment_id") == attachment_id
            and (to is None or e.get("to") == to)]


def _consumer_instances(history: History, run: dict[str, Any], consumers: frozenset[str]) -> int:
    """How many consumer instances the run had: as configured, or as started (extra instances), whichever is more."""
    counts = {**(run.get("adapter", {}).get("roles") or {}), **((run.get("scenario") or {}).get("roles") or {})}
    started = {e.get("role") for e in history.of_type("role") if _role_kind(e.get("role")) in consumers}
    return max(sum(int(counts.get(role, 1)) for role in consumers), len(started))


# The shapes passed between the steps below: the accepted uploads (base.accepted_attachments), the memoised
# transitions of one attachment (base.transitions_of), one failure (a poison item's stay or a consumer crash).
Accepted = dict[str, dict[str, Event]]
TransOf = Callable[[str | None], list[dict[str, Any]]]
Failure = dict[str, Any]
# (start, (order of the attachment, number of the stay), attachment id, the stay)
StayEntry = tuple[float, tuple[int, int], str, dict[str, Any]]


def _failures(history: History, accepted: Accepted, trans_of: TransOf, consumers: frozenset[str]) -> list[Failure]:
    """Poison items leaving processing (each stay is one failure) and consumer crashes, in time order."""
    out = []
    for attachment_id, acc in accepted.items():
        if acc["invoke"].get("kind") != "poison":
            continue
        for stay in _intervals(trans_of(attachment_id)):
            out.append({"kind": "poison", "attachment_id": attachment_id, "start": stay["start"],
                        "end": stay["end"] if stay["end"] is not None else stay["start"], "stay": stay,
                        "op": acc["invoke"].get("sample") or acc["invoke"].get("op"), "job_id": acc["ok"].get("job_id")})
    for e in history.of_type("fault"):
        crash = (e.get("action") == "crash" and e.get("phase") == "hit") or \
                (e.get("action") == "sigkill" and e.get("phase") == "start")
        if crash and _role_kind(e.get("role")) in consumers:
            out.append({"kind": "crash", "start": e["wall"], "end": e["wall"], "fault": e, "instance": e.get("role")})
    return sorted(out, key=lambda f: f["start"])


class _Stays:
    """Every accepted attachment's stays in ``processing``, indexed by start and by end: a failure's members are a
    range query, not a pass over every attachment per failure (a long soak has thousands of both). Results come in
    the order of ``accepted``, then of the stays, as a scan would give them."""

    def __init__(self, accepted: Accepted, trans_of: TransOf) -> None:
        self.order = {attachment_id: i for i, attachment_id in enumerate(accepted)}
        closed: list[StayEntry] = []
        self.open: list[StayEntry] = []
        for attachment_id in accepted:
            for n, stay in enumerate(_intervals(trans_of(attachment_id))):
                (self.open if stay["end"] is None else closed).append((stay["start"], (self.order[attachment_id], n),
                                                                       attachment_id, stay))
        self.by_start = sorted(closed, key=lambda x: x[0])
        self.starts = [x[0] for x in self.by_start]
        self.by_end = sorted(closed, key=lambda x: x[3]["end"])
        self.ends = [x[3]["end"] for x in self.by_end]
        self.longest = max((x[3]["end"] - x[0] for x in closed), default=0.0)

    def started_by(self, a: float, b: float) -> list[StayEntry]:
        """Stays that may overlap [a, b]: started by ``b`` and not ended before ``a - longest``, and every open one."""
        lo, hi = bisect.bisect_left(self.starts, a - self.longest), bisect.bisect_right(self.starts, b)
        return sorted(self.by_start[lo:hi] + self.open, key=lambda x: x[1])

    def ended_within(self, a: float, b: float) -> list[StayEntry]:
        lo, hi = bisect.bisect_left(self.ends, a), bisect.bisect_right(self.ends, b)
        return sorted(self.by_end[lo:hi], key=lambda x: x[1])


def _members(failure: Failure, accepted: Accepted, trans_of: TransOf,
             stays: _Stays | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(in flight with the failure, committed ready while in flight together with them), each
    {"attachment_id", "stay"}; the failing poison item itself is the first of the first list."""
    stays = stays or _Stays(accepted, trans_of)
    in_flight, committed = [], []
    if failure["kind"] == "poison":
        a, b = failure["start"], failure["end"]
        in_flight.append({"attachment_id": failure["attachment_id"], "stay": failure["stay"]})
    else:
        a = b = failure["start"]
    for _, _, attachment_id, stay in stays.started_by(a, b):
        if attachment_id == failure.get("attachment_id"):
            continue
        end = stay["end"] if stay["end"] is not None else float("inf")
        if failure["kind"] == "poison":
            # Strictly overlapping, on the implementation's own clock: an item claimed once the poison's
            # outcome was committed came in its freed slot, after its batch.
            if stay["start"] < b and end > a:
                in_flight.append({"attachment_id": attachment_id, "stay": stay})
        elif stay["start"] <= a < end:
            in_flight.append({"attachment_id": attachment_id, "stay": stay})
    if failure["kind"] == "crash" and in_flight:
        since = min(m["stay"]["start"] for m in in_flight)
        for _, _, attachment_id, stay in stays.ended_within(since, a):
            if stay["to"] == "ready":
                committed.append({"attachment_id": attachment_id, "stay": stay})
    return in_flight, committed


def _looks_while_down(failure: Failure, peeks: list[Event], starts: list[Event]) -> list[dict[str, Any]]:
    """The looks into the work queue between a crash and the crashed instance's restart."""
    restart = next((e["wall"] for e in starts if e.get("role") == failure["instance"] and e["wall"] > failure["start"]),
                   None)
    return [q for q in peeks if failure["start"] <= q["wall"] and (restart is None or q["wall"] <= restart)]


def _returned_by_trace(history: History, failure: Failure, looked: list[dict[str, Any]],
                       starts: list[Event]) -> list[dict[str, Any]]:
    """Looks that counted the queue without listing it (an exact ready count: nothing consumed) say which messages
    came back from the firehose trace instead: the deliveries the broker handed out again (``redelivered`` set)
    after the crash, until the next event that could return deliveries (a consumer instance exiting, a fault
    starting) — with every consumer instance down until the restart, those are what the crash returned. Given as one
    look, at the first look's time."""
    if not looked or any("messages" in q for q in looked):
        return looked
    from .ack_after_commit import deliveries_traced_before

    if not deliveries_traced_before(history, failure["start"]):
        return []
    restart = next((e["line"] for e in starts if e.get("role") == failure["instance"] and e["wall"] > failure["start"]),
                   looked[-1]["line"])
    # Until anything else could return deliveries: a consumer exiting again, or another fault starting.
    consumers = frozenset(role_kind(i) for i in [failure["instance"]])
    until = next((e["line"] for e in history.events if e["line"] > restart and (
        (e.get("type") == "role" and e.get("action") == "exit" and role_kind(e.get("role")) in consumers)
        or (e.get("type") == "fault" and e.get("phase") in ("start", "hit")))), None)
    seen, messages = set(), []
    for d in history.of_type("delivery"):
        if d["line"] <= failure["fault"]["line"] or not d.get("redelivered"):
            continue
        if until is not None and d["line"] > until:
            break
        if (d.get("job_id"), d.get("attempt")) not in seen:
            seen.add((d.get("job_id"), d.get("attempt")))
            messages.append({"job_id": d.get("job_id"), "attachment_id": d.get("attachment_id"),
                             "attempt": d.get("attempt"), "redelivered": True, "line": d["line"]})
    return [{**looked[0], "kind": "traced_redeliveries", "messages": messages}]


def _committed_unacked(failure: Failure, returned: list[dict[str, Any]], members: list[dict[str, Any]],
                       trans_of: TransOf, starts: list[Event]) -> list[dict[str, Any]]:
    """Returned deliveries whose job had committed before the crash: in flight on the consumer all the same, since
    the broker gave them back (committed, never acknowledged — the very window). With several workers of one
    process committing together, every item of the batch may have left ``processing`` by the time the crash
    lands: the broker's redeliveries, not the implementation's states, say the batch was there."""
    known = {m["attachment_id"] for m in members}
    since = _started_at(failure, starts)
    out = []
    for m in returned:
        attachment_id = m.get("attachment_id")
        if attachment_id in known:
            continue
        stays = [s for s in _intervals(trans_of(attachment_id)) if s["end"] is not None
                 and s["end"] <= failure["start"] and (since is None or s["start"] >= since)]
        if stays and stays[-1]["to"] in TERMINAL_STATES:
            known.add(attachment_id)
            out.append({"attachment_id": attachment_id, "stay": stays[-1]})
    return out


def _started_at(failure: Failure, starts: list[Event]) -> float | None:
    """When the crashed instance was last started before the crash: what it claimed earlier, it does not hold."""
    return max((e["wall"] for e in starts if e.get("role") == failure["instance"] and e["wall"] < failure["start"]),
               default=None)


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    seed = seed_of(run)
    scenario = run.get("scenario") or {}
    options = (scenario.get("check_options") or {}).get(NAME) or {}
    window = float(options.get("sample_window_seconds", SAMPLE_WINDOW_SECONDS))
    lag = float(options.get("stats_lag_seconds", STATS_LAG_SECONDS))
    asked = NAME in (scenario.get("checks") or []) or "BE-JOB-007" in (scenario.get("requirements") or [])
    requirements = list(REQUIREMENTS)

    def not_judged(reason: str, facts: Iterable[dict[str, Any]] = ()) -> Verdict:
        return undecided(NAME, requirements, reason, asked, seed, facts)

    if not final_read_ok(final):
        return not_judged("the final state could not be read")
    consumers = frozenset(run.get("adapter", {}).get("consumers") or ())
    samples = [e for e in history.of_type("consumer") if e.get("consumer_tag") is not None]
    multi = [e for e in samples if int(e.get("unacked") or 0) >= 2]
    one_at_a_time = max((int(e.get("consumers") or 0) for e in history.of_type("consumer")), default=0) <= 1
    accepted = accepted_attachments(history)
    cache: dict[str | None, list[dict[str, Any]]] = {}

    def trans_of(attachment_id: str | None) -> list[dict[str, Any]]:
        if attachment_id not in cache:
            cache[attachment_id] = transitions_of(history, final, attachment_id)
        return cache[attachment_id]

    kinds = {a: acc["invoke"].get("kind") for a, acc in accepted.items()}
    records = final.get("attachments", {})
    expiry = (run.get("adapter", {}).get("expiry") or {}).get("error_code") or "expired"
    duplicates: dict[str, list[dict[str, Any]]] = {}
    for item in duplicate_effects.check(history, final, run).evidence:
        if item.get("attachment_id"):
            duplicates.setdefault(item["attachment_id"], []).append(item)
    peeks = [q for q in history.of_type("queue") if q.get("kind") == "peek"]
    starts = [e for e in history.of_type("role") if e.get("action") == "start"]
    single_consumer = _consumer_instances(history, run, consumers) <= 1
    reported: set[tuple[str, str]] = set()
    returned_most = 0

    batches, skipped = [], []
    problems: list[dict[str, Any]] = []
    stays = _Stays(accepted, trans_of)
    for failure in _failures(history, accepted, trans_of, consumers):
        in_flight, committed = _members(failure, accepted, trans_of, stays)
        what = (f"poison {failure['op']}{_position(failure['op'], run)} failing at {_fmt(failure['end'], history)}"
                if failure["kind"] == "poison" else f"crash of {failure['instance']} at t={failure['fault']['t']:.2f}")
        looked = _looks_while_down(failure, peeks, starts) if failure["kind"] == "crash" else []
        looked = _returned_by_trace(history, failure, looked, starts)
        # The broker's word for "several deliveries on one consumer": what the crash returned to the queue (the
        # first look only: the harness's own look requeues, and marks, every message it sees) or a sample.
        # Traced redeliveries after the crash count whole: a committed item among them was unacked when the crash
        # came (the window between commit and ack), so it was in flight on the consumer too — the whole batch back.
        # A listed look counts only unfinished jobs: a finished job's message in the queue may be an older copy.
        traced = bool(looked) and looked[0].get("kind") == "traced_redeliveries"
        returned = [m for m in (looked[0].get("messages") or [] if looked else []) if m.get("redelivered") and (
                    traced or state_at(trans_of(m.get("attachment_id")), failure["start"]) not in TERMINAL_STATES)]
        returned_most = max(returned_most, len(returned))
        near = multi if one_at_a_time else [e for e in multi
                                            if failure["start"] - window <= e["wall"] <= failure["end"] + lag]
        if failure["kind"] == "crash":
            committed += _committed_unacked(failure, returned, in_flight + committed, trans_of, starts)
        size = len(in_flight) + len(committed)
        if size < 2 or (failure["kind"] == "crash" and not in_flight and len(returned) < 2):
            skipped.append(f"{what}: nothing else in flight with it ({size} item{'s' if size != 1 else ''})")
            continue
        if len(returned) >= 2:
            proof, proof_events = dict(proven_by="returned", returned=[m.get("attachment_id") for m in returned],
                                       peek_line=looked[0].get("line")), [looked[0]]
            held = f"the broker returned {len(returned)} of its deliveries to the queue"
        elif near:
            sample = min(near, key=lambda e: abs(e["wall"] - failure["end"]))
            proof, proof_events = dict(proven_by="sample", consumer_tag=sample.get("consumer_tag"),
                                       unacked=sample.get("unacked"), sample_line=sample.get("line")), [sample]
            held = f"consumer {sample.get('consumer_tag')} held {sample.get('unacked')} deliveries"
        elif single_consumer and one_at_a_time and failure["kind"] == "poison":
            # The implementation's own transitions: with one consumer instance, items processing alongside the
            # poison were all delivered to it — a batch, whatever the broker's lagging statistics say. (A crash is
            # judged by what the broker returned, which the "settled with the batch" check needs anyway.)
            proof, proof_events = dict(proven_by="overlap", processing_together=size), []
            held = f"the only consumer instance was processing {size} items together (its recorded transitions)"
        else:
            skipped.append(f"{what}: {size} items in flight together, but "
                           + ("several consumers were sampled and none held 2 or more deliveries from "
                              f"{window}s before to {lag}s after it" if multi else
                              "nothing showed 2 or more deliveries on one consumer"))
            continue
        ids = list(dict.fromkeys(m["attachment_id"] for m in in_flight + committed))
        base: dict[str, Any] = dict(failure=failure["kind"], batch=ids, **proof)
        fault_events = [failure["fault"]] if failure["kind"] == "crash" else _lines(history, failure["attachment_id"])[:3]
        found_before = len(problems)

        # 1. Lost: every member reaches its outcome once the system drained.
        for attachment_id in ids:
            record = records.get(attachment_id) or {}
            if record.get("status") != 200:
                skipped.append(f"{what}: {attachment_id} was not read at the end")
                continue
            body = record.get("body") or {}
            state, kind = body.get("state"), kinds.get(attachment_id)
            ok = accepted[attachment_id]["ok"]
            if kind == "poison":
                if state not in TERMINAL_STATES:
                    problems.append(evidence(f"{what}: the failing item never reached a terminal state (still "
                                             f"{state!r})", attachment_id=attachment_id, job_id=ok.get("job_id"),
                                             events=fault_events + proof_events, **base))
            elif state != "ready" and not (state == "failed" and kind == "bad") and not (
                    state == "failed" and body.get("error_code") == expiry):
                problems.append(evidence(f"{what}: a batch member was lost — {state!r} after draining, not ready",
                                         attachment_id=attachment_id, job_id=ok.get("job_id"),
                                         events=fault_events + proof_events + _lines(history, attachment_id)[-2:],
                                         error_code=body.get("error_code"), **base))
        # 2. A crash returns every unfinished delivery of the batch to the queue (individual acks).
        if looked and not single_consumer:
            skipped.append(f"{what}: the work queue was looked into, but other consumers could have taken the "
                           "returned deliveries")
        elif looked:
            since = _started_at(failure, starts)
            for m in in_flight:
                if state_at(trans_of(m["attachment_id"]), looked[0]["wall"]) in TERMINAL_STATES:
                    continue  # it committed before the kill landed: not in flight after all
                if since is not None and m["stay"]["start"] < since:
                    continue  # claimed by an earlier life of the consumer: its delivery went with that one
                if not any(x.get("attachment_id") == m["attachment_id"] for q in looked for x in q.get("messages") or []):
                    problems.append(evidence(
                        f"{what}: a delivery in flight was settled with the batch — {len(looked)} looks into the "
                        "work queue while the consumer was down did not find it (acknowledged before its own "
                        "outcome, e.g. by another item's ack with multiple=true)",
                        attachment_id=m["attachment_id"], job_id=accepted[m["attachment_id"]]["ok"].get("job_id"),
                        events=[failure["fault"]] + looked[:2] + _lines(history, m["attachment_id"])[-3:],
                        processing_since=m["stay"]["claim"]["at_text"],
                        committed_meanwhile=[c["attachment_id"] for c in committed],
                        peeked=[{"t": q["t"], "attachments": [x.get("attachment_id") for x in q.get("messages") or []]}
                                for q in looked[:3]], **base))
        # 3. Re-executed: a member's effect repeated after the failure (what duplicate_effects finds).
        for attachment_id in ids:
            for item in duplicates.get(attachment_id, []):
                if (attachment_id, item["message"]) in reported:
                    continue
                reported.add((attachment_id, item["message"]))
                problems.append({**item, "message": f"{what}: a batch member was re-executed — {item['message']}",
                                 **base})
        # 4. The failing item must not be reported a success.
        if failure["kind"] == "poison":
            poison_id = failure["attachment_id"]
            body = (records.get(poison_id) or {}).get("body") or {}
            if failure["stay"]["to"] == "ready" or body.get("state") == "ready":
                problems.append(evidence(f"{what}: the failing item was reported successful (ready) — its pixel "
                                         "data is garbage by construction",
                                         attachment_id=poison_id, job_id=failure["job_id"],
                                         events=_lines(history, poison_id, to="ready")[:2] + proof_events,
                                         final_state=body.get("state"), **base))
        batches.append(evidence(
            f"{what}: {len(ids)} items in flight together"
            + (f" ({len(committed)} committed before it)" if failure["kind"] == "crash" else "")
            + f", {held}" + ("" if len(problems) == found_before else " — broken"),
            attachment_id=failure.get("attachment_id"), job_id=failure.get("job_id"),
            events=fault_events[:1] + proof_events,
            outcomes={m: ((records.get(m) or {}).get("body") or {}).get("state") for m in ids}, **base))

    if problems:
        return Verdict(NAME, INVALID, requirements,
                       f"{len(problems)} batch items lost, re-executed or wrongly settled around "
                       f"{len(batches)} failures in a multi-delivery batch", evidence=problems[:30] + batches[:10],
                       seed=seed)
    if batches:
        return Verdict(NAME, VALID, requirements,
                       f"{len(batches)} failures inside multi-delivery batches ("
                       f"{sum(b['failure'] == 'poison' for b in batches)} poison, "
                       f"{sum(b['failure'] == 'crash' for b in batches)} consumer crashes): no item lost, "
                       "re-executed or settled with another's outcome",
                       evidence=batches + [{"message": s} for s in skipped], seed=seed)
    if not multi and returned_most < 2:
        most = max((int(e.get("unacked") or 0) for e in samples), default=None)
        return not_judged(
            "no consumer sample ever showed 2 or more deliveries in flight on one consumer "
            + (f"({len(samples)} samples, at most {most} unacknowledged)" if samples else "(no consumer was sampled)")
            + (f", and no consumer crash returned 2 or more at once (at most {returned_most})" if peeks else ""),
            [evidence("consumer samples", events=samples[:1] + samples[-1:], samples=len(samples), max_unacked=most)]
            + [{"message": s} for s in skipped])
    return not_judged("deliveries were in flight together on one consumer, but "
                      + ("no failure happened while they were: " + "; ".join(skipped) if skipped else
                         "no failure happened at all (no poison item was processed, no consumer crashed)"),
                      [evidence("multi-delivery samples", events=multi[:1] + multi[-1:], samples=len(multi))])


def _position(op: str | None, run: dict[str, Any]) -> str:
    """`` (first of 20 in upload order)`` — where the planned workload put this upload."""
    ops = [o.get("op") for o in run.get("workload") or []]
    if op not in ops:
        return ""
    index, total = ops.index(op), len(ops)
    name = {0: "first", total - 1: "last", total // 2: "middle"}.get(index, f"#{index + 1}")
    return f" ({name} of {total} in upload order)"


def _fmt(wall: float, history: History) -> str:
    """A wall time as the run's relative t (seconds), for readable summaries."""
    events = history.events
    if not events:
        return f"{wall:.3f}"
    first = events[0]
    return f"t={wall - first['wall'] + first['t']:.2f}"
