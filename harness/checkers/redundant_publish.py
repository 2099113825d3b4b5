"""Redundant publish — a job's message is never published again while an earlier one still waits in the work
queue (BE-JOB-004: the queue of a backlog is bounded by the backlog itself).

A safety net that republishes "stale" queued jobs (a message lost at the broker) must not count a message that is
merely waiting behind a held or slow consumer as lost: every period it would add a copy per job, the queue grows
to its max length and new uploads back off. What the harness can prove without internals:

* while **every** consumer role (adapter ``consumer`` flag) is held by the harness (``hold_start`` … ``hold_end``
  phases naming all of them), nothing consumes the work queue: a message that reached it stays there undelivered
  unless the broker itself drops or dead-letters it;
* the tap sees every message that reaches the work queue, with the time the harness saw it (never before it was
  published).

So for an attachment accepted during such a hold, every message of its job tapped before the hold ended and before
any further transition of the attachment was seen (an expiry, say) was published while its earlier message still
waited: the second and later ones are the symptom. Not judged: a window in which the dead-letter queue grew (a
message may have left by dead-lettering), a later message whose earlier one carried an AMQP ``expiration`` that
had run out, a pair with a fault or an unexpected role exit between them (a publisher that lost its confirm
rightly publishes again). A queue-level message TTL without a dead-letter queue is a blind spot (the tap cannot see it).

Exercised when some job of such a hold waited longer than the adapter's ``stale_queued_seconds`` plus a sweep
interval (a republishing net would have fired by then); without that timing and without a finding the verdict is
``unknown``: nothing says the hold outlasted the implementation's threshold — unless the adapter says there is no
republish safety net at all (``[capabilities] republish = false``): then there is no threshold to outlast, and "no
job published twice while every consumer was held" is the whole claim, judged as such (exercised as soon as a job
waited behind the hold).
"""

from __future__ import annotations

from typing import Any

from ..history import Event, History
from .base import (INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, consumer_roles, evidence, role_kind,
                   seed_of, timing, FinalState, RunInfo)

NAME = "redundant_publish"
REQUIREMENTS = ["BE-JOB-004"]
TIMINGS = ("stale_queued_seconds",)


def consumer_holds(history: History, run: RunInfo) -> list[tuple[float, float, dict[str, Any]]]:
    """(start t, end t, hold_start line) of every interval in which every consumer role was held."""
    consumers = consumer_roles(run)
    if not consumers:
        return []
    last_t = max((e["t"] for e in history), default=0.0)
    starts: dict[Any, Event] = {}
    out = []
    for e in history.of_type("phase"):
        roles = {role_kind(r) for r in (e.get("roles") or [])}
        if e.get("name") == "hold_start" and consumers <= roles:
            starts[e.get("fault")] = e
        elif e.get("name") == "hold_end" and e.get("fault") in starts:
            began = starts.pop(e.get("fault"))
            out.append((began["t"], e["t"], began))
    out.extend((began["t"], last_t, began) for began in starts.values())
    return sorted(out, key=lambda w: w[0])


def dead_letters_grew(history: History, start: float, end: float) -> bool:
    samples = [e.get("ready") or 0 for e in history.of_type("queue")
               if e.get("dead_letter") and start <= e["t"] <= end and not e.get("kind")]
    return bool(samples) and max(samples) > samples[0]


def expired_before(first: dict[str, Any], later: dict[str, Any]) -> bool:
    """The earlier message carried a per-message TTL that had run out when the later one was seen."""
    expiration = (first.get("properties") or {}).get("expiration")
    try:
        return expiration is not None and (later["t"] - first["t"]) * 1000 >= float(expiration)
    except (TypeError, ValueError):
        return True  # an expiration we cannot read: do not judge


def disturbed(history: History, start: float, end: float) -> bool:
    """A fault or an unexpected role exit meanwhile: a publisher that lost its confirm republishes (at-least-once),
    which is not what this checker judges."""
    return any(start <= e["t"] <= end and (e["type"] == "fault" or (e.get("action") == "exit" and not e.get("expected")))
               for e in history.of_type("fault", "role"))


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    holds = consumer_holds(history, run)
    accepted = accepted_attachments(history)
    messages = history.of_type("message")
    by_job: dict[Any, list[dict[str, Any]]] = {}
    for m in messages:
        job_id = (m.get("body") or {}).get("job_id")
        if job_id:
            by_job.setdefault(job_id, []).append(m)
    transitions: dict[Any, list[dict[str, Any]]] = {}
    for e in history.of_type("transition"):
        if e.get("from") is not None:  # anything after the acceptance's none -> queued
            transitions.setdefault(e.get("attachment_id"), []).append(e)
    permuted_at = min((e["t"] for e in history.of_type("fault") if e.get("action") == "permute"),
                      default=float("inf"))
    stale = timing(run, "stale_queued_seconds")
    sweep = timing(run, "sweep_interval_seconds") or 0.0
    problems, skipped, longest = [], [], 0.0
    held_jobs = 0
    for start, end, _began in holds:
        unjudgeable = dead_letters_grew(history, start, end)
        for attachment_id, acc in accepted.items():
            invoke, ok = acc["invoke"], acc["ok"]
            if not start <= invoke["t"] <= end:
                continue
            held_jobs += 1
            longest = max(longest, end - ok["t"])
            changed = min((t["t"] for t in transitions.get(attachment_id, [])), default=float("inf"))
            changed = min(changed, permuted_at)  # from there on the work queue holds the harness's own copies
            seen = [m for m in by_job.get(ok.get("job_id"), []) if start <= m["t"] <= min(end, changed)]
            for index, later in enumerate(seen[1:], start=1):
                first = seen[0]
                item = evidence("job published again while its earlier message still waited undelivered in the work "
                                "queue (every consumer held since before the upload)", attachment_id=attachment_id,
                                job_id=ok.get("job_id"), events=[ok, first, later],
                                copy=index + 1, earlier_seen_t=first["t"], later_seen_t=later["t"],
                                attempts=[(first.get("body") or {}).get("attempt"),
                                          (later.get("body") or {}).get("attempt")],
                                hold=[start, end])
                if unjudgeable or expired_before(first, later) or disturbed(history, first["t"] - 1.0, later["t"]):
                    skipped.append(item)
                else:
                    problems.append(item)
    depth = [e for e in history.of_type("queue") if not e.get("dead_letter") and not e.get("kind")]
    facts: dict[str, Any] = {"jobs_accepted_during_holds": held_jobs,
             "max_work_queue_ready_sampled": max((e.get("ready") or 0 for e in depth), default=None),
             "final_work_queue": ((final or {}).get("queues") or {}).get("work")}
    if problems:
        jobs = sorted({p["job_id"] for p in problems})
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len(problems)} extra messages for {len(jobs)} jobs published while an earlier message of "
                       f"the same job still waited in the work queue with every consumer held "
                       f"(the queue grows by a copy per job per period)",
                       evidence=[evidence("observation", **facts)] + problems[:40], seed=seed_of(run))
    if not holds or not held_jobs:
        return Verdict(NAME, VALID, REQUIREMENTS, "no upload was accepted while every consumer was held",
                       exercised=False, seed=seed_of(run))
    if skipped:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(skipped)} repeated messages, but the dead-letter queue grew or the earlier copy had "
                       "expired: it may have left the work queue, so the repeat may be a rightful republish",
                       evidence=[evidence("observation", **facts)] + skipped[:20], seed=seed_of(run))
    declared = (run.get("adapter") or {}).get("capabilities") or {}
    if stale is None and declared.get("republish") is False:
        return Verdict(NAME, VALID, REQUIREMENTS,
                       f"no republish safety net (the adapter declares [capabilities] republish = false): {held_jobs} "
                       f"jobs waited up to {longest:.1f}s behind held consumers and none was published again",
                       exercised=longest > 0, evidence=[evidence("observation", **facts)], seed=seed_of(run))
    if stale is None:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"no job was published twice during the hold ({held_jobs} jobs, longest wait {longest:.1f}s), "
                       "but the adapter declares no stale_queued_seconds: cannot tell whether the hold outlasted its "
                       "republish threshold (an implementation without a republish safety net declares "
                       "[capabilities] republish = false)", evidence=[evidence("observation", **facts)], seed=seed_of(run))
    exercised = longest >= stale + sweep
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"{held_jobs} jobs waited up to {longest:.1f}s behind held consumers "
                   f"(stale_queued_seconds {stale:g}); none was published again while its message waited",
                   exercised=exercised, evidence=[evidence("observation", **facts)], seed=seed_of(run))
