"""Invariant 2 — no duplicate effects (BE-JOB-002).

Per (attachment, pipeline_version) ``ready`` is reached once; per effect key
(attachment, pipeline_version, variant) one published result; each stored
object's bytes match the recorded checksum; no variant object is rewritten
after its result was published (a second irreversible effect after redelivery): each key a ``ready`` result names is
snapshotted (ETag, version, size, Last-Modified) when ready is first seen, before any redelivery the harness causes,
and any change of it later is a rewrite however soon; without a snapshot, Last-Modified more than the slack after
ready is.
"""

from __future__ import annotations

from typing import Any

from collections import Counter

from ..history import History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, final_read_ok,
                   parse_time, seed_of, transitions_of, FinalState, RunInfo)

NAME = "duplicate_effects"
REQUIREMENTS = ["BE-JOB-002"]
# Object stores report Last-Modified in whole seconds; allow that much skew before calling a rewrite.
REWRITE_SLACK_SECONDS = 1.5


# What an object store says of one stored version of an object: any change of these is a new write.
MARKS = ("etag", "version_id", "size", "last_modified")


def _norm(mark: str, value: Any) -> Any:
    if mark == "last_modified":
        return parse_time(value)
    return str(value).strip('"') if mark == "etag" else value


def _where(history: History, type_: str, field: str, value: Any) -> list[dict[str, Any]]:
    """Indexed when the history can (a long run's history: not a scan per attachment), else a scan."""
    if hasattr(history, "where"):
        return history.where(type_, field, value)
    return [e for e in history.of_type(type_) if e.get(field) == value]


def _changed_since_ready(history: History, attachment_id: str, item: dict[str, Any], obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The object at a key a ``ready`` result named, as snapshotted when ready was first seen (``snapshot`` lines,
    harness/ready_snapshot.py), against every later look at it: the object watcher's writes and the final read. Any
    mark that differs (ETag, version, size, or Last-Modified even within its one-second resolution) is a rewrite
    after ready, whatever the timing; a mark one side lacks is not compared (nor Last-Modified between a HEAD and a
    listing: their resolutions differ)."""
    key = item.get("key")
    snaps = [e for e in _where(history, "snapshot", "attachment_id", attachment_id)
             if e.get("key") == key and e.get("exists")]
    if not snaps:
        return []
    snap = snaps[0]
    later = [("object watcher", e) for e in _where(history, "object", "key", key) if e["seq"] > snap["seq"]]
    later.append(("final read", obj))
    for source, seen in later:
        # A listing reports Last-Modified in milliseconds, a HEAD or GET in whole seconds: compared like with like.
        marks = [m for m in MARKS if not (source == "object watcher" and m == "last_modified")]
        differs = [m for m in marks if snap.get(m) is not None and seen.get(m) is not None
                   and _norm(m, snap[m]) != _norm(m, seen[m])]
        if differs:
            return [evidence(f"variant object {key!r} rewritten after ready was published ({', '.join(differs)} "
                             f"changed since the snapshot taken when ready was first seen; seen by the {source})",
                             attachment_id=attachment_id, variant=item.get("name"),
                             snapshot={m: snap.get(m) for m in MARKS}, later={m: seen.get(m) for m in MARKS},
                             events=[snap] + ([seen] if source == "object watcher" else []))]
    return []


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
    accepted = accepted_attachments(history)
    problems = []
    checked = 0
    for attachment_id, record in sorted(final.get("attachments", {}).items()):
        if record.get("status") != 200:
            continue
        body = record.get("body") or {}
        version = body.get("pipeline_version")
        ok_event = accepted.get(attachment_id, {}).get("ok")
        trans = transitions_of(history, final, attachment_id)
        readies = [t for t in trans if t["to"] == "ready"]
        if len(readies) > 1:
            problems.append(evidence(
                f"ready reached {len(readies)} times for pipeline_version {version}",
                attachment_id=attachment_id, job_id=(ok_event or {}).get("job_id"), events=[ok_event],
                ready_transitions=[{"seq": t["seq"], "at": t["at_text"], "attempt": t["attempt"], "actor": t["actor"]}
                                   for t in readies]))
        observed_ready = [e for e in _where(history, "transition", "attachment_id", attachment_id)
                          if e.get("to") == "ready"
                          and e.get("pipeline_version") in (None, version)]  # level 5: per version
        if len(observed_ready) > 1 and len(readies) <= 1:
            problems.append(evidence("ready observed more than once during the run", attachment_id=attachment_id,
                                     events=observed_ready))
        variants = body.get("variants") or []
        names = Counter(v.get("name") for v in variants)
        for name, count in names.items():
            if count > 1:
                problems.append(evidence(f"variant {name!r} published {count} times", attachment_id=attachment_id))
        keys = Counter(v.get("key") for v in variants)
        for key, count in keys.items():
            if count > 1:
                problems.append(evidence(f"object key {key!r} used by {count} variants", attachment_id=attachment_id))
        final_keys = {v.get("name"): v.get("key") for v in variants}
        for snap in _where(history, "snapshot", "attachment_id", attachment_id):
            if snap.get("pipeline_version") not in (None, version):
                continue  # level 5: another version's result (GET serves the newest ready one; version_isolation)
            if final_keys.get(snap.get("variant"), snap.get("key")) != snap.get("key"):
                problems.append(evidence(
                    f"variant {snap.get('variant')!r} published at {snap.get('key')!r} when ready was first seen, "
                    f"at {final_keys[snap.get('variant')]!r} at the final read: the result was replaced after ready",
                    attachment_id=attachment_id, events=[snap]))
        objects = record.get("objects") or {}
        ready_at = readies[-1]["at"] if readies else parse_time(body.get("updated_at"))
        items: list[dict[str, Any]] = ([body["original"]] if body.get("original") else []) + list(variants)
        for item in items:
            key = item.get("key")
            obj = objects.get(key)
            if obj is None:
                continue
            checked += 1
            if not obj.get("exists"):
                # An original may go once the attachment is terminal: after its results are published (ready), or
                # under the documented retention of failed work (CONTRACT §8; staging_safety judges originals).
                if item is not body.get("original") or body.get("state") not in TERMINAL_STATES:
                    problems.append(evidence(f"published object {key!r} is missing from S3",
                                             attachment_id=attachment_id, variant=item.get("name")))
                continue
            if item.get("sha256") and obj.get("sha256") and obj["sha256"] != item["sha256"]:
                problems.append(evidence(f"object {key!r} bytes do not match the recorded sha256",
                                         attachment_id=attachment_id, recorded=item["sha256"], actual=obj["sha256"]))
            if item.get("size") is not None and obj.get("size") is not None and obj["size"] != item["size"]:
                problems.append(evidence(f"object {key!r} size differs from the recorded size",
                                         attachment_id=attachment_id, recorded=item["size"], actual=obj["size"]))
            if item is not body.get("original"):
                problems.extend(_changed_since_ready(history, attachment_id, item, obj))
            modified = parse_time(obj.get("last_modified"))
            if item is not body.get("original") and ready_at and modified and modified > ready_at + REWRITE_SLACK_SECONDS:
                problems.append(evidence(
                    f"variant object {key!r} rewritten {modified - ready_at:.1f}s after ready was published",
                    attachment_id=attachment_id, ready_at=readies[-1]["at_text"] if readies else body.get("updated_at"),
                    last_modified=obj.get("last_modified")))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} duplicate or inconsistent effects",
                       evidence=problems, seed=seed_of(run))
    snapshotted = len({(e.get("attachment_id"), e.get("key")) for e in history.of_type("snapshot") if e.get("exists")})
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"one ready and one result per effect key; {checked} objects match their checksums; "
                   + (f"{snapshotted} variant objects unchanged since ready was first seen (ETag, size, Last-Modified)"
                      if snapshotted else "no snapshot at ready: a rewrite is judged by Last-Modified alone "
                      f"(more than {REWRITE_SLACK_SECONDS:g}s after ready)"),
                   exercised=bool(final.get("attachments")), seed=seed_of(run))
