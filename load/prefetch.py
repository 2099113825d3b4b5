"""Probe BE-JOB-004 from outside: per-consumer unacknowledged deliveries never exceed the prefetch limit.

Reads the RabbitMQ management API (loopback only): each consumer's prefetch_count on a queue, and each of
their channels' messages_unacknowledged, sampled while a backlog drains. Pure `evaluate()` turns samples
into a verdict with evidence.
"""
from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field

import httpx

from load.targets import require_loopback


@dataclass(frozen=True)
class ChannelSample:
    at: float
    channel: str
    prefetch: int
    unacked: int


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


def sample_channels(management_url: str, vhost: str, queue: str, auth=("harness", "harness")) -> list[ChannelSample]:
    """One sample of every consumer channel on `queue`."""
    require_loopback(management_url)
    quoted = urllib.parse.quote(vhost, safe="")
    with httpx.Client(base_url=management_url, auth=auth, timeout=5) as client:
        consumers = client.get(f"/api/consumers/{quoted}").raise_for_status().json()
        ours = [c for c in consumers if c["queue"]["name"] == queue]
        now = time.time()
        samples = []
        for consumer in ours:
            channel_name = consumer["channel_details"]["name"]
            channel = client.get(f"/api/channels/{urllib.parse.quote(channel_name, safe='')}")
            if channel.status_code != 200:
                continue  # the channel closed between the two reads
            body = channel.json()
            # Prefetch may be set per consumer (basic.qos global=false) or per channel (global=true).
            prefetch = consumer.get("prefetch_count") or body.get("prefetch_count") or body.get("global_prefetch_count") or 0
            samples.append(ChannelSample(now, channel_name, int(prefetch), int(body.get("messages_unacknowledged", 0))))
        return samples


def evaluate(samples: list[ChannelSample]) -> PrefetchVerdict:
    """Unacked ≤ prefetch on every sample; a prefetch of 0 means unlimited, which itself is a violation."""
    violations = [s for s in samples if s.prefetch == 0 or s.unacked > s.prefetch]
    prefetches = {s.prefetch for s in samples}
    return PrefetchVerdict(ok=bool(samples) and not violations, max_unacked=max((s.unacked for s in samples), default=0),
                           prefetch=max(prefetches) if prefetches else None, samples=len(samples),
                           violations=violations)
