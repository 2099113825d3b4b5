"""Invariant 6 — ownership (BE-JOB-006).

When a worker is paused longer than its lease, the job it held is recovered
and finished by someone else while it sleeps, and once it wakes its stale
writes are rejected: no transition by an older attempt after a newer attempt
started, and ready stays single (see duplicate_effects).
"""

from __future__ import annotations

from .ack_after_commit import in_flight_at, role_kind
from .base import INVALID, TERMINAL_STATES, VALID, Verdict, evidence, level_of, seed_of, timings_of, transitions_of

NAME = "lease_ownership"
REQUIREMENTS = ["BE-JOB-006"]


def pauses(history) -> list[tuple[dict, dict | None]]:
    """(sigstop event, matching sigcont event or None) for worker pauses."""
    out = []
    stops = [e for e in history.of_type("fault") if e.get("action") == "sigstop" and role_kind(e.get("role")) == "worker"]
    conts = [e for e in history.of_type("fault") if e.get("action") == "sigcont"]
    for stop in stops:
        cont = next((c for c in conts if c.get("role") == stop.get("role") and c["seq"] > stop["seq"]), None)
        out.append((stop, cont))
    return out


def check(history, final, run) -> Verdict:
    lease = float(timings_of(run).get("lease_seconds", 30))
    ids = sorted(set((final or {}).get("attachments", {})))
    problems, proven = [], []
    # Fencing, over the whole run: once attempt n+1 has claimed, attempt n writes nothing more.
    for attachment_id in ids:
        trans = transitions_of(history, final, attachment_id)
        newest = 0
        for t in trans:
            a = t["attempt"] if isinstance(t["attempt"], int) else None
            if a is None:
                continue
            if a < newest and t["from"] == "processing":
                problems.append(evidence(f"stale owner (attempt {a}) wrote {t['from']}→{t['to']} after attempt "
                                         f"{newest} claimed", attachment_id=attachment_id, seq=t["seq"], at=t["at_text"]))
            newest = max(newest, a)
    exercised = False
    for stop, cont in pauses(history):
        paused_for = (cont["wall"] if cont else float("inf")) - stop["wall"]
        if paused_for <= lease:
            continue
        for attachment_id in ids:
            trans = transitions_of(history, final, attachment_id)
            flight = in_flight_at(trans, stop["wall"])
            if flight is None:
                continue
            exercised = True
            later = [t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0)]
            done = next((t for t in later if t["to"] in TERMINAL_STATES), None)
            base = dict(attachment_id=attachment_id, events=[stop, cont], paused_seconds=round(paused_for, 2),
                        lease_seconds=lease, attempt=flight["attempt"])
            if level_of(run) >= 4 and cont and (done is None or done["at"] is None or done["at"] > cont["wall"]):
                problems.append(evidence("job of a worker paused past its lease was not recovered while it slept",
                                         **base))
            else:
                proven.append(evidence("job recovered from the paused owner", reached=done and done["to"], **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} ownership violations", evidence=problems,
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(proven)} jobs recovered from paused owners; no stale writes" if exercised
                   else "no stale writes; no job held by a worker paused past its lease",
                   exercised=exercised, evidence=proven, seed=seed_of(run))
