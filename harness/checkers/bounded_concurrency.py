"""Invariant 8 — bounded concurrency (BE-JOB-004).

While a backlog drains, the runner samples every consumer of the work queue from the RabbitMQ management
API (``consumer`` history lines: prefetch_count and the channel's messages_unacknowledged). Invalid when a
consumer's prefetch is 0 (unlimited), when its unacked deliveries exceed its prefetch, or when either exceeds
the prefetch limit the adapter declares (``[limits] prefetch``). Too few samples with a consumer holding
deliveries prove nothing: unknown.
"""

from __future__ import annotations

from ..prefetch import ChannelSample, evaluate
from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, seed_of

NAME = "bounded_concurrency"
REQUIREMENTS = ["BE-JOB-004"]
# The broker refreshes its statistics every 500 ms on the harness stack: a few seconds of draining at ~0.15 s
# gives dozens of ticks; fewer than this did not watch the drain.
MIN_TICKS = 5


def check(history, final, run) -> Verdict:
    scenario = run.get("scenario") or {}
    options = (scenario.get("check_options") or {}).get(NAME) or {}
    limit = (run.get("adapter", {}).get("limits") or {}).get("prefetch")
    lines = [e for e in history.of_type("consumer") if e.get("consumer_tag") is not None]
    sampled = any(e.get("name") == "consumer_sampling_start" for e in history.of_type("phase"))
    if not sampled and NAME not in (scenario.get("checks") or []):
        return Verdict(NAME, VALID, REQUIREMENTS, "no consumer sampling in this scenario", exercised=False,
                       seed=seed_of(run))
    samples = {id(e): ChannelSample(e["wall"], e.get("channel") or "", int(e.get("prefetch") or 0),
                                    int(e.get("unacked") or 0), e.get("consumer_tag") or "") for e in lines}
    by_sample = {samples[id(e)]: e for e in lines}
    verdict = evaluate(list(samples.values()), limit)
    if verdict.violations:
        problems = []
        for s in verdict.violations[:20]:
            e = by_sample[s]
            why = ("prefetch 0 (unlimited)" if s.prefetch == 0 else
                   f"unacked {s.unacked} > prefetch {s.prefetch}" if s.unacked > s.prefetch else
                   f"prefetch {s.prefetch} / unacked {s.unacked} above the declared limit {limit}")
            problems.append(evidence(f"consumer {s.consumer}: {why}", events=[e], consumer_tag=s.consumer,
                                     channel=s.channel, prefetch=s.prefetch, unacked=s.unacked, limit=limit))
        consumers = sorted({s.consumer for s in verdict.violations})
        return Verdict(NAME, INVALID, REQUIREMENTS,
                       f"{len(verdict.violations)} samples over the bound on consumers {', '.join(consumers)}",
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
    return Verdict(NAME, VALID, REQUIREMENTS, f"unacked within prefetch: {summary}", evidence=facts,
                   seed=seed_of(run))
