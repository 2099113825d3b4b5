"""Broken on purpose: no prefetch limit.

The reference's worker asks the broker for a prefetch of WORKER_CONCURRENCY
(or PREFETCH) deliveries. This variant asks for 0 — "no limit" in AMQP — the
default of many client libraries when nobody sets it: under a backlog the
broker pushes every ready message to the first consumer, which holds them all
unacked in its memory while it works through them a few at a time.

Everything else is the reference (its own in-process bound on concurrent work
still holds: the bug is the unbounded local queue, not extra parallelism).
"""

import sys

import aio_pika

from reference.cli import main

_set_qos = aio_pika.Channel.set_qos


async def _unlimited_qos(self, *args, **kwargs):
    kwargs["prefetch_count"] = 0  # THE BUG: basic.qos(prefetch_count=0) = unlimited
    return await _set_qos(self, *args, **kwargs)


# Patched at the broker call, not in the settings: the settings' own checks (a batch never larger than the
# prefetch) still see the configured prefetch, as they would in a service that forgot to pass it on.
aio_pika.Channel.set_qos = _unlimited_qos

if __name__ == "__main__":
    sys.exit(main())
