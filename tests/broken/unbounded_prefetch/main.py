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

from reference.cli import main
from reference.settings import Settings

Settings.effective_prefetch = property(lambda self: 0)  # THE BUG: basic.qos(prefetch_count=0) = unlimited

if __name__ == "__main__":
    sys.exit(main())
