"""Invariant 3 — no regression (BE-JOB-002, BE-JOB-006).

Each attachment's transitions form a path in CONTRACT §5 starting null→queued,
each ``from`` equal to the previous ``to``; ``ready`` is final (level 5 rules
aside); ``failed``→``queued`` only by an operator replay — one the harness itself
asked for and the implementation accepted (the wording of ``actor`` is free);
``queued``→``failed`` only as expiry (the attachment ends with the expiry
error_code). The states seen by polling during the run must also never go from
``ready`` back to anything else.
"""

from __future__ import annotations

from typing import Any

from ..vocabulary import CONTRACT_STATES
from ..history import History
from .base import (ALLOWED_TRANSITIONS, EXPIRY_TRANSITION, INVALID, UNKNOWN, VALID, Verdict, evidence, expiry_code,
                   has_capability, operator_replays, seed_of, transitions_of, FinalState, RunInfo)

NAME = "state_regression"
REQUIREMENTS = ["BE-JOB-002", "BE-JOB-006"]
NEEDS = (("events", "capabilities.events (GET /v1/attachments/{id}/events, or [events] sql)"),)


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    problems = []
    ids = set(final.get("attachments", {}) if final else {}) | {
        e["attachment_id"] for e in history.of_type("transition", "state") if e.get("attachment_id")}
    for attachment_id in sorted(ids):
        trans = transitions_of(history, final or {}, attachment_id)
        replays_asked = len(operator_replays(history, attachment_id))
        replays_seen = 0
        final_body = ((final or {}).get("attachments", {}).get(attachment_id) or {}).get("body") or {}
        previous = None
        for index, t in enumerate(trans):
            pair = (t["from"], t["to"])
            where: dict[str, Any] = dict(attachment_id=attachment_id, seq=t["seq"], at=t["at_text"], attempt=t["attempt"],
                         actor=t["actor"], reason=t["reason"], history_line=t["line"])
            if index == 0 and t["from"] is not None:
                problems.append(evidence(f"first transition starts from {t['from']!r}, not null", **where))
            if index > 0 and t["from"] != previous:
                problems.append(evidence(f"transition {pair} does not continue from {previous!r}", **where))
            if pair not in ALLOWED_TRANSITIONS:
                problems.append(evidence(f"transition {t['from']}→{t['to']} is not in CONTRACT §5", **where))
            elif pair == ("failed", "queued"):
                replays_seen += 1
                if replays_seen > replays_asked:
                    problems.append(evidence(f"failed→queued #{replays_seen} but the harness asked for "
                                             f"{replays_asked} operator replays", **where))
            elif pair == EXPIRY_TRANSITION and final_body and final_body.get("error_code") != expiry_code(run):
                problems.append(evidence(f"queued→failed is only allowed as expiry, but the attachment ended "
                                         f"{final_body.get('state')!r} with error_code "
                                         f"{final_body.get('error_code')!r}", **where))
            previous = t["to"]
        seen_ready = None
        unknown_said = False
        for e in history.of_type("state"):
            if e.get("attachment_id") != attachment_id:
                continue
            if e.get("state") is not None and e.get("state") not in CONTRACT_STATES and not unknown_said:
                unknown_said = True  # a service's own name the adapter does not map ([vocabulary] states)
                problems.append(evidence(f"polled state {e.get('state')!r} is not a contract state "
                                         f"({', '.join(CONTRACT_STATES)}) nor mapped by the adapter's [vocabulary] "
                                         "states", attachment_id=attachment_id, events=[e]))
            if seen_ready and e.get("state") != "ready":
                problems.append(evidence(f"polled state went ready → {e.get('state')}", attachment_id=attachment_id,
                                         events=[seen_ready, e]))
                break
            if e.get("state") == "ready":
                seen_ready = e
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} illegal transitions or states", evidence=problems,
                       seed=seed_of(run))
    if ids and not has_capability(run, "events"):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"the implementation exposes no events: only the polled states of "
                       f"{len(ids)} attachments were checked (no ready regression), not their transitions",
                       seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"{len(ids)} attachments followed CONTRACT §5 paths",
                   exercised=bool(ids), seed=seed_of(run))
