"""Controlled replay (BE-JOB-003, level 4): only an authenticated operator can replay a failed job, the
replay is a recorded failed→queued transition by the operator with a new attempt, and it ends terminal again."""

from __future__ import annotations

from .base import INVALID, TERMINAL_STATES, VALID, Verdict, evidence, seed_of, transitions_of

NAME = "replay_audit"
REQUIREMENTS = ["BE-JOB-003"]


def check(history, final, run) -> Verdict:
    replays = [e for e in history.of_type("ok", "fail") if e.get("f") == "replay"]
    problems, proven = [], []
    for r in replays:
        attachment_id = r.get("attachment_id")
        base = dict(attachment_id=attachment_id, events=[r])
        if r.get("unauthenticated_status") not in (401, 403):
            problems.append(evidence(f"replay without a token answered {r.get('unauthenticated_status')}, not 401",
                                     **base))
        if r["type"] != "ok":
            problems.append(evidence(f"operator replay of a failed job answered {r.get('status')}, not 202", **base))
            continue
        trans = transitions_of(history, final or {}, attachment_id)
        replayed = [t for t in trans if (t["from"], t["to"]) == ("failed", "queued")]
        if not replayed:
            problems.append(evidence("replay accepted (202) but no failed→queued transition recorded", **base))
            continue
        t = replayed[-1]
        before = [p for p in trans if (p["seq"] or 0) < (t["seq"] or 0) and isinstance(p["attempt"], int)]
        if before and isinstance(t["attempt"], int) and t["attempt"] <= max(p["attempt"] for p in before):
            problems.append(evidence("replay did not start a new attempt", attempt=t["attempt"], **base))
        if not (t["actor"] or "").startswith(("operator", "admin")):
            problems.append(evidence(f"replay recorded with actor {t['actor']!r}, not the operator", **base))
        if trans and trans[-1]["to"] not in TERMINAL_STATES:
            problems.append(evidence(f"replayed job did not end terminal: {trans[-1]['to']!r}", **base))
        else:
            proven.append(evidence("replayed by the operator with a new attempt, audited, terminal again",
                                   attempt=t["attempt"], actor=t["actor"], **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} replay contract violations", evidence=problems,
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(proven)} operator replays audited and bounded" if proven else "no replay performed",
                   exercised=bool(proven), evidence=proven, seed=seed_of(run))
