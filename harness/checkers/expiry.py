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
"""

from __future__ import annotations

from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, consumer_roles, evidence, expiry_code, final_read_ok,
                   parse_time, seed_of, timings_of, transitions_of)

NAME = "expiry"
REQUIREMENTS = ["BE-JOB-005"]
# A consumer cannot claim anything in the first instant after its (re)start: the release line is written just
# after the spawn, so a TTL that ran out this long before it ran out before any claim.
SPAWN_SLACK_SECONDS = 0.1
# S3 Last-Modified has whole seconds (rounded down) and a PUT started just before the deadline may be dated a
# moment after it: only a write this long after the latest possible deadline counts as started past it.
LATE_WRITE_SLACK_SECONDS = 1.0


def expired_in_time(history, attachment_id: str, code: str, sent_wall: float, ttl: float) -> bool:
    """Whether the attachment was first seen failed with the expiry code no earlier than its upload was sent + TTL
    (harness clock): a correct expiry of work that waited out its TTL — behind a backlog on a slow machine, say —
    which proves nothing either way about fresh work reaching ``ready``."""
    seen = next((e for e in history.of_type("state") if e.get("attachment_id") == attachment_id
                 and e.get("state") == "failed" and e.get("error_code") == code), None)
    return seen is not None and seen["wall"] >= sent_wall + float(ttl) - 0.05


def consumer_holds(history, run) -> list[tuple[dict, dict]]:
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


def first_invoke(history, invoke: dict) -> dict:
    """The first attempt of an upload (a client retry reuses the Idempotency-Key: the server may have created
    the attachment at the first attempt)."""
    while invoke.get("retry_of"):
        earlier = _invoke_of(history, invoke["retry_of"])
        if earlier is None:
            break
        invoke = earlier
    return invoke


def _invoke_of(history, op: str) -> dict | None:
    if hasattr(history, "where"):  # indexed once per history: a long run's checks call this per attachment
        found = history.where("invoke", "op", op)
        return found[-1] if found else None
    return next((e for e in reversed(history.of_type("invoke")) if e.get("op") == op), None)


def results(record: dict) -> list[str]:
    """Variant results the API reports for an attachment: what no expired job may have."""
    return [f"variant {v.get('name')} {v.get('key')}" for v in (record.get("body") or {}).get("variants") or []]


def objects(attachment_id: str, record: dict, final: dict) -> list[str]:
    """Black box: any stored object besides the original whose key names the attachment."""
    original = ((record.get("body") or {}).get("original") or {}).get("key")
    return [f"object {o['key']}" for o in final.get("bucket_objects") or []
            if attachment_id in o.get("key", "") and o.get("key") != original]


def written_after(attachment_id: str, record: dict, final: dict, wall: float) -> list[dict]:
    """Listed objects naming the attachment (besides its original) whose Last-Modified is after ``wall``."""
    original = ((record.get("body") or {}).get("original") or {}).get("key")
    out = []
    for o in final.get("bucket_objects") or []:
        if attachment_id in o.get("key", "") and o.get("key") != original:
            modified = parse_time(o.get("last_modified"))
            if modified is not None and modified > wall:
                out.append(o)
    return out


def check(history, final, run) -> Verdict:
    checks = (run.get("scenario") or {}).get("checks") or []
    ttl = timings_of(run).get("job_ttl_seconds")
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
        base = dict(attachment_id=attachment_id, job_id=acc["ok"].get("job_id"), events=[first, acc["ok"]],
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
                                             acc["ok"]["wall"] + float(ttl) + LATE_WRITE_SLACK_SECONDS)
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
    if reported and not holds and ttl is not None:
        # No consumer was held (e.g. the deadline passed during a slow fetch or render): what expired was
        # judged above — failed, never ready, no results, nothing written past its deadline.
        return Verdict(NAME, VALID, REQUIREMENTS,
                       f"{reported} attachments expired during their work, none with an effect or a write past its "
                       f"deadline; {note}", exercised=True, evidence=leftovers, seed=seed_of(run))
    if NAME in checks:
        why = ("the adapter declares no job_ttl_seconds" if ttl is None else
               "no job expired, and no consumer was held" if not holds else
               "no job's TTL ran out while consumers were held" if not proven else
               "no upload came after the consumers were back")
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"expiry not proven: {why}", evidence=proven, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{reported} attachments reported expired, none with an effect" if reported
                   else "no job expired", exercised=bool(reported), seed=seed_of(run))
