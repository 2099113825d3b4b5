"""Invariant 2 — no duplicate effects (BE-JOB-002).

Per (attachment, pipeline_version) ``ready`` is reached once; per effect key
(attachment, pipeline_version, variant) one published result; each stored
object's bytes match the recorded checksum; no variant object is rewritten
after its result was published (a second irreversible effect after redelivery).
"""

from __future__ import annotations

from collections import Counter

from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, final_read_ok,
                   parse_time, seed_of, transitions_of)

NAME = "duplicate_effects"
REQUIREMENTS = ["BE-JOB-002"]
# Object stores report Last-Modified in whole seconds; allow that much skew before calling a rewrite.
REWRITE_SLACK_SECONDS = 1.5


def check(history, final, run) -> Verdict:
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
        observed_ready = [e for e in history.of_type("transition")
                          if e.get("attachment_id") == attachment_id and e.get("to") == "ready"]
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
        objects = record.get("objects") or {}
        ready_at = readies[-1]["at"] if readies else parse_time(body.get("updated_at"))
        for item in ([body.get("original")] if body.get("original") else []) + list(variants):
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
            modified = parse_time(obj.get("last_modified"))
            if item is not body.get("original") and ready_at and modified and modified > ready_at + REWRITE_SLACK_SECONDS:
                problems.append(evidence(
                    f"variant object {key!r} rewritten {modified - ready_at:.1f}s after ready was published",
                    attachment_id=attachment_id, ready_at=readies[-1]["at_text"] if readies else body.get("updated_at"),
                    last_modified=obj.get("last_modified")))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} duplicate or inconsistent effects",
                       evidence=problems, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"one ready and one result per effect key; {checked} objects match their checksums",
                   exercised=bool(final.get("attachments")), seed=seed_of(run))
