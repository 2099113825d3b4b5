"""Worker: consumes job messages, renders variants, publishes the result
atomically, and acks only after that commit.

Per delivery: validate against jobs.schema.json (poison → dead-letter with a
reason) → claim in the database (lease + fencing token; a job that is ready,
failed, stale or owned elsewhere is acked as a no-op) → read trusted storage
metadata from the database → render in a process pool → write deterministic
keys per effect key while the lease is live → ONE fenced statement commits
results, the ready transition and its event → ack.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import json
import logging
import os
import time
import uuid
from datetime import datetime, timezone

import aio_pika
import psycopg
from psycopg_pool import AsyncConnectionPool

from reference import brokers, imaging, metrics, topology
from reference.backoff import AttemptBudget, FullJitterBackoff, reconnect_delays
from reference.batching import BatchAssembler
from reference.db.pool import open_pool
from reference.db.queries import queries
from reference.failpoints import FailpointError, Failpoints
from reference.keys import fencing_token_of_variant_key, variant_key, variant_prefix
from reference.lease import Lease, LeaseLost
from reference.messages import InvalidMessage, JobMessage, parse
from reference.runtime import process_identity, sleep_or_stop
from reference.storage import ObjectMissing, ObjectStore, StorageUnavailable, sha256_hex

log = logging.getLogger("reference.worker")

DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)
# The database's condition, not the job's: waited out like an outage (a read-only database, e.g. a failover).
DB_UNAVAILABLE = (*DB_ERRORS, psycopg.errors.ReadOnlySqlTransaction)
UNEXPECTED_BACKOFF_CAP_SECONDS = 30.0
RELEASE_TIMEOUT_SECONDS = 1.0
# A render whose header promises at most this many pixels per second of its time limit is retried once in a fresh
# process when it runs over the limit (issue 23 defect 12). About a third of the slowest throughput measured here
# (a 3 MP photo JPEG renders all three variants at ~14 MP/s, a 16 MP PNG at ~27 MP/s on one core).
CHEAP_DECODE_PIXELS_PER_SECOND = 5_000_000
# That retry is judged by its process's own CPU time (a process the machine starves of CPU is not slow), within this
# many limits of wall-clock time.
STARVED_WALL_FACTOR = 10
COMMIT_REFUSALS = 3  # a fenced commit refused this often while the job still looks ours: give it up (nack)
CLAIM_RACES = 3  # claims tried again when the job is found queued at the delivery's own attempt (a release raced)
TRANSIENT_ERRORS = (StorageUnavailable, FailpointError, concurrent.futures.process.BrokenProcessPool,
                    asyncio.TimeoutError, ConnectionError, *DB_ERRORS)


class Stopping(Exception):
    """Shutdown began while waiting for a dependency."""


class JobExpired(Exception):
    """The job's deadline passed before its first effect (re-checked after fetch and render)."""


class SessionEnded(Exception):
    """The broker session of a delivery ended before the delivery got a processing slot."""


_SESSION: contextvars.ContextVar = contextvars.ContextVar("broker_session", default=None)


class _Session:
    """One broker session (connection + channel + consumer). Its deliveries can only be settled on its channel."""

    def __init__(self):
        self.ended = asyncio.Event()
        self.reason = ""
        self.waiting: set[asyncio.Task] = set()  # its deliveries still waiting for a processing slot

    def end(self, reason: str) -> None:
        if self.ended.is_set():
            return
        self.reason = reason
        self.ended.set()
        for task in list(self.waiting):  # gone with the channel: the broker redelivers them
            task.cancel()


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _process_cpu_seconds(executor) -> float | None:
    """CPU time (user + system) used so far by the one process of a single-process executor, from /proc (Linux);
    None when it cannot be read."""
    try:
        (process,) = (getattr(executor, "_processes", None) or {}).values()
        with open(f"/proc/{process.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:  # noqa: BLE001 - no /proc, no process yet, a process gone: judged by the wall clock
        return None


def _retrieve(future) -> None:
    if not future.cancelled():
        future.exception()  # read, so that a render nobody awaits any more logs no "never retrieved" error


class _OverLimit(Exception):
    """A render ran over its time limit; its process is being replaced (``fresh``: the replacement, handed to
    this render only, or None)."""

    def __init__(self, fresh: "asyncio.Future | None"):
        super().__init__("over the time limit")
        self.fresh = fresh


class RenderPool:
    """Pillow renders in child processes, each process rendering one image at a time.

    Every image worker is a single-process executor of its own. A render first waits for an idle process — outside
    its time limit — and only then starts its clock: the limit bounds the render's OWN decode and encode, never the
    time it queued behind a slow neighbour. A render over its limit (or cancelled) kills and replaces only its own
    process, so no neighbour's render is cancelled, broken or timed out by it; a replacement is warmed up before it
    takes work, so its start-up is not charged to the next render either. A process that dies while idle (an OOM
    kill) leaves an executor that refuses work: the render that finds it replaces it and takes the next idle one;
    a replacement that does not start within ``start_timeout`` is killed and another one started.

    A time-out is not always the image's fault: a process that got no CPU (a loaded machine) or a slow neighbour
    can push a small image past the limit. An image whose header promises a decode far below the limit
    (``promises_cheap_decode``) is therefore rendered once more, in the fresh process that replaced the one that
    timed out, with its own full limit — of CPU time, within STARVED_WALL_FACTOR limits of wall-clock time; only a
    second time-out makes it ``decode_timeout``. An image whose header promises an expensive decode is timed out
    at once."""

    def __init__(self, workers: int, limits: imaging.Limits, timeout_seconds: float,
                 start_timeout_seconds: float = 30.0):
        self.workers, self.limits, self.timeout = workers, limits, timeout_seconds
        self.start_timeout = start_timeout_seconds
        self.executors = {imaging.make_pool(1, limits) for _ in range(workers)}
        self.idle: asyncio.Queue = asyncio.Queue()
        for executor in self.executors:
            self.idle.put_nowait(executor)
        self.starting: set[asyncio.Task] = set()

    def warm_up(self) -> None:
        # Start the forkserver and every pool process now, before any socket is opened.
        for future in [executor.submit(imaging.warm_up, self.limits) for executor in self.executors]:
            future.result()

    async def render(self, data: bytes, variants: tuple[str, ...],
                     pixels: int | None = None) -> list[imaging.RenderedVariant]:
        """``pixels``: the image's dimensions as recorded from its header (the worker passes the attachment's);
        without them the header is read here (Pillow opens lazily, no pixel is decoded)."""
        cheap = self.promises_cheap_decode(data, pixels)
        while True:
            executor = await self.idle.get()  # queueing for a process is not part of the time limit
            try:
                future = asyncio.get_running_loop().run_in_executor(executor, imaging.render_variants, data,
                                                                    variants, self.limits)
                break
            except (concurrent.futures.process.BrokenProcessPool, RuntimeError):
                # Its process died while idle (an OOM killer, a cgroup kill): the executor refuses new work at
                # once. Replace it and take the next idle process; this render has not started, so nothing of it
                # is charged (issue 23 defect 1: a broken executor was neither returned nor replaced).
                self._replace(executor, "its idle process died")
        try:
            return await self._finish(executor, future, keep_replacement=cheap)
        except _OverLimit as over:
            fresh = over.fresh
        if fresh is None:
            raise imaging.ImageRejected("decode_timeout", f"over {self.timeout:g}s")
        # Its header promises a decode far below the limit: the time-out says more about the machine than about
        # the file. Once more, in the fresh process that replaced the one that timed out (issue 23 defect 12).
        log.warning("a render whose header promises a cheap decode ran over %gs; once more in a fresh process",
                    self.timeout)
        metrics.JOBS.labels("render_retried").inc()
        executor = await fresh  # cancelled while waiting: the replacement goes to the idle queue (_start)
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, imaging.render_variants, data, variants,
                                                                self.limits)
        except (concurrent.futures.process.BrokenProcessPool, RuntimeError):
            self._replace(executor, "its process died")
            raise concurrent.futures.process.BrokenProcessPool("a fresh render process died") from None
        try:
            return await self._finish(executor, future, keep_replacement=False, cpu_judged=True)
        except _OverLimit:
            raise imaging.ImageRejected("decode_timeout", f"over {self.timeout:g}s twice, the second time in a "
                                                          "fresh process") from None

    def promises_cheap_decode(self, data: bytes, pixels: int | None = None) -> bool:
        """True when the image's header (read without decoding) promises a render far below the time limit: at
        most CHEAP_DECODE_PIXELS_PER_SECOND x the limit pixels (the first frame's, which is all a render decodes).
        Unreadable: promises nothing."""
        if pixels is None:
            pixels = imaging.header_pixels(data)
        return pixels is not None and pixels <= CHEAP_DECODE_PIXELS_PER_SECOND * self.timeout

    async def _finish(self, executor, future, keep_replacement: bool,
                      cpu_judged: bool = False) -> list[imaging.RenderedVariant]:
        """Wait for a render under the time limit. ``cpu_judged`` (the retry of a cheap image): past the limit of
        wall-clock time the render goes on while its process has used less CPU than the limit — it was starved by
        the machine, not slowed by the image — up to STARVED_WALL_FACTOR limits of wall-clock time."""
        started = time.monotonic()
        cpu_at_start = _process_cpu_seconds(executor) if cpu_judged else None
        if cpu_at_start is not None:
            future.add_done_callback(_retrieve)  # shielded below: its outcome is read even if nobody awaits it
        wait = self.timeout
        try:
            while True:
                try:
                    result = await asyncio.wait_for(future if cpu_at_start is None else asyncio.shield(future), wait)
                    break
                except asyncio.TimeoutError:
                    cpu = None if cpu_at_start is None else _process_cpu_seconds(executor)
                    if cpu is not None:
                        used, elapsed = cpu - cpu_at_start, time.monotonic() - started
                        wall_left = self.timeout * STARVED_WALL_FACTOR - elapsed
                        if used < self.timeout and wall_left > 0:
                            wait = max(0.05, min(self.timeout - used, wall_left))
                            continue
                    raise _OverLimit(self._replace(executor, "decode time limit exceeded",
                                                   keep=keep_replacement)) from None
        except _OverLimit:
            raise
        except concurrent.futures.process.BrokenProcessPool:
            self._replace(executor, "its process died")
            raise
        except asyncio.CancelledError:
            self._replace(executor, "its render was cancelled")  # the process may still be busy with it
            raise
        except BaseException:
            self.idle.put_nowait(executor)  # the render itself raised (ImageRejected): the process is fine
            raise
        self.idle.put_nowait(executor)
        return result

    def _replace(self, executor, why: str, keep: bool = False) -> "asyncio.Future | None":
        """Kill ``executor``'s process and start a replacement. ``keep``: the warmed-up replacement is handed to the
        caller (the returned future) instead of the idle queue — unless the caller stopped waiting for it."""
        log.warning("replacing one image process: %s", why)
        self.executors.discard(executor)
        imaging.kill_pool(executor)
        replacement = imaging.make_pool(1, self.limits)
        self.executors.add(replacement)
        loop = asyncio.get_running_loop()
        handoff = loop.create_future() if keep else None
        task = loop.create_task(self._start(replacement, handoff))
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)
        return handoff

    async def _warm(self, executor) -> None:
        await asyncio.get_running_loop().run_in_executor(executor, imaging.warm_up, self.limits)

    async def _start(self, executor, handoff: "asyncio.Future | None" = None) -> None:
        """Make the replacement's process ready, then let it take work (or hand it to the render waiting for it
        in ``handoff``). A start that fails or does not finish within ``start_timeout`` (a hung fork, a warm-up
        that never returns) is given up and another replacement tried: the slot is never lost."""
        try:
            while True:
                try:
                    await asyncio.wait_for(self._warm(executor), self.start_timeout)
                    break
                except Exception as exc:  # could not start (TimeoutError included): try a fresh one
                    log.warning("image process did not start (%s); retrying", type(exc).__name__)
                    self.executors.discard(executor)
                    imaging.kill_pool(executor)
                    executor = imaging.make_pool(1, self.limits)  # the slot is counted while it waits to retry
                    self.executors.add(executor)
                    await asyncio.sleep(0.5)
        except BaseException:
            if handoff is not None and not handoff.done():
                handoff.cancel()  # shut down: the render waiting for it ends too
            raise
        if executor not in self.executors:  # shut down meanwhile
            imaging.kill_pool(executor)
            if handoff is not None and not handoff.done():
                handoff.cancel()
        elif handoff is not None and not handoff.done():
            handoff.set_result(executor)
        else:
            self.idle.put_nowait(executor)

    def shutdown(self) -> None:
        for task in list(self.starting):
            task.cancel()
        for executor in list(self.executors):
            imaging.kill_pool(executor)
        self.executors.clear()


class Worker:
    def __init__(self, settings, failpoints: Failpoints | None = None):
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
        self.tasks: set[asyncio.Task] = set()
        self.db: AsyncConnectionPool | None = None
        self.stop = asyncio.Event()
        self.dead_letter_exchange = None
        self.work_channel = None
        # Batch mode (WORKER_BATCH_SIZE > 1): one assembler per broker session; deliveries dispatched in batches
        # and not finished yet (they hold prefetch credit, so a batch that cannot grow is dispatched at once).
        self._assemblers: dict = {}
        self._batch_in_flight = 0

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
        delays = reconnect_delays()
        try:
            while not stop.is_set():
                connected = False
                try:
                    connected = await self._consume_session(stop)
                except Exception as exc:
                    log.warning("broker session ended (%s: %s)", type(exc).__name__, exc)
                if stop.is_set():
                    break
                if connected:
                    delays = reconnect_delays()
                await sleep_or_stop(stop, next(delays))
        finally:
            await self._drain_in_flight()
            self.render_pool.shutdown()
            await self.db.close(timeout=2)

    async def _consume_session(self, stop: asyncio.Event) -> bool:
        """One broker session: consume until stop, or until the session can no longer deliver — the connection
        closed, the channel closed by the broker (e.g. a consumer timeout), or the consumer cancelled by the broker
        (e.g. its queue deleted). Any of these ends the session, and ``run`` opens a new one; a session that merely
        looks connected while nothing is delivered never lingers."""
        connection = await brokers.connect(self.settings, timeout=self.settings.db_connect_timeout_seconds,
                                            heartbeat=self.settings.heartbeat_seconds,
                                            client_properties={"connection_name": self.identity})
        session = _Session()
        connection.close_callbacks.add(lambda *_: session.end("connection closed"))
        try:
            channel = await connection.channel(publisher_confirms=True)
            channel.close_callbacks.add(lambda _channel, exc=None: session.end(f"channel closed ({exc!r})"))
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(lambda frame: session.end("consumer cancelled by the broker"))
            await channel.set_qos(prefetch_count=self.settings.effective_prefetch)
            await topology.declare(channel, topology.config_from_settings(self.settings))
            self.dead_letter_exchange = await channel.get_exchange(topology.DEAD_LETTER_EXCHANGE, ensure=False)
            # Level 5: a worker consumes its own pipeline version's queue only (version 1: the original one).
            version = self.settings.pipeline_version
            if version != 1:
                await topology.declare_version(channel, topology.config_from_settings(self.settings), version)
            self.work_channel = channel
            queue = await channel.get_queue(topology.queue_for(version), ensure=False)
            # One process-wide bound on deliveries in flight, across sessions: deliveries of an earlier session
            # still being processed count against it, so this session takes none before they are done.
            if not await self._wait_for_earlier_sessions(stop, session):
                return True
            consumer_tag = await queue.consume(functools.partial(self._on_message, session=session), no_ack=False)
            log.info("consuming %s (pipeline version %d)", topology.queue_for(version), version)
            while not (stop.is_set() or session.ended.is_set()):
                if connection.is_closed or channel.is_closed:  # belt and braces: a close with no callback
                    session.end("channel or connection found closed")
                    break
                await _wait_any(stop, session.ended, timeout=1.0)
            if stop.is_set() and not session.ended.is_set():
                # Graceful: no new deliveries, let in-flight work finish and ack.
                try:
                    await asyncio.wait_for(queue.cancel(consumer_tag), 2.0)
                except Exception:
                    pass
                await self._drain_in_flight()
            else:
                log.warning("broker session ended: %s; reconnecting", session.reason)
            return True
        finally:
            session.end("session closed")
            # A batch still filling is gone with the channel (the broker returns its deliveries); its timer finds
            # the session ended and settles nothing.
            self._assemblers.pop(session, None)
            try:
                await asyncio.wait_for(connection.close(), 2.0)
            except Exception:
                pass

    async def _wait_for_earlier_sessions(self, stop: asyncio.Event, session: "_Session") -> bool:
        """Wait until no delivery of an earlier session is in flight (True), or stop / this session ended (False).
        Those deliveries can no longer be settled (the broker has already returned them), but work that started
        on them finishes its transition; only then may this session take ``prefetch`` new deliveries."""
        logged = False
        while self.tasks:
            if stop.is_set() or session.ended.is_set():
                return False
            if not logged:
                log.info("waiting for %d deliveries of an earlier broker session before consuming", len(self.tasks))
                logged = True
            await asyncio.wait(set(self.tasks), timeout=0.5)
        return not (stop.is_set() or session.ended.is_set())

    async def _drain_in_flight(self) -> None:
        if not self.tasks:
            return
        grace = max(0.5, self.settings.shutdown_grace_seconds - 3.0)
        done, pending = await asyncio.wait(set(self.tasks), timeout=grace)
        for task in pending:  # unacked: the broker returns these deliveries
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage,
                          session: "_Session | None" = None) -> None:
        if self.settings.worker_batch_size > 1:
            self._add_to_batch(message, session)
            return
        self._spawn(self._deliver(message, session))

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ----------------------------------------------------------- batch mode (BE-JOB-007)

    def _add_to_batch(self, message, session: "_Session | None") -> None:
        """Batch mode: deliveries are dispatched together (reference/batching.py says when), and each item then
        runs the single-delivery path unchanged — its own claim, lease, fenced commit and ack (never
        ``multiple=true``), its own retry or dead-letter — so no item waits for, or is settled by, another."""
        assembler = self._assemblers.get(session)
        if assembler is None:
            assembler = self._assemblers[session] = BatchAssembler(
                self.settings.worker_batch_size, self.settings.worker_batch_wait_ms / 1000.0,
                self.settings.effective_prefetch)
        batch = assembler.add(message, time.monotonic(), self._batch_in_flight)
        if batch is not None:
            self._spawn(self._run_batch(batch, session))
        elif len(assembler) == 1:  # a new batch opened: dispatch it when its wait is over, full or not
            self._spawn(self._dispatch_when_due(assembler, assembler.generation, assembler.deadline(), session))

    async def _dispatch_when_due(self, assembler: BatchAssembler, generation: int, deadline: float,
                                 session: "_Session | None") -> None:
        # The deadline is read when the batch opens: by the time this task runs, the batch may already have filled
        # and gone (the assembler then has no deadline, and `due` says no for this generation).
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if assembler.due(time.monotonic(), generation):
            await self._run_batch(assembler.take(), session)

    async def _run_batch(self, messages: list, session: "_Session | None") -> None:
        self._batch_in_flight += len(messages)
        log.debug("dispatching a batch of %d deliveries", len(messages))

        async def item(message) -> None:
            try:
                await self._deliver(message, session)
            finally:
                self._batch_in_flight -= 1

        outcomes = await asyncio.gather(*(item(message) for message in messages), return_exceptions=True)
        for message, outcome in zip(messages, outcomes):
            if isinstance(outcome, Exception):
                log.error("delivery %s of a batch ended with %s", getattr(message, "message_id", "?"),
                          type(outcome).__name__, exc_info=outcome)

    async def _deliver(self, message, session: "_Session | None") -> None:
        token = _SESSION.set(session)
        try:
            await self._handle(message)
        except (SessionEnded, asyncio.CancelledError):
            if session is None or not session.ended.is_set():
                raise
            # Its session ended before it got a slot: the broker has returned the delivery; nothing to settle.
        finally:
            _SESSION.reset(token)

    @contextlib.asynccontextmanager
    async def _slot(self):
        """A process-wide processing slot (WORKER_CONCURRENCY across every broker session). A delivery of a session
        that ends while it waits gives up its place: it is never processed after its channel is gone."""
        session = _SESSION.get()
        task = asyncio.current_task()
        if session is not None:
            if session.ended.is_set():
                raise SessionEnded()
            session.waiting.add(task)
        try:
            await self.slots.acquire()
        finally:
            if session is not None:
                session.waiting.discard(task)
        try:
            if session is not None and session.ended.is_set():
                raise SessionEnded()
            yield
        finally:
            self.slots.release()

    # ----------------------------------------------------------- one delivery

    async def _handle(self, message) -> None:
        received_at = time.monotonic()
        async with self._slot():
            metrics.IN_FLIGHT.inc()
            job = None
            try:
                try:
                    job = parse(message.body, message.message_id)
                except InvalidMessage as exc:
                    await self._dead_letter(message, str(exc))
                    return
                if job.pipeline_version != self.settings.pipeline_version:
                    await self._forward(message, job)
                    return
                await self._process(message, job, received_at)
            except Stopping:
                await _settle(message, "nack")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._unexpected_before_claim(message, exc, job)
            finally:
                metrics.IN_FLIGHT.dec()

    async def _unexpected_before_claim(self, message, exc: BaseException, job: JobMessage | None = None) -> None:
        """An error that is neither an outage (waited out in ``_db``) nor a verdict on the job, before the job
        was ours: nothing can be recorded on the job, so the delivery backs off before it goes back (never a hot
        requeue), and after ``max_attempts`` deliveries it is dead-lettered with the cause in its headers."""
        deliveries = delivery_count(message)
        reason = redact(exc)
        metrics.JOBS.labels("unexpected").inc()
        log.error("unexpected error before the claim of %s (delivery %d): %s", message.message_id, deliveries + 1,
                  reason, exc_info=exc)
        if deliveries + 1 >= self.settings.max_attempts:
            if job is not None:
                await self._record_dead_letter(job, f"unexpected_error: {reason}")
            await self._dead_letter(message, f"unexpected_error: {reason}")
            return
        delay = min(UNEXPECTED_BACKOFF_CAP_SECONDS, self.backoff.delay(deliveries))
        await sleep_or_stop(self.stop, delay)
        await _settle(message, "nack")

    async def _process(self, message, job: JobMessage, received_at: float) -> None:
        # One owner string per delivery: a claim whose reply was lost is recognised as ours (adopt_claim).
        params = {"job_id": job.job_id, "attempt": job.attempt, "owner": f"{self.identity}/{uuid.uuid4().hex[:12]}",
                  "lease_seconds": self.settings.lease_seconds, "actor": f"worker:{self.identity}",
                  "pipeline_version": self.settings.pipeline_version}
        # claimed_at: when the statement that succeeded was sent (not when the first try was): a claim that
        # waited out an outage starts with a whole lease, never with a dead local one.
        claim, claimed_at, retried = await self._db_timed(queries().claim_job, params)
        if claim is None and retried:
            claim, claimed_at, _ = await self._db_timed(queries().adopt_claim, params)
            if claim is not None:
                log.info("job %s: our claim committed but its reply was lost; adopted", job.job_id)
        races = 0
        while claim is None:
            if not await self._not_claimed(message, job, may_claim_again=races < CLAIM_RACES):
                return
            races += 1
            claim, claimed_at, _ = await self._db_timed(queries().claim_job, params)
        token = claim["fencing_token"]
        log.info("claimed job %s attempt %d token %d", job.job_id, claim["attempt"], token)
        if claim["expired"]:
            if await self._finish_failed(message, claim, "expired", "expired before its effect"):
                metrics.count_expired("worker", "claim")
            return

        timings: dict[str, float] = {"wait": claimed_at - received_at, "claim": time.monotonic() - claimed_at}
        # The job's deadline on the monotonic clock, from the database's own clock at the claim: never later
        # than the real one (claimed_at precedes the statement).
        expires_in = claim.get("expires_in_seconds")
        expires_at = None if expires_in is None else claimed_at + float(expires_in)
        lease = Lease(lease_seconds=self.settings.lease_seconds, renew_seconds=self.settings.lease_renew_seconds,
                      claimed_at_monotonic=claimed_at, renew=lambda: self._renew(job.job_id, token)).start()
        try:
            try:
                results = await self._produce_effects(claim, lease, timings, expires_at)
            except JobExpired as exc:
                if await self._finish_failed(message, claim, "expired", str(exc), lease=lease):
                    metrics.count_expired("worker", "processing")
                return
            except LeaseLost as exc:
                metrics.JOBS.labels("lease_lost").inc()
                log.warning("job %s: lease lost before commit (%s); not acking", job.job_id, exc)
                await _settle(message, "nack")
                return
            except imaging.ImageRejected as exc:
                await self._finish_failed(message, claim, exc.code, exc.detail or exc.code, lease=lease)
                return
            except ObjectMissing:
                await self._finish_failed(message, claim, "original_missing", "staging original not found",
                                          lease=lease)
                return
            except TRANSIENT_ERRORS as exc:
                await self._finish_transient(message, claim, exc, lease=lease)
                return

            try:
                await self.failpoints.ahit("after_s3_write_before_commit")
            except FailpointError as exc:
                await self._finish_transient(message, claim, exc, lease=lease)
                return
            mark = time.monotonic()
            committed = await self._commit(claim, results, lease)
            timings["commit"] = time.monotonic() - mark
            if committed == "expired":
                if await self._finish_failed(message, claim, "expired", "expired before its commit", lease=lease):
                    metrics.count_expired("worker", "commit")
                return
            if committed != "ready":
                metrics.JOBS.labels("fenced").inc()
                log.warning("job %s: commit rejected by the fence (token %d); not acking", job.job_id, token)
                await _settle(message, "nack")
                return
            metrics.JOB_SECONDS.observe(time.monotonic() - claimed_at)
        except Stopping:
            # Shutting down while the job was ours: not the job's error; give it back without spending an attempt.
            await self._release(claim, "released: the worker is stopping")
            await _settle(message, "nack")
            return
        except asyncio.CancelledError:
            await self._release(claim, "released: the worker is stopping")
            raise
        except Exception as exc:
            # Neither transient nor permanent: retried with backoff like a transient error, the cause kept.
            log.error("job %s: unexpected error after the claim: %s", job.job_id, redact(exc), exc_info=exc)
            metrics.JOBS.labels("unexpected").inc()
            await self._finish_transient(message, claim, exc, lease=lease)
            return
        finally:
            await lease.stop()

        try:
            await self.failpoints.ahit("after_commit_before_ack")
        except FailpointError:
            await _settle(message, "nack")  # redelivery finds it ready: a no-op ack
            return
        await _settle(message, "ack")
        metrics.JOBS.labels("ready").inc()
        log.info("job %s ready (attempt %d) in %.3fs: %s", job.job_id, claim["attempt"], time.monotonic() - claimed_at,
                 " ".join(f"{k} {v:.3f}" for k, v in timings.items()))
        if token > 1:  # earlier claims may have left objects under their own tokens: ready is final, remove them
            await self._remove_variant_objects(claim, keep={r["object_key"] for r in results})

    async def _not_claimed(self, message, job: JobMessage, may_claim_again: bool = False) -> bool:
        """Settle a delivery whose claim found nothing to take; True (nothing settled) when the job is ``queued`` at
        this very delivery's attempt: it was released (a drain) between the claim and this read, so this delivery
        is a message of the job's current attempt and must claim it, never be acked as stale (issue 23 defect 2)."""
        snapshot = await self._db(queries().job_snapshot, {"job_id": job.job_id})
        if snapshot is None:
            await self._dead_letter(message, "unknown_job: no such job in the database")
            return False
        state = snapshot["state"]
        if state == "queued" and snapshot["attempt"] == job.attempt and may_claim_again:
            log.info("job %s attempt %d: queued again at this attempt since the claim (released); claiming again",
                     job.job_id, job.attempt)
            return True
        if state == "ready":
            outcome = "noop_ready"  # the completed effect is recorded: nothing to rewrite
        elif state == "failed":
            outcome = "noop_terminal"
        elif state == "processing":
            outcome = "busy"  # the lease holder finishes it, or the sweeper requeues it
        else:
            outcome = "stale"  # a message of another attempt; that attempt has its own message
        metrics.JOBS.labels(outcome).inc()
        log.info("job %s attempt %d: %s (state %s, attempt %d): ack", job.job_id, job.attempt, outcome, state,
                 snapshot["attempt"])
        await _settle(message, "ack")
        return False

    async def _produce_effects(self, claim, lease: Lease, timings: dict[str, float],
                               expires_at: float | None = None) -> list[dict]:
        await lease.wait_live(self.stop)
        mark = time.monotonic()
        original = await self._store_call(claim, lease, expires_at, self.store.get_bytes, claim["original_key"])
        if sha256_hex(original) != claim["original_sha256"].strip():
            raise imaging.ImageRejected("original_checksum_mismatch", "staging object differs from its record")
        timings["fetch"], mark = time.monotonic() - mark, time.monotonic()
        await lease.wait_live(self.stop)
        # The dimensions the API read from the header at the upload: what the image promises, never parsed here.
        width, height = claim.get("original_width"), claim.get("original_height")
        rendered = await self.render_pool.render(original, tuple(claim["variants"]),
                                                 pixels=width * height if width and height else None)
        timings["render"], mark = time.monotonic() - mark, time.monotonic()
        results = []
        for variant in rendered:
            await lease.wait_live(self.stop)  # no new effect while ownership is in doubt
            # Fetch, render and earlier writes may have waited long (a backlog in the pool, a slow store, an
            # outage): no write is started past the deadline.
            await self._ensure_not_expired(claim, expires_at)
            key = variant_key(claim["attachment_id"], claim["pipeline_version"], variant.name, variant.extension,
                              claim["fencing_token"])
            digest = sha256_hex(variant.data)
            await self._store_call(claim, lease, expires_at, self.store.put_bytes, key, variant.data,
                                   variant.content_type, digest)
            results.append({"variant": variant.name, "object_key": key, "sha256": digest, "size": len(variant.data),
                            "content_type": variant.content_type, "width": variant.width, "height": variant.height})
        timings["store"] = time.monotonic() - mark
        return results

    async def _store_call(self, claim, lease: Lease, expires_at: float | None, call, *args):
        """One object-store call of the job's work, waiting out an outage of the store as ``_db`` waits out one of
        the database: the store's condition, not the job's, so no attempt is spent (issue 23 defect 8: with 20
        attempts and their backoff an outage of about an hour failed every job it touched as attempts_exhausted).
        The claim is held meanwhile (the lease renews while the database answers); the wait is bounded by the
        job's deadline (JobExpired), by a lost lease (LeaseLost) and by a stop (Stopping: the job is released)."""
        delays = reconnect_delays(0.2, 5.0)
        waited_since = None
        while True:
            await lease.wait_live(self.stop)
            try:
                result = await asyncio.to_thread(call, *args)
                if waited_since is not None:
                    log.info("job %s: object store back after %.1fs; no attempt spent", claim["job_id"],
                             time.monotonic() - waited_since)
                return result
            except StorageUnavailable as exc:
                if waited_since is None:
                    waited_since = time.monotonic()
                    metrics.JOBS.labels("storage_waited").inc()
                wait = next(delays)
                log.warning("job %s: object store unavailable (%s); waiting %.2fs, no attempt spent",
                            claim["job_id"], redact(exc), wait)
                await self._ensure_not_expired(claim, expires_at)
                if await sleep_or_stop(self.stop, wait):
                    raise Stopping() from None

    async def _ensure_not_expired(self, claim, expires_at: float | None) -> None:
        """Raise JobExpired when the job's deadline has passed. The local estimate (monotonic, never later than
        the real deadline) decides when to ask; the database's clock decides whether it passed."""
        if expires_at is None or time.monotonic() < expires_at:
            return
        row = await self._db(queries().job_expired, {"job_id": claim["job_id"]})
        if row is not None and row["expired"]:
            raise JobExpired("expired before its effect (after a long wait)")

    async def _commit(self, claim, results: list[dict], lease: Lease | None = None) -> str:
        """Fenced commit; returns "ready", "expired" or "fenced". An error whose
        outcome is unknown is resolved by reading the job back; a lease that
        lapsed while the database was unreachable is revived first."""
        params = {"job_id": claim["job_id"], "fencing_token": claim["fencing_token"],
                  "variants": json.dumps(results), "actor": f"worker:{self.identity}"}
        delays = reconnect_delays(0.1, 1.0)
        refusals = 0
        while True:
            if lease is not None:
                try:
                    await lease.wait_live(self.stop)
                except LeaseLost:
                    break
            try:
                row = await self._db_once(queries().commit_result, params)
                if row is not None:
                    return "ready"
                refusals += 1
            except DB_UNAVAILABLE as exc:
                log.warning("commit of %s failed (%s); checking its outcome", claim["job_id"], type(exc).__name__)
            snapshot = await self._db(queries().job_snapshot, {"job_id": claim["job_id"]})
            if snapshot is None:
                break
            if snapshot["state"] == "ready" and snapshot["fencing_token"] == claim["fencing_token"]:
                return "ready"  # our commit went through before the connection broke
            if not (snapshot["state"] == "processing" and snapshot["fencing_token"] == claim["fencing_token"]):
                break
            if snapshot["expired"]:
                return "expired"
            if refusals >= COMMIT_REFUSALS:
                break
            if not snapshot["lease_live"]:
                # Still ours, but the lease lapsed in the database (an outage): revive it, then commit.
                try:
                    if not await self._renew(claim["job_id"], claim["fencing_token"]):
                        break
                except DB_UNAVAILABLE:
                    pass
            await sleep_or_stop(self.stop, next(delays))
        return "fenced"

    async def _fenced(self, sql: str, params: dict, lease: Lease | None):
        """A fenced transition; when it was refused only because the lease lapsed (an outage), revive the lease
        and try once more."""
        row = await self._db(sql, params)
        if row is None and lease is not None and lease.lost_reason is None:
            try:
                await lease.wait_live(self.stop, timeout=self.settings.lease_seconds * 2)
            except LeaseLost:
                return None
            row = await self._db(sql, params)
        return row

    async def _finish_transient(self, message, claim, exc: BaseException, lease: Lease | None = None) -> None:
        reason = redact(exc)
        if self.budget.exhausted(claim["attempt"], claim["attempt_base"]):
            await self._finish_failed(message, claim, "attempts_exhausted", reason, lease=lease)
            return
        delay = self.backoff.delay(claim["attempt"] - claim["attempt_base"] - 1)
        row = await self._fenced(queries().retry_job, {
            "job_id": claim["job_id"], "fencing_token": claim["fencing_token"], "delay_seconds": delay,
            "reason": reason, "actor": f"worker:{self.identity}",
        }, lease)
        if row is None:
            metrics.JOBS.labels("fenced").inc()
            log.warning("job %s: retry not recorded, lease lost; not acking", claim["job_id"])
            await _settle(message, "nack")
            return
        metrics.JOBS.labels("retried").inc()
        log.info("job %s: transient error (%s); attempt %d at +%.2fs", claim["job_id"], reason, row["attempt"], delay)
        await _settle(message, "ack")
        await self._remove_variant_objects(claim)

    async def _finish_failed(self, message, claim, error_code: str, reason: str, lease: Lease | None = None) -> bool:
        """Record ``failed`` under the fence and ack; False (and nack) if the fence rejected it."""
        row = await self._fenced(queries().fail_job, {
            "job_id": claim["job_id"], "fencing_token": claim["fencing_token"], "error_code": error_code,
            "reason": reason[:500], "actor": f"worker:{self.identity}",
        }, lease)
        if row is None:
            metrics.JOBS.labels("fenced").inc()
            await _settle(message, "nack")
            return False
        metrics.JOBS.labels("expired" if error_code == "expired" else "failed").inc()
        log.info("job %s failed: %s", claim["job_id"], error_code)
        await _settle(message, "ack")
        await self._remove_variant_objects(claim)
        return True

    async def _remove_variant_objects(self, claim, keep: set[str] = frozenset()) -> None:
        """Delete variant objects that no published result can name, once the job's outcome is recorded.

        Keys carry the fencing token of the claim that wrote them (keys.variant_key), so this never races a
        replay or a retry: after ``failed`` (or a retry), only keys of this claim's token and older ones are
        deleted, and every later claim — a replay, the next attempt — writes keys of a higher token. After
        ``ready`` (final), every key but the published ones goes. A stale owner paused inside its PUT may still
        land an object after this; it is under its own token, never named by ``ready``. Best effort: an S3
        error leaves the objects (unreferenced) and is logged.
        """
        token = claim["fencing_token"]
        try:
            prefix = variant_prefix(claim["attachment_id"], claim["pipeline_version"])
            listed = await asyncio.to_thread(lambda: [o.key for o in self.store.list_prefix(prefix)])
            doomed = [key for key in listed if key not in keep
                      and (keep or (fencing_token_of_variant_key(key) or 0) <= token)]
            for key in doomed:
                await asyncio.to_thread(self.store.delete, key)
            if doomed:
                log.info("job %s: removed %d variant objects no result names", claim["job_id"], len(doomed))
        except Exception as exc:
            log.warning("job %s: variant cleanup failed (%s); objects left unreferenced", claim["job_id"],
                        type(exc).__name__)

    async def _release(self, claim, reason: str) -> None:
        """processing -> queued, same attempt, with an outbox row of its own (the delivery that goes back unacked
        may already have been taken and acked elsewhere: issue 23 defect 2): bounded, best effort."""
        try:
            await asyncio.wait_for(asyncio.shield(self._db_once(queries().release_job, {
                "job_id": claim["job_id"], "fencing_token": claim["fencing_token"], "reason": reason,
                "actor": f"worker:{self.identity}"})), RELEASE_TIMEOUT_SECONDS)
            log.info("job %s: released without spending an attempt (%s)", claim["job_id"], reason)
        except BaseException as exc:  # noqa: BLE001 - shutting down: the lease recovery is the fallback
            log.warning("job %s: release failed (%s); the lease recovery takes it", claim["job_id"],
                        type(exc).__name__)

    async def _forward(self, message, job: JobMessage) -> None:
        """Level 5: a message of another pipeline version (an old relay, a manual or DLQ republish put it on this
        version's queue) is never processed here and never requeued here: it is published (confirmed) to its own
        version's queue, declared if needed, then acked. If that publish fails it is acked all the same: the job's
        row stays `queued` in the database and the sweeper republishes it through the outbox
        (STALE_QUEUED_SECONDS) — no loss, no requeue loop, and prefetch stays bounded."""
        metrics.JOBS.labels("forwarded").inc()
        try:
            channel = self.work_channel
            await topology.declare_version(channel, topology.config_from_settings(self.settings), job.pipeline_version)
            exchange = await channel.get_exchange(topology.EXCHANGE, ensure=False)
            await exchange.publish(
                aio_pika.Message(message.body, headers=dict(message.headers or {}), content_type=message.content_type,
                                 message_id=message.message_id, type=message.type,
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=topology.routing_key_for(job.pipeline_version), mandatory=False, timeout=10)
            log.info("job %s is pipeline version %d (this worker: %d): forwarded to %s", job.job_id,
                     job.pipeline_version, self.settings.pipeline_version, topology.queue_for(job.pipeline_version))
        except Exception as exc:
            log.warning("job %s: forwarding to pipeline version %d failed (%s); acked, the sweeper republishes it",
                        job.job_id, job.pipeline_version, type(exc).__name__)
        await _settle(message, "ack")

    async def _record_dead_letter(self, job: JobMessage, reason: str) -> None:
        """Record on the job that its delivery is dead-lettered (queued -> processing -> failed, error_code
        ``dead_lettered``, one transaction), so that the lost-message safety net does not republish it until its TTL
        (issue 23 defect 7). Only the job's current attempt, still ``queued``, is taken; anything else (another
        attempt, ready, failed, leased) is left as it is. Best effort and bounded: if the database refuses, the job
        stays queued and the safety net is the fallback, as before."""
        try:
            row = await asyncio.wait_for(self._db_once(queries().dead_letter_job, {
                "job_id": job.job_id, "attempt": job.attempt, "pipeline_version": self.settings.pipeline_version,
                "reason": reason[:500], "actor": f"worker:{self.identity}"}), RELEASE_TIMEOUT_SECONDS * 5)
        except Exception as exc:  # noqa: BLE001 - logged; the safety net stays the fallback
            log.warning("job %s: its dead-lettering could not be recorded (%s); it stays queued", job.job_id,
                        type(exc).__name__)
            return
        if row is not None:
            metrics.JOBS.labels("dead_lettered").inc()
            log.warning("job %s attempt %d: failed as dead_lettered (%s)", job.job_id, job.attempt, reason)

    async def _dead_letter(self, message, reason: str) -> None:
        metrics.JOBS.labels("poison").inc()
        log.warning("dead-lettering message %s: %s", message.message_id, reason)
        try:
            headers = dict(message.headers or {})
            headers.update({"x-dead-letter-reason": reason[:500], "x-dead-lettered-by": self.identity,
                            "x-dead-lettered-at": datetime.now(timezone.utc).isoformat()})
            await self.dead_letter_exchange.publish(
                aio_pika.Message(message.body, headers=headers, content_type=message.content_type,
                                 message_id=message.message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=topology.ROUTING_KEY, mandatory=False, timeout=10)
        except Exception as exc:
            log.warning("dead-letter publish failed (%s); rejecting to the queue's DLX", type(exc).__name__)
            await _settle(message, "reject")
            return
        # If this ack is lost the redelivery is dead-lettered again: a duplicate in the DLQ, never a loss.
        await _settle(message, "ack")

    # ----------------------------------------------------------- database helpers

    async def _renew(self, job_id: uuid.UUID, token: int) -> bool:
        row = await self._db_once(queries().renew_lease, {
            "job_id": job_id, "fencing_token": token, "lease_seconds": self.settings.lease_seconds})
        return row is not None

    async def _db_once(self, sql: str, params: dict):
        async with self.db.connection() as conn:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchone()

    async def _db(self, sql: str, params: dict):
        """Run one statement, waiting out database outages (the delivery stays
        unacked meanwhile; prefetch bounds how many wait)."""
        row, _, _ = await self._db_timed(sql, params)
        return row

    async def _db_timed(self, sql: str, params: dict):
        """``_db`` that also returns when the successful try was sent (monotonic) and whether it had to retry.
        Outages and a database that refuses writes for now (read-only) are waited out with backoff: they are
        the database's condition, not an error of the job."""
        delays = reconnect_delays(0.2, 5.0)
        retried = False
        while True:
            started = time.monotonic()
            try:
                return await self._db_once(sql, params), started, retried
            except DB_UNAVAILABLE as exc:
                retried = True
                wait = next(delays)
                log.warning("database unavailable (%s); retrying in %.2fs", redact(exc), wait)
                if await sleep_or_stop(self.stop, wait):
                    raise Stopping() from None

def redact(exc: BaseException) -> str:
    """An operator-visible reason without secrets: the error kind, and only our own messages; for a database
    error its SQLSTATE (the cause, never the server's text, which may quote data)."""
    if isinstance(exc, (StorageUnavailable, FailpointError)):
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.Error) and sqlstate:
        return f"{type(exc).__name__} (SQLSTATE {sqlstate})"
    return type(exc).__name__


def delivery_count(message) -> int:
    """How many times the broker delivered this message before (quorum queues count in x-delivery-count)."""
    try:
        count = int((message.headers or {}).get("x-delivery-count") or 0)
    except (TypeError, ValueError, AttributeError):
        count = 0
    if count == 0 and getattr(message, "redelivered", False):
        count = 1
    return count


async def _settle(message, how: str) -> None:
    try:
        if how == "ack":
            await message.ack()
        elif how == "nack":
            await message.nack(requeue=True)
        else:
            await message.reject(requeue=False)
    except Exception as exc:  # channel gone: the broker redelivers; the DB state decides then
        log.info("could not %s delivery %s: %s", how, getattr(message, "message_id", "?"), type(exc).__name__)
