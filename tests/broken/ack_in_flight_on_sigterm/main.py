"""Broken on purpose: on SIGTERM the worker acks its in-flight deliveries without finishing them and exits, leaving
their claims to lease recovery.

Everything else is the reference. Its graceful stop lets work in flight finish within the grace and releases what
cannot (``processing -> queued`` at the same attempt, the delivery returned unacked). This one settles every
delivery it holds at once (ack), cancels the work and releases nothing: nothing is lost for good — the job stays
``processing`` until its lease runs out, and the sweeper's recovery brings it back — but each job in flight at the
stop is charged a new attempt and waits a whole lease. A rolling deploy (scenarios/rolling-deploy.toml) must show
it: ``graceful_stop`` invalid (an attempt spent by the stop).
"""

import asyncio
import sys

from reference import worker as worker_mod
from reference.cli import main

_original_process = worker_mod.Worker._process
_in_flight: dict[int, object] = {}  # deliveries whose job this worker is claiming or processing


async def _process_remembering(self, message, job, *args, **kwargs):
    _in_flight[id(message)] = message
    try:
        await _original_process(self, message, job, *args, **kwargs)
    finally:
        _in_flight.pop(id(message), None)


async def _drain_by_acking(self):
    for message in list(_in_flight.values()):  # THE BUG: settled unfinished
        try:
            await message.ack()
        except Exception:
            pass
    pending = set(self.tasks)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2.0)


async def _release_nothing(self, claim, reason):
    return None  # the claim stays until its lease runs out


worker_mod.Worker._process = _process_remembering
worker_mod.Worker._drain_in_flight = _drain_by_acking
worker_mod.Worker._release = _release_nothing

if __name__ == "__main__":
    sys.exit(main())
