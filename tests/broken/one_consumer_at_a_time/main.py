"""Not broken, only unproven: one consumer at a time (active-standby).

Every worker instance takes an exclusive file lock (in the run's shared TMPDIR) before it starts consuming; a second
instance waits, connected and healthy, until the first one is gone. Correct, but copies of one job published at once
never meet on two consumers: nothing shows that its deduplication is atomic under a race. The harness must say
so — ``copies_raced`` (and checklist rows BE-JOB-002.3 / BE-JOB-004.2) not proven — instead of passing the rows on a
race that never happened.

Everything else is the reference.
"""

import asyncio
import fcntl
import os
import sys
import tempfile

import aio_pika

from reference.cli import main

_consume = aio_pika.Queue.consume
_held = []  # the lock's file stays open (and locked) for the life of the process


async def _consume_when_alone(self, *args, **kwargs):
    if not _held:
        path = os.path.join(os.environ.get("TMPDIR") or tempfile.gettempdir(), "one-consumer-at-a-time.lock")
        handle = open(path, "a+")
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # THE SHAPE: only the lock holder consumes
                break
            except BlockingIOError:
                await asyncio.sleep(0.2)
        _held.append(handle)
    return await _consume(self, *args, **kwargs)


aio_pika.Queue.consume = _consume_when_alone

if __name__ == "__main__":
    sys.exit(main())
