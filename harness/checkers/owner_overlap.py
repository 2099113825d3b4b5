"""The old and the new owner at work at once (BE-JOB-006.3).

A consumer paused past its lease holds a job; the job is recovered and claimed anew while it sleeps. When the old
owner wakes *before the new claim has ended*, both are at work on one job at once — the case fencing exists for:
the stale owner's commit must be rejected while the new owner is still rendering, writing and committing. This
check is exercised only when such an overlap was seen (the newer claim began before SIGCONT and ended after it);
a new owner that was already done when the old one woke proves nothing here (``lease_ownership`` covers it).

Invalid: any transition out of ``processing`` by the stale attempt (a lower attempt number) once the newer claim
began — in particular one committed while the new owner was still working — and any ``ready`` committed by the old
owner after the newer claim began whatever attempt it carries (its actor is the old claim's, not the new one's:
``lease_ownership.stale_commits``). A claim that ended ``ready`` after the old owner woke, with actors that do not
tell the two owners apart, is judged by the claims' order instead: actors are free wording and may name a role, not
an instance (CONTRACT §5), so a commit stamped with the newest claim's attempt, higher than the paused owner's, is the
newest claim's (a stale commit stamped with its own, lower attempt is a finding above; one stamped with the row's
current attempt is fenced by effects: ``duplicate_effects``). Only when neither actors nor attempts tell the claims
apart (a recovery that spends no attempt, with role-level actors) is it ``unknown`` where the scenario relies on this
check: the commit cannot be attributed. ``ready`` once per job is ``duplicate_effects``'s.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, consumer_roles, evidence, seed_of, timing, transitions_of, FinalState, RunInfo)
from .ack_after_commit import in_flight_at
from .base import undecided
from .lease_ownership import pauses, stale_commits

NAME = "owner_overlap"
REQUIREMENTS = ["BE-JOB-006"]
TIMINGS = ("lease_seconds",)


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    lease = timing(run, "lease_seconds")
    paused = pauses(history, consumer_roles(run))
    if not paused:
        return Verdict(NAME, VALID, REQUIREMENTS, "no consumer was paused: no old owner to overlap a new one",
                       exercised=False, seed=seed_of(run))
    if lease is None:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "a consumer was paused, but the adapter declares no "
                       "lease_seconds: cannot tell whether it lost its lease", seed=seed_of(run))
    ids = sorted(set((final or {}).get("attachments", {})))
    problems, overlaps, apart, unattributed = [], [], 0, []
    for stop, cont in paused:
        if cont is None or cont["wall"] - stop["wall"] <= lease:
            continue
        for attachment_id in ids:
            trans = transitions_of(history, final or {}, attachment_id)
            flight = in_flight_at(trans, stop["wall"])
            if flight is None or not isinstance(flight["attempt"], int):
                continue
            later = [t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0) and t["at"] is not None]
            new_claim = next((t for t in later if t["to"] == "processing" and t["at"] < cont["wall"]), None)
            if new_claim is None:
                continue
            after = [t for t in later if (t["seq"] or 0) > (new_claim["seq"] or 0)]
            ended = next((t for t in after if t["from"] == "processing"
                          and (not isinstance(t["attempt"], int) or t["attempt"] >= (new_claim["attempt"] or 0))),
                         None)
            base: dict[str, Any] = dict(attachment_id=attachment_id, events=[stop, cont], stale_attempt=flight["attempt"],
                        new_attempt=new_claim["attempt"], new_claim_at=new_claim["at_text"],
                        new_claim_ended_at=ended and ended["at_text"])
            for t in after:
                if t["from"] == "processing" and isinstance(t["attempt"], int) and t["attempt"] < (
                        new_claim["attempt"] if isinstance(new_claim["attempt"], int) else flight["attempt"] + 1):
                    during = ended is None or t["at"] < ended["at"]
                    problems.append(evidence(
                        f"stale owner (attempt {t['attempt']}) wrote {t['from']}→{t['to']} after attempt "
                        f"{new_claim['attempt']} claimed" + (" while the new owner was still working" if during else ""),
                        seq=t["seq"], at=t["at_text"], **base))
            flagged = {p.get("seq") for p in problems if p.get("attachment_id") == attachment_id}
            for t, older, newer in stale_commits(trans):
                if (t["seq"] or 0) > (new_claim["seq"] or 0) and t["seq"] not in flagged:
                    during = ended is None or ended is t or t["at"] < ended["at"]
                    problems.append(evidence(
                        f"stale owner ({older['actor']}) committed {t['from']}→{t['to']} after {newer['actor']} "
                        f"claimed (stamped attempt {t['attempt']})"
                        + (" while the new owner was still working" if during else ""),
                        seq=t["seq"], at=t["at_text"], **base))
            by_actor = bool(ended and ended.get("actor") and ended["actor"] == new_claim.get("actor")
                            and new_claim.get("actor") != flight.get("actor"))
            # Actors that do not tell owners apart (a role's name): the claims' own order does, when the new claim took
            # a higher attempt and the commit carries it.
            by_order = bool(ended and not by_actor and ended.get("actor") == new_claim.get("actor")
                            and all(isinstance(x, int) for x in (ended["attempt"], new_claim["attempt"],
                                                                 flight["attempt"]))
                            and ended["attempt"] >= new_claim["attempt"] > flight["attempt"])
            if ended is not None and ended["to"] == "ready" and ended["at"] > cont["wall"] and not (
                    by_actor or by_order):
                # Both owners were awake when the claim ended: neither the actor nor the attempts say whose it was.
                unattributed.append(evidence(
                    "the new claim ended ready after the old owner woke, and the events' actor does not tell "
                    "whose commit it was", actors={"stale_claim": flight.get("actor"),
                                                   "new_claim": new_claim.get("actor"), "commit": ended.get("actor")},
                    **base))
            if ended is None or ended["at"] > cont["wall"]:
                overlaps.append(evidence(
                    f"old owner woke {cont['wall'] - new_claim['at']:.1f}s into the new owner's claim, "
                    + (f"{ended['at'] - cont['wall']:.1f}s before it ended {ended['to']}" if ended else
                       "which never ended")
                    + (f" (the commit attributed to the newest claim by attempt order: attempt {ended['attempt']} of "
                       f"the claim at {new_claim['at_text']}, the paused owner's was {flight['attempt']}; the actors "
                       f"({new_claim.get('actor')!r}) name no instance)" if ended and by_order and not by_actor else ""),
                    **base))
            else:
                apart += 1
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} stale writes beside a new owner",
                       evidence=problems, seed=seed_of(run))
    if unattributed:
        return undecided(NAME, REQUIREMENTS, f"{len(unattributed)} claims ended ready beside a woken old owner, and "
                         "the events' actor does not tell the owners apart: a stale commit stamped with the current "
                         "attempt would look the same", NAME in ((run.get("scenario") or {}).get("checks") or []),
                         seed_of(run), unattributed, unknown_prefix="cannot tell whose commit it was")
    if overlaps:
        return Verdict(NAME, VALID, REQUIREMENTS, f"{len(overlaps)} jobs had the old and the new owner at work at "
                       "once; the stale owner wrote nothing", evidence=overlaps, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   "not exercised: " + (f"{apart} new owners were done before the old one woke" if apart else
                                        "no job of a consumer paused past its lease was claimed anew while it slept"),
                   exercised=False, seed=seed_of(run))
