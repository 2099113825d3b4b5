"""Broken on purpose: exact exponential backoff (no jitter), picked up by a one-second poller.

The reference waits ``uniform(0, min(cap, base * 2**n))`` before the next attempt of a job that met a transient
error (full jitter, CONTRACT §8), and its relay wakes when the earliest outbox row is due. This variant waits exactly
``min(cap, base * 2**n)`` — the same delay for every job at one retry number — and its relay polls the outbox on a
fixed one-second tick (aligned to the wall clock), so a retry is published on the first tick after it is due. Its
work takes a varied time (0-1 s before the effects, as images of different sizes do; derived from the job id and
attempt, so a rerun is the same), so requeues fall at every phase of the tick: the tick adds up to a second of
noise to each measured delay, which looks like spread, while the delay the implementation chose is one number per
retry. Only the worker's retry delay (and its work time) and the relay's wait are replaced; everything else is
the reference.
"""

import asyncio
import hashlib
import sys
import time

from reference import backoff as backoff_mod
from reference import relay as relay_mod
from reference import worker as worker_mod
from reference.cli import main

POLL_SECONDS = 1.0


def _exact_delay(self, failures_before, rng=None):
    return self.ceiling(failures_before)  # THE BUG: no jitter, one delay per retry number for every job


async def _tick_wait(self, work, wake, stop, listener, floor=0.0):
    """Sleep to the next whole-second tick (NOTIFY and the earliest due row are ignored), or until stop."""
    timeout = POLL_SECONDS - (time.time() % POLL_SECONDS)
    waiters = [asyncio.create_task(stop.wait())]
    try:
        await asyncio.wait([*waiters, listener], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


_produce_effects = worker_mod.Worker._produce_effects


async def _varied_work(self, claim, *args, **kwargs):
    """The same work after 0-1 s, varied per job and attempt (not the bug: the circumstance that shows it)."""
    digest = hashlib.sha256(f"{claim['job_id']}:{claim['attempt']}".encode()).digest()
    await asyncio.sleep(int.from_bytes(digest[:2], "big") / 65536)
    return await _produce_effects(self, claim, *args, **kwargs)


backoff_mod.FullJitterBackoff.delay = _exact_delay
relay_mod.Relay._wait = _tick_wait
worker_mod.Worker._produce_effects = _varied_work

if __name__ == "__main__":
    sys.exit(main())
