"""No ack after the lease was lost (BE-JOB-006.4).

Where the database holds the lease and a role recovers stuck work, a stale owner acking its old delivery once the
job was recovered is harmless: the recovery gave the job a way back. The harm the seed guards against is an owner
that lost (or let lapse) its lease and SETTLES ITS DELIVERY WITHOUT A DURABLE OUTCOME: the message is gone while the
job is not done, and only a recovering role could still save it.

So a scenario pauses (SIGSTOP) a consumer holding a job for longer than its lease, with every role that recovers
work held (``hold`` on the sigstop step; the paused role itself is never held), resumes it, and keeps recovery held
while it probes (``probe_seconds``): each sample records the work queue's exact ready count (passive declare), the
management API's unacked count (refreshed every statistics interval, so it lags), then every job's state read
afresh. Nobody recovered the job, so the woken owner may revive its lapsed lease and commit (docs/CONTRACT.md §8),
or give the delivery back (nack, or a durable transition of its own); what it may not do is ack and walk away.

For each job in ``processing`` when the pause began, judged on samples where it is the only unfinished job (the
queue's counts are then its own):

* invalid — at the end of the probe it was still ``processing`` and the work queue held no message in every sample
  of the last ``queue_stats_lag_seconds`` (check option, default 1.5 s, at least 3 samples): the exact ready count 0,
  and ready + unacked 0 in the management API's snapshot. That snapshot lags (a quorum queue's counts reach the API
  up to ~5 s late on RabbitMQ 3.10), but its two counts are of one instant, so a delivery moving between ready and
  unacked, a nack or a dropped connection never shows there as an empty queue; the lag only delays an ack showing,
  so the probe must outlast it (an ack later than the probe's end minus the lag is not seen);
* valid — it left ``processing`` (terminal, or a transition of the owner's own) during the probe, or a message was
  in the work queue at the end of it;
* unknown — the probe was not taken, the samples could not be attributed, or the queue was empty for less than the
  statistics lag at the end (inconsistent).

Exercised only when a consumer was paused past its lease while holding a job, with recovery held from before the
pause to the end of the probe, and the probe saw the job after the wake-up.

**After a recovery** (recovery not held; the job left ``processing`` while its owner slept): the seed says a lost
lease must not lead to the message being acknowledged, recovered or not. The owner's delivery (the last delivery of
the claimed attempt's message the broker's firehose traced up to TRACE_LAG_SECONDS after the claim or the pause,
while the paused instance was the only consumer instance) must be given back — nacked or returned with its channel —
which shows as a later redelivery of the same message (same bytes, ``redelivered``). None by the end of the run, with
the work queue empty at the final read (nothing returned and still waiting there): the old owner settled it →
``invalid``. Without such a traced delivery, or with messages left in the queue: ``unknown`` where the scenario
relies on this check, else a note.
"""

from __future__ import annotations

from typing import Any

from .ack_after_commit import hold_intervals, in_flight_at
from ..history import Event, History
from .base import (INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, consumer_roles, evidence, recovering_roles,
                   role_kind, seed_of, timing, transitions_of, FinalState, RunInfo)
from .lease_ownership import pauses

NAME = "stale_ack"
REQUIREMENTS = ["BE-JOB-006"]
TIMINGS = ("lease_seconds",)
DEFAULT_STATS_LAG = 1.5
TRACE_LAG_SECONDS = 1.0
MIN_SAMPLES = 3


def probe_phases(history: History) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(resume_probe_start, resume_probe_end or None) phase pairs."""
    phases = history.of_type("phase")
    out = []
    for start in [e for e in phases if e.get("name") == "resume_probe_start"]:
        end = next((e for e in phases if e.get("name") == "resume_probe_end" and e["seq"] > start["seq"]
                    and e.get("fault") == start.get("fault")), None)
        out.append((start, end))
    return out


def messages(sample: dict[str, Any]) -> int:
    """Messages of the work queue in a probe sample: the exact ready count (now), or the management snapshot's
    ready + unacked (one consistent, possibly stale, instant: a delivery moving between ready and unacked, or a
    nack, never shows there as an empty queue), whichever is larger."""
    snapshot = (sample.get("stats_ready") or 0) + (sample.get("unacked") or 0)
    return max(sample.get("ready") or 0, snapshot)


def judge(attachment_id: str, samples: list[dict[str, Any]], lag: float) -> tuple[str, str, dict[str, Any]]:
    """(status, why, facts) for one held job over the probe's samples (in order)."""
    seen = [s for s in samples if attachment_id in (s.get("states") or {})]
    if not seen:
        return UNKNOWN, "the probe never read its state", {}
    left = next((s for s in seen if s["states"][attachment_id] != "processing"), None)
    if left is not None:
        return VALID, f"left processing ({left['states'][attachment_id]}) during the probe", {
            "outcome": left["states"][attachment_id], "outcome_t": left["t"]}
    # From here on the job was processing in every sample: are there messages, and whose?
    usable: list[Event | None] = []
    for s in seen:
        unfinished = [a for a, st in (s.get("states") or {}).items() if st not in TERMINAL_STATES]
        if unfinished != [attachment_id] or s.get("ready") is None or s.get("unacked") is None:
            usable.append(None)  # another unfinished job, or a count missing: this sample proves nothing
        else:
            usable.append(s)
    if usable[-1] is None:
        return UNKNOWN, "the last sample could not be attributed to this job (another unfinished job, or a count " \
                        "missing)", {}
    streak: list[Event] = []
    for sample in reversed(usable):
        if sample is None or messages(sample) > 0:
            break
        streak.append(sample)
    streak.reverse()
    last = usable[-1]
    facts: dict[str, Any] = {"last_sample": {"t": last["t"], "wall": last["wall"], "ready": last["ready"],
                             "stats_ready": last.get("stats_ready"), "unacked": last["unacked"],
                             "consumers": last.get("consumers")}}
    if not streak:
        return VALID, "still processing, its message still in the work queue at the end of the probe " \
                      f"(ready {last['ready']}, unacked {last['unacked']})", facts
    span = streak[-1]["wall"] - streak[0]["wall"]
    facts.update(empty_from_t=streak[0]["t"], empty_from_wall=streak[0]["wall"], empty_for_seconds=round(span, 2),
                 empty_samples=len(streak))
    if span >= lag and len(streak) >= MIN_SAMPLES:
        return INVALID, f"still processing while the work queue held no message of it (ready 0, unacked 0) for " \
                        f"the last {span:.1f}s of the probe, every recovering role held", facts
    return UNKNOWN, f"the work queue was empty only for the last {span:.1f}s ({len(streak)} samples): less than " \
                    f"the statistics lag ({lag:g}s), inconclusive", facts


def only_consumer(history: History, consumers: frozenset[str], stop: dict[str, Any]) -> bool:
    """Whether the paused instance was the only consumer instance started before the pause (so every delivery traced
    before it went to the paused owner)."""
    started = {e.get("role") for e in history.of_type("role") if e.get("action") == "start"
               and role_kind(e.get("role")) in consumers and e["wall"] <= stop["wall"]}
    return started <= {stop.get("role")}


def given_back(history: History, final: FinalState, attachment_id: str, trans: list[dict[str, Any]], stop: dict[str, Any], cont: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(status, why, facts) for the delivery a paused owner held when its job was recovered while it slept."""
    deliveries = [e for e in history.of_type("delivery") if e.get("attachment_id") == attachment_id]
    # The firehose's copy of a delivery reaches the harness a little after the delivery itself (which came before the
    # claim, and the claim before the pause): a line up to TRACE_LAG_SECONDS after the pause is still the owner's.
    flight = in_flight_at(trans, stop["wall"]) or {}
    claimed = flight.get("at") if flight.get("at") is not None else stop["wall"]
    held = [e for e in deliveries if e["wall"] < min(stop["wall"], claimed) + TRACE_LAG_SECONDS
            and (not isinstance(e.get("attempt"), int) or not isinstance(flight.get("attempt"), int)
                 or e["attempt"] == flight["attempt"])]
    if not held:
        return UNKNOWN, "no delivery of the job was traced before the pause (firehose)", {}
    mine = held[-1]
    facts = {"delivery_line": mine["seq"], "delivered_wall": mine["wall"], "message_sha256": mine.get("sha256")}
    again = next((e for e in deliveries if e["seq"] > mine["seq"] and e.get("sha256") == mine.get("sha256")
                  and e.get("redelivered")), None)
    if again is not None:
        return VALID, "its delivery was given back after the pause (the same message redelivered)", {
            **facts, "redelivered_line": again["seq"], "redelivered_wall": again["wall"]}
    work = ((final or {}).get("queues") or {}).get("work") or {}
    if not final or work.get("ready") is None:
        return UNKNOWN, "no redelivery of its message traced, and the work queue's depth at the end is unknown", facts
    if work.get("ready"):
        return UNKNOWN, f"no redelivery of its message traced, but {work['ready']} messages were still in the work " \
                        "queue at the end (it may have been given back late)", facts
    return INVALID, "the old owner woke past its lost lease (the job was recovered while it slept) and " \
                    "its delivery was never seen again: settled (acked) instead of given back — a lost lease led to " \
                    "the message being acknowledged", facts


def after_recovery(history: History, final: FinalState, run: RunInfo, consumers: frozenset[str], ids: list[str],
                   stop: Event, cont: Event, lease: float) -> list[tuple[str, dict[str, Any]]]:
    """(status, evidence) for each job a paused owner held whose job was recovered while it slept (recovery not
    held): was its delivery given back? [] when there is none, or the deliveries cannot be attributed."""
    if not only_consumer(history, consumers, stop):
        return []
    out = []
    for attachment_id in ids:
        trans = transitions_of(history, final or {}, attachment_id)
        flight = in_flight_at(trans, stop["wall"])
        if flight is None:
            continue
        left = next((t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0) and t["at"] is not None), None)
        if left is None or left["from"] != "processing" or left["to"] not in ("queued", "failed") \
                or left["at"] >= cont["wall"]:
            continue  # not recovered while it slept (or ended by the owner itself)
        status, why, facts = given_back(history, final, attachment_id, trans, stop, cont)
        out.append((status, evidence(why, attachment_id=attachment_id, events=[stop, cont], attempt=flight["attempt"],
                                     paused_seconds=round(cont["wall"] - stop["wall"], 2), lease_seconds=lease,
                                     recovered_at=left["at_text"], **facts)))
    return out


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    consumers, recovering = consumer_roles(run), recovering_roles(run)
    paused = pauses(history, consumers)
    if not paused:
        return Verdict(NAME, VALID, REQUIREMENTS, "no consumer was paused: no stale owner to watch",
                       exercised=False, seed=seed_of(run))
    lease = timing(run, "lease_seconds")
    if lease is None:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "a consumer was paused, but the adapter declares no "
                       "lease_seconds: cannot tell whether it outlived its lease", seed=seed_of(run))
    options = (run.get("scenario") or {}).get("check_options") or {}
    lag = float(options.get("queue_stats_lag_seconds", DEFAULT_STATS_LAG))
    probes = probe_phases(history)
    queue_samples = [q for q in history.of_type("queue") if q.get("kind") == "resume_probe"]
    ids = sorted(set((final or {}).get("attachments", {})) |
                 {e["attachment_id"] for e in history.of_type("transition") if e.get("attachment_id")})
    problems: list[dict[str, Any]] = []
    proven: list[dict[str, Any]] = []
    unknowns: list[dict[str, Any]] = []
    notes: list[str] = []
    asked = NAME in ((run.get("scenario") or {}).get("checks") or [])

    def judged_after_recovery(stop: Event, cont: Event) -> bool:
        """The pause judged by what its owner's delivery did after the job was recovered (no probe to read): each
        finding filed; an unknown where the scenario does not ask for this checker is a note. False: nothing to judge."""
        judged = after_recovery(history, final, run, consumers, ids, stop, cont, lease)
        for status, item in judged:
            if status == UNKNOWN and not asked:  # not this scenario's question: a note, not an unknown
                notes.append(f"{item['attachment_id']}: not judged after its recovery: {item['message']}")
                continue
            {VALID: proven, INVALID: problems, UNKNOWN: unknowns}[status].append(item)
        return bool(judged)

    for stop, cont in paused:
        if cont is None:
            notes.append(f"pause at line {stop['line']} never ended")
            continue
        if cont["wall"] - stop["wall"] <= lease:
            notes.append(f"pause at line {stop['line']} lasted {cont['wall'] - stop['wall']:.1f}s, not past the "
                         f"lease ({lease:g}s)")
            continue
        probe = next(((s, e) for s, e in probes if s["seq"] > cont["seq"]), None)
        if probe is None:
            if judged_after_recovery(stop, cont):
                continue
            notes.append(f"pause at line {stop['line']}: no probe after the wake-up")
            continue
        p_start, p_end = probe
        others = recovering - {role_kind(stop.get("role"))}
        hold = next((h for h in hold_intervals(history, others) if h[0] <= stop["wall"]
                     and (h[1] is None or (p_end is not None and h[1] >= p_end["wall"]))), None) if others else True
        if hold is None:
            if judged_after_recovery(stop, cont):
                continue
            notes.append(f"pause at line {stop['line']} not probed: {', '.join(sorted(others))} not held from before "
                         "the pause to the end of the probe (a recovery could mask a lost delivery)")
            continue
        end_wall = p_end["wall"] if p_end is not None else float("inf")
        samples = [q for q in queue_samples if p_start["wall"] <= q["wall"] <= end_wall]
        for attachment_id in ids:
            trans = transitions_of(history, final or {}, attachment_id)
            flight = in_flight_at(trans, stop["wall"])
            if flight is None:
                continue
            base: dict[str, Any] = dict(attachment_id=attachment_id, events=[stop, cont, p_start] + ([p_end] if p_end else []),
                        attempt=flight["attempt"], processing_since=flight["at_text"],
                        paused_wall=stop["wall"], resumed_wall=cont["wall"],
                        paused_seconds=round(cont["wall"] - stop["wall"], 2), lease_seconds=lease,
                        probe_from_wall=p_start["wall"], probe_to_wall=p_end and p_end["wall"],
                        held=sorted(others), samples=len(samples))
            done_before = next((t for t in trans if (t["seq"] or 0) > (flight["seq"] or 0) and t["at"] is not None
                                and t["at"] < cont["wall"] and t["from"] == "processing"), None)
            if done_before is not None:
                notes.append(f"{attachment_id}: left processing ({done_before['to']}) before the wake-up")
                continue
            if not samples:
                unknowns.append(evidence("the probe after the wake-up recorded no sample", **base))
                continue
            status, why, facts = judge(attachment_id, samples, lag)
            item = evidence(why, **base, **facts)
            {VALID: proven, INVALID: problems, UNKNOWN: unknowns}[status].append(item)
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} deliveries of an owner woken past its lease "
                       f"were settled by it: {problems[0]['message']}", evidence=problems + unknowns + proven,
                       seed=seed_of(run))
    if unknowns:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unknowns)} jobs of an owner woken past its lease could "
                       "not be judged: " + unknowns[0]["message"], evidence=unknowns + proven, seed=seed_of(run))
    if proven:
        return Verdict(NAME, VALID, REQUIREMENTS, f"{len(proven)} jobs of an owner woken past its lease: each "
                       "reached an outcome or kept its message in the work queue (recovery held), or its delivery "
                       "was given back (recovered while it slept)", evidence=proven, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, "not exercised: " + ("; ".join(notes) if notes else
                   "no consumer paused past its lease held a job in processing"),
                   exercised=False, seed=seed_of(run))
