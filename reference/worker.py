"""Worker: consumes job messages, renders variants, publishes the result
atomically, and acks only after that commit.

Per delivery: validate against jobs.schema.json (poison → dead-letter with a
reason) → claim in the database (lease + fencing token; a job that is ready,
failed, stale or owned elsewhere is acked as a no-op) → read trusted storage
metadata from the database → render in a process pool → write deterministic
keys per effect key while the lease is live → ONE fenced statement commits
results, the ready transition and its event → ack.

Its parts, one module each:
- reference/worker_session.py: the broker side — the consume session (connection, channel, consumer), reconnecting,
  dispatching deliveries (one by one or in batches) under the processing slots, settling them (``settle``),
  dead-lettering and forwarding;
- reference/worker_jobs.py: job processing — claim, fetch, render call, writes, fenced commit, retries and
  failures, the lease's renewal statement and the database helpers;
- reference/worker_render.py: the render pool (Pillow in child processes, each render under its time limit);
- this module: ``Worker``, which builds the state they share and runs them (``run``).

A patch of a worker internal patches the module that defines it: ``Worker.<method>`` (every method resolves on
``Worker``), ``worker_session.settle``, ``worker_jobs.queries`` — never a name this module merely imports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

from reference import imaging
from reference.backoff import AttemptBudget, FullJitterBackoff
from reference.db.pool import open_pool
from reference.failpoints import Failpoints
from reference.health import Health
from reference.runtime import process_identity
from reference.settings import Settings
from reference.storage import ObjectStore
from reference.worker_jobs import (  # noqa: F401 - public names of the worker, importable from here as before
    CLAIM_RACES, COMMIT_REFUSALS, DB_ERRORS, DB_UNAVAILABLE, RELEASE_TIMEOUT_SECONDS, TRANSIENT_ERRORS,
    UNEXPECTED_BACKOFF_CAP_SECONDS, ExecutionDeadlinePassed, JobExpired, JobProcessor, Stopping, redact,
)
from reference.worker_render import RenderPool
from reference.worker_session import SessionEnded, delivery_count  # noqa: F401 - as above

log = logging.getLogger("reference.worker")


class Worker(JobProcessor):
    """The worker process: its settings, failpoints, retry policy, render pool, object store and processing slots,
    and ``run``, which opens the database pool and consumes until stopped (reference/worker_session.py), each
    delivery processed by reference/worker_jobs.py."""

    def __init__(self, settings: Settings, failpoints: Failpoints | None = None) -> None:
        self.settings = settings
        self.failpoints = failpoints or Failpoints(settings.failpoints)
        self.identity = process_identity("worker")
        self.budget = AttemptBudget(settings.max_attempts)
        self.backoff = FullJitterBackoff(settings.retry_base_seconds, settings.retry_cap_seconds)
        self.limits = imaging.Limits(settings.max_pixels, settings.max_side, settings.max_frames)
        # Started first: the pool's processes never inherit a broker or database socket.
        self.render_pool = RenderPool(settings.image_workers, self.limits, settings.decode_timeout_seconds,
                                      settings.image_worker_start_timeout_seconds)
        self.render_pool.warm_up()
        self.store = ObjectStore.from_settings(settings, max_pool_connections=settings.worker_concurrency * 2 + 4)
        self.slots = asyncio.Semaphore(settings.worker_concurrency)
        self.tasks = set()
        self.db = None
        self.stop = asyncio.Event()
        self.dead_letter_exchange = None
        self.work_channel = None
        # Batch mode (WORKER_BATCH_SIZE > 1): one assembler per broker session; deliveries dispatched in batches
        # and not finished yet (they hold prefetch credit, so a batch that cannot grow is dispatched at once).
        self._assemblers = {}
        self._batch_in_flight = 0
        # Health (reference/health.py, served on METRICS_PORT): live unless an execution is held past its deadline
        # (EXECUTION_TIMEOUT_SECONDS) plus a lease — its abandonment failed, the worker is stuck; ready while a broker
        # session consumes. executions: "<job_id>/<token>" → the claim's monotonic time (reference/worker_jobs.py).
        self.executions = {}
        self.consuming = False
        self.health = Health("worker", settings.health_stall_seconds)
        self.health.live_when("executions", self._executions_check)
        self.health.ready_when("consuming", lambda: (self.consuming, "a broker session consumes" if self.consuming
                                                     else "not consuming (connecting, or between sessions)"))

    def _executions_check(self) -> tuple[bool, str]:
        limit = self.settings.execution_timeout_seconds + self.settings.lease_seconds
        now = time.monotonic()
        stuck = sorted(key for key, since in list(self.executions.items()) if now - since > limit)
        if stuck:
            return False, f"held past the execution deadline plus a lease ({limit:g}s): {', '.join(stuck[:5])}"
        return True, f"{len(self.executions)} executions, none past {limit:g}s"

    # ----------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=self.settings.worker_concurrency * 2 + 4, thread_name_prefix="worker-io"))
        self.db = await open_pool(self.settings, self.identity, min_size=1,
                                  max_size=self.settings.worker_concurrency + 2)
        log.info("worker %s: concurrency=%d prefetch=%d image_workers=%d batch=%d (wait %gms) variants from DB",
                 self.identity, self.settings.worker_concurrency, self.settings.effective_prefetch,
                 self.settings.image_workers, self.settings.worker_batch_size, self.settings.worker_batch_wait_ms)
        try:
            await self._consume_until_stopped(stop)
        finally:
            await self._drain_in_flight()
            self.render_pool.shutdown()
            await self.db.close(timeout=2)
