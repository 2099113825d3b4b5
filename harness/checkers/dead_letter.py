"""Unprocessable messages are isolated, never looped nor crashed on (BE-JOB-003, checklist row BE-JOB-003.3).

The scenario's ``inject`` fault publishes into the work queue messages no consumer can process (not JSON; JSON that
fails jobs.schema.json; a well-formed job nobody knows: harness/inject.py), among normal uploads, each with a marker
of its own. The run traces every delivery from the work queue (the firehose's ``deliver.<queue>``), and the final
read peeks the dead-letter queue with requeue. Per injected message:

* it is delivered a bounded number of times — at most ``max_attempts + 1`` (one delivery per attempt an
  implementation may spend on it, plus one redelivery of a lost ack); more is a requeue loop;
* when the adapter declares ``[broker] dead_letter_queue``, it ends there (recognised by its body hash, its
  ``message_id`` or its marker): absent, it was acked and dropped — silent loss — or still cycles;
* no consumer role exits on its own after the injection (a crash on poison input; faults the harness caused
  elsewhere are excused as in ``role_stability``).

Without a declared dead-letter queue the seed's exception applies (isolation may be absent when the terminal result
is defined and observable and masks no lost work): the verdict judges only what is observable — no redelivery loop,
no crash, the work queue empty at the end — and says that isolation was not declared. Lost good work is
``lost_accepted_work``'s; the controlled replay of what was isolated is ``replay_audit``'s (scenario poison-replay):
the contract's replay is per attachment, and an injected message has none.
"""

from __future__ import annotations

from typing import Any

import base64

from ..history import History
from .base import INVALID, UNKNOWN, VALID, Verdict, consumer_roles, evidence, role_kind, seed_of, timing, FinalState, RunInfo
from .role_stability import fault_intervals

NAME = "dead_letter"
REQUIREMENTS = ["BE-JOB-003"]
TIMINGS = ("max_attempts",)
PEEK_LIMIT = 50  # the final read peeks this many dead letters at most (harness/final_state.py)


def injections(history: History) -> list[dict[str, Any]]:
    """Every message the harness injected into the work queue (fault ``inject``, one line per message)."""
    return [e for e in history.of_type("fault") if e.get("action") == "inject" and e.get("phase") == "publish"]


def injected_as(message: dict[str, Any], injected: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The injection a tapped ``message`` line is (by its message_id or its body), or None."""
    message_id = (message.get("properties") or {}).get("message_id")
    for inj in injected:
        if message_id is not None and message_id == inj.get("marker"):
            return inj
        if message.get("body") is not None and message.get("body") == inj.get("body"):
            return inj
        if message.get("body_raw") is not None and message.get("body_raw") == inj.get("raw"):
            return inj
    return None


def _text(item: dict[str, Any]) -> str:
    payload = item.get("payload")
    if not isinstance(payload, str):
        return ""
    if item.get("payload_encoding") == "base64":
        try:
            return base64.b64decode(payload).decode("utf-8", "replace")
        except ValueError:
            return ""
    return payload


def same_message(item: dict[str, Any], inj: dict[str, Any]) -> bool:
    """A delivery line or a dead letter is this injected message: the same bytes, its message_id, or (a dead letter
    wrapped in an envelope of the implementation's own) its marker or job_id inside."""
    if item.get("sha256") and item.get("sha256") == inj.get("sha256"):
        return True
    if item.get("message_id") and item.get("message_id") == inj.get("marker"):
        return True
    text = _text(item)
    return bool(text) and any(m and m in text for m in (inj.get("marker"), inj.get("job_id")))


def consumer_crashes(history: History, run: RunInfo, since: float) -> list[dict[str, Any]]:
    """Consumer exits after ``since`` (wall) that neither the harness nor an armed failpoint caused."""
    consumers = consumer_roles(run)
    grace = max(10.0, 2 * (timing(run, "lease_seconds") or 5.0))
    intervals = fault_intervals(history)
    out = []
    for e in history.of_type("role"):
        if e.get("action") != "exit" or e.get("expected") or e.get("armed") or e["wall"] < since:
            continue
        if role_kind(e.get("role")) not in consumers:
            continue
        if any(a - 1 <= e["wall"] <= b + grace for a, b in intervals):
            continue
        out.append(evidence(f"consumer {e.get('role')} exited with code {e.get('returncode')} after unprocessable "
                            "messages were injected", events=[e], role=e.get("role"),
                            returncode=e.get("returncode"), log_tail=(e.get("log_tail") or "")[-1500:] or None))
    return out


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    seed = seed_of(run)
    injected = injections(history)
    if not injected:
        return Verdict(NAME, VALID, REQUIREMENTS, "no unprocessable message injected: nothing to isolate",
                       exercised=False, seed=seed)
    sent = [i for i in injected if i.get("routed")]
    if not sent:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"none of the {len(injected)} injected messages was routed to the "
                       "work queue: nothing was provoked", evidence=[evidence("not routed", events=injected[:5])],
                       seed=seed)
    final = final or {}
    broker = (run.get("adapter") or {}).get("broker") or {}
    dlq = broker.get("dead_letter_queue")
    max_attempts = timing(run, "max_attempts")
    bound = None if max_attempts is None else int(max_attempts) + 1
    traced = any(i.get("deliveries_traced") for i in sent)
    deliveries = [d for d in history.of_type("delivery") if d.get("queue") in (None, broker.get("work_queue"))]
    tapped = history.of_type("message")
    dead = final.get("dead_letters")
    work = (final.get("queues") or {}).get("work") or {}
    problems, unknowns, proven = [], [], []
    for inj in sent:
        got = [d for d in deliveries if same_message(d, inj)]
        facts = dict(kind=inj.get("kind"), marker=inj.get("marker"), sha256=inj.get("sha256"),
                     published_wall=inj.get("wall"), deliveries=len(got) if traced else None,
                     redelivered=sum(1 for d in got if d.get("redelivered")) if traced else None,
                     delivered_t=[d["t"] for d in got][:8] or None,
                     tapped=sum(1 for m in tapped if injected_as(m, [inj]) is not None))
        base: dict[str, Any] = dict(job_id=inj.get("job_id"), events=[inj] + got[:2] + got[2:][-1:], **facts)
        if bound is None:
            unknowns.append(evidence("the adapter declares no max_attempts: deliveries cannot be bounded", **base))
            continue
        if traced and len(got) > bound:
            problems.append(evidence(f"injected {inj.get('kind')} message delivered {len(got)} times (bound {bound} = "
                                     "max_attempts + 1): a requeue loop instead of a terminal outcome", **base))
            continue
        if dlq:
            if dead is None:
                unknowns.append(evidence(f"the dead-letter queue {dlq!r} was not read at the end", **base))
                continue
            found = next((d for d in dead if same_message(d, inj)), None)
            if found is None:
                if len(dead) >= PEEK_LIMIT:
                    unknowns.append(evidence(f"not among the first {PEEK_LIMIT} dead letters peeked", **base))
                else:
                    problems.append(evidence(f"injected {inj.get('kind')} message never reached the declared "
                                             f"dead-letter queue {dlq!r}: dropped silently (acked) or still cycling",
                                             dead_letters=len(dead), **base))
                continue
            proven.append(evidence(f"injected {inj.get('kind')} message isolated in {dlq!r}", dead_letter=found,
                                   **base))
        else:
            if traced and not got:
                unknowns.append(evidence("no delivery of the injected message was traced: its handling was not seen",
                                         **base))
                continue
            proven.append(evidence(f"injected {inj.get('kind')} message consumed without a loop (no dead-letter "
                                   "queue declared: where it ended is not observable)", **base))
    if not dlq and work.get("ready"):
        problems.append(evidence("no dead-letter queue declared and the work queue still holds messages at the end: "
                                 "unprocessable messages may be cycling", queue=work))
    problems += consumer_crashes(history, run, min(i["wall"] for i in sent))
    if not traced:
        note = "deliveries not traced (firehose unavailable): the number of deliveries was not counted"
        proven.append(evidence(note))
    replay = evidence("controlled replay from isolation is judged by replay_audit (scenario poison-replay): the "
                      "contract's replay is the operator's per attachment, which an injected message does not have")
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} isolation violations among {len(sent)} injected "
                       "unprocessable messages: " + problems[0]["message"], evidence=problems + unknowns + proven,
                       seed=seed)
    if unknowns:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unknowns)} of {len(sent)} injected messages not judged: "
                       + unknowns[0]["message"], evidence=unknowns + proven, seed=seed)
    most = max((p.get("deliveries") or 0 for p in proven), default=0)
    counted = f"each delivered at most {most} times (bound {bound})" if traced else "deliveries not counted"
    if dlq:
        summary = (f"{len(proven) - (0 if traced else 1)} injected unprocessable messages isolated in {dlq!r}, "
                   f"{counted}; no consumer crashed")
    else:
        summary = ("isolation not declared (the adapter names no [broker] dead_letter_queue): judged by the seed's "
                   f"exception only — {len(sent)} injected unprocessable messages ended without a redelivery loop "
                   f"({counted}) or a consumer crash, and the work queue drained")
    return Verdict(NAME, VALID, REQUIREMENTS, summary, exercised=True, evidence=proven + [replay], seed=seed)
