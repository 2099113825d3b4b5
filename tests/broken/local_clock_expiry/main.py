"""Broken on purpose: the worker dates expiry by its own wall clock against the producer's stamp.

The reference decides whether a job has expired from one clock, the database's (``expires_at <= now()`` in the
claim): every role agrees whatever its own clock says. This variant decides at the claim from the worker's local
wall clock against the ``expires_at`` the producer stamped into the message — correct only while the two clocks
agree. A worker whose clock runs ahead expires fresh work; one whose clock runs behind processes stale work. Its
later re-checks after a long wait are the reference's (the database's clock).

Everything else is the reference.
"""

import contextvars
import sys
from datetime import datetime, timezone

from reference import worker as worker_mod
from reference.cli import main
from reference.db.queries import queries

_job = contextvars.ContextVar("local_clock_job", default=None)
_original_process = worker_mod.Worker._process
_original_db_timed = worker_mod.Worker._db_timed


async def _process_noting_the_job(self, message, job, received_at):
    token = _job.set(job)
    try:
        await _original_process(self, message, job, received_at)
    finally:
        _job.reset(token)


async def _db_timed_local_expiry(self, sql, params):
    row, started, retried = await _original_db_timed(self, sql, params)
    job = _job.get()
    if row is not None and job is not None and sql in (queries().claim_job, queries().adopt_claim):
        row = dict(row)
        row["expired"] = datetime.now(timezone.utc) >= job.expires_at  # THE BUG: the worker's clock, the producer's stamp
    return row, started, retried


worker_mod.Worker._process = _process_noting_the_job
worker_mod.Worker._db_timed = _db_timed_local_expiry

if __name__ == "__main__":
    sys.exit(main())
