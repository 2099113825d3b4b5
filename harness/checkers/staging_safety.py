"""Invariant 11 — staging safety (BE-JOB-001; window after_staging_before_record).

The original of every live or ready attachment still exists; objects no
attachment refers to (orphans of uploads that got no 202) are gone once the
declared staging retention plus a sweep interval has passed. An upload whose
outcome stayed unknown (no try of it answered 202 or refused) is neither lost
nor successful (CONTRACT §11): the server may have recorded it, so one old
unreferenced object of its size may be its live original — kept as a note,
not judged an orphan.

In a run whose scenario moves role clocks (``clock_skew``, harness/clock.py), a run without violations is
``unknown`` unless every skewed role's offset was shown in effect (verified or preloaded).
"""

from __future__ import annotations

from collections import Counter

from ..clock import unverified as unverified_skew
from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, final_read_ok, missing_timings, parse_time, seed_of, timing

NAME = "staging_safety"
REQUIREMENTS = ["BE-JOB-001"]


def unresolved_uploads(history) -> list[dict]:
    """The first try of every upload whose outcome stayed unknown: no try of the same sample got a 202 or a refusal."""
    tries: dict[str, list[dict]] = {}
    for o in history.operations().values():
        if o["invoke"].get("f") == "upload":
            tries.setdefault(o["invoke"].get("sample") or o["invoke"]["op"], []).append(o)
    return [ops[0]["invoke"] for ops in tries.values()
            if not any(o["complete"] is not None and o["complete"]["type"] in ("ok", "fail") for o in ops)]


def check(history, final, run) -> Verdict:
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
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
    lacking = missing_timings(run, "staging_retention_seconds", "sweep_interval_seconds")
    grace = None if lacking else (timing(run, "staging_retention_seconds") + 2 * timing(run, "sweep_interval_seconds")
                                  + 2)
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
    if orphans and grace is None and not problems:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(orphans)} orphan objects under {staging!r}, but the adapter "
                       f"declares no {' / '.join(lacking)}: their retention cannot be judged",
                       evidence=[evidence("orphans", keys=[o.get("key") for o in orphans[:10]])], seed=seed_of(run))
    expired = [o for o in orphans if grace is not None and read_at
               and (parse_time(o.get("last_modified")) or read_at) < read_at - grace]
    unknown_sizes = Counter(e.get("size") for e in unresolved_uploads(history) if e.get("size") is not None)
    notes = []
    for o in expired:
        if unknown_sizes.get(o.get("size"), 0) > 0:
            unknown_sizes[o.get("size")] -= 1
            notes.append(evidence("old unreferenced object the size of an upload whose outcome stayed unknown: "
                                  "possibly the original of work the server accepted", key=o.get("key"),
                                  size=o.get("size"), last_modified=o.get("last_modified")))
            continue
        problems.append(evidence("orphan object outlived its retention", key=o.get("key"),
                                 last_modified=o.get("last_modified"), retention_plus_grace=grace))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} staging safety violations",
                       evidence=problems + notes, seed=seed_of(run))
    skew = unverified_skew(history)
    if skew:  # the scenario moved some role's clock: nothing found proves nothing unless the offset took effect
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"no violation, but the clock offset of {', '.join(sorted({e.get('role') for e in skew}))} is "
                       f"not shown in effect ({'; '.join(sorted({e.get('status') + ': ' + str(e.get('reason')) for e in skew}))}): "
                       "staging cleanup under clock skew not judged",
                       evidence=[evidence("clock offset not in effect", events=skew)] + notes, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"originals intact; {len(orphans)} young orphans under {staging!r}, none past retention"
                   if staging else "originals intact; staging folder not identifiable, orphans not judged",
                   exercised=bool(final.get("attachments")) or bool(orphans), evidence=notes, seed=seed_of(run))
