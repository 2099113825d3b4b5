"""Copies of one job raced (BE-JOB-002, BE-JOB-004; checklist rows BE-JOB-002.3 and BE-JOB-004.2).

Not an invariant of the implementation but the proof that the event those rows name happened: deduplication is
atomic only where copies of one job were handed out at once. ``duplicate_effects`` finding one effect per key
proves nothing about atomicity when the copies arrived one after another (the job ready before a copy was even
published).

Copies raced when, for a job the harness republished (fault ``republish``), the copies were in the work queue —
published and routed, the republish's end line — before the job's first terminal transition (the server's own time),
and the broker handed the job (the original and its copies) out on two or more channels (the traced deliveries of
the work queue, the firehose's ``deliver.<queue>``): two consumers took it while it was unfinished. The trace carries
no delivery time (the tap records it when it drains it, a fraction of a second later), so the order of a copy's
delivery and the commit is bounded by the copies' publish alone: a broker hands a ready message to an idle consumer
at once. Copies that reached the queue after the
job was terminal are a sequential redelivery; copies all handed to one consumer (an active-standby pair, one
consumer instance) never met. Seen nowhere, or deliveries not traced: not proven (``unknown`` where the scenario
declares this check). The evidence names the republish fault (its history line) it judged.
"""

from __future__ import annotations

from typing import Any

from .ack_after_commit import consumers_running_at
from ..history import History
from .base import (
    VALID,
    Verdict,
    consumer_roles,
    evidence,
    not_proven,
    seed_of,
    transitions_of,
    FinalState,
    RunInfo,
)

NAME = "copies_raced"
REQUIREMENTS = ["BE-JOB-002", "BE-JOB-004"]
PROVES = ("raced",)


def _attachment_of(history: History) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in history.of_type("ok"):
        if e.get("job_id") and e.get("attachment_id"):
            out.setdefault(e["job_id"], e["attachment_id"])
    for m in history.of_type("message"):
        body: dict[str, Any] = m["body"] if isinstance(m.get("body"), dict) else {}
        if body.get("job_id") and body.get("attachment_id"):
            out.setdefault(body["job_id"], body["attachment_id"])
    return out


def _republish_that_never_happened(history: History, run: RunInfo) -> list[dict[str, Any]]:
    """Evidence naming each scheduled republish fault (its index) that copied no job, with what the run noted about
    it (a trigger that never came, a consumer count that never reached the one asked for)."""
    steps = [i for i, f in enumerate(((run or {}).get("scenario") or {}).get("faults") or [])
             if f.get("action") == "republish"]
    empty = [e for e in history.of_type("fault") if e.get("action") == "republish" and e.get("phase") == "start"]
    steps += [e["fault"] for e in empty if e.get("fault") is not None and e["fault"] not in steps]
    out = []
    for index in steps:
        notes = [e for e in history.of_type("note") if e.get("fault") == index]
        starts = [e for e in empty if e.get("fault") == index]
        why = "; ".join(str(n.get("message")) for n in notes) or \
            ("it found no job in the state it copies" if starts else "it never started")
        out.append(evidence(f"fault {index} (republish) copied no job: {why}", fault=index, events=notes + starts))
    return out


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    consumers = consumer_roles(run)
    starts = [e for e in history.of_type("fault") if e.get("action") == "republish" and e.get("phase") == "start"
              and e.get("jobs")]
    ends = [e for e in history.of_type("fault") if e.get("action") == "republish" and e.get("phase") == "end"]
    if not starts:
        never = _republish_that_never_happened(history, run)
        return not_proven(NAME, REQUIREMENTS, "a race of copies", "no job was republished"
                          + (f" ({never[0]['message']})" if never else ""), run, never)
    attachment_of = _attachment_of(history)
    traced = any(e.get("source") == "firehose" and e.get("deliveries") for e in history.of_type("observe"))
    raced, missed = [], []
    for start in starts:
        end = next((e for e in ends if e["line"] > start["line"]), None)
        if end is None or not end.get("routed"):
            missed.append(evidence("the copies were not routed to the work queue", events=[start] + ([end] if end else [])))
            continue
        running = consumers_running_at(history, consumers, end["wall"])
        for job_id in start["jobs"]:
            attachment_id = attachment_of.get(job_id)
            trans = transitions_of(history, final or {}, attachment_id) if attachment_id else []
            terminal = next((t for t in trans if t["to"] in ("ready", "failed") and t["at"] is not None), None)
            base: dict[str, Any] = {"job_id": job_id, "attachment_id": attachment_id, "events": [start, end],
                    "fault": start.get("line"), "copies": start.get("copies"), "consumers_running": running,
                    "terminal_at": terminal["at_text"] if terminal else None}
            if terminal is None:
                missed.append(evidence("the job never reached a terminal state the run saw", **base))
                continue
            if end["wall"] >= terminal["at"]:
                missed.append(evidence("the copies reached the queue after the job was already terminal: a "
                                       "sequential redelivery, not a race", **base))
                continue
            if not traced:
                missed.append(evidence("deliveries from the work queue were not traced: whether two consumers held "
                                       "the job at once was not seen", **base))
                continue
            handed = [d for d in history.of_type("delivery") if d.get("job_id") == job_id]
            channels = sorted({f"{d.get('connection')}/{d.get('channel')}" for d in handed})
            if len(handed) < 2 or len(channels) < 2:
                missed.append(evidence(f"{len(handed)} deliveries of the job on {len(channels)} channel(s) "
                                       f"({len(running)} consumer instances running): the copies never met on two "
                                       "consumers", channels=channels, **base))
                continue
            raced.append(evidence(f"copies of the job, published while it was unfinished, were handed out on "
                                  f"{len(channels)} channels ({len(handed)} deliveries)", channels=channels, **base))
    if not raced:
        why = missed[0]["message"] if missed else "no republished job to judge"
        return not_proven(NAME, REQUIREMENTS, "a race of copies", why, run, missed[:10])
    return Verdict(NAME, VALID, REQUIREMENTS, f"{len(raced)} jobs raced with copies of themselves",
                   evidence=raced[:10] + missed[:5], seed=seed_of(run), proves=["raced"])
