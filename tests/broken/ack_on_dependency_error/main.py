"""Broken on purpose: a delivery is acked (dropped) when a dependency fails.

The reference waits a database outage out while it holds the delivery unacked (``Worker._db_timed``), waits an
object-store outage out the same way, and on any other transient error records the retry durably (``processing ->
queued``, a new attempt in the outbox) before it acks. This variant gives up instead: the first time the database
does not answer while it handles a delivery (the claim, a lease or expiry check, the commit), or a transient error
reaches its retry path, it acks the delivery and records nothing. (Since the reference waits store outages out
inside the render, the database part is what ``database-outages-past-lease`` provokes.)
The job stays ``queued`` or ``processing`` with no message anywhere; the sweeper's lease recovery and lost-message
safety net (the reference's, unchanged) bring it back later, so every upload still ends ``ready``. Only the
worker's database helper and its transient-error path are replaced; everything else is the reference.
"""

import sys

from reference import worker as worker_mod
from reference import worker_jobs as jobs_mod
from reference import worker_session as session_mod
from reference.cli import main
from reference.storage import StorageUnavailable


class _Dropped(BaseException):
    """A dependency failed while a delivery was in hand: drop it (a BaseException, so no handler of the reference
    turns it into a retry on the way out)."""


async def _db_timed_once(self, sql, params):
    import time

    started = time.monotonic()
    try:
        return await self._db_once(sql, params), started, False
    except jobs_mod.DB_UNAVAILABLE as exc:
        raise _Dropped(f"database unavailable: {type(exc).__name__}") from None


_finish_transient = worker_mod.Worker._finish_transient


async def _finish_transient_dropping(self, message, claim, exc, lease=None):
    if isinstance(exc, (StorageUnavailable, *jobs_mod.DB_UNAVAILABLE)):
        raise _Dropped(f"dependency failed: {type(exc).__name__}")
    return await _finish_transient(self, message, claim, exc, lease=lease)


_process = worker_mod.Worker._process


async def _process_dropping(self, message, job, received_at):
    try:
        await _process(self, message, job, received_at)
    except _Dropped as exc:
        jobs_mod.log.warning("job %s: %s; acking the delivery (THE BUG: nothing recorded)", job.job_id, exc)
        await session_mod.settle(message, "ack")


worker_mod.Worker._db_timed = _db_timed_once
worker_mod.Worker._finish_transient = _finish_transient_dropping
worker_mod.Worker._process = _process_dropping

if __name__ == "__main__":
    sys.exit(main())
