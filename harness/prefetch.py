"""Bounded prefetch (BE-JOB-004), read from outside: every consumer of a queue, its prefetch_count and its
channel's messages_unacknowledged, as the RabbitMQ management API reports them.

Shared by the harness (consumer samples in the history, the `bounded_concurrency` checker) and the load probe
(load/prefetch.py). `read_consumers` does the I/O on a given client; `evaluate` is pure.
"""
from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChannelSample:
    at: float
    channel: str
    prefetch: int
    unacked: int  # the channel's messages_unacknowledged: shared by every consumer on that channel
    consumer: str = ""
    tick: int | None = None  # one read of every consumer (samples of one read share it; else their `at`)


@dataclass
class PrefetchVerdict:
    ok: bool
    max_unacked: int
    prefetch: int | None
    samples: int
    violations: list[ChannelSample] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.samples:
            return "prefetch unknown: no consumer channel was sampled"
        state = "within" if self.ok else "EXCEEDED"
        return (f"prefetch {state}: max unacked per consumer channel {self.max_unacked} with prefetch "
                f"{self.prefetch} over {self.samples} samples" +
                (f"; first violation {self.violations[0]}" if self.violations else ""))


def read_consumers(client, vhost: str, queue: str) -> list[ChannelSample]:
    """One sample of every consumer on `queue`; `client` is an httpx.Client on the management API."""
    quoted = urllib.parse.quote(vhost, safe="")
    consumers = client.get(f"/api/consumers/{quoted}").raise_for_status().json()
    now = time.time()
    samples = []
    for consumer in (c for c in consumers if c["queue"]["name"] == queue):
        details = consumer.get("channel_details")
        if not isinstance(details, dict) or not details.get("name"):
            continue  # listed before the broker filled in its channel (an empty list, not an object): next tick
        channel_name = details["name"]
        channel = client.get(f"/api/channels/{urllib.parse.quote(channel_name, safe='')}")
        if channel.status_code != 200:
            continue  # the channel closed between the two reads
        body = channel.json()
        # Prefetch may be set per consumer (basic.qos global=false) or per channel (global=true).
        prefetch = consumer.get("prefetch_count") or body.get("prefetch_count") or body.get("global_prefetch_count") or 0
        samples.append(ChannelSample(now, channel_name, int(prefetch), int(body.get("messages_unacknowledged", 0)),
                                     consumer.get("consumer_tag") or ""))
    return samples


def channel_bound(group: list[ChannelSample]) -> tuple[int, int]:
    """(consumers, the most deliveries they may hold together) for the samples of one channel at one read: the
    unacked count is the channel's, so several consumers on one channel (per-consumer prefetch, basic.qos
    global=false) are bounded by the sum of their prefetches, never each by its own."""
    prefetch = {s.consumer: s.prefetch for s in group}
    return len(prefetch), sum(prefetch.values())


def evaluate(samples: list[ChannelSample], limit: int | None = None) -> PrefetchVerdict:
    """Unacked ≤ prefetch on every channel at every read (the sum of its consumers' prefetches); a prefetch of 0
    means unlimited, which itself is a violation. With `limit` (the implementation's declared prefetch per
    consumer), a prefetch above it, or a channel's unacked above it times its consumers, are violations too."""
    groups: dict[tuple, list[ChannelSample]] = {}
    for s in samples:
        groups.setdefault((s.tick if s.tick is not None else s.at, s.channel), []).append(s)
    violations = []
    for group in groups.values():
        consumers, bound = channel_bound(group)
        unacked = max(s.unacked for s in group)
        over = unacked > bound or (limit is not None and unacked > limit * consumers)
        violations += [s for s in group if over or s.prefetch == 0 or (limit is not None and s.prefetch > limit)]
    prefetches = {s.prefetch for s in samples}
    return PrefetchVerdict(ok=bool(samples) and not violations, max_unacked=max((s.unacked for s in samples), default=0),
                           prefetch=max(prefetches) if prefetches else None, samples=len(samples),
                           violations=violations)
