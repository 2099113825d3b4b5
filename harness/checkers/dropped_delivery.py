"""No delivery of unfinished work is settled: not on a technical error, not by a shared ack (BE-JOB-001).

When the database or the object store fails while a consumer holds a delivery, the delivery must stay unacked (or go
back to the queue) until the job has a durable outcome: its result committed, ``failed``, or a retry recorded. A
consumer that acks ("drops") the delivery instead leaves a job ``queued`` or ``processing`` with no message
anywhere; a lease recovery or a lost-message safety net may bring it back later, so nothing is lost at the end and
``lost_accepted_work`` is satisfied — but the ack was not matched against the transaction boundary. A shared
``multiple=true`` ack at the newest delivery tag settles the other unfinished deliveries of a batch the same way.

The harness cannot see an ack (the firehose traces publishes and deliveries, not acks), but it sees what an ack
allows: the broker hands a consumer a new delivery only while the consumer holds fewer unacked deliveries than its
prefetch. So, from the traced deliveries of the work queue (``delivery`` lines with the message's ``job_id``,
``attempt`` and the broker's ``connection`` and ``channel``):

* a delivery ``d`` of (job, attempt) is **necessarily still held** at a later instant ``x`` when it is the only
  delivery of that (job, attempt) in the whole run (never redelivered, so never given back; no copy that could
  have been the one claimed), the job was ``queued`` or ``processing`` at that attempt at ``x``, and between
  ``d`` (less the tap's lag) and ``x`` (plus a slack) the job had no transition other than its claim
  (``queued -> processing`` at that attempt) — nothing durable that would let its owner ack;
* at each delivery ``x`` to a channel, in any scenario, the deliveries of that
  channel necessarily still held must number fewer than the channel's bound: the declared prefetch
  (``[limits] prefetch``, per consumer) times the most consumers the work queue had at once (a channel has at most
  that many). Reaching the bound means the broker had a free slot it could not have had: at least one of them was
  acked while its job was unfinished — ``invalid``. The evidence says whether a dependency fault was in force (a
  failing toxic — cut, blackhole, reset_peer — a restart of the database or the object store, or the store refusing
  writes with 403, until ``lease_seconds`` after it ended, when declared): ``database-outages-past-lease`` relies
  on the check, its backlog keeping the prefetch full through each cut.

The harness's own looks into the queue (management API gets, on a direct connection named ``<user@node...>``) are
not a consumer's and are never judged. Deliveries a consumer gives back (nack, a closed channel) are redelivered and
so never counted; nor is a delivery of an attachment that has several jobs (level 5: another pipeline version),
whose transitions name no job; a job that reached
any outcome, or a recovery, is not counted from then on. Unknown (where a scenario relies on it) when deliveries were
not traced, or the adapter declares no prefetch, or the work queue never showed a consumer (``basic.get`` ignores
the prefetch), or no consumer was handed a delivery while it held another of an unfinished job and no backlog
waited through a fault (below). Exercised when one was, or when the broker's own figures show the same: a
work-queue sample inside a dependency fault (at least a second into it: the management statistics lag) with
messages ready while the queue's one consumer held its whole prefetch unacked — the broker pushes a ready message
to a free slot, so every delivery was held, and one settled would have brought a delivery the count above judges.

Its own finding, with an invalid verdict: how many of the jobs so held ended terminal all the same — their delivery
never handed out again, so a lease recovery or the lost-message safety net did the work the broker should have.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, seed_of, timing, transitions_of, FinalState, RunInfo

NAME = "dropped_delivery"
REQUIREMENTS = ["BE-JOB-001"]

FAILING_TOXICS = frozenset({"cut", "blackhole", "reset_peer"})
BROKER_SERVICES = frozenset({"rabbitmq", "broker", "amqp"})
# A delivery line is written when the tap drains the firehose (every 0.2 s, later on a loaded machine): the real
# delivery may precede its line by this much. Transitions within it of a delivery are taken as possibly after it.
TAP_LAG_SECONDS = 2.0
# Transition times are the implementation's (its database's clock): one this close after a delivery line counts
# as possibly before the delivery.
SLACK_SECONDS = 0.5


def dependency_windows(history: History, grace: float) -> list[tuple[float, float, dict[str, Any]]]:
    """(start wall, end wall + grace, start line) of each fault that made the database or the object store fail."""
    out = []
    for e in history.of_type("fault"):
        if e.get("phase") != "start" or str(e.get("service") or "") in BROKER_SERVICES:
            continue
        failing = ((e.get("action") == "toxic" and e.get("toxic") in FAILING_TOXICS) or e.get("action") == "restart_service"
                   or (e.get("action") == "s3_deny" and e.get("probe_status") == 403))
        if not failing:
            continue
        end = next((x for x in history.of_type("fault") if x["seq"] > e["seq"] and x.get("phase") == "end"
                    and x.get("action") == e.get("action") and x.get("service") == e.get("service")
                    and x.get("toxic") == e.get("toxic")), None)
        out.append((e["wall"], (end["wall"] if end is not None else float("inf")) + grace, e))
    return out


# Queue figures come from the management API's statistics, refreshed every half second in the harness's broker (up to
# 5 s in a default RabbitMQ): a sample counts only this long after its fault began.
STATS_LAG_SECONDS = 1.0


def backlog_during_faults(samples: list[dict[str, Any]], windows: list[tuple[float, float, dict[str, Any]]],
                          bound: int, grace: float) -> dict[str, Any] | None:
    """A work-queue sample taken inside a dependency fault (its grace left out) with messages ready, one consumer and
    every slot of it taken (``unacked`` at the bound): the broker pushes a ready message to a consumer with a free
    slot, so its deliveries were all held — had the consumer settled one while its job was unfinished, the broker
    would have handed it another, a delivery the count above judges. Without it a consumer that never held a full
    prefetch through a fault shows nothing either way. One consumer only: with several, one channel cannot reach
    the bound, so a drop could not be counted."""
    for sample in samples:
        if int(sample.get("consumers") or 0) != 1 or not int(sample.get("ready") or 0):
            continue
        if int(sample.get("unacked") or 0) < bound:
            continue
        for start, judged_until, fault in windows:
            if start + STATS_LAG_SECONDS <= sample["wall"] <= judged_until - grace:  # the fault itself, not its grace
                return {"fault": fault, "sample": sample}
    return None


def _key(d: dict[str, Any]) -> tuple[Any, ...] | None:
    if not d.get("job_id") or d.get("attempt") is None or not d.get("attachment_id"):
        return None
    return str(d["job_id"]), d["attempt"]


def held_at(trans: list[dict[str, Any]], d: dict[str, Any], x_wall: float) -> bool:
    """Whether a correct consumer must still hold delivery ``d`` (its job's only one at its attempt) at ``x_wall``."""
    if not trans or any(t["at"] is None for t in trans):
        return False
    attempt = d["attempt"]
    until = x_wall + SLACK_SECONDS
    current = [t for t in trans if t["at"] <= until]
    if not current or current[-1]["to"] not in ("queued", "processing") or current[-1]["attempt"] != attempt:
        return False
    for t in trans:
        if d["wall"] - TAP_LAG_SECONDS < t["at"] <= until:
            harmless = ((t["from"] is None and t["to"] == "queued") or
                        (t["from"] == "queued" and t["to"] == "processing" and t["attempt"] == attempt))
            if not harmless:
                return False
    return True


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    asked = NAME in ((run.get("scenario") or {}).get("checks") or [])
    seed = seed_of(run)
    # How long after a fault its deliveries are still judged (a grace only: the count is sound at any instant).
    lease = timing(run, "lease_seconds") or 0.0
    windows = dependency_windows(history, lease)

    def undecided(why: str) -> Verdict:
        if asked:
            return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"cannot tell: {why}", seed=seed)
        return Verdict(NAME, VALID, REQUIREMENTS, f"not exercised: {why}", exercised=False, seed=seed)

    if not any(e.get("source") == "firehose" and e.get("deliveries") for e in history.of_type("observe")):
        return undecided("deliveries from the work queue were not traced (no firehose): what the broker handed out, "
                         "and so what it could hand out, is not known")
    prefetch = ((run.get("adapter") or {}).get("limits") or {}).get("prefetch")
    if not prefetch:
        return undecided("the adapter declares no finite prefetch ([limits] prefetch): the broker's free slots are "
                         "not known")
    work_queue = ((run.get("adapter") or {}).get("broker") or {}).get("work_queue")
    samples = [q for q in history.of_type("queue") if not q.get("dead_letter")
               and (work_queue is None or q.get("queue") == work_queue)]
    consumers = max((int(q.get("consumers") or 0) for q in samples), default=0)
    if consumers < 1:
        return undecided("the work queue never showed a consumer (basic.get ignores the prefetch)")
    bound = int(prefetch) * consumers

    deliveries = [d for d in history.of_type("delivery") if work_queue is None or d.get("queue") in (None, work_queue)]
    once: dict[tuple[Any, ...], int] = {}
    for d in deliveries:
        k = _key(d)
        if k is not None:
            once[k] = once.get(k, 0) + 1
    trans_cache: dict[str, list[dict[str, Any]]] = {}

    def trans(attachment_id: str) -> list[dict[str, Any]]:
        if attachment_id not in trans_cache:
            trans_cache[attachment_id] = transitions_of(history, final or {}, attachment_id)
        return trans_cache[attachment_id]

    def one_job(attachment_id: str) -> bool:
        """An attachment with several jobs (level 5: another pipeline version of it, whose messages may go to a queue
        of their own) is read with the transitions of its latest job only, which name no job: whether an earlier
        job's delivery is still held cannot be read from them. Not judged."""
        body = ((((final or {}).get("attachments") or {}).get(attachment_id) or {}).get("body") or {})
        versions: list[Any] = body["versions"] if isinstance(body.get("versions"), list) else []
        return len(versions) <= 1 and sum(t["from"] is None for t in trans(attachment_id)) <= 1

    by_channel: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for d in deliveries:
        by_channel.setdefault((d.get("connection"), d.get("channel")), []).append(d)
    problems, judged, contested, in_faults = [], 0, 0, 0
    for channel, items in by_channel.items():
        if channel == (None, None):
            continue  # the broker did not say which channel: nothing to count per consumer
        if str(channel[0] or "").startswith("<"):
            continue  # a direct (in-broker) connection: the harness's own looks through the management API (a
            # basic.get, no prefetch), never a consumer of the implementation, whose connections are "ip:port -> ..."
        for i, x in enumerate(items):
            window = next((w for w in windows if w[0] <= x["wall"] <= w[1]), None)
            judged += 1
            in_faults += window is not None
            held = [d for d in items[:i] if (key := _key(d)) is not None and once[key] == 1
                    and one_job(d["attachment_id"]) and held_at(trans(d["attachment_id"]), d, x["wall"])]
            contested += bool(held)
            if len(held) >= bound:
                during = (f"during a dependency fault ({window[2].get('action')} on {window[2].get('service')}, line "
                          f"{window[2].get('line')})" if window else "outside any dependency fault")
                problems.append(evidence(
                    f"the broker handed channel {channel[1]} of {channel[0]} a delivery {during} while {len(held)} "
                    f"deliveries it held were of jobs still queued or processing at their attempt, with nothing "
                    f"recorded since (bound: prefetch {prefetch} x {consumers} consumers = {bound}): at least one was "
                    "acked while its job was unfinished", events=([window[2]] if window else []) + [x, *held],
                    job_id=x.get("job_id"), during_fault=bool(window),
                    attachment_id=x.get("attachment_id"), delivered_wall=x["wall"], bound=bound,
                    held=[{"job_id": d["job_id"], "attachment_id": d["attachment_id"], "attempt": d["attempt"],
                           "delivered_wall": d["wall"], "line": d.get("line")} for d in held]))
    if problems:
        held_ids = {h["attachment_id"] for item in problems for h in item["held"]}
        states = {a: (((final or {}).get("attachments") or {}).get(a) or {}).get("body", {}).get("state")
                  for a in held_ids}
        finished = sorted(a for a, state in states.items() if state in ("ready", "failed"))
        faulted = sum(1 for item in problems if item["during_fault"])
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} deliveries handed to a consumer ({faulted} "
                       "during a dependency fault) prove that it had settled deliveries of unfinished jobs (no "
                       f"outcome, no retry recorded, never given back); {len(finished)} of the {len(held_ids)} jobs so held ended "
                       "terminal all the same, their delivery never handed out again: a recovery or the safety net "
                       "did the work", evidence=problems, seed=seed)
    if not contested:
        waited = backlog_during_faults(samples, windows, bound, lease)
        if waited is None:
            return undecided(f"no consumer was handed a delivery while it held another of an unfinished job ({judged} "
                             "deliveries judged), nor did messages wait in the queue while a fault held its one consumer's "
                             "deliveries")
        return Verdict(NAME, VALID, REQUIREMENTS, f"during a dependency fault ({waited['fault'].get('action')} on "
                       f"{waited['fault'].get('service')}) {waited['sample'].get('ready')} messages waited ready in the "
                       f"work queue while its one consumer held {waited['sample'].get('unacked')} deliveries (prefetch "
                       f"{prefetch}), and the broker handed it none: no delivery was settled while its job was "
                       f"unfinished ({judged} deliveries judged)", evidence=[evidence(
                           "messages ready while the consumer's deliveries were held through a dependency fault",
                           events=[waited["fault"], waited["sample"]], bound=bound)], seed=seed)
    return Verdict(NAME, VALID, REQUIREMENTS, f"{contested} of {judged} deliveries were handed to a consumer holding "
                   f"unfinished work ({in_faults} of the {judged} during {len(windows)} dependency faults): none "
                   "implies a settled "
                   f"delivery of unfinished work (bound {bound} per channel)", seed=seed)
