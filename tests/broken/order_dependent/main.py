"""Broken on purpose: the worker depends on delivery order ("out of date" sequence check).

The reference treats every job on its own: the order in which the broker delivers jobs does not matter. This
variant keeps, per worker process, the creation time of the newest job it has started, and refuses a job created
more than half a second before that one as out of date — the sequence check of a team that assumed the queue
delivers in creation order ("a newer job has already been handled; an older one arriving now is stale"), with a
little slack for jitter. The job ends ``failed`` with error_code ``out_of_order``: with the queue in creation
order nothing changes, but permuted or redelivered work is lost.

Everything else is the reference.
"""

import contextvars
import logging
import sys
from datetime import timedelta

from reference import imaging
from reference import worker as worker_mod
from reference.cli import main

SLACK = timedelta(seconds=0.5)
log = logging.getLogger("reference.worker")
_job = contextvars.ContextVar("order_dependent_job", default=None)
_newest = None  # creation time of the newest job this process has started

_original_process = worker_mod.Worker._process
_original_produce = worker_mod.Worker._produce_effects


async def _process_noting_the_job(self, message, job, received_at):
    token = _job.set(job)
    try:
        await _original_process(self, message, job, received_at)
    finally:
        _job.reset(token)


async def _produce_in_sequence(self, claim, lease, timings, expires_at=None):
    global _newest
    job = _job.get()
    if job is not None:
        if _newest is not None and job.created_at < _newest - SLACK:  # THE BUG: delivery order taken as creation order
            log.info("job %s created %s, before the newest started (%s): out of date", job.job_id,
                     job.created_at.isoformat(), _newest.isoformat())
            raise imaging.ImageRejected("out_of_order", "an older job than the newest one already started")
        _newest = job.created_at if _newest is None else max(_newest, job.created_at)
    return await _original_produce(self, claim, lease, timings, expires_at)


worker_mod.Worker._process = _process_noting_the_job
worker_mod.Worker._produce_effects = _produce_in_sequence

if __name__ == "__main__":
    sys.exit(main())
