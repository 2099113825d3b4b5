"""Controlled replay from the dead-letter queue (BE-JOB-003, checklist row BE-JOB-003.3; scenario dead-letter-replay).

The fault ``dlq_replay`` takes a real job's message off the work queue while the consumers are held and puts it,
unchanged, into the adapter's dead-letter queue — what a delivery limit leaves there — then replays that job's
dead letters through ``[admin] dlq_replay_path``: without the operator token, then with it, twice; with
``dlq_replay_all_path`` it also replays every dead letter once. Unprocessable messages injected by ``inject`` are
dead letters no replay can map to a job. Judged:

* the replay is an operator's: without the token it is refused (401/403);
* every authenticated replay answers 2xx — the second one too: replaying the same dead letter again is a no-op,
  never an error;
* the job was still unfinished when the replay was asked for (else ``unknown``: the replay revived nothing — the
  scenario holds the recovery roles until then, so no safety net finishes it first);
* the job ends terminal, reached ``ready`` at most once, and (``duplicate_effects``) has one effect per key;
* an injected unprocessable message is still in the dead-letter queue after a replay of everything (the final read
  peeks it): a replay never drops what it cannot map.

Not observable through the contract, and so not judged: the implementation's own audit record of the replay (who,
when, why) — its answers are kept in the evidence. An adapter without ``dlq_replay_path`` makes this ``unknown``
(the scenario requires capability ``dlq_replay`` and is skipped in a grade).
"""

from __future__ import annotations

from typing import Any, Iterable

from ..history import History
from .base import INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, evidence, final_read_ok, seed_of, transitions_of, FinalState, RunInfo
from .dead_letter import PEEK_LIMIT, injections, same_message

NAME = "dead_letter_replay"
REQUIREMENTS = ["BE-JOB-003"]


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    seed = seed_of(run)

    def verdict(status: str, summary: str, found: Iterable[dict[str, Any]] = (), exercised: bool = False) -> Verdict:
        return Verdict(NAME, status, REQUIREMENTS, summary, exercised=exercised, evidence=list(found), seed=seed)

    steps = [e for e in history.of_type("fault") if e.get("action") == "dlq_replay"]
    moves = [e for e in steps if e.get("phase") == "move"]
    if not steps:
        return verdict(VALID, "no dead-letter replay in this run")
    if not moves:
        why = str(next((e.get("why") for e in steps if e.get("phase") == "skip"), "no message was dead-lettered"))
        return verdict(UNKNOWN, f"dead-letter replay not exercised: {why}", [evidence(why, events=steps[:3])])
    move = moves[0]
    if not move.get("routed"):
        return verdict(UNKNOWN, "the job message moved to the dead-letter queue was not routed there",
                       [evidence("not routed", events=[move])])
    calls = [e for e in history.of_type("ok", "fail") if e.get("f") == "dlq_replay"]
    if not calls:
        return verdict(UNKNOWN, "the job's message was dead-lettered but no replay was asked for (the step ran out "
                                "of time)", [evidence("no replay", events=[move])])
    if not final_read_ok(final):
        return verdict(UNKNOWN, "the final state could not be read")
    asked = next((e for e in history.of_type("invoke") if e.get("f") == "dlq_replay"), {})
    if asked.get("state_before") in TERMINAL_STATES:
        return verdict(UNKNOWN, f"the dead-lettered job was already {asked['state_before']} when the replay was asked "
                                "for (something else finished it): what a replay revives was not exercised",
                       [evidence("finished before the replay", events=[move, asked])])
    attachment_id, job_id = move.get("attachment_id"), move.get("job_id")
    base: dict[str, Any] = dict(attachment_id=attachment_id, job_id=job_id)
    problems, proven, unknowns = [], [], []
    first = calls[0]
    if first.get("unauthenticated_status") not in (401, 403):
        problems.append(evidence(f"dead-letter replay without the operator token answered "
                                 f"{first.get('unauthenticated_status')}, not 401/403", events=[first], **base))
    for call in calls:
        if call["type"] != "ok":
            again = " (a second replay of the same dead letter must be a no-op)" if call.get("round", 1) > 1 else ""
            problems.append(evidence(f"dead-letter replay ({call.get('scope')}, round {call.get('round')}) answered "
                                     f"{call.get('status')}{again}", events=[call], answer=call.get("answer"), **base))
    record = ((final.get("attachments") or {}).get(attachment_id) or {}).get("body") or {}
    trans = transitions_of(history, final, attachment_id)
    readies = [t for t in trans if t["to"] == "ready"]
    if record.get("state") not in TERMINAL_STATES:
        problems.append(evidence(f"the job whose message was dead-lettered and replayed ended {record.get('state')!r}, "
                                 "not terminal", **base))
    elif len(readies) > 1:
        problems.append(evidence(f"the replayed job reached ready {len(readies)} times", transitions=trans[-8:],
                                 **base))
    else:
        proven.append(evidence(f"dead-lettered job ended {record.get('state')} after {len(calls)} replays "
                               f"(ready {len(readies)} time(s))", answers=[c.get("answer") for c in calls], **base))
    replayed_all = any(c.get("scope") == "all" and c["type"] == "ok" for c in calls)
    unmappable = [i for i in injections(history) if i.get("routed")]
    dead = final.get("dead_letters")
    if replayed_all and unmappable:
        if dead is None:
            unknowns.append(evidence("the dead-letter queue was not read at the end: whether the unmappable dead "
                                     "letters stayed is unknown"))
        else:
            gone = [i for i in unmappable if not any(same_message(d, i) for d in dead)]
            if gone and len(dead) >= PEEK_LIMIT:
                unknowns.append(evidence(f"{len(gone)} unmappable letters not among the first {PEEK_LIMIT} peeked"))
            elif gone:
                problems.append(evidence(f"{len(gone)} of {len(unmappable)} unmappable dead letters are gone after a "
                                         "replay of every dead letter: dropped instead of left with their reason",
                                         markers=[i.get("marker") for i in gone], events=gone[:3]))
            else:
                proven.append(evidence(f"{len(unmappable)} unmappable dead letters stayed in the dead-letter queue "
                                       "through a replay of everything"))
    elif not replayed_all:
        proven.append(evidence("no replay of every dead letter declared ([admin] dlq_replay_all_path): that "
                               "unmappable letters stay is judged by dead_letter only"))
    proven.append(evidence("the implementation's audit record of the replay is not observable through the contract "
                           "and is not judged"))
    if problems:
        return verdict(INVALID, f"{len(problems)} dead-letter replay violations: " + problems[0]["message"],
                       problems + unknowns + proven, exercised=True)
    if unknowns:
        return verdict(UNKNOWN, unknowns[0]["message"], unknowns + proven)
    return verdict(VALID, f"job {job_id}'s dead letter replayed {len(calls)} times behind the operator token: "
                          f"terminal once, every replay answered 2xx"
                          + (", unmappable letters stayed" if replayed_all and unmappable else ""),
                   proven, exercised=True)
