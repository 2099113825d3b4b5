"""Clock agreement — producer and consumer clocks apart (BE-JOB-005.4: expiry judged the same whatever each role's
clock says).

The scenario starts the roles that create and publish jobs (``@producers``) and the ones that consume and recover
them (``@consumers``, ``@recovers_work``) with wall clocks apart (libfaketime offsets, recorded per instance as
``observe`` lines ``source = "clock_skew"``, with whether the offset was shown in effect) and in different time
zones (``source = "clock_tz"``), keeps every consumer held or paused (SIGSTOP of every consumer instance) past the
job TTL while uploads arrive, then lets them go. The contract (CONTRACT §5, Expiry) dates a deadline on one clock; a role that compares its own wall clock
with a time another role stamped, or reads a zone-less local time, expires fresh work or processes stale work here.

Judged on the harness's own clock only (no server timestamp is trusted):

* a job whose TTL ran out before any consumer was back (202 at A, A + TTL ≤ release) ends ``failed`` with the
  expiry error_code, with no variant results and no stored object besides its original;
* an upload made after the consumers were back ends ``ready`` (after the first claim following the release: when
  the harness saw it, or its event time plus the largest clock offset in effect, whichever is earlier);
* nothing is seen expired before its TTL: the harness's first sight of the expiry outcome comes no earlier than the
  upload's first try + TTL (an observation is always after the fact, so an earlier one proves an early expiry).

Exercised only when a clock offset really reached both sides — every role the scenario skews shows its offset on its
own clock as it reports it, and the offsets put a producer and a consumer at least half a TTL apart — and jobs on both
sides of the deadline were observed. An offset is shown in effect (``verified``) by the role's HTTP ``Date`` header
(its API, or its /metrics: harness/clock.py), else (``stamped``) by the claim events the only consumer role stamped:
an event seen by the harness at wall time W with ``at`` = A proves the stamping clock at least A − W ahead (seen after
the fact), one stamped before the upload that caused it was sent proves a clock behind. libfaketime merely mapped into
a process proves nothing. Time zones alone never pass the check: two UTC offsets change how a time is written, not
what the clocks read, so with an offset not shown in effect (a Go program reads the clock without libc; a role that
drops ``LD_PRELOAD``) the check is ``unknown`` with the role and the reason.
"""

from __future__ import annotations

from typing import Any

from datetime import datetime, timezone

from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, consumer_roles, evidence, expiry_code,
                   final_read_ok, not_proven, parse_time, role_kind, seed_of, timings_of, FinalState, RunInfo)
from .expiry import SPAWN_SLACK_SECONDS, consumer_holds, expired_in_time, first_invoke, objects, results

NAME = "clock_agreement"
REQUIREMENTS = ["BE-JOB-005"]
TIMINGS = ("job_ttl_seconds",)
IN_EFFECT = ("verified", "stamped")  # an offset seen on the role's own clock (HTTP Date, or event times it stamped)
# The harness polls every attachment about every 0.1 s per attachment; an expiry seen this much before the TTL
# ran out is early beyond any rounding of the 202's own time.
EARLY_SLACK_SECONDS = 0.05
# An event time counts as showing an offset only beyond this (a stamp's rounding, the harness's own clock reads).
DATE_SLACK_SECONDS = 1.0
PRODUCERS, CONSUMERS, RECOVERS = "@producers", "@consumers", "@recovers_work"


def utc_offset_hours(zone: str | None) -> float | None:
    if not zone:
        return None
    try:
        from zoneinfo import ZoneInfo

        offset = ZoneInfo(zone).utcoffset(datetime.now(timezone.utc).replace(tzinfo=None))
        return None if offset is None else offset.total_seconds() / 3600
    except Exception:
        return None


def stamped_offset(history: History, role_kinds: frozenset[str]) -> dict[str, Any] | None:
    """What the claim events (``→ processing``) show of the clock that stamped them, when one consumer role makes
    every claim: the largest A − W (A the event's ``at``, W the harness's first sight of it: a lower bound of how far
    ahead that clock runs) and the smallest A − U (U the harness's first try of the upload: an upper bound, below 0
    for a clock behind), with the events that show them."""
    if len(role_kinds) != 1:
        return None
    sent: dict[Any, float] = {}
    for e in history.of_type("ok"):
        if e.get("f") == "upload" and e.get("attachment_id"):
            invoke = next((i for i in history.of_type("invoke") if i.get("op") == e.get("op")), None)
            sent.setdefault(e["attachment_id"], (invoke or e)["wall"])
    ahead: dict[str, Any] | None = None
    behind: dict[str, Any] | None = None
    for e in history.of_type("transition"):
        at = parse_time(e.get("at_server"))
        if e.get("to") != "processing" or at is None:
            continue
        if ahead is None or at - e["wall"] > ahead["bound"]:
            ahead = {"bound": round(at - e["wall"], 3), "attachment_id": e.get("attachment_id"),
                     "at": e.get("at_server"), "seen_wall": e["wall"]}
        upload = sent.get(e.get("attachment_id"))
        if upload is not None and (behind is None or at - upload < behind["bound"]):
            behind = {"bound": round(at - upload, 3), "attachment_id": e.get("attachment_id"),
                      "at": e.get("at_server"), "upload_sent_wall": upload}
    return {"role": next(iter(role_kinds)), "ahead_at_least": ahead, "behind_at_least": behind}


def clocks(history: History, run: RunInfo) -> list[dict[str, Any]]:
    """Per role instance that got a clock of its own: its side, the offset in effect (0 where not shown) and TZ. An
    offset not seen in a Date header counts when the claim events the role stamped show it (``stamped``: the bound
    they prove, never more than asked)."""
    consumers = consumer_roles(run)
    stamps = stamped_offset(history, consumers)
    out: dict[Any, dict[str, Any]] = {}
    for e in history.of_type("observe"):
        if e.get("source") not in ("clock_skew", "clock_tz"):
            continue
        groups = set(e.get("groups") or [])
        role = e.get("role")
        item = out.setdefault(role, {"role": role, "groups": sorted(groups), "offset_seconds": 0.0,
                                     "offset_status": None, "tz": None, "utc_offset_hours": None})
        kind = role_kind(role)
        item["side"] = ("producer" if PRODUCERS in groups and kind not in consumers else
                        "consumer" if kind in consumers or CONSUMERS in groups or RECOVERS in groups else "other")
        if e.get("source") == "clock_skew":
            item["offset_status"] = e.get("status")
            item["offset_requested"] = e.get("offset_seconds")
            item["offset_seconds"] = float(e.get("offset_seconds") or 0) if e.get("status") in IN_EFFECT else 0.0
            item["offset_reason"] = e.get("reason")
        else:
            item["tz"] = e.get("tz")
            item["utc_offset_hours"] = utc_offset_hours(e.get("tz"))
    for item in out.values():
        asked = float(item.get("offset_requested") or 0)
        if item["offset_status"] in IN_EFFECT or not asked or stamps is None or role_kind(item["role"]) != stamps["role"]:
            continue
        ahead, behind = stamps["ahead_at_least"], stamps["behind_at_least"]
        shown = (min(asked, ahead["bound"]) if asked > 0 and ahead and ahead["bound"] > DATE_SLACK_SECONDS else
                 max(asked, behind["bound"]) if asked < 0 and behind and behind["bound"] < -DATE_SLACK_SECONDS else None)
        if shown is not None:
            item.update(offset_status="stamped", offset_seconds=shown, offset_stamp=ahead if asked > 0 else behind,
                        offset_reason=f"its claim events' times show its clock {abs(shown):g}s "
                                      f"{'ahead' if asked > 0 else 'behind'} at least (asked {asked:+g}s; "
                                      f"{item.get('offset_reason')})")
    return list(out.values())


def difference(items: list[dict[str, Any]], ttl: float | None) -> dict[str, Any]:
    """What clock difference reached a producer and a consumer: offsets (seconds) and UTC offsets (hours)."""
    producers = [c for c in items if c["side"] == "producer"]
    consumers = [c for c in items if c["side"] == "consumer"]
    offset_gap = max((abs(c["offset_seconds"] - p["offset_seconds"]) for p in producers for c in consumers), default=0.0)
    zone_gap = max((abs((c["utc_offset_hours"] or 0) - (p["utc_offset_hours"] or 0)) for p in producers
                    for c in consumers if c["tz"] or p["tz"]), default=0.0)
    needed = 0.5 * float(ttl) if ttl else 1.0
    return {"producers": len(producers), "consumers": len(consumers), "offset_gap_seconds": round(offset_gap, 3),
            "offset_exercised": bool(producers and consumers) and offset_gap >= needed,
            "zone_gap_hours": zone_gap, "zone_exercised": bool(producers and consumers) and zone_gap > 0,
            "offset_not_applied": sorted({f"{c['role']}: {c.get('offset_status')} ({c.get('offset_reason')})"
                                          for c in items if c.get("offset_status") and c["offset_status"] not in IN_EFFECT
                                          and float(c.get("offset_requested") or 0)})}


def consumer_pauses(history: History, run: RunInfo) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(sigstop, sigcont) line pairs during which every instance of every consumer role was paused (SIGSTOP): like a
    hold, nothing consumed meanwhile, and the consumers resume at once, warm (no start-up to wait for)."""
    consumers = consumer_roles(run)
    counts = (run.get("adapter") or {}).get("roles") or {}
    needed = sum(int(counts.get(role, 1)) for role in consumers)
    stops = [e for e in history.of_type("fault") if e.get("action") == "sigstop" and e.get("phase") == "start"
             and role_kind(e.get("role")) in consumers]
    conts = [e for e in history.of_type("fault") if e.get("action") == "sigcont" and role_kind(e.get("role")) in consumers]
    if not stops or not needed or len({e.get("role") for e in stops}) < needed:
        return []
    start = max(stops, key=lambda e: e["seq"])  # from when all were paused
    end = next((e for e in conts if e["seq"] > start["seq"]), None)  # to when the first resumed
    return [(start, end)] if end is not None else []


def back_at(history: History, end: dict[str, Any], slack: float) -> float | None:
    """An upper bound of the first claim after the release: when the harness first saw one (its own clock), or the
    claim's own event time plus ``slack`` (the largest clock offset in effect: a stamp from a skewed role is never
    off by more), whichever is earlier."""
    seen = [e["wall"] for e in history.of_type("transition", "state") if e["wall"] >= end["wall"]
            and (e.get("to") == "processing" or e.get("state") == "processing")]
    stamped = [t + slack for t in (parse_time(e.get("at_server")) for e in history.of_type("transition")
                                   if e.get("to") == "processing") if t is not None and t >= end["wall"]]
    return min(seen + stamped, default=None)


def expiry_seen(history: History, attachment_id: str, code: str) -> dict[str, Any] | None:
    """The first history line showing the attachment failed with the expiry error_code (harness clock)."""
    return next((e for e in history.of_type("state") if e.get("attachment_id") == attachment_id
                 and e.get("state") == "failed" and e.get("error_code") == code), None)


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    declared = NAME in ((run.get("scenario") or {}).get("checks") or [])
    items = clocks(history, run)
    if not items:
        if declared:
            return Verdict(NAME, UNKNOWN, REQUIREMENTS, "no role was started with a clock of its own",
                           seed=seed_of(run))
        return Verdict(NAME, VALID, REQUIREMENTS, "no clock offset or time zone in this run", exercised=False,
                       seed=seed_of(run))
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
    ttl: Any = timings_of(run).get("job_ttl_seconds")
    code = expiry_code(run)
    gap: dict[str, Any] = difference(items, ttl)
    facts = evidence("clocks per role instance", clocks=items, **gap)
    if gap["offset_not_applied"]:  # the scenario's clock offset is a fault that did not (visibly) happen
        facts["fault"] = {"kind": "clock_skew", "not_shown": gap["offset_not_applied"]}
    accepted = accepted_attachments(history)
    records = final.get("attachments", {})
    problems, stale_ok, fresh_ok = [], [], []
    holds = (consumer_holds(history, run) + consumer_pauses(history, run)) if ttl is not None else []
    for attachment_id, acc in sorted(accepted.items()):
        if acc["invoke"].get("kind") in ("bad", "poison", "heavy"):
            continue
        first = first_invoke(history, acc["invoke"])
        body = (records.get(attachment_id) or {}).get("body") or {}
        base: dict[str, Any] = dict(attachment_id=attachment_id, job_id=acc["ok"].get("job_id"), final_state=body.get("state"),
                    error_code=body.get("error_code"), ttl_seconds=ttl)
        seen = expiry_seen(history, attachment_id, code)
        if ttl is not None and seen is not None and seen["wall"] < first["wall"] + float(ttl) - EARLY_SLACK_SECONDS:
            problems.append(evidence(f"seen expired {seen['wall'] - first['wall']:.2f}s after its upload was sent, "
                                     f"before its TTL of {ttl}s (by the harness's clock)", events=[first, seen], **base))
        for _start, end in holds:
            back = back_at(history, end, max((abs(c["offset_seconds"]) for c in items), default=0.0))
            if acc["ok"]["wall"] + float(ttl) <= end["wall"] - SPAWN_SLACK_SECONDS:
                effects = results(records.get(attachment_id) or {}) + objects(attachment_id, records.get(attachment_id)
                                                                               or {}, final)
                if body.get("state") == "failed" and body.get("error_code") == code and not effects:
                    stale_ok.append(attachment_id)
                else:
                    problems.append(evidence(f"its TTL ran out while every consumer was held, yet it ended "
                                             f"{body.get('state')!r} ({body.get('error_code')})"
                                             + (" with effects" if effects else ""), events=[first, acc["ok"], end],
                                             effects=effects[:6] or None, released_wall=end["wall"], **base))
            elif back is not None and first["wall"] >= back:
                if body.get("state") == "ready":
                    fresh_ok.append(attachment_id)
                elif not expired_in_time(history, attachment_id, code, first["wall"], ttl):
                    problems.append(evidence(f"uploaded after the consumers were back and within its TTL, yet it "
                                             f"ended {body.get('state')!r} ({body.get('error_code')})",
                                             events=[first, acc["ok"], end], first_claim_after_release=back, **base))
    facts.update(stale_expired=len(stale_ok), fresh_ready=len(fresh_ok))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len(problems)} jobs judged against the wrong clock with producer and consumer clocks apart "
                       f"(offset gap {gap['offset_gap_seconds']:g}s, time zones {gap['zone_gap_hours']:g}h apart)",
                       evidence=problems[:40] + [facts], seed=seed_of(run))
    # Time zones alone prove nothing (how a time is written, not what a clock reads): every offset the scenario asked
    # for must show on the role's own clock, and they must put the two sides apart.
    why = ("the adapter declares no job_ttl_seconds" if ttl is None else
           "the clock offset was not shown on the role's own clock (HTTP Date header or event times it stamped) in "
           + "; ".join(gap["offset_not_applied"]) + (f"; time zones {gap['zone_gap_hours']:g}h apart alone prove no "
                                                      "clock difference" if gap["zone_exercised"] else "")
           if gap["offset_not_applied"] else
           "no clock offset reached both a producer and a consumer role" + (
               f" (time zones {gap['zone_gap_hours']:g}h apart alone prove no clock difference)"
               if gap["zone_exercised"] else "") if not gap["offset_exercised"] else
           "no consumer was held" if not holds else
           "no job's TTL ran out while the consumers were held" if not stale_ok else
           "no upload came after the consumers were back" if not fresh_ok else None)
    if why:
        return not_proven(NAME, REQUIREMENTS, "clock agreement", why, run, [facts])
    parts = [f"{gap['offset_gap_seconds']:g}s apart (" + ", ".join(
        sorted({f"{c['role']} {c['offset_status']}" for c in items if c.get("offset_status") in IN_EFFECT})) + ")"]
    if gap["zone_exercised"]:
        parts.append(f"time zones {gap['zone_gap_hours']:g}h apart")
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"producer and consumer clocks: {', '.join(parts)}: {len(stale_ok)} jobs past their TTL expired with no "
                   f"effect, {len(fresh_ok)} fresh uploads reached ready, none seen expired before its TTL",
                   evidence=[facts], seed=seed_of(run))
