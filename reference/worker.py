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
import json
import logging
import time
import uuid

import aio_pika
import psycopg
from psycopg_pool import AsyncConnectionPool

from reference import imaging, metrics, topology
from reference.backoff import AttemptBudget, FullJitterBackoff, reconnect_delays
from reference.db.pool import open_pool
from reference.db.queries import queries
from reference.failpoints import FailpointError, Failpoints
from reference.keys import variant_key
from reference.lease import Lease, LeaseLost
from reference.messages import InvalidMessage, JobMessage, parse
from reference.runtime import process_identity, sleep_or_stop
from reference.storage import ObjectMissing, ObjectStore, StorageUnavailable, sha256_hex

log = logging.getLogger("reference.worker")

DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)
TRANSIENT_ERRORS = (StorageUnavailable, FailpointError, concurrent.futures.process.BrokenProcessPool,
                    asyncio.TimeoutError, ConnectionError, *DB_ERRORS)


class Stopping(Exception):
    """Shutdown began while waiting for a dependency."""


class RenderPool:
    """The Pillow process pool, rebuilt if a pool process dies or hangs."""

    def __init__(self, workers: int, limits: imaging.Limits, timeout_seconds: float):
        self.workers, self.limits, self.timeout = workers, limits, timeout_seconds
        self.executor = imaging.make_pool(workers, limits)

    def warm_up(self) -> None:
        # Start the forkserver and pool processes now, before any socket is opened.
        list(self.executor.map(abs, range(self.workers)))

    async def render(self, data: bytes, variants: tuple[str, ...]) -> list[imaging.RenderedVariant]:
        executor = self.executor
        future = asyncio.get_running_loop().run_in_executor(executor, imaging.render_variants, data, variants,
                                                            self.limits)
        try:
            return await asyncio.wait_for(future, self.timeout)
        except asyncio.TimeoutError:
            self._replace(executor, "decode time limit exceeded")
            raise imaging.ImageRejected("decode_timeout", f"over {self.timeout:.0f}s") from None
        except concurrent.futures.process.BrokenProcessPool:
            self._replace(executor, "a pool process died")
            raise

    def _replace(self, executor, why: str) -> None:
        if executor is not self.executor:
            return
        log.warning("replacing the image pool: %s", why)
        self.executor = imaging.make_pool(self.workers, self.limits)
        processes = list(getattr(executor, "_processes", {}).values())  # no public API to kill a hung task
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            try:
                process.kill()
            except Exception:
                pass

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class Worker:
    def __init__(self, settings, failpoints: Failpoints | None = None):
        self.settings = settings
        self.failpoints = failpoints or Failpoints(settings.failpoints)
        self.identity = process_identity("worker")
        self.budget = AttemptBudget(settings.max_attempts)
        self.backoff = FullJitterBackoff(settings.retry_base_seconds, settings.retry_cap_seconds)
        self.limits = imaging.Limits(settings.max_pixels, settings.max_side, settings.max_frames)
        # Started first: the pool's processes never inherit a broker or database socket.
        self.render_pool = RenderPool(settings.image_workers, self.limits, settings.decode_timeout_seconds)
        self.render_pool.warm_up()
        self.store = ObjectStore.from_settings(settings, max_pool_connections=settings.worker_concurrency * 2 + 4)
        self.slots = asyncio.Semaphore(settings.worker_concurrency)
        self.tasks: set[asyncio.Task] = set()
        self.db: AsyncConnectionPool | None = None
        self.stop = asyncio.Event()
        self.dead_letter_exchange = None

    # ----------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=self.settings.worker_concurrency * 2 + 4, thread_name_prefix="worker-io"))
        self.db = await open_pool(self.settings, self.identity, min_size=1,
                                  max_size=self.settings.worker_concurrency + 2)
        log.info("worker %s: concurrency=%d prefetch=%d image_workers=%d variants from DB", self.identity,
                 self.settings.worker_concurrency, self.settings.effective_prefetch, self.settings.image_workers)
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
        connection = await aio_pika.connect(self.settings.amqp_url, timeout=self.settings.db_connect_timeout_seconds,
                                            heartbeat=self.settings.heartbeat_seconds,
                                            client_properties={"connection_name": self.identity})
        closed = asyncio.Event()
        connection.close_callbacks.add(lambda *_: closed.set())
        try:
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=self.settings.effective_prefetch)
            await topology.declare(channel, topology.config_from_settings(self.settings))
            self.dead_letter_exchange = await channel.get_exchange(topology.DEAD_LETTER_EXCHANGE, ensure=False)
            queue = await channel.get_queue(topology.QUEUE, ensure=False)
            consumer_tag = await queue.consume(self._on_message, no_ack=False)
            log.info("consuming %s", topology.QUEUE)
            waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(closed.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if stop.is_set() and not closed.is_set():
                # Graceful: no new deliveries, let in-flight work finish and ack.
                try:
                    await asyncio.wait_for(queue.cancel(consumer_tag), 2.0)
                except Exception:
                    pass
                await self._drain_in_flight()
            return True
        finally:
            try:
                await asyncio.wait_for(connection.close(), 2.0)
            except Exception:
                pass

    async def _drain_in_flight(self) -> None:
        if not self.tasks:
            return
        grace = max(0.5, self.settings.shutdown_grace_seconds - 3.0)
        done, pending = await asyncio.wait(set(self.tasks), timeout=grace)
        for task in pending:  # unacked: the broker returns these deliveries
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        task = asyncio.create_task(self._handle(message))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ----------------------------------------------------------- one delivery

    async def _handle(self, message) -> None:
        received_at = time.monotonic()
        async with self.slots:
            metrics.IN_FLIGHT.inc()
            try:
                try:
                    job = parse(message.body, message.message_id)
                except InvalidMessage as exc:
                    await self._dead_letter(message, str(exc))
                    return
                await self._process(message, job, received_at)
            except Stopping:
                await _settle(message, "nack")
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("unexpected error handling %s", message.message_id)
                await _settle(message, "nack")
            finally:
                metrics.IN_FLIGHT.dec()

    async def _process(self, message, job: JobMessage, received_at: float) -> None:
        claimed_at = time.monotonic()
        claim = await self._db(queries().claim_job, {
            "job_id": job.job_id, "attempt": job.attempt, "owner": self.identity,
            "lease_seconds": self.settings.lease_seconds, "actor": f"worker:{self.identity}",
        })
        if claim is None:
            await self._not_claimed(message, job)
            return
        token = claim["fencing_token"]
        log.info("claimed job %s attempt %d token %d", job.job_id, claim["attempt"], token)
        if claim["expired"]:
            if await self._finish_failed(message, claim, "expired", "expired before its effect"):
                metrics.JOBS_EXPIRED.inc()
            return

        timings: dict[str, float] = {"wait": claimed_at - received_at}
        lease = Lease(lease_seconds=self.settings.lease_seconds, renew_seconds=self.settings.lease_renew_seconds,
                      claimed_at_monotonic=claimed_at, renew=lambda: self._renew(job.job_id, token)).start()
        try:
            try:
                results = await self._produce_effects(claim, lease, timings)
            except LeaseLost as exc:
                metrics.JOBS.labels("lease_lost").inc()
                log.warning("job %s: lease lost before commit (%s); not acking", job.job_id, exc)
                await _settle(message, "nack")
                return
            except imaging.ImageRejected as exc:
                await self._finish_failed(message, claim, exc.code, exc.detail or exc.code)
                return
            except ObjectMissing:
                await self._finish_failed(message, claim, "original_missing", "staging original not found")
                return
            except TRANSIENT_ERRORS as exc:
                await self._finish_transient(message, claim, exc)
                return

            try:
                await self.failpoints.ahit("after_s3_write_before_commit")
            except FailpointError as exc:
                await self._finish_transient(message, claim, exc)
                return
            mark = time.monotonic()
            committed = await self._commit(claim, results)
            timings["commit"] = time.monotonic() - mark
            if committed == "expired":
                if await self._finish_failed(message, claim, "expired", "expired before its commit"):
                    metrics.JOBS_EXPIRED.inc()
                return
            if committed != "ready":
                metrics.JOBS.labels("fenced").inc()
                log.warning("job %s: commit rejected by the fence (token %d); not acking", job.job_id, token)
                await _settle(message, "nack")
                return
            metrics.JOB_SECONDS.observe(time.monotonic() - claimed_at)
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

    async def _not_claimed(self, message, job: JobMessage) -> None:
        snapshot = await self._db(queries().job_snapshot, {"job_id": job.job_id})
        if snapshot is None:
            await self._dead_letter(message, "unknown_job: no such job in the database")
            return
        state = snapshot["state"]
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

    async def _produce_effects(self, claim, lease: Lease, timings: dict[str, float]) -> list[dict]:
        lease.ensure_live()
        mark = time.monotonic()
        original = await asyncio.to_thread(self.store.get_bytes, claim["original_key"])
        if sha256_hex(original) != claim["original_sha256"].strip():
            raise imaging.ImageRejected("original_checksum_mismatch", "staging object differs from its record")
        timings["fetch"], mark = time.monotonic() - mark, time.monotonic()
        lease.ensure_live()
        rendered = await self.render_pool.render(original, tuple(claim["variants"]))
        timings["render"], mark = time.monotonic() - mark, time.monotonic()
        results = []
        for variant in rendered:
            lease.ensure_live()  # stop starting new effects once ownership is in doubt
            key = variant_key(claim["attachment_id"], claim["pipeline_version"], variant.name, variant.extension)
            digest = sha256_hex(variant.data)
            await asyncio.to_thread(self.store.put_bytes, key, variant.data, variant.content_type, digest)
            results.append({"variant": variant.name, "object_key": key, "sha256": digest, "size": len(variant.data),
                            "content_type": variant.content_type, "width": variant.width, "height": variant.height})
        timings["store"] = time.monotonic() - mark
        return results

    async def _commit(self, claim, results: list[dict]) -> str:
        """Fenced commit; returns "ready", "expired" or "fenced". An error whose
        outcome is unknown is resolved by reading the job back."""
        params = {"job_id": claim["job_id"], "fencing_token": claim["fencing_token"],
                  "variants": json.dumps(results), "actor": f"worker:{self.identity}"}
        delays = reconnect_delays(0.1, 1.0)
        while True:
            try:
                row = await self._db_once(queries().commit_result, params)
                if row is not None:
                    return "ready"
                break
            except DB_ERRORS as exc:
                log.warning("commit of %s failed (%s); checking its outcome", claim["job_id"], type(exc).__name__)
            snapshot = await self._db(queries().job_snapshot, {"job_id": claim["job_id"]})
            if snapshot["state"] == "ready" and snapshot["fencing_token"] == claim["fencing_token"]:
                return "ready"  # our commit went through before the connection broke
            if not (snapshot["state"] == "processing" and snapshot["fencing_token"] == claim["fencing_token"]
                    and snapshot["lease_live"]):
                break
            await sleep_or_stop(self.stop, next(delays))
        snapshot = await self._db(queries().job_snapshot, {"job_id": claim["job_id"]})
        if (snapshot["state"] == "processing" and snapshot["fencing_token"] == claim["fencing_token"]
                and snapshot["lease_live"] and snapshot["expired"]):
            return "expired"
        return "fenced"

    async def _finish_transient(self, message, claim, exc: BaseException) -> None:
        reason = redact(exc)
        if self.budget.exhausted(claim["attempt"], claim["attempt_base"]):
            await self._finish_failed(message, claim, "attempts_exhausted", reason)
            return
        delay = self.backoff.delay(claim["attempt"] - claim["attempt_base"] - 1)
        row = await self._db(queries().retry_job, {
            "job_id": claim["job_id"], "fencing_token": claim["fencing_token"], "delay_seconds": delay,
            "reason": reason, "actor": f"worker:{self.identity}",
        })
        if row is None:
            metrics.JOBS.labels("fenced").inc()
            log.warning("job %s: retry not recorded, lease lost; not acking", claim["job_id"])
            await _settle(message, "nack")
            return
        metrics.JOBS.labels("retried").inc()
        log.info("job %s: transient error (%s); attempt %d at +%.2fs", claim["job_id"], reason, row["attempt"], delay)
        await _settle(message, "ack")

    async def _finish_failed(self, message, claim, error_code: str, reason: str) -> bool:
        """Record ``failed`` under the fence and ack; False (and nack) if the fence rejected it."""
        row = await self._db(queries().fail_job, {
            "job_id": claim["job_id"], "fencing_token": claim["fencing_token"], "error_code": error_code,
            "reason": reason[:500], "actor": f"worker:{self.identity}",
        })
        if row is None:
            metrics.JOBS.labels("fenced").inc()
            await _settle(message, "nack")
            return False
        metrics.JOBS.labels("expired" if error_code == "expired" else "failed").inc()
        log.info("job %s failed: %s", claim["job_id"], error_code)
        await _settle(message, "ack")
        return True

    async def _dead_letter(self, message, reason: str) -> None:
        metrics.JOBS.labels("poison").inc()
        log.warning("dead-lettering message %s: %s", message.message_id, reason)
        try:
            headers = dict(message.headers or {})
            headers.update({"x-dead-letter-reason": reason[:500], "x-dead-lettered-by": self.identity})
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
        delays = reconnect_delays(0.2, 5.0)
        while True:
            try:
                return await self._db_once(sql, params)
            except DB_ERRORS as exc:
                wait = next(delays)
                log.warning("database unavailable (%s); retrying in %.2fs", type(exc).__name__, wait)
                if await sleep_or_stop(self.stop, wait):
                    raise Stopping() from None


def redact(exc: BaseException) -> str:
    """An operator-visible reason without secrets: the error kind, and only our own messages."""
    if isinstance(exc, (StorageUnavailable, FailpointError)):
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return type(exc).__name__


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
