"""Outbox relay (level 4): publishes outbox rows to RabbitMQ.

Each batch is fetched with ``FOR UPDATE SKIP LOCKED`` inside a transaction,
published persistent + mandatory on a publisher-confirm channel, and marked
published only after its confirm, in the same transaction. A crash anywhere
before that commit leaves the rows unpublished: they are published again and
the worker deduplicates (at-least-once). The relay wakes on LISTEN/NOTIFY
(trigger on outbox inserts) with a polling fallback, and also at the earliest
``available_at`` so delayed retries leave on time. Broker or database outages
end the session; it reconnects with jittered backoff. A row the broker refuses
is deferred with backoff; a row whose message can never pass the message schema
is never deferred: it is settled as dead and its job ends ``failed`` with
``unpublishable_message`` (metric ``reference_outbox_publish_failures_total{kind="unpublishable"}``). A row the
broker returns for want of a route (a pipeline version no worker declared a queue for) is deferred for
OUTBOX_UNROUTABLE_GIVE_UP_SECONDS after the row was written, then settled the same way with ``unroutable``
(``kind="unroutable"``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import aio_pika
from aio_pika.abc import AbstractExchange
from opentelemetry.trace import Span, SpanKind
from pamqp.commands import Basic
from psycopg.rows import DictRow

from reference import brokers, metrics, topology, tracing
from reference.backoff import FullJitterBackoff, reconnect_delays
from reference.db.pool import Connection, connect
from reference.db.queries import queries
from reference.failpoints import Failpoints
from reference.health import Health, fresh
from reference.messages import InvalidMessage, JobMessage
from reference.runtime import sleep_or_stop
from reference.tracing import accept_tracestate

if TYPE_CHECKING:
    from reference.settings import Settings

log = logging.getLogger("reference.relay")
NOTIFY_CHANNEL = "reference_outbox"
PUBLISH_TIMEOUT_SECONDS = 10.0
# Rows that are due but locked by another relay mid-publish (SKIP LOCKED) must not make this one spin:
# after an empty drain it waits at least this long for them (a NOTIFY still wakes it at once).
CONTENDED_WAIT_SECONDS = 0.2
# error_code of a job whose message can never pass schemas/jobs.schema.json (terminal, never retried).
UNPUBLISHABLE_ERROR_CODE = "unpublishable_message"
UNROUTABLE_ERROR_CODE = "unroutable"


class Relay:
    def __init__(self, settings: Settings, failpoints: Failpoints | None = None) -> None:
        self.settings = settings
        self.failpoints = failpoints or Failpoints(settings.failpoints)
        self.topology = topology.config_from_settings(settings)
        self.row_backoff = FullJitterBackoff(settings.retry_base_seconds, settings.retry_cap_seconds)
        self.connected = False
        # Readiness (reference/health.py): connected to both, and the outbox's oldest due row younger than
        # RELAY_READY_MAX_LAG_SECONDS as this relay last measured it (each wait between batches measures it).
        self.lag_seconds: float | None = None
        self.lag_seen_at: float | None = None
        self.health = Health("relay", settings.health_stall_seconds)
        self.health.ready_when("connected", lambda: (self.connected, "database and broker sessions open"
                                                     if self.connected else "not connected (reconnecting)"))
        self.health.ready_when("outbox_lag", self._lag_check)

    def _lag_check(self) -> tuple[bool, str]:
        limit = self.settings.relay_ready_max_lag_seconds
        seen, detail = fresh(self.lag_seen_at, 3 * self.settings.relay_poll_seconds
                             + self.settings.db_statement_timeout_seconds + PUBLISH_TIMEOUT_SECONDS,
                             "outbox lag measured")
        if not seen:
            return False, detail
        lag = self.lag_seconds or 0.0
        return lag <= limit, f"outbox lag {lag:.1f}s (limit {limit:g}s); {detail}"

    async def run(self, stop: asyncio.Event) -> None:
        delays = reconnect_delays()
        while not stop.is_set():
            self.connected = False
            try:
                await self._session(stop)
            except Exception as exc:
                if self.connected:
                    delays = reconnect_delays()  # a healthy session resets the backoff
                wait = next(delays)
                log.warning("relay session ended (%s: %s); reconnecting in %.2fs", type(exc).__name__, exc, wait)
                await sleep_or_stop(stop, wait)

    async def _session(self, stop: asyncio.Event) -> None:
        work = listen = amqp = None
        listener = None
        try:
            work = await connect(self.settings, "reference-relay")
            listen = await connect(self.settings, "reference-relay-listen")
            await listen.execute(f"LISTEN {NOTIFY_CHANNEL}")
            amqp = await brokers.connect(self.settings, timeout=self.settings.db_connect_timeout_seconds,
                                          heartbeat=self.settings.heartbeat_seconds,
                                          client_properties={"connection_name": "reference-relay"})
            channel = await amqp.channel(publisher_confirms=True, on_return_raises=True)
            await topology.declare(channel, self.topology)
            exchange = await channel.get_exchange(topology.EXCHANGE, ensure=False)
            self.connected = True
            log.info("relay connected")
            wake = asyncio.Event()
            listener = asyncio.create_task(self._listen(listen, wake))
            while not stop.is_set():
                if listener.done():
                    listener.result()  # re-raise the LISTEN connection's failure
                    raise ConnectionError("LISTEN connection ended")
                if amqp.is_closed:
                    raise ConnectionError("broker connection closed")
                published = await self._drain_once(work, exchange)
                if self.lag_seen_at is None or time.monotonic() - self.lag_seen_at >= self.settings.relay_poll_seconds:
                    await self._measure_lag(work)
                if published >= self.settings.relay_batch_size:
                    continue  # more may be due right now
                wake.clear()
                await self._wait(work, wake, stop, listener,
                                 floor=CONTENDED_WAIT_SECONDS if published == 0 else 0.0)
        finally:
            if listener is not None:
                listener.cancel()
            for closer in (amqp, listen, work):
                if closer is not None:
                    try:
                        await asyncio.wait_for(closer.close(), 2.0)
                    except Exception:
                        pass

    async def _listen(self, conn: Connection, wake: asyncio.Event) -> None:
        async for _ in conn.notifies():
            wake.set()

    async def _wait(self, work: Connection, wake: asyncio.Event, stop: asyncio.Event, listener: asyncio.Task[None],
                    floor: float = 0.0) -> None:
        """Sleep until the earliest due row, a NOTIFY, stop, or the poll interval; at least ``floor``."""
        timeout = self.settings.relay_poll_seconds
        cursor = await work.execute(queries().outbox_next_due)
        row = await cursor.fetchone()
        if row and row["seconds"] is not None:
            timeout = max(floor, min(timeout, row["seconds"]))
        if timeout <= 0:
            return
        waiters = [asyncio.create_task(wake.wait()), asyncio.create_task(stop.wait())]
        try:
            await asyncio.wait([*waiters, listener], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _measure_lag(self, work: Connection) -> None:
        cursor = await work.execute(queries().outbox_lag)
        row = await cursor.fetchone()
        self.lag_seconds = max(0.0, (row["seconds"] if row else None) or 0.0)
        self.lag_seen_at = time.monotonic()
        metrics.OUTBOX_LAG.set(self.lag_seconds)

    async def _drain_once(self, work: Connection, exchange: AbstractExchange) -> int:
        """Publish one batch of due rows; returns how many were confirmed (or settled as unpublishable)."""
        broken: BaseException | None = None
        async with work.transaction():
            cursor = await work.execute(queries().outbox_fetch, {"limit": self.settings.relay_batch_size})
            rows = await cursor.fetchall()
            if not rows:
                return 0
            await self.failpoints.ahit("after_commit_before_publish")
            # A message that fails the schema now fails it on every later try: it is never put on the
            # wire, and its row gets a terminal outcome below instead of a deferral.
            messages: list[tuple[DictRow, aio_pika.Message]] = []
            unpublishable: list[tuple[DictRow, InvalidMessage]] = []
            # One PRODUCER span per publish, continuing the row's trace (the API's request span); its context is
            # the message's traceparent, so the worker's CONSUMER span is its child.
            spans: list[Span] = []
            for row in rows:
                span = publish_span(row)
                try:
                    messages.append((row, build_message(row, tracing.carrier_of(span))))
                    spans.append(span)
                except InvalidMessage as exc:
                    tracing.end_span(span, exc)
                    unpublishable.append((row, exc))
            outcomes = await asyncio.gather(*(self._publish(exchange, message,
                                                            topology.routing_key_for(row["pipeline_version"]))
                                              for row, message in messages),
                                            return_exceptions=True)
            for span, outcome in zip(spans, outcomes):
                tracing.end_span(span, outcome if isinstance(outcome, BaseException) else None)
            confirmed: list[Any] = []
            refused: list[tuple[DictRow, Exception]] = []
            for (row, _), outcome in zip(messages, outcomes):
                if outcome is True:
                    confirmed.append(row["id"])
                elif isinstance(outcome, (aio_pika.exceptions.DeliveryError, aio_pika.exceptions.PublishError,
                                          ValueError)):
                    refused.append((row, outcome))
                elif isinstance(outcome, BaseException):
                    broken = broken or outcome
            # Confirms are in; the crash window is before they are recorded.
            if confirmed:
                await self.failpoints.ahit("after_publish_before_confirm")
            if confirmed:
                await work.execute(queries().outbox_mark_published, {"ids": confirmed})
            unroutable: list[tuple[DictRow, Exception]] = []
            for row, outcome in refused:
                if _no_route(outcome) and (row.get("age_seconds") or 0.0) >= self.settings.outbox_unroutable_give_up_seconds:
                    unroutable.append((row, outcome))
                    continue
                delay = self.row_backoff.delay(row["publish_attempts"])
                metrics.OUTBOX_FAILURES.labels("refused").inc()
                log.warning("outbox row %s refused by the broker (%s); retry in %.2fs", row["id"], outcome, delay,
                            extra={"job_id": row["job_id"], "attachment_id": row.get("attachment_id"),
                                   "attempt": row["attempt"]})
                await work.execute(queries().outbox_defer, {
                    "ids": [row["id"]], "error": str(outcome)[:500], "delay_seconds": delay,
                })
            for row, invalid in unpublishable:
                await self._bury(work, row, invalid)
            for row, outcome in unroutable:
                # Issue 23 defect 6: no queue is bound for the row's routing key (a reprocess to a pipeline version
                # no worker ever declared) and none was for OUTBOX_UNROUTABLE_GIVE_UP_SECONDS: a terminal outcome,
                # never a deferral without end.
                await self._bury(work, row, outcome, error_code=UNROUTABLE_ERROR_CODE, kind="unroutable")
        metrics.OUTBOX_PUBLISHED.inc(len(confirmed))
        if broken is not None:
            metrics.OUTBOX_FAILURES.labels("connection").inc()
            raise broken if isinstance(broken, Exception) else ConnectionError(str(broken))
        return len(confirmed) + len(unpublishable) + len(unroutable)

    async def _bury(self, work: Connection, row: DictRow, exc: BaseException,
                    error_code: str | None = None, kind: str = "unpublishable") -> None:
        """Terminal outcome of a row whose message can never be published (or routed): the row is settled (dead)
        and, when it carries the job's current queued attempt, the job ends failed with ``error_code``
        (UNPUBLISHABLE_ERROR_CODE unless given)."""
        error_code = error_code or UNPUBLISHABLE_ERROR_CODE
        cursor = await work.execute(queries().outbox_bury_unpublishable, {
            "id": row["id"], "error": str(exc)[:500], "error_code": error_code, "actor": "relay",
        })
        done = await cursor.fetchone()
        metrics.OUTBOX_FAILURES.labels(kind).inc()
        ids = {"job_id": row["job_id"], "attachment_id": row.get("attachment_id"), "attempt": row["attempt"]}
        if done and done["failed_job_id"] is not None:
            log.error("outbox row %s of job %s attempt %s can never be published (%s): job failed/%s",
                      row["id"], row["job_id"], row["attempt"], exc, error_code, extra=ids)
        else:
            log.error("outbox row %s of job %s attempt %s can never be published (%s): row settled, "
                      "the job is not queued at that attempt", row["id"], row["job_id"], row["attempt"], exc,
                      extra=ids)

    async def _publish(self, exchange: AbstractExchange, message: aio_pika.Message, routing_key: str = topology.ROUTING_KEY) -> bool:
        # Level 5: a version's own routing key. Mandatory: a version whose queue no consumer has declared yet is
        # returned (refused) and its row deferred with backoff, never dropped.
        result = await exchange.publish(message, routing_key, mandatory=True,
                                        timeout=PUBLISH_TIMEOUT_SECONDS)
        if not isinstance(result, Basic.Ack):
            # A returned message (basic.return) or a nack: the frame is what _no_route reads.
            raise aio_pika.exceptions.DeliveryError(None, cast(Any, result))
        return True


def _no_route(outcome: BaseException) -> bool:
    """The broker returned the message: no queue is bound for its routing key (basic.return 312 NO_ROUTE)."""
    frame = getattr(outcome, "frame", None)
    return isinstance(frame, Basic.Return) and getattr(frame, "reply_code", None) == 312


def publish_span(row: DictRow) -> Span:
    """The PRODUCER span of one publish of ``row``, a child of the row's traceparent (a new trace without one)."""
    return tracing.start_span(f"{topology.routing_key_for(row['pipeline_version'])} publish",
                              kind=SpanKind.PRODUCER,
                              parent=tracing.parent_context(row.get("traceparent"), row.get("tracestate")),
                              attributes={"messaging.system": "rabbitmq", "messaging.operation.type": "publish",
                                          "messaging.message.id": str(row["job_id"]), "reference.job_id": str(row["job_id"]),
                                          "reference.attempt": row["attempt"],
                                          "reference.attachment_id": str(row.get("attachment_id"))})


def build_message(row: DictRow, trace: Mapping[str, str] | None = None) -> aio_pika.Message:
    """The AMQP message of an outbox row; raises InvalidMessage when it can never pass the schema. ``trace``
    (the publish span's ``traceparent``/``tracestate``) replaces the row's own when it names one."""
    traceparent, tracestate = row["traceparent"], row["tracestate"]
    if trace and trace.get("traceparent"):
        traceparent, tracestate = trace["traceparent"], accept_tracestate(trace.get("tracestate")) or tracestate
    try:
        job = JobMessage(
            job_id=row["job_id"], attempt=row["attempt"], attachment_id=row["attachment_id"],
            pipeline_version=row["pipeline_version"], variants=tuple(row["variants"] or ()),
            created_at=row["created_at"], expires_at=row["expires_at"],
            traceparent=traceparent, tracestate=tracestate,
        )
        body = job.to_body()  # validates against schemas/jobs.schema.json
        properties = job.amqp_properties()
    except InvalidMessage:
        raise
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # a value no message can carry
        raise InvalidMessage(f"cannot build the message: {type(exc).__name__}: {str(exc)[:200]}") from None
    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, app_id="reference-relay",
                            **properties)
