"""Invariant 8 — bounded concurrency (BE-JOB-004).

While a backlog drains, the runner samples every consumer of the work queue from the RabbitMQ management
API (``consumer`` history lines: prefetch_count and the channel's messages_unacknowledged). Invalid when a
consumer's prefetch is 0 (unlimited), when a channel's unacked deliveries exceed the prefetch of its consumers
(their sum: several consumers may share one channel, each with its own prefetch), or when either exceeds the
prefetch limit the adapter declares (``[limits] prefetch``, per consumer). Too few samples with a consumer holding
deliveries prove nothing: unknown. So does a bound the backlog never reached: a finite prefetch proves a bound only
when more work waited than the consumers may hold (the backlog — uploads accepted before the consumers were
released — must exceed the declared prefetch × the consumers seen at once), and without a declared prefetch the
harness cannot tell a bound from a large number (unknown).
"""

from __future__ import annotations

from ..prefetch import ChannelSample, channel_bound, evaluate
from ..history import History
from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, seed_of, FinalState, RunInfo

NAME = "bounded_concurrency"
REQUIREMENTS = ["BE-JOB-004"]
# The broker refreshes its statistics every 500 ms on the harness stack: a few seconds of draining at ~0.15 s
# gives dozens of ticks; fewer than this did not watch the drain.
MIN_TICKS = 5


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    scenario = run.get("scenario") or {}
    options = (scenario.get("check_options") or {}).get(NAME) or {}
    limit = (run.get("adapter", {}).get("limits") or {}).get("prefetch")
    lines = [e for e in history.of_type("consumer") if e.get("consumer_tag") is not None]
    sampled = any(e.get("name") == "consumer_sampling_start" for e in history.of_type("phase"))
    if not sampled and NAME not in (scenario.get("checks") or []):
        return Verdict(NAME, VALID, REQUIREMENTS, "no consumer sampling in this scenario", exercised=False,
                       seed=seed_of(run))
    samples = {id(e): ChannelSample(e["wall"], e.get("channel") or "", int(e.get("prefetch") or 0),
                                    int(e.get("unacked") or 0), e.get("consumer_tag") or "", e.get("tick"))
               for e in lines}
    by_sample = {samples[id(e)]: e for e in lines}
    verdict = evaluate(list(samples.values()), limit)
    if verdict.violations:
        problems = []
        for s in verdict.violations[:20]:
            e = by_sample[s]
            n, bound = channel_bound([o for o in samples.values() if o.channel == s.channel and o.tick == s.tick
                                      and (o.tick is not None or o.at == s.at)] or [s])
            shared = f" (the sum over the {n} consumers on its channel)" if n > 1 else ""
            why = ("prefetch 0 (unlimited)" if s.prefetch == 0 else
                   f"unacked {s.unacked} > prefetch {bound}{shared}" if s.unacked > bound else
                   f"prefetch {s.prefetch} / unacked {s.unacked} above the declared limit {limit}{shared}")
            problems.append(evidence(f"consumer {s.consumer}: {why}", events=[e], consumer_tag=s.consumer,
                                     channel=s.channel, prefetch=s.prefetch, unacked=s.unacked, limit=limit))
        over = sorted({s.consumer for s in verdict.violations})
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len(verdict.violations)} samples over the bound on consumers {', '.join(over)}",
                       evidence=problems, seed=seed_of(run))
    busy_ticks = {e.get("tick") for e in lines if (e.get("unacked") or 0) > 0}
    ticks = {e.get("tick") for e in lines}
    need = int(options.get("min_ticks", MIN_TICKS))
    summary = (f"{len(ticks)} sampling ticks ({len(busy_ticks)} with deliveries in flight) over "
               f"{len({s.consumer for s in samples.values()})} consumers: max unacked {verdict.max_unacked}, "
               f"prefetch {verdict.prefetch}, declared limit {limit}")
    facts = [evidence(summary, events=lines[:1] + lines[-1:], consumers=sorted({s.consumer for s in samples.values()}),
                      max_unacked=verdict.max_unacked, prefetch=verdict.prefetch, limit=limit)]
    if len(busy_ticks) < need:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"too few samples to judge (need {need} ticks with deliveries "
                       f"in flight): {summary}", evidence=facts, seed=seed_of(run))
    if limit is None:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "the adapter declares no prefetch ([limits] prefetch): a "
                       f"finite prefetch cannot be told from one too large to bound anything; {summary}",
                       evidence=facts, seed=seed_of(run))
    per_tick: dict[int | None, set[str]] = {}
    for s in samples.values():
        per_tick.setdefault(s.tick, set()).add(s.consumer)
    consumers = max((len(c) for c in per_tick.values()), default=0)
    backlog = backlog_of(history)
    facts.append(evidence(f"backlog {backlog} against the declared prefetch {limit} × {consumers} consumers",
                          backlog=backlog, limit=limit, consumers_at_once=consumers))
    if backlog <= int(limit) * consumers:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"the bound was never reached: a backlog of {backlog} does not "
                       f"exceed the declared prefetch {limit} × {consumers} consumers, so every waiting message "
                       f"may be held at once whatever the bound; {summary}", evidence=facts, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"unacked within prefetch: {summary}", evidence=facts,
                   seed=seed_of(run))


def backlog_of(history: History) -> int:
    """What waited for the consumers when they were released (the ``hold_end`` of the step that started the
    sampling, else the whole run): the uploads accepted (202) by then, or the messages the tap saw reach the work
    queue by then, whichever is more."""
    start = next((e for e in history.of_type("phase") if e.get("name") == "consumer_sampling_start"), None)
    ends = [e for e in history.of_type("phase") if e.get("name") == "hold_end"
            and (start is None or e.get("fault") == start.get("fault"))]
    until = min((e["wall"] for e in ends), default=None)
    accepted = {ok.get("attachment_id") for _, ok in history.accepted()
                if until is None or ok["wall"] <= until}
    published = [m for m in history.of_type("message") if until is None or m["wall"] <= until]
    return max(len(accepted - {None}), len(published))
