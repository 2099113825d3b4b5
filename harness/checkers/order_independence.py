"""Order independence — permuted and parallel delivery (BE-JOB-004.1: the handler must not depend on delivery
order).

The scenario holds every consumer instance while a backlog builds, then the harness takes every ready message out
of the work queue and publishes it again in a seeded random order (``fault`` lines ``action = "permute"``: the
original and the permuted order of job ids), and starts two or more consumer instances at once. What the harness can
prove without internals:

* the permutation really changed the order (the ``permute`` end line, ``changed = true``, two or more messages);
* more than one consumer consumed, in parallel: the broker's management API showed deliveries in flight (unacked
  ≥ 1) on at least two consumer connections while the backlog drained (``consumer`` sample lines); or, since the
  management statistics may lag by seconds, at least two consumers were attached to the work queue — listed by
  the management API, or counted exactly (a passive declare, ``queue`` lines ``kind = "consumers"``) while
  permuted messages still waited — and permuted jobs were processed at once (their ``queued → processing →
  terminal`` intervals, by the implementation's own event times, overlap);
* every permuted job ends ``ready`` once (an upload the harness planted to fail — poison, bad, hostile — may end
  ``failed`` instead), with no duplicate effect and no transition outside the contract: the
  findings of ``lost_accepted_work``, ``duplicate_effects`` and ``state_regression`` about the permuted
  attachments are this check's findings too (an order-dependent handler typically refuses, fails or drops a job
  that comes "out of order").

Exercised only when both the permutation and the parallel consumption were observed; ``unknown`` (in a scenario
that declares it) when the permutation failed or left the order as it was, or when no two consumers were seen
holding deliveries. The claim order (first ``queued → processing`` of each permuted job, by the implementation's
event times) is kept as evidence of how the permuted order reached the handler, not judged.
"""

from __future__ import annotations

from . import duplicate_effects, lost_accepted_work, state_regression
from ..history import History
from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, faults, final_read_ok,
                   not_proven, seed_of, transitions_of, FinalState, RunInfo)

NAME = "order_independence"
REQUIREMENTS = ["BE-JOB-004"]


def connection_of(channel: str | None) -> str:
    """``127.0.0.1:5000 -> 127.0.0.1:5672 (1)`` -> the connection part (one consumer instance per connection)."""
    text = channel or ""
    return text.rsplit(" (", 1)[0] if text.endswith(")") else text


def consuming_connections(history: History) -> tuple[set[str], int]:
    """Connections seen holding deliveries of the work queue (unacked ≥ 1), and the most seen at one tick."""
    seen: set[str] = set()
    per_tick: dict[int, set[str]] = {}
    for e in history.of_type("consumer"):
        if (e.get("unacked") or 0) >= 1 and e.get("channel"):
            connection = connection_of(e.get("channel"))
            seen.add(connection)
            per_tick.setdefault(e.get("tick") or 0, set()).add(connection)
    return seen, max((len(v) for v in per_tick.values()), default=0)


def attached_connections(history: History) -> set[str]:
    """Consumer connections the broker listed on the work queue (whether or not their statistics showed deliveries)."""
    return {connection_of(e.get("channel")) for e in history.of_type("consumer") if e.get("channel")}


def attached_while_waiting(history: History) -> int:
    """The most consumers the broker counted on the work queue (exactly, by a passive declare after the release)
    while at least one message still waited there."""
    return max((e.get("consumers") or 0 for e in history.of_type("queue")
                if e.get("kind") == "consumers" and (e.get("ready") or 0) >= 1), default=0)


def most_at_once(history: History, final: FinalState, attachment_ids: list[str]) -> int:
    """The most permuted jobs in processing at one time: from each one's first claim to its terminal transition."""
    spans = []
    for attachment_id in attachment_ids:
        trans = transitions_of(history, final, attachment_id)
        begin = next((t["at"] for t in trans if t["to"] == "processing" and t["at"] is not None), None)
        end = next((t["at"] for t in reversed(trans) if t["to"] in ("ready", "failed") and t["at"] is not None), None)
        if begin is not None and end is not None and end >= begin:
            spans.append((begin, end))
    points = sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    best = running = 0
    for _, step in points:
        running += step
        best = max(best, running)
    return best


def claim_order(history: History, final: FinalState, attachment_ids: list[str]) -> list[str]:
    """Permuted attachments in the order of their first claim (the implementation's own event times)."""
    firsts = []
    for attachment_id in attachment_ids:
        claims = [t for t in transitions_of(history, final, attachment_id) if t["to"] == "processing"]
        if claims and claims[0]["at"] is not None:
            firsts.append((claims[0]["at"], attachment_id))
    return [a for _, a in sorted(firsts)]


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    declared = NAME in ((run.get("scenario") or {}).get("checks") or [])
    ends = [e for e in faults(history) if e.get("action") == "permute" and e.get("phase") in ("end", "failed")]
    if not ends:
        if declared:
            return Verdict(NAME, UNKNOWN, REQUIREMENTS, "the work queue was never permuted (no permute step ran)",
                           seed=seed_of(run))
        return Verdict(NAME, VALID, REQUIREMENTS, "no permutation in this run", exercised=False, seed=seed_of(run))
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
    done = [e for e in ends if e.get("phase") == "end"]
    permuted_ids = [d.get("attachment_id") for e in done for d in e.get("permuted") or [] if d.get("attachment_id")]
    changed = [e for e in done if e.get("changed") and len(e.get("permuted") or []) >= 2]
    connections, at_once = consuming_connections(history)
    attached = attached_connections(history)
    overlap = most_at_once(history, final, permuted_ids)
    waiting = attached_while_waiting(history)
    parallel = len(connections) >= 2 or (max(len(attached), waiting) >= 2 and overlap >= 2)
    facts = evidence("permutation and consumption observed", events=ends,
                     original=[d.get("job_id") for e in done for d in e.get("original") or []],
                     permuted=[d.get("job_id") for e in done for d in e.get("permuted") or []],
                     consumer_connections_with_deliveries=sorted(connections),
                     most_connections_with_deliveries_at_once=at_once,
                     consumer_connections_attached=sorted(attached), most_permuted_jobs_processing_at_once=overlap,
                     most_consumers_attached_while_messages_waited=waiting,
                     claim_order=claim_order(history, final, permuted_ids))
    # What the permuted jobs must show: ready once, one effect per key, no regression. An upload the harness planted
    # to fail (workload kind other than good: poison, bad, hostile, heavy) may end failed; it must end terminal.
    targets = set(permuted_ids)
    problems = []
    records = final.get("attachments", {})
    planted = {a for a, acc in accepted_attachments(history).items() if acc["invoke"].get("kind") not in (None, "good")}
    for attachment_id in sorted(targets):
        body = (records.get(attachment_id) or {}).get("body") or {}
        readies = [t for t in transitions_of(history, final, attachment_id) if t["to"] == "ready"]
        if attachment_id in planted and body.get("state") == "failed":
            continue
        if body.get("state") != "ready":
            problems.append(evidence(f"a permuted job did not end ready: {body.get('state')!r} "
                                     f"({body.get('error_code')})", attachment_id=attachment_id,
                                     job_id=body.get("job_id"), permuted_position=permuted_ids.index(attachment_id)))
        elif len(readies) > 1:
            problems.append(evidence(f"a permuted job reached ready {len(readies)} times", attachment_id=attachment_id))
    for module in (lost_accepted_work, duplicate_effects, state_regression):
        verdict = module.check(history, final, run)
        if verdict.status == INVALID:
            mine = [dict(item, found_by=module.NAME) for item in verdict.evidence
                    if item.get("attachment_id") in targets]
            problems += [m for m in mine if not any(p.get("attachment_id") == m.get("attachment_id")
                                                     and p["message"] == m["message"] for p in problems)]
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len({p.get('attachment_id') for p in problems})} of {len(targets)} permuted jobs broke "
                       "under permuted, parallel delivery (not ready once, a duplicate effect or a regression)",
                       evidence=problems[:40] + [facts], seed=seed_of(run))
    failed = [e for e in ends if e.get("phase") == "failed"]
    why = ("the permutation failed (the originals were put back): " + str(failed[0].get("error")) if failed and not done
           else "the permutation left the order as it was (fewer than two messages, or the same order)" if not changed
           else (f"no parallel consumption seen: deliveries in flight on {len(connections)} consumer connection(s), "
                 f"{len(attached)} listed, at most {waiting} attached while messages waited, at most {overlap} "
                 "permuted jobs processing at once")
           if not parallel else None)
    if why:
        return not_proven(NAME, REQUIREMENTS, "order independence", why, run, [facts])
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{len(targets)} jobs delivered in a permuted order to "
                   f"{max(len(connections), len(attached), waiting)} consumers (up to {max(at_once, overlap)} "
                   f"{'consumers with deliveries' if at_once >= 2 else 'jobs processing'} at once): each ended ready "
                   "once, one effect per key, no regression", evidence=[facts], seed=seed_of(run))
