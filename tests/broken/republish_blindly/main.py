"""Broken on purpose: the lost-message safety net republishes blindly.

A queued job whose message was lost (dead-lettered, say) needs a new message,
and the reference's sweeper sends one only while the work queue holds no
ready message: a message still waiting behind busy or stopped consumers is
not lost. This variant skips that look at the queue, so every job that waits
longer than the threshold behind a held consumer is published again — and
again each period: the backlog grows by copies of itself.

Everything else is the reference.
"""

import sys

from reference import sweeper as sweeper_mod
from reference.cli import main


async def _queue_looks_empty(self, queue_name):
    return 0  # THE BUG: never asks the broker how many messages still wait


sweeper_mod.Sweeper._work_queue_ready = _queue_looks_empty

if __name__ == "__main__":
    sys.exit(main())
