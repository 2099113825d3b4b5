"""Invariant 1 — no lost accepted work (BE-JOB-001, BE-JOB-003).

Every upload answered 202 ends ``ready`` with every variant its level promises,
or ``failed`` with an error_code when the input was deliberately bad (or with the adapter's expiry
error_code: expired work is judged by the expiry checker). A ``heavy`` upload (valid but slow to decode) may end
``failed`` with an error_code too — a pixel or decode time limit may refuse it — but never non-terminal; its
neighbours are good uploads like any other, so one that a slow neighbour made fail is lost work. Operations
with unknown outcome (``info``) are neither lost nor successful (Jepsen); a
client retry with the same Idempotency-Key that gets a 202 makes them accepted.

A transient fault may spend attempts within the budget (the seeds allow it; CONTRACT §5 lets attempts be counted at
the claim): a good upload that ends ``failed`` with an error_code, having spent exactly its budget (its last attempt
is the adapter's ``max_attempts``; more is ``bounded_retries``'s), while a transient fault of the run (a cut, a
toxic, a restart of a dependency or a broker node) was in force during its processing, is an outcome of its own —
kept as a note, not lost work. Failed before its budget was spent, without an error_code, or with no fault in force
is lost. "Outages cost no attempt" is a property of the reference (its own grade test), not a requirement on all.
"""

from __future__ import annotations

from typing import Any

from . import hostile_inputs, permanent_failure, retry_exhaustion
from ..history import Event, History
from .base import (INVALID, LEVEL_VARIANTS, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, expiry_code,
                   final_read_ok, level_of, seed_of, timing, transitions_of, FinalState, RunInfo, declared_timing)

NAME = "lost_accepted_work"
REQUIREMENTS = ["BE-JOB-001", "BE-JOB-003"]
ALWAYS_COUNTED = True  # its unknown (no upload accepted, nothing observed) counts everywhere
TRANSIENT_FAULTS = frozenset({"toxic", "restart_service", "kill_broker_node", "partition_broker_node",
                              "s3_deny"})  # a refusal of the store later lifted


def transient_faults(history: History) -> list[tuple[float, float, dict[str, Any]]]:
    """(start wall, end wall, start line) of every transient dependency fault of the run (end: the run's last line
    when it never ended)."""
    last = max((e["wall"] for e in history), default=0.0)
    open_: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    out = []
    for e in history.of_type("fault"):
        if e.get("action") not in TRANSIENT_FAULTS:
            continue
        key = (e.get("action"), e.get("service"), e.get("role"), e.get("node"))
        if e.get("phase") == "start":
            open_.setdefault(key, []).append(e)
        elif e.get("phase") == "end" and open_.get(key):
            began = open_[key].pop(0)
            out.append((began["wall"], e["wall"], began))
    out += [(began["wall"], last, began) for starts in open_.values() for began in starts]
    return out


def budget_spent_by_fault(history: History, final: FinalState, run: RunInfo, attachment_id: str, body: dict[str, Any],
                          faults: list[tuple[float, float, Event]]) -> dict[str, Any] | None:
    """The fault that was in force while this failed job was processing, when it ended failed with an error_code
    having spent exactly its attempt budget (None otherwise)."""
    budget = timing(run, "max_attempts")
    if budget is None or not body.get("error_code") or not faults:
        return None
    trans = transitions_of(history, final, attachment_id)
    attempts = [t["attempt"] for t in trans if isinstance(t["attempt"], int)]
    if not attempts or max(attempts + [body.get("attempt") or 0]) != int(budget):
        return None
    claimed = [t["at"] for t in trans if t["to"] == "processing" and t["at"] is not None]
    ended = next((t["at"] for t in reversed(trans) if t["to"] == "failed" and t["at"] is not None), None)
    if not claimed or ended is None:
        return None
    return next((f for start, end, f in faults if start <= ended and end >= claimed[0]), None)


def unroutable_publishes(history: History, attachment_id: str, job_id: str | None) -> list[dict[str, Any]]:
    """The tap's ``unroutable`` lines naming this attachment or job: its message published to no queue."""
    return [e for e in history.of_type("unroutable")
            if e.get("attachment_id") == attachment_id or (job_id and e.get("job_id") == job_id)]


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    accepted = accepted_attachments(history)
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", evidence=[
            evidence("final read failed", errors=(final or {}).get("errors"))], seed=seed_of(run))
    if not accepted and run.get("workload"):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"none of {len(run['workload'])} uploads was accepted: "
                       "nothing to prove", evidence=[evidence("uploads refused", refused=[
                           {k: e.get(k) for k in ("op", "status", "error")} for e in history.of_type("fail", "info")][:10])],
                       seed=seed_of(run))
    promised = LEVEL_VARIANTS.get(level_of(run), LEVEL_VARIANTS[3])
    records = final.get("attachments", {})
    problems, unknowns = [], []
    # A transient error armed on every attempt (outlasting every job's retry budget) must end jobs failed:
    # retry_exhaustion judges that outcome (attempt, error_code); here it is not a loss.
    exhausting = bool(retry_exhaustion.exhausting_arms_of(history, run, len(accepted)))
    faults = transient_faults(history)
    notes = []
    for attachment_id, acc in sorted(accepted.items()):
        invoke, ok = acc["invoke"], acc["ok"]
        # may legitimately end failed (hostile kinds: hostile_inputs judges which outcome each may have)
        bad_input = invoke.get("kind") in ("bad", "poison", "heavy", *hostile_inputs.MAY_FAIL)
        record = records.get(attachment_id)
        if record is None or record.get("status") is None:
            unknowns.append(evidence("attachment not read at the end", attachment_id=attachment_id,
                                     job_id=ok.get("job_id"), events=[invoke, ok]))
            continue
        if record["status"] == 404:
            problems.append(evidence("accepted (202) but unknown to the API (404)", attachment_id=attachment_id,
                                     job_id=ok.get("job_id"), events=[invoke, ok]))
            continue
        body = record.get("body") or {}
        state = body.get("state")
        base: dict[str, Any] = dict(attachment_id=attachment_id, job_id=ok.get("job_id"), events=[invoke, ok],
                    final_state=state, attempt=body.get("attempt"), sample=invoke.get("sample"))
        if state == "ready":
            names = {v.get("name") for v in body.get("variants") or []}
            missing = [v for v in promised if v not in names]
            if missing:
                problems.append(evidence(f"ready without promised variants {missing}", **base))
            elif bad_input and invoke.get("kind") == "bad":
                pass  # a lenient implementation may decode a file we thought bad; not a loss
        elif state == "failed":
            if body.get("error_code") == expiry_code(run) and not bad_input:
                pass  # expired work is an outcome of its own, judged by the expiry checker
            elif exhausting and body.get("error_code"):
                pass  # the retry budget ran out under a fault on every attempt: judged by retry_exhaustion
            elif body.get("error_code") and permanent_failure.met_refusal(history, final, attachment_id):
                pass  # the store refused every write for good while it was unfinished: judged by permanent_failure
            elif not bad_input and (spent := budget_spent_by_fault(history, final, run, attachment_id, body, faults)):
                notes.append(evidence(
                    f"ended failed at its attempt budget ({int(declared_timing(run, 'max_attempts'))}), spent while a transient "
                    f"fault was in force ({spent.get('action')} {spent.get('toxic') or ''} on "
                    f"{spent.get('service') or spent.get('node')}, line {spent.get('line')}): an outcome, not lost work",
                    error_code=body.get("error_code"), fault=spent.get("line"), **base))
            elif not bad_input:
                problems.append(evidence("good input ended failed", error_code=body.get("error_code"), **base))
            elif not body.get("error_code"):
                problems.append(evidence("failed without an error_code", **base))
        else:
            dropped = unroutable_publishes(history, attachment_id, ok.get("job_id"))
            cause = (f"; its message was published unroutable {len(dropped)} time(s) (exchange "
                     f"{dropped[0].get('exchange')!r}, routing key {dropped[0].get('routing_key')!r}, first at "
                     f"t={dropped[0].get('t')}): the broker confirmed and dropped it — the topology did not exist "
                     "when it was published (docs/CONTRACT.md §4)") if dropped else ""
            problems.append(evidence(f"accepted work never finished: still {state!r} after drain{cause}",
                                     **{**base, "events": base["events"] + dropped[:2]}))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len(problems)} of {len(accepted)} accepted uploads lost or incomplete",
                       evidence=problems + unknowns, seed=seed_of(run))
    if unknowns:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unknowns)} accepted uploads could not be read",
                       evidence=unknowns, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"all {len(accepted)} accepted uploads reached a terminal state"
                   + (f"; {len(notes)} failed at their attempt budget, spent by a transient fault" if notes else ""),
                   exercised=bool(accepted), evidence=notes[:20], seed=seed_of(run))
