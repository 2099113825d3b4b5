"""The worker's job processing, one delivery at a time: validate the message (poison → dead-letter with a reason),
claim the job in the database (lease + fencing token; a job that is ready, failed, stale or owned elsewhere is acked
as a no-op), read its trusted storage metadata from the database, render in the render pool, write deterministic keys
per effect key while the lease is live, then ONE fenced statement commits the results, the ready transition and its
event — and only then the delivery is acked. Outages of the database and the object store are waited out (the
delivery stays unacked, no attempt spent); a transient error is a retry with backoff, a verdict on the job a
``failed`` under the fence.

Every settlement goes through ``worker_session.settle`` (looked up there at each call, so one definition decides)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry.trace import SpanKind
from psycopg.rows import DictRow

from reference import imaging, metrics, tracing, worker_session
from reference.backoff import reconnect_delays
from reference.db.queries import queries
from reference.failpoints import FailpointError
from reference.keys import fencing_token_of_variant_key, variant_key, variant_prefix
from reference.lease import Lease, LeaseLost
from reference.messages import InvalidMessage, JobMessage, parse
from reference.runtime import sleep_or_stop
from reference.storage import ObjectMissing, StorageUnavailable, sha256_hex
from reference.worker_session import SessionConsumer, delivery_count

if TYPE_CHECKING:
    from reference.backoff import AttemptBudget, FullJitterBackoff
    from reference.db.pool import Pool
    from reference.failpoints import Failpoints
    from reference.storage import ObjectStore
    from reference.worker_render import RenderPool

_T = TypeVar("_T")

log = logging.getLogger("reference.worker")

DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)
# The database's condition, not the job's: waited out like an outage (a read-only database, e.g. a failover).
DB_UNAVAILABLE = (*DB_ERRORS, psycopg.errors.ReadOnlySqlTransaction)
UNEXPECTED_BACKOFF_CAP_SECONDS = 30.0
RELEASE_TIMEOUT_SECONDS = 1.0
COMMIT_REFUSALS = 3  # a fenced commit refused this often while the job still looks ours: give it up (nack)
CLAIM_RACES = 3  # claims tried again when the job is found queued at the delivery's own attempt (a release raced)
TRANSIENT_ERRORS = (StorageUnavailable, FailpointError, concurrent.futures.process.BrokenProcessPool,
                    asyncio.TimeoutError, ConnectionError, *DB_ERRORS)


class Stopping(Exception):
    """Shutdown began while waiting for a dependency."""


class JobExpired(Exception):
    """The job's deadline passed before its first effect (re-checked after fetch and render)."""


class ExecutionDeadlinePassed(Exception):
    """The claim ran past EXECUTION_TIMEOUT_SECONDS (a deadline per execution): its work is abandoned and the attempt
    recorded as a retry, whatever the lease renewal says. The sweeper recovers such a claim too (expire_leases)."""

    def __str__(self) -> str:
        return "execution deadline passed"


class JobProcessor(SessionConsumer):
    """What the worker does with one delivery (``_handle``), on the state ``Worker.__init__`` makes."""

    failpoints: Failpoints
    budget: AttemptBudget
    backoff: FullJitterBackoff
    store: ObjectStore
    render_pool: RenderPool
    db: Pool | None
    executions: dict[str, float]  # "<job_id>/<token>" -> the claim's monotonic time (liveness: reference/health.py)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
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
                # The CONSUMER span continues the message's traceparent (the relay's publish span): S3 and commit
                # spans below are its children, and the job's log lines name its trace id.
                with tracing.span(f"{getattr(message, 'routing_key', None) or 'jobs'} process", kind=SpanKind.CONSUMER,
                                  parent=tracing.parent_context(*tracing.message_trace(getattr(message, "headers", None), job)),
                                  attributes={"messaging.system": "rabbitmq", "messaging.operation.type": "process",
                                              "reference.job_id": str(job.job_id), "reference.attempt": job.attempt,
                                              "reference.attachment_id": str(job.attachment_id)}):
                    await self._process(message, job, received_at)
            except Stopping:
                await worker_session.settle(message, "nack")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._unexpected_before_claim(message, exc, job)
            finally:
                metrics.IN_FLIGHT.dec()

    async def _unexpected_before_claim(self, message: AbstractIncomingMessage, exc: BaseException,
                                       job: JobMessage | None = None) -> None:
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
        await worker_session.settle(message, "nack")

    async def _process(self, message: AbstractIncomingMessage, job: JobMessage, received_at: float) -> None:
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
        # The message's trace (W3C traceparent, started by the API, carried by the relay) names this job's log lines.
        # With tracing on, the CONSUMER span's trace id (the message's, or a new trace's for a malformed one).
        claim = {**claim, "trace_id": tracing.current_trace_id()
                 or (job.traceparent[3:35] if job.traceparent else None)}
        log.info("claimed job %s attempt %d token %d", job.job_id, claim["attempt"], token, extra=self._ids(claim))
        if claim["expired"]:
            if await self._finish_failed(message, claim, "expired", "expired before its effect"):
                metrics.count_expired("worker", "claim")
            return

        # Liveness (reference/health.py): an execution held past its deadline plus a lease is a stuck worker.
        execution = f"{job.job_id}/{token}"
        self.executions[execution] = claimed_at
        timings: dict[str, float] = {"wait": claimed_at - received_at, "claim": time.monotonic() - claimed_at}
        # The job's deadline on the monotonic clock, from the database's own clock at the claim: never later
        # than the real one (claimed_at precedes the statement).
        expires_in = claim.get("expires_in_seconds")
        expires_at = None if expires_in is None else claimed_at + float(expires_in)
        renew_seconds = self.settings.lease_renew_seconds
        assert renew_seconds is not None  # Settings fills it in (a third of the lease)
        lease = Lease(lease_seconds=self.settings.lease_seconds, renew_seconds=renew_seconds,
                      claimed_at_monotonic=claimed_at, renew=lambda: self._renew(job.job_id, token)).start()
        try:
            try:
                results = await self._within_execution_deadline(
                    self._produce_effects(claim, lease, timings, expires_at),
                    claimed_at + self.settings.execution_timeout_seconds)
            except ExecutionDeadlinePassed as exc:
                metrics.JOBS.labels("abandoned").inc()
                log.warning("job %s: execution deadline passed (%gs since the claim); abandoned",
                            job.job_id, self.settings.execution_timeout_seconds, extra=self._ids(claim))
                await self._finish_transient(message, claim, exc, lease=lease)
                return
            except JobExpired as exc:
                if await self._finish_failed(message, claim, "expired", str(exc), lease=lease):
                    metrics.count_expired("worker", "processing")
                return
            except LeaseLost as exc:
                metrics.JOBS.labels("lease_lost").inc()
                log.warning("job %s: lease lost before commit (%s); not acking", job.job_id, exc)
                await worker_session.settle(message, "nack")
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
            with tracing.span("commit", attributes={"reference.fencing_token": token, "db.operation.name": "commit"}):
                committed = await self._commit(claim, results, lease)
            timings["commit"] = time.monotonic() - mark
            if committed == "expired":
                if await self._finish_failed(message, claim, "expired", "expired before its commit", lease=lease):
                    metrics.count_expired("worker", "commit")
                return
            if committed != "ready":
                metrics.JOBS.labels("fenced").inc()
                log.warning("job %s: commit rejected by the fence (token %d); not acking", job.job_id, token)
                await worker_session.settle(message, "nack")
                return
            metrics.JOB_SECONDS.observe(time.monotonic() - claimed_at)
        except Stopping:
            # Shutting down while the job was ours: not the job's error; give it back without spending an attempt.
            await self._release(claim, "released: the worker is stopping")
            await worker_session.settle(message, "nack")
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
            self.executions.pop(execution, None)
            await lease.stop()

        try:
            await self.failpoints.ahit("after_commit_before_ack")
        except FailpointError:
            await worker_session.settle(message, "nack")  # redelivery finds it ready: a no-op ack
            return
        await worker_session.settle(message, "ack")
        metrics.JOBS.labels("ready").inc()
        log.info("job %s ready (attempt %d) in %.3fs: %s", job.job_id, claim["attempt"], time.monotonic() - claimed_at,
                 " ".join(f"{k} {v:.3f}" for k, v in timings.items()), extra={**self._ids(claim), "outcome": "ready"})
        if token > 1:  # earlier claims may have left objects under their own tokens: ready is final, remove them
            await self._remove_variant_objects(claim, keep={r["object_key"] for r in results})

    @staticmethod
    def _ids(claim: DictRow) -> dict[str, Any]:
        """The context fields of a job's log lines (LOG_FORMAT=json names them: reference/runtime.py)."""
        return {"job_id": claim["job_id"], "attachment_id": claim["attachment_id"], "attempt": claim["attempt"],
                "fencing_token": claim["fencing_token"], "pipeline_version": claim.get("pipeline_version"),
                "trace_id": claim.get("trace_id")}

    async def _within_execution_deadline(self, work: Coroutine[Any, Any, _T], deadline: float) -> _T:
        """Run ``work`` (the fetch, render and writes of one claim) until the monotonic ``deadline``: past it the
        work is cancelled — a render that never returns included — and ExecutionDeadlinePassed raised."""
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), RELEASE_TIMEOUT_SECONDS * 5)
        except BaseException:  # noqa: BLE001 - the abandoned work's own end (cancelled, or its error) is not ours
            pass
        raise ExecutionDeadlinePassed()

    async def _not_claimed(self, message: AbstractIncomingMessage, job: JobMessage,
                           may_claim_again: bool = False) -> bool:
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
        await worker_session.settle(message, "ack")
        return False

    async def _produce_effects(self, claim: DictRow, lease: Lease, timings: dict[str, float],
                               expires_at: float | None = None) -> list[dict[str, Any]]:
        await lease.wait_live(self.stop)
        mark = time.monotonic()
        with tracing.span("s3 get original", kind=SpanKind.CLIENT, attributes={"rpc.system": "s3"}) as span:
            original = await self._store_call(claim, lease, expires_at, self.store.get_bytes, claim["original_key"])
            tracing.set_attribute(span, "reference.bytes", len(original))
        if sha256_hex(original) != claim["original_sha256"].strip():
            raise imaging.ImageRejected("original_checksum_mismatch", "staging object differs from its record")
        timings["fetch"], mark = time.monotonic() - mark, time.monotonic()
        await lease.wait_live(self.stop)
        # The dimensions the API read from the header at the upload: what the image promises, never parsed here.
        width, height = claim.get("original_width"), claim.get("original_height")
        with tracing.span("render", attributes={"reference.variants": ",".join(claim["variants"])}):
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
            with tracing.span("s3 put variant", kind=SpanKind.CLIENT,
                              attributes={"rpc.system": "s3", "reference.variant": variant.name,
                                          "reference.bytes": len(variant.data)}):
                await self._store_call(claim, lease, expires_at, self.store.put_bytes, key, variant.data,
                                       variant.content_type, digest)
            results.append({"variant": variant.name, "object_key": key, "sha256": digest, "size": len(variant.data),
                            "content_type": variant.content_type, "width": variant.width, "height": variant.height})
        timings["store"] = time.monotonic() - mark
        return results

    async def _store_call(self, claim: DictRow, lease: Lease, expires_at: float | None, call: Callable[..., _T],
                          *args: Any) -> _T:
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

    async def _ensure_not_expired(self, claim: DictRow, expires_at: float | None) -> None:
        """Raise JobExpired when the job's deadline has passed. The local estimate (monotonic, never later than
        the real deadline) decides when to ask; the database's clock decides whether it passed."""
        if expires_at is None or time.monotonic() < expires_at:
            return
        row = await self._db(queries().job_expired, {"job_id": claim["job_id"]})
        if row is not None and row["expired"]:
            raise JobExpired("expired before its effect (after a long wait)")

    async def _commit(self, claim: DictRow, results: list[dict[str, Any]], lease: Lease | None = None) -> str:
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

    async def _fenced(self, sql: str, params: dict[str, Any], lease: Lease | None) -> DictRow | None:
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

    async def _finish_transient(self, message: AbstractIncomingMessage, claim: DictRow, exc: BaseException,
                                lease: Lease | None = None) -> None:
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
            await worker_session.settle(message, "nack")
            return
        metrics.JOBS.labels("retried").inc()
        log.info("job %s: transient error (%s); attempt %d at +%.2fs", claim["job_id"], reason, row["attempt"], delay,
                 extra={**self._ids(claim), "outcome": "retried"})
        await worker_session.settle(message, "ack")
        await self._remove_variant_objects(claim)

    async def _finish_failed(self, message: AbstractIncomingMessage, claim: DictRow, error_code: str, reason: str,
                             lease: Lease | None = None) -> bool:
        """Record ``failed`` under the fence and ack; False (and nack) if the fence rejected it."""
        row = await self._fenced(queries().fail_job, {
            "job_id": claim["job_id"], "fencing_token": claim["fencing_token"], "error_code": error_code,
            "reason": reason[:500], "actor": f"worker:{self.identity}",
        }, lease)
        if row is None:
            metrics.JOBS.labels("fenced").inc()
            await worker_session.settle(message, "nack")
            return False
        metrics.JOBS.labels("expired" if error_code == "expired" else "failed").inc()
        log.info("job %s failed: %s", claim["job_id"], error_code, extra={**self._ids(claim), "outcome": "failed"})
        await worker_session.settle(message, "ack")
        await self._remove_variant_objects(claim)
        return True

    async def _remove_variant_objects(self, claim: DictRow, keep: AbstractSet[str] = frozenset()) -> None:
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

    async def _release(self, claim: DictRow, reason: str) -> None:
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
    # ----------------------------------------------------------- database helpers

    async def _renew(self, job_id: uuid.UUID, token: int) -> bool:
        row = await self._db_once(queries().renew_lease, {
            "job_id": job_id, "fencing_token": token, "lease_seconds": self.settings.lease_seconds})
        return row is not None

    async def _db_once(self, sql: str, params: dict[str, Any]) -> DictRow | None:
        if self.db is None:
            raise RuntimeError("the worker's database pool is not open")
        async with self.db.connection() as conn:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchone()

    async def _db(self, sql: str, params: dict[str, Any]) -> DictRow | None:
        """Run one statement, waiting out database outages (the delivery stays
        unacked meanwhile; prefetch bounds how many wait)."""
        row, _, _ = await self._db_timed(sql, params)
        return row

    async def _db_timed(self, sql: str, params: dict[str, Any]) -> tuple[DictRow | None, float, bool]:
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
    if isinstance(exc, ExecutionDeadlinePassed):
        return str(exc)
    if isinstance(exc, (StorageUnavailable, FailpointError)):
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.Error) and sqlstate:
        return f"{type(exc).__name__} (SQLSTATE {sqlstate})"
    return type(exc).__name__

