"""A permanent error ends the job (BE-JOB-003): it is not retried, nor waited out, forever.

A scenario makes a dependency fail for good — the object store refuses every write of the run's key with 403
AccessDenied (fault kind ``s3_deny``, proven by the harness's own PUT answering 403) to the end of the run. Every job
not terminal when the refusal began cannot produce its effect any more. Whether the implementation recognises the
error as permanent (``failed`` at once) or retries it as transient within its attempt budget (``failed`` once the
budget is spent), the job must end ``failed`` with an ``error_code``, within ``max_attempts`` attempts:

* invalid — a job that met the refusal is not terminal at the final read (retried or held forever, as if the store
  were down), or it ended ``failed`` without an ``error_code``, or it spent more than ``max_attempts`` attempts
  (the last is also ``bounded_retries``'s);
* valid — every job that met the refusal ended ``failed`` with an ``error_code`` within the budget (evidence: the
  attempts spent and how long after the refusal it failed); a job ``ready`` after the refusal is reported, not
  judged (its effects may have been written before it, or while the refusal lapsed — the harness's guard saw a PUT
  go through and set it again: ``duplicate_effects`` checks they exist);
* unknown (where a scenario relies on it) — the refusal was not proven (the harness's PUT did not answer 403), the
  final state was not read, or no job was left to meet it.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, final_read_ok,
                   seed_of, state_at, timing, transitions_of, FinalState, RunInfo)

NAME = "permanent_failure"
REQUIREMENTS = ["BE-JOB-003"]
DENY_ACTION = "s3_deny"


def refusals(history: History) -> list[dict[str, Any]]:
    """The ``s3_deny`` start lines whose refusal the harness proved (its own PUT answered 403)."""
    return [e for e in history.of_type("fault") if e.get("action") == DENY_ACTION and e.get("phase") == "start"
            and e.get("probe_status") == 403]


def lapses(history: History) -> list[dict[str, Any]]:
    """The ``s3_deny`` lapse lines: the harness's own PUT went through while the refusal was meant to hold (the
    store's identity configuration lost the change), and the refusal was set again at once."""
    return [e for e in history.of_type("fault") if e.get("action") == DENY_ACTION and e.get("phase") == "lapsed"]


def refused_from(start: dict[str, Any]) -> float:
    """When the refusal took effect: the policy change (``applied_wall``), before the probe that proved it and the
    line that says so (a run recorded before the field: the line's own time)."""
    return float(start.get("applied_wall") or start["wall"])


def met_refusal(history: History, final: FinalState, attachment_id: str) -> bool:
    """Whether this job was unfinished when a proven, never lifted refusal of the store began (lost_accepted_work
    leaves its ``failed`` outcome to this checker)."""
    proven = refusals(history)
    if not proven or any(e.get("action") == DENY_ACTION and e.get("phase") == "end" for e in history.of_type("fault")):
        return False
    return state_at(transitions_of(history, final or {}, attachment_id), refused_from(proven[0])) not in TERMINAL_STATES


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    asked = NAME in ((run.get("scenario") or {}).get("checks") or [])
    seed = seed_of(run)

    def undecided(why: str) -> Verdict:
        if asked:
            return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"cannot tell: {why}", seed=seed)
        return Verdict(NAME, VALID, REQUIREMENTS, f"not exercised: {why}", exercised=False, seed=seed)

    tried = [e for e in history.of_type("fault") if e.get("action") == DENY_ACTION and e.get("phase") == "start"]
    proven = refusals(history)
    if not tried:
        return Verdict(NAME, VALID, REQUIREMENTS, "not exercised: no dependency was made to fail permanently",
                       exercised=False, seed=seed)
    if not proven:
        e = tried[0]
        return undecided(f"the store's refusal was not proven: the harness's own PUT answered "
                         f"{e.get('probe_status')} {e.get('probe_code') or ''}".strip())
    if not final_read_ok(final):
        return undecided("the final state could not be read")
    max_attempts = timing(run, "max_attempts")  # without it the bound is bounded_retries's (unknown there)
    start = proven[0]
    ended = next((e for e in history.of_type("fault") if e.get("action") == DENY_ACTION and e.get("phase") == "end"
                  and e["seq"] > start["seq"]), None)
    problems, proven_items, notes = [], [], []
    for attachment_id in sorted(accepted_attachments(history)):
        record = (final.get("attachments") or {}).get(attachment_id) or {}
        body = record.get("body") or {}
        trans = transitions_of(history, final, attachment_id)
        before = state_at(trans, refused_from(start))
        if before in TERMINAL_STATES:
            continue  # done before the refusal
        state, attempt, code = body.get("state"), body.get("attempt"), body.get("error_code")
        base: dict[str, Any] = dict(attachment_id=attachment_id, events=[start], state=state, attempt=attempt, error_code=code,
                    state_at_refusal=before, refused_from_wall=refused_from(start))
        if ended is not None:
            notes.append(f"{attachment_id}: the refusal ended before its outcome could be judged")
            continue
        if state not in TERMINAL_STATES:
            problems.append(evidence(f"still {state} at the final read, attempt {attempt}: the store refused every "
                                     "write from the refusal on, and the job was neither failed nor given up — "
                                     "retried or held as if the store were down", **base))
        elif state == "ready":
            ready_at = next((t["at"] for t in reversed(trans) if t["to"] == "ready" and t["at"] is not None), None)
            lapse = next((e for e in lapses(history) if ready_at is None
                          or float(e.get("refused_until_wall") or 0) <= ready_at), None)
            notes.append(f"{attachment_id}: ready (the store took writes while the refusal lapsed, after "
                         f"{float(lapse.get('refused_until_wall') or 0) - refused_from(start):.1f}s; set again "
                         f"{float(lapse.get('reapplied_wall') or 0) - refused_from(start):.1f}s after it began)"
                         if lapse is not None else f"{attachment_id}: ready (its effects written before the refusal)")
        elif not code:
            problems.append(evidence("failed without an error_code", **base))
        elif isinstance(attempt, int) and max_attempts is not None and attempt > max_attempts:
            problems.append(evidence(f"failed only at attempt {attempt}, past max_attempts {max_attempts:g}", **base))
        else:
            failed_at = next((t["at"] for t in reversed(trans) if t["to"] == "failed" and t["at"] is not None), None)
            proven_items.append(evidence(
                f"failed ({code}) at attempt {attempt}" + (f" of {max_attempts:g}" if max_attempts else "")
                + (f", {failed_at - refused_from(start):.1f}s after the refusal" if failed_at is not None else ""),
                **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} jobs met a permanent refusal of the store "
                       f"({start.get('probe_code')}) and did not end failed within the budget: "
                       + problems[0]["message"], evidence=problems + proven_items, seed=seed)
    if not proven_items:
        return undecided("no job was left to meet the refusal" + (f" ({'; '.join(notes)})" if notes else ""))
    return Verdict(NAME, VALID, REQUIREMENTS, f"{len(proven_items)} jobs met a permanent refusal of the store "
                   f"({start.get('probe_code')}): each ended failed with an error_code"
                   + (f" within max_attempts {max_attempts:g}" if max_attempts else ""), evidence=proven_items, seed=seed)
