"""Invariant 11 — staging safety (BE-JOB-001; window after_staging_before_record).

The original of every live or ready attachment still exists; objects no
attachment refers to (orphans of uploads that got no 202) are gone once the
declared staging retention plus a sweep interval has passed.
"""

from __future__ import annotations

from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, final_read_ok, parse_time, seed_of, timings_of

NAME = "staging_safety"
REQUIREMENTS = ["BE-JOB-001"]


def check(history, final, run) -> Verdict:
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
    timings = timings_of(run)
    problems = []
    referenced = set()
    for attachment_id, record in final.get("attachments", {}).items():
        body = record.get("body") or {}
        original = body.get("original") or {}
        for item in [original] + list(body.get("variants") or []):
            if item.get("key"):
                referenced.add(item["key"])
        obj = (record.get("objects") or {}).get(original.get("key"))
        if obj is not None and not obj.get("exists") and body.get("state") != "failed":
            problems.append(evidence("original deleted while the attachment is live or ready",
                                     attachment_id=attachment_id, key=original.get("key"), state=body.get("state")))
    listing = final.get("bucket_objects")
    if listing is None:
        return Verdict(NAME, UNKNOWN if not problems else INVALID, REQUIREMENTS, "bucket listing not recorded",
                       evidence=problems, seed=seed_of(run))
    read_at = parse_time(final.get("read_at"))
    grace = float(timings.get("staging_retention_seconds", 86400)) + 2 * float(
        timings.get("sweep_interval_seconds", 30)) + 2
    # Only the staging area is subject to retention: the folder all originals share. Variant objects of work
    # that never committed are an implementation's business (they are rewritten on redelivery).
    original_keys = [(r.get("body") or {}).get("original", {}).get("key") or "" for r in final["attachments"].values()]
    prefixes = {k.split("/", 1)[0] + "/" for k in original_keys if "/" in k}
    variant_keys = [v.get("key") or "" for r in final["attachments"].values()
                    for v in (r.get("body") or {}).get("variants") or []]
    staging = next(iter(prefixes)) if len(prefixes) == 1 else None
    if staging and any(k.startswith(staging) for k in variant_keys):
        staging = None  # originals and variants share a folder: cannot tell staging objects apart
    orphans = [o for o in listing if o.get("key") not in referenced and staging and o["key"].startswith(staging)]
    expired = [o for o in orphans if read_at and (parse_time(o.get("last_modified")) or read_at) < read_at - grace]
    for o in expired:
        problems.append(evidence("orphan object outlived its retention", key=o.get("key"),
                                 last_modified=o.get("last_modified"), retention_plus_grace=grace))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} staging safety violations", evidence=problems,
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"originals intact; {len(orphans)} young orphans under {staging!r}, none past retention"
                   if staging else "originals intact; staging folder not identifiable, orphans not judged",
                   exercised=bool(final.get("attachments")) or bool(orphans), seed=seed_of(run))
