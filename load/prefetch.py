"""Probe BE-JOB-004 from outside: per-consumer unacknowledged deliveries never exceed the prefetch limit.

Reads the RabbitMQ management API (loopback only): each consumer's prefetch_count on a queue, and each of
their channels' messages_unacknowledged, sampled while a backlog drains. The reading and the pure
`evaluate()` live in harness/prefetch.py, which the harness's `bounded_concurrency` checker shares.
"""
from __future__ import annotations

from harness import http_clients
from harness.prefetch import ChannelSample, PrefetchVerdict, evaluate, read_consumers
from load.targets import require_loopback

__all__ = ["ChannelSample", "PrefetchVerdict", "evaluate", "sample_channels"]


def sample_channels(management_url: str, vhost: str, queue: str, auth=("harness", "harness")) -> list[ChannelSample]:
    """One sample of every consumer channel on `queue`."""
    require_loopback(management_url)
    with http_clients.client(base_url=management_url, auth=auth, timeout=5) as client:
        return read_consumers(client, vhost, queue)
