"""Invariant 7 — expiry (BE-JOB-005).

The scenario runs the implementation with a short job TTL and keeps every consumer stopped past it while
uploads are accepted. A job whose TTL ran out before any consumer was back (accepted at A with
A + ttl ≤ release: the server stamped its expiry no later than that) must end ``failed`` with the
adapter's expiry error_code, never ``ready``, with no variant results or objects. Any attachment reported
expired must show no business effect either (no variant results, never ``ready``) and must really have waited
its TTL; objects left by work that began before its TTL ran out and whose commit was then refused are
unreferenced, like those of the after_s3_write_before_commit window, and are kept as a note. Work accepted after the
consumers are back (after the first claim following the release) must still reach ``ready``: expiry is not
applied to fresh work.

In every scenario, whatever else it provokes: no attachment is committed ``ready``, and no object ``ready`` names is
written, after its job's deadline. The harness's own clocks decide that it could be late at all (the latest
possible deadline is the 202's wall time + TTL; S3 dates the objects): a variant object ``ready`` names dated past
that (beyond S3's whole-second slack) is an effect started past the deadline; a ``ready`` the harness first saw
past it whose own record (the ``processing → ready`` event against the ``expires_at`` its message carried, or its
creation event + TTL) puts the commit past the deadline is a commit past it. A scenario that holds no consumer
(the deadline passes during a slow fetch) proves expiry only when a job claimed before its deadline then ended
expired (the re-check after the wait ran): that something expired at its claim proves nothing about the re-check.
"""

from __future__ import annotations

from typing import Any

from datetime import datetime, timezone

from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, consumer_roles, evidence, expiry_code, final_read_ok,
                   parse_time, seed_of, timings_of, transitions_of, FinalState, RunInfo)

NAME = "expiry"
REQUIREMENTS = ["BE-JOB-005"]
TIMINGS = ("job_ttl_seconds",)
# A consumer cannot claim anything in the first instant after its (re)start: the release line is written just
# after the spawn, so a TTL that ran out this long before it ran out before any claim.
SPAWN_SLACK_SECONDS = 0.1
# S3 Last-Modified has whole seconds (rounded down) and a PUT started just before the deadline may be dated a
# moment after it: only a write this long after the latest possible deadline counts as started past it.
LATE_WRITE_SLACK_SECONDS = 1.0
# Work that ended expired (the right outcome) and left an object dated after its deadline: the write may have been
# issued just before the deadline (the check before each effect passed) and stored later, the client and the store
# starved on a loaded machine (a correct TypeScript worker's thumbnail was dated 1-2 s past it in a CI rehearsal).
# Only a write this much later than the slack above counts as started past the deadline.
IN_FLIGHT_WRITE_SECONDS = 1.5
# The implementation's own stamps (a commit event's ``at`` against the ``expires_at`` on the wire) come from its own
# clocks: a commit this much past the deadline they state is past it (more where the run moved a role's clock).
OWN_CLOCK_SLACK_SECONDS = 0.5


def wire_deadlines(history: History) -> dict[str, float]:
    """job_id -> the ``expires_at`` its messages carried (the earliest, on the wire as the harness's tap saw it)."""
    out: dict[str, float] = {}
    for m in history.of_type("message"):
        body = m.get("body")
        if isinstance(body, dict) and isinstance(body.get("job_id"), str):
            at = parse_time(body.get("expires_at"))
            if at is not None:
                out[body["job_id"]] = min(out.get(body["job_id"], at), at)
    return out


def clock_offsets(history: History) -> float:
    """The largest clock offset the run gave any role (seconds; 0 without clock faults): two roles' stamps may be
    up to twice this apart."""
    return max((abs(float(e.get("offset_seconds") or 0)) for e in history.of_type("observe")
                if e.get("source") == "clock_skew"), default=0.0)


def first_seen_ready(history: History, attachment_id: str) -> float | None:
    """Wall time (harness clock) the harness first saw the attachment ``ready`` (a GET or its events)."""
    seen = [e["wall"] for e in history.of_type("state") if e.get("attachment_id") == attachment_id
            and e.get("state") == "ready"]
    seen += [e["wall"] for e in history.of_type("transition") if e.get("attachment_id") == attachment_id
             and e.get("to") == "ready"]
    return min(seen, default=None)


def named_objects(record: dict[str, Any], final: dict[str, Any]) -> list[tuple[str, float | None]]:
    """(key, Last-Modified) of every object the attachment's ``ready`` result names (final read and bucket list)."""
    listed = {o.get("key"): o.get("last_modified") for o in final.get("bucket_objects") or []}
    stored = record.get("objects") or {}
    out = []
    for v in (record.get("body") or {}).get("variants") or []:
        key = v.get("key")
        if key:
            modified = (stored.get(key) or {}).get("last_modified") or listed.get(key)
            out.append((key, parse_time(modified)))
    return out


def past_deadline(history: History, final: FinalState, run: RunInfo, accepted: dict[str, Any],
                  ttl: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Every scenario: (violations, attachments judged) for ``ready`` results committed, or variant objects written,
    after the job's deadline. Judged only on the upload's own job (the version its message named)."""
    if ttl is None:
        return [], []
    deadlines = wire_deadlines(history)
    versions: dict[str, Any] = {}
    for m in history.of_type("message"):
        body = m.get("body")
        if isinstance(body, dict) and isinstance(body.get("job_id"), str):
            versions.setdefault(body["job_id"], body.get("pipeline_version"))
    skew = 2 * clock_offsets(history)
    problems, judged = [], []
    for attachment_id, acc in sorted(accepted.items()):
        record = (final.get("attachments") or {}).get(attachment_id) or {}
        body = record.get("body") or {}
        if body.get("state") != "ready":
            continue
        job_id = acc["ok"].get("job_id")
        version = versions.get(job_id)
        served = body.get("pipeline_version")
        if version is not None and served is not None and served != version:
            continue  # another version's job (level 5): its own deadline, not this upload's
        latest = acc["ok"]["wall"] + float(ttl)  # harness clock: the server stamped the deadline no later
        judged.append(attachment_id)
        base: dict[str, Any] = dict(attachment_id=attachment_id, job_id=job_id, events=[acc["ok"]], ttl_seconds=ttl,
                    deadline_no_later_than=round(latest, 3))
        late = [(k, m) for k, m in named_objects(record, final)
                if m is not None and m > latest + LATE_WRITE_SLACK_SECONDS]
        if late:
            problems.append(evidence("ready names objects written after the job's deadline (an effect started "
                                     "past it: expiry not re-checked after a long wait)",
                                     effects=[f"object {k} at {utc(m)}" for k, m in late][:6], **base))
            continue
        seen = first_seen_ready(history, attachment_id)
        if seen is None or seen <= latest:
            continue  # the harness saw it ready before the latest possible deadline: in time
        trans = transitions_of(history, final, attachment_id)
        ready = next((t for t in trans if t["to"] == "ready" and t["at"] is not None), None)
        created = next((t for t in trans if t["from"] is None and t["at"] is not None), None)
        own = deadlines.get(job_id)
        source = "the expires_at its message carried"
        if own is None and created is not None:
            own, source = created["at"] + float(ttl), "its creation event + TTL"
        if ready is None or own is None:
            continue
        if ready["at"] > own + OWN_CLOCK_SLACK_SECONDS + skew:
            problems.append(evidence(f"committed ready {ready['at'] - own:.2f}s after its deadline ({source}; "
                                     f"the harness first saw it ready {seen - latest:.2f}s after the latest "
                                     "possible deadline): expiry not re-checked before the commit",
                                     ready_at=ready.get("at_text"), deadline=utc(own), seen_ready_wall=seen,
                                     **base))
    return problems, judged


def expired_after_a_claim_in_time(history: History, final: FinalState, accepted: dict[str, Any], code: str,
                                  ttl: Any) -> list[dict[str, Any]]:
    """Attachments that ended expired (``processing → failed`` with the expiry code) after a claim made before
    their deadline: the harness saw the claim before the earliest possible deadline (the upload sent + TTL, its own
    clock), or the claim's own event precedes the ``expires_at`` its message carried."""
    if ttl is None:
        return []
    deadlines = wire_deadlines(history)
    out = []
    for attachment_id, acc in sorted(accepted.items()):
        body = ((final.get("attachments") or {}).get(attachment_id) or {}).get("body") or {}
        if body.get("state") != "failed" or body.get("error_code") != code:
            continue
        trans = transitions_of(history, final, attachment_id)
        if not trans or trans[-1]["from"] != "processing" or trans[-1]["to"] != "failed":
            continue
        claim = next((t for t in reversed(trans[:-1]) if t["to"] == "processing"), None)
        if claim is None:
            continue
        earliest = first_invoke(history, acc["invoke"])["wall"] + float(ttl)
        seen = [e["wall"] for e in history.of_type("transition") if e.get("attachment_id") == attachment_id
                and e.get("to") == "processing" and e.get("event_seq") == claim["seq"]]
        own = deadlines.get(acc["ok"].get("job_id"))
        by_harness = bool(seen) and min(seen) < earliest
        by_record = own is not None and claim["at"] is not None and claim["at"] < own
        if by_harness or by_record:
            out.append(evidence("claimed before its deadline, expired during its work (re-checked after the wait)",
                                attachment_id=attachment_id, job_id=acc["ok"].get("job_id"), claim_at=claim.get("at_text"),
                                seen_by="harness clock" if by_harness else "its own claim event and expires_at"))
    return out


def expired_while_paused(history: History, run: RunInfo, final: FinalState, accepted: dict[str, Any], code: str,
                         ttl: Any) -> list[dict[str, Any]]:
    """Attachments that ended expired whose TTL ran out (202 + TTL, harness clock) while every instance of the
    consumer roles was paused (SIGSTOP until SIGCONT)."""
    if ttl is None:
        return []
    consumers = consumer_roles(run)
    faults = history.of_type("fault")
    stops = [e for e in faults if e.get("action") == "sigstop" and e.get("phase") == "start"
             and e.get("role", "").split("#", 1)[0] in consumers]
    spans = []
    for stop in stops:
        cont = next((e for e in faults if e.get("action") == "sigcont" and e.get("role") == stop.get("role")
                     and e["seq"] > stop["seq"]), None)
        spans.append((stop["wall"], cont["wall"] if cont else float("inf"), stop.get("role")))
    instances = {e.get("role") for e in history.of_type("role") if e.get("action") == "start"
                 and e.get("role", "").split("#", 1)[0] in consumers}
    out = []
    for attachment_id, acc in sorted(accepted.items()):
        body = ((final.get("attachments") or {}).get(attachment_id) or {}).get("body") or {}
        if body.get("state") != "failed" or body.get("error_code") != code:
            continue
        ran_out = acc["ok"]["wall"] + float(ttl)
        paused = {role for start, end, role in spans if start <= ran_out < end}
        if paused and instances <= paused:
            out.append(evidence("its TTL ran out while every consumer was paused: failed, no effect",
                                attachment_id=attachment_id, job_id=acc["ok"].get("job_id")))
    return out


def utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def expired_in_time(history: History, attachment_id: str, code: str, sent_wall: float, ttl: float) -> bool:
    """Whether the attachment was first seen failed with the expiry code no earlier than its upload was sent + TTL
    (harness clock): a correct expiry of work that waited out its TTL — behind a backlog on a slow machine, say —
    which proves nothing either way about fresh work reaching ``ready``."""
    seen = next((e for e in history.of_type("state") if e.get("attachment_id") == attachment_id
                 and e.get("state") == "failed" and e.get("error_code") == code), None)
    return seen is not None and seen["wall"] >= sent_wall + float(ttl) - 0.05


def consumer_holds(history: History, run: RunInfo) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(hold_start, hold_end) phase pairs that held a consumer role."""
    consumers = consumer_roles(run)
    starts = [e for e in history.of_type("phase") if e.get("name") == "hold_start"
              and consumers & set(e.get("roles") or [])]
    out = []
    for start in starts:
        end = next((e for e in history.of_type("phase") if e.get("name") == "hold_end" and e["seq"] > start["seq"]
                    and e.get("fault") == start.get("fault")), None)
        if end is not None:
            out.append((start, end))
    return out


def first_invoke(history: History, invoke: dict[str, Any]) -> dict[str, Any]:
    """The first attempt of an upload (a client retry reuses the Idempotency-Key: the server may have created
    the attachment at the first attempt)."""
    while invoke.get("retry_of"):
        earlier = _invoke_of(history, invoke["retry_of"])
        if earlier is None:
            break
        invoke = earlier
    return invoke


def _invoke_of(history: History, op: str) -> dict[str, Any] | None:
    if hasattr(history, "where"):  # indexed once per history: a long run's checks call this per attachment
        found = history.where("invoke", "op", op)
        return found[-1] if found else None
    return next((e for e in reversed(history.of_type("invoke")) if e.get("op") == op), None)


def results(record: dict[str, Any]) -> list[str]:
    """Variant results the API reports for an attachment: what no expired job may have."""
    return [f"variant {v.get('name')} {v.get('key')}" for v in (record.get("body") or {}).get("variants") or []]


def objects(attachment_id: str, record: dict[str, Any], final: dict[str, Any]) -> list[str]:
    """Black box: any stored object besides the original whose key names the attachment."""
    original = ((record.get("body") or {}).get("original") or {}).get("key")
    return [f"object {o['key']}" for o in final.get("bucket_objects") or []
            if attachment_id in o.get("key", "") and o.get("key") != original]


def written_after(attachment_id: str, record: dict[str, Any], final: dict[str, Any], wall: float) -> list[dict[str, Any]]:
    """Listed objects naming the attachment (besides its original) whose Last-Modified is after ``wall``."""
    original = ((record.get("body") or {}).get("original") or {}).get("key")
    out = []
    for o in final.get("bucket_objects") or []:
        if attachment_id in o.get("key", "") and o.get("key") != original:
            modified = parse_time(o.get("last_modified"))
            if modified is not None and modified > wall:
                out.append(o)
    return out


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    checks = (run.get("scenario") or {}).get("checks") or []
    ttl: Any = timings_of(run).get("job_ttl_seconds")
    holds = consumer_holds(history, run)
    code = expiry_code(run)
    if not final_read_ok(final):
        if NAME in checks:
            return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
        return Verdict(NAME, VALID, REQUIREMENTS, "final state not read; nothing to judge", exercised=False,
                       seed=seed_of(run))
    records = final.get("attachments", {})
    accepted = accepted_attachments(history)
    problems, proven, fresh_ok, fresh_bad, leftovers, reported = [], [], [], [], [], 0
    # 1. Whatever is reported expired has no business effect, was never ready, and really waited its TTL.
    for attachment_id, acc in sorted(accepted.items()):
        record = records.get(attachment_id) or {}
        body = record.get("body") or {}
        if body.get("error_code") != code:
            continue
        reported += 1
        first = first_invoke(history, acc["invoke"])
        base: dict[str, Any] = dict(attachment_id=attachment_id, job_id=acc["ok"].get("job_id"), events=[first, acc["ok"]],
                    final_state=body.get("state"), error_code=code)
        was_ready = [e for e in history.of_type("state") if e.get("attachment_id") == attachment_id
                     and e.get("state") == "ready"] + [t for t in transitions_of(history, final, attachment_id)
                                                      if t["to"] == "ready"]
        found = results(record)
        ended = parse_time(body.get("updated_at"))
        if body.get("state") != "failed":
            problems.append(evidence(f"expired but not failed: {body.get('state')!r}", **base))
        if was_ready:
            problems.append(evidence("expired after it was ready", **base))
        if found:
            problems.append(evidence("expired work has a business effect", effects=found[:6], **base))
        elif objects(attachment_id, record, final):
            # An object stored after the job's deadline is an effect started past it (CONTRACT §5: expired work
            # must not start its effect; the seeds: re-check after a wait that may exceed the deadline). The
            # server stamped the deadline no later than the 202 + TTL; S3 dates whole seconds (rounded down).
            late = [o for o in written_after(attachment_id, record, final,
                                             acc["ok"]["wall"] + float(ttl) + LATE_WRITE_SLACK_SECONDS
                                             + IN_FLIGHT_WRITE_SECONDS)
                    ] if ttl is not None else []
            if late:
                problems.append(evidence("expired work wrote objects after its deadline (an effect started past "
                                         "it: expiry not re-checked after a long wait)",
                                         effects=[f"object {o['key']} at {o.get('last_modified')}" for o in late][:6],
                                         deadline_no_later_than=acc["ok"]["wall"] + float(ttl), **base))
            else:
                # Work that began before its TTL ran out may have written objects before its commit was refused:
                # unreferenced, like the after_s3_write_before_commit window; kept as a note (the contract asks
                # for no cleanup of them; held jobs: see 2.).
                leftovers.append(evidence("expired during its work: unreferenced objects left (warning)",
                                          effects=objects(attachment_id, record, final)[:6], **base))
        if ttl is not None and ended is not None and ended < first["wall"] + float(ttl) - 0.05:
            problems.append(evidence(f"reported expired {ended - first['wall']:.2f}s after upload, before its "
                                     f"TTL of {ttl}s", **base))
    # 2. Jobs whose TTL ran out while every consumer was held must expire; work after the release must not.
    for start, end in holds:
        if ttl is None:
            break
        back = min((t["at"] for a in accepted for t in transitions_of(history, final, a)
                    if t["to"] == "processing" and t["at"] is not None and t["at"] >= end["wall"]), default=None)
        for attachment_id, acc in sorted(accepted.items()):
            first = first_invoke(history, acc["invoke"])
            body = (records.get(attachment_id) or {}).get("body") or {}
            base = dict(attachment_id=attachment_id, job_id=acc["ok"].get("job_id"), events=[first, acc["ok"], end],
                        final_state=body.get("state"), error_code=body.get("error_code"), ttl_seconds=ttl,
                        released_wall=end["wall"], hold_lines=[start["line"], end["line"]])
            if acc["invoke"].get("kind") in ("bad", "poison", "heavy"):
                continue
            if acc["ok"]["wall"] + float(ttl) <= end["wall"] - SPAWN_SLACK_SECONDS:
                found = objects(attachment_id, records.get(attachment_id) or {}, final)
                if found:  # it expired before anyone could start it: nothing at all may have been done
                    problems.append(evidence("expired before any consumer was back, yet has objects",
                                             effects=found[:6], **base))
                elif body.get("state") == "failed" and body.get("error_code") == code:
                    proven.append(evidence("expired while every consumer was held: failed, no effect", **base))
                else:
                    problems.append(evidence(f"TTL ran out before any consumer was back, yet it ended "
                                             f"{body.get('state')!r} ({body.get('error_code')})", **base))
            elif back is not None and first["wall"] >= back:
                if body.get("state") == "ready":
                    fresh_ok.append(attachment_id)
                elif not expired_in_time(history, attachment_id, code, first["wall"], ttl):
                    fresh_bad.append(evidence(f"uploaded after the consumers were back, yet ended "
                                             f"{body.get('state')!r} ({body.get('error_code')})", **base))
    if proven or NAME in checks:  # other scenarios hold consumers too, with failures of their own making
        problems += fresh_bad
    # 3. Any scenario: nothing committed ready, and no object it names written, past the job's deadline.
    late, judged_late = past_deadline(history, final, run, accepted, ttl)
    problems += late
    note = "the expiry metric is judged by expiry_metric"
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} expiry violations",
                       evidence=problems + proven[:3], seed=seed_of(run))
    if proven and fresh_ok:
        return Verdict(NAME, VALID, REQUIREMENTS,
                       f"{len(proven)} jobs expired while consumers were held, none with an effect; "
                       f"{len(fresh_ok)} fresh uploads reached ready; {note}",
                       evidence=proven + [evidence("fresh uploads reached ready", attachment_ids=fresh_ok)] + leftovers,
                       seed=seed_of(run))
    rechecked = expired_after_a_claim_in_time(history, final, accepted, code, ttl) if not holds else []
    if rechecked and ttl is not None:
        # No consumer was held (the deadline passed during a slow fetch or render): jobs claimed in time then
        # expired (the re-check after the wait ran), and nothing was committed or written past a deadline.
        return Verdict(NAME, VALID, REQUIREMENTS,
                       f"{len(rechecked)} jobs claimed before their deadline expired during their work "
                       f"({reported} expired in all), none with an effect or a write past its deadline; "
                       f"{len(judged_late)} ready results committed in time; {note}", exercised=True,
                       evidence=rechecked[:6] + leftovers, seed=seed_of(run))
    paused = expired_while_paused(history, run, final, accepted, code, ttl) if not holds else []
    if paused:
        # Every consumer was paused (SIGSTOP) past the TTL of work that waited (clock-skew-expiry): like a hold,
        # what expired there was judged above — failed, never ready, no results, nothing written past its deadline.
        return Verdict(NAME, VALID, REQUIREMENTS,
                       f"{len(paused)} jobs whose TTL ran out while every consumer was paused expired ({reported} "
                       f"in all), none with an effect or a write past its deadline; {note}", exercised=True,
                       evidence=paused[:6] + leftovers, seed=seed_of(run))
    if NAME in checks:
        why = ("the adapter declares no job_ttl_seconds" if ttl is None else
               "no job expired, and no consumer was held" if not holds and not reported else
               (f"{reported} jobs expired, none after a claim before its deadline: the re-check after a long "
                "wait was not exercised") if not holds else
               "no job's TTL ran out while consumers were held" if not proven else
               "no upload came after the consumers were back")
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"expiry not proven: {why}", evidence=proven, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{reported} attachments reported expired, none with an effect" if reported
                   else "no job expired", exercised=bool(reported), seed=seed_of(run))
