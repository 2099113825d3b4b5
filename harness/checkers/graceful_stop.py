"""graceful_stop — a SIGTERM loses nothing and spends no attempt (BE-JOB-001, BE-JOB-003).

A rolling deploy stops consumer instances one at a time with SIGTERM (the ``sigterm`` fault kind,
chaos/kinds/sigterm.py) while work is in flight. A graceful stop finishes what it holds, or hands it back: its
deliveries go back to the queue unacked and the job is released without a new attempt (CONTRACT §5: a broker
redelivery is never a new attempt). Judged from what the harness observed, for each SIGTERM to an instance of a
consumer role (the adapter's ``consumer`` flags), over every job that was ``processing`` at that moment (its
transitions: the events read at the end, else the polls):

- **lost**: the job never reached a terminal state (``ready`` or ``failed``) — the stop dropped its delivery;
- **attempt spent**: a higher attempt number than the job had at the SIGTERM shows after it (a later transition,
  or the final read): the stop left it to lease recovery, or recorded the stop as a failure of the job. A stop
  acking its deliveries unfinished is seen here too: the job waits out its lease and comes back as a new attempt.

Which instance held a job is not observed, so every job in flight at the SIGTERM counts: a scenario that proves
this runs no other fault (nothing else may spend an attempt meanwhile). A stop that needed SIGKILL after the grace
is shown in the evidence; what it cost (lost work, a spent attempt) decides. Nothing to judge (no consumer
SIGTERM, nothing in flight at any, no attempt numbers): ``unknown`` where the scenario names this check, otherwise
valid and not exercised.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import (INVALID, TERMINAL_STATES, VALID, Verdict, accepted_attachments, consumer_roles, evidence,
                   not_proven, role_kind, seed_of, transitions_of, FinalState, RunInfo)

NAME = "graceful_stop"
REQUIREMENTS = ["BE-JOB-001", "BE-JOB-003"]


def stops(history: History, consumers: frozenset[str]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(start line, end line or None) of every SIGTERM the harness sent to a running consumer instance. A SIGTERM
    whose process had already exited (its exit line, same pid, came first: another fault's crash) stopped
    nothing gracefully: what followed is that crash's, not the stop's."""
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    open_: dict[Any, int] = {}
    exited = set()
    for e in history.of_type("fault", "role"):
        if e.get("type") == "role":
            if e.get("action") == "exit" and e.get("pid") is not None:
                exited.add(e["pid"])
            continue
        if e.get("action") != "sigterm" or role_kind(e.get("role")) not in consumers:
            continue
        if e.get("phase") == "start" and e.get("pid") in exited:
            continue
        if e.get("phase") == "start":
            open_[e.get("role")] = len(out)
            out.append((e, None))
        elif e.get("phase") == "end" and e.get("role") in open_:
            i = open_.pop(e.get("role"))
            out[i] = (out[i][0], e)
    return out


def _attempt(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    consumers = consumer_roles(run)
    found = stops(history, consumers)
    if not found:
        return not_proven(NAME, REQUIREMENTS, "a graceful stop", "no consumer instance was sent SIGTERM", run, [])
    final = final or {}
    records = final.get("attachments") or {}
    ids = sorted(accepted_attachments(history))
    trans_of = {a: [t for t in transitions_of(history, final, a) if t["at"] is not None] for a in ids}
    bad, judged, stopped = [], [], []
    for start, end in found:
        wall = start["wall"]
        stopped.append(evidence(
            f"SIGTERM {start.get('role')}: "
            + ("no exit seen" if end is None else
               f"exited after {end.get('exit_seconds')} s" + (" — SIGKILL after the grace" if end.get("killed") else
                                                              f" (grace {end.get('grace')} s)")),
            events=[start, end], killed=bool(end and end.get("killed"))))
        for attachment_id in ids:
            trans = trans_of[attachment_id]
            before = [t for t in trans if t["at"] <= wall]
            if not before or before[-1]["to"] != "processing":
                continue
            at_stop = max((n for n in (_attempt(t["attempt"]) for t in before) if n is not None), default=None)
            body = (records.get(attachment_id) or {}).get("body") or {}
            state = body.get("state") or (trans[-1]["to"] if trans else None)
            after = [n for n in (_attempt(t["attempt"]) for t in trans if t["at"] > wall) if n is not None]
            if _attempt(body.get("attempt")) is not None:
                after.append(body["attempt"])
            if state not in TERMINAL_STATES:
                bad.append(evidence(f"in flight at SIGTERM {start.get('role')}, never terminal (last seen "
                                    f"{state!r}): the stop lost it", attachment_id=attachment_id,
                                    events=[start], transition_lines=[before[-1].get("line")]))
                continue
            if at_stop is None:
                continue  # no attempt number seen: this job cannot say whether an attempt was spent
            judged.append(attachment_id)
            if after and max(after) > at_stop:
                spent = next((t for t in trans if t["at"] > wall and (_attempt(t["attempt"]) or 0) > at_stop), None)
                bad.append(evidence(
                    f"in flight at SIGTERM {start.get('role')} at attempt {at_stop}, then attempt {max(after)}"
                    + (f" ({spent['from']} → {spent['to']}, {spent.get('reason')!r} by {spent.get('actor')!r})"
                       if spent else " (final read)") + ": the stop spent an attempt",
                    attachment_id=attachment_id, events=[start],
                    transition_lines=[before[-1].get("line"), spent and spent.get("line")],
                    attempt_at_stop=at_stop, attempt_after=max(after)))
    seed = seed_of(run)
    if bad:
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len(bad)} job(s) in flight at a consumer's SIGTERM lost or charged an attempt "
                       f"({len(found)} stops)", evidence=bad[:20] + stopped, seed=seed)
    if not judged:
        return not_proven(NAME, REQUIREMENTS, "a graceful stop",
                          f"{len(found)} consumer SIGTERMs, but no job with an attempt number was in flight at any",
                          run, stopped)
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(set(judged))} job(s) in flight at {len(found)} consumer SIGTERMs all ended terminal, no "
                   "attempt spent", evidence=stopped, seed=seed)
