"""Controlled replay (BE-JOB-003, level 4): only an authenticated operator can replay a failed job, the
replay is a recorded failed→queued transition with a new attempt, and it ends terminal again.

The replay is known from the call the harness made, not from the event's ``actor``; the new attempt is read
under either attempt convention of CONTRACT §5 (on the failed→queued transition, or on the claim after it).
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, attempt_after, evidence, has_capability,
                   seed_of, transitions_of, FinalState, RunInfo)

NAME = "replay_audit"
REQUIREMENTS = ["BE-JOB-003"]
NEEDS = (("events", "capabilities.events (GET /v1/attachments/{id}/events, or [events] sql)"),)


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    replays = [e for e in history.of_type("ok", "fail") if e.get("f") == "replay"]
    if replays and not has_capability(run, "events"):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(replays)} replays asked for, but the implementation exposes "
                       "no events: the audit record and the new attempt cannot be observed", seed=seed_of(run))
    problems, proven = [], []
    for r in replays:
        attachment_id = r.get("attachment_id")
        base: dict[str, Any] = dict(attachment_id=attachment_id, events=[r])
        if r.get("unauthenticated_status") not in (401, 403):
            problems.append(evidence(f"replay without a token answered {r.get('unauthenticated_status')}, not 401",
                                     **base))
        if r["type"] != "ok":
            problems.append(evidence(f"operator replay of a failed job answered {r.get('status')}, not 202", **base))
            continue
        trans = transitions_of(history, final or {}, attachment_id)
        replayed = [i for i, t in enumerate(trans) if (t["from"], t["to"]) == ("failed", "queued")]
        if not replayed:
            problems.append(evidence("replay accepted (202) but no failed→queued transition recorded", **base))
            continue
        index = replayed[-1]
        t = trans[index]
        attempt = attempt_after(trans, index)
        earlier = [p["attempt"] for p in trans[:index] if isinstance(p["attempt"], int)]
        if earlier and (attempt is None or attempt <= max(earlier)):
            problems.append(evidence("replay did not start a new attempt (neither on failed→queued nor on the "
                                     "next claim)", attempt=attempt, earlier_attempts=max(earlier), **base))
        if trans and trans[-1]["to"] not in TERMINAL_STATES:
            problems.append(evidence(f"replayed job did not end terminal: {trans[-1]['to']!r}", **base))
        else:
            proven.append(evidence("replayed by the operator with a new attempt, audited, terminal again",
                                   attempt=attempt, actor=t["actor"], **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} replay contract violations", evidence=problems,
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(proven)} operator replays audited and bounded" if proven else "no replay performed",
                   exercised=bool(proven), evidence=proven, seed=seed_of(run))
