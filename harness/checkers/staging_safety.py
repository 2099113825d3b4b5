"""Invariant 11 — staging safety (BE-JOB-001; window after_staging_before_record).

The original of every live or ready attachment still exists; objects no
attachment refers to (orphans of uploads that got no 202) are gone once the
declared staging retention plus a sweep interval has passed. An upload whose
outcome stayed unknown (no try of it answered 202 or refused) is neither lost
nor successful (CONTRACT §11): the server may have recorded it, so one old
unreferenced object of its size may be its live original — kept as a note,
not judged an orphan.

Which objects are staging objects is read from the API's ``original.key`` of the attachments, never guessed: the key
with the attachment's id cut out is a template (``staging/{id}``, ``{id}/original``, ``uploads/2026/11/{id}.bin``)
that no variant key may match; an implementation whose keys do not contain the id gives the folder all originals
share instead. A layout in which staging objects cannot be told apart from variants makes orphans unjudgeable:
``unknown`` where the scenario relies on this check.

An orphan still younger than the retention plus its grace at the final read proves nothing either way (the runner
waits the grace out before its final read in the scenarios that rely on this check, within a bound): ``unknown`` where
the scenario relies on it, with how young it was.

In a run whose scenario moves role clocks (``clock_skew``, harness/clock.py), a run without violations is
``unknown`` unless every skewed role's offset was shown in effect (verified or preloaded).
"""

from __future__ import annotations

from typing import Any, Callable

import re
from collections import Counter

from ..clock import unverified as unverified_skew
from ..history import History, Operation
from .base import (INVALID, UNKNOWN, VALID, Verdict, evidence, final_read_ok, missing_timings, parse_time, seed_of,
                   timing, undecided, FinalState, RunInfo)

NAME = "staging_safety"
REQUIREMENTS = ["BE-JOB-001"]
TIMINGS = ("staging_retention_seconds", "sweep_interval_seconds")


def unresolved_uploads(history: History) -> list[dict[str, Any]]:
    """The first try of every upload whose outcome stayed unknown: no try of the same sample got a 202 or a refusal."""
    tries: dict[str, list[Operation]] = {}
    for o in history.operations().values():
        if o["invoke"].get("f") == "upload":
            tries.setdefault(o["invoke"].get("sample") or o["invoke"]["op"], []).append(o)
    return [ops[0]["invoke"] for ops in tries.values()
            if not any(o["complete"] is not None and o["complete"]["type"] in ("ok", "fail") for o in ops)]


def grace_of(timings: dict[str, Any]) -> float | None:
    """How long after its staging an orphan must be gone: the declared retention, two sweeps and 2 s of slack."""
    retention, sweep = timings.get("staging_retention_seconds"), timings.get("sweep_interval_seconds")
    if retention is None or sweep is None:
        return None
    return float(retention) + 2 * float(sweep) + 2


def staging_layout(final: FinalState) -> tuple[str, Callable[[str], bool]] | None:
    """(description, predicate on an object key) of the staging area, from the API's ``original.key``; None when
    staging objects cannot be told apart from variants."""
    records = [(a, r.get("body") or {}) for a, r in (final.get("attachments") or {}).items()]
    originals: list[tuple[str, str]] = [(a, b["original"]["key"]) for a, b in records
                                        if (b.get("original") or {}).get("key")]
    variants = [v.get("key") or "" for _, b in records for v in b.get("variants") or []]
    if not originals:
        return None
    templates = {key.replace(a, "\0") for a, key in originals if a and a in key}
    if len(templates) == 1 and all(a in key for a, key in originals):
        template = next(iter(templates))
        pattern = re.compile("^" + "[^/]+".join(re.escape(part) for part in template.split("\0")) + "$")
        if not any(pattern.match(k) for k in variants):
            return template.replace("\0", "{id}"), lambda key: bool(pattern.match(key))
    keys = [key for _, key in originals]
    common = keys[0]
    for key in keys[1:]:
        while not key.startswith(common):
            common = common[:-1]
    folder = common[:common.rfind("/") + 1]
    if folder and not any(k.startswith(folder) for k in variants):
        return folder, lambda key: key.startswith(folder)
    return None


def skew_not_in_effect(skew: list[dict[str, Any]], notes: list[dict[str, Any]], run: RunInfo) -> Verdict:
    return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                   f"no violation, but the clock offset of {', '.join(sorted({str(e.get('role')) for e in skew}))} is "
                   f"not shown in effect ({'; '.join(sorted({str(e.get('status')) + ': ' + str(e.get('reason')) for e in skew}))}): "
                   "staging cleanup under clock skew not judged",
                   evidence=[evidence("clock offset not in effect", events=skew)] + notes, seed=seed_of(run))


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
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
    grace = None if lacking else grace_of({n: timing(run, n) for n in ("staging_retention_seconds",
                                                                        "sweep_interval_seconds")})
    # Only the staging area is subject to retention (variant objects of work that never committed are an
    # implementation's business: they are rewritten on redelivery). Its layout comes from original.key.
    layout = staging_layout(final)
    asked = NAME in ((run.get("scenario") or {}).get("checks") or [])
    if layout is None:
        if problems:
            return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} staging safety violations",
                           evidence=problems, seed=seed_of(run))
        skew = unverified_skew(history)
        if skew:
            return skew_not_in_effect(skew, [], run)
        return undecided(NAME, REQUIREMENTS, "originals intact, but the staging layout cannot be told apart from the "
                         "variants' (from original.key): orphans not judged", asked, seed_of(run),
                         [evidence("originals", keys=sorted({(r.get("body") or {}).get("original", {}).get("key")
                                                             for r in final["attachments"].values()} - {None})[:5])])
    staging, is_staging = layout
    orphans = [o for o in listing if o.get("key") not in referenced and is_staging(o.get("key") or "")]
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
        return skew_not_in_effect(skew, notes, run)
    young = [o for o in orphans if o not in expired]
    if young:  # the final read came before their retention ran out: their cleanup was not put to the test
        ages = [round(read_at - modified, 1) for o in young
                if read_at and (modified := parse_time(o.get("last_modified")))]
        return undecided(NAME, REQUIREMENTS, f"originals intact; {len(young)} young orphans under {staging!r} (aged "
                         f"{min(ages, default='?')}-{max(ages, default='?')} s at the final read, retention + grace "
                         f"{grace} s): their cleanup not judged", asked, seed_of(run),
                         [evidence("orphans younger than the retention at the final read",
                                   keys=[o.get("key") for o in young[:10]], ages=ages[:10])] + notes,
                         unknown_prefix="staging retention not exercised", idle_prefix="not exercised")
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"originals intact; {len(orphans)} orphans under {staging!r}, none left past retention",
                   exercised=bool(final.get("attachments")) or bool(orphans), evidence=notes, seed=seed_of(run))
