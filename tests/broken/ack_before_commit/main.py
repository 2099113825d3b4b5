"""Broken on purpose: the worker acks every delivery BEFORE processing it (ack before commit).

Everything else is the reference. A crash between the effect and its commit
then loses the delivery: only lease recovery (the sweeper) could save the job.
"""

import sys

from reference import worker as worker_mod
from reference.cli import main

_original_process = worker_mod.Worker._process


class _AlreadyAcked:
    """The delivery as the reference sees it, except that settling it again does nothing."""

    def __init__(self, message):
        self._message = message

    def __getattr__(self, name):
        return getattr(self._message, name)

    async def ack(self, *args, **kwargs):
        pass

    async def nack(self, *args, **kwargs):
        pass

    async def reject(self, *args, **kwargs):
        pass


async def _process_acking_first(self, message, job, *args, **kwargs):
    await message.ack()  # THE BUG: acked before the effect is durable
    await _original_process(self, _AlreadyAcked(message), job, *args, **kwargs)


worker_mod.Worker._process = _process_acking_first

if __name__ == "__main__":
    sys.exit(main())
