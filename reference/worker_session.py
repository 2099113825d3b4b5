"""The worker's broker side: one consume session at a time (connection, channel, consumer), reconnecting when it
ends; deliveries dispatched one by one or in batches under a process-wide bound of processing slots; settling a
delivery (ack, nack, reject) on its own session's channel; publishing to the dead-letter exchange and forwarding a
message of another pipeline version. What is done with a delivery is reference/worker_jobs.py (``_handle``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from reference import brokers, metrics, topology
from reference.backoff import reconnect_delays
from reference.batching import BatchAssembler
from reference.messages import JobMessage
from reference.runtime import sleep_or_stop

if TYPE_CHECKING:
    from reference.settings import Settings

log = logging.getLogger("reference.worker")


class SessionEnded(Exception):
    """The broker session of a delivery ended before the delivery got a processing slot."""


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("broker_session", default=None)


class _Session:
    """One broker session (connection + channel + consumer). Its deliveries can only be settled on its channel."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.reason = ""
        self.waiting: set[asyncio.Task[Any]] = set()  # its deliveries still waiting for a processing slot

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


class SessionConsumer:
    """Consumes the worker's queue and hands each delivery to ``_handle`` (reference/worker_jobs.py) in a task of
    its own. The state it uses is made by ``Worker.__init__`` (reference/worker.py)."""

    settings: Settings
    identity: str
    stop: asyncio.Event
    slots: asyncio.Semaphore  # WORKER_CONCURRENCY processing slots, across broker sessions
    tasks: set[asyncio.Task[None]]  # deliveries (and batches) in flight
    dead_letter_exchange: AbstractExchange | None
    work_channel: AbstractChannel | None
    _assemblers: dict[_Session | None, BatchAssembler]  # batch mode: one per broker session
    _batch_in_flight: int

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        raise NotImplementedError  # reference/worker_jobs.py: JobProcessor._handle

    async def _consume_until_stopped(self, stop: asyncio.Event) -> None:
        """Broker sessions one after another until ``stop``: a session that ends (the connection or channel lost,
        the consumer cancelled) is replaced by a new one after a backoff, which restarts once a session connected."""
        delays = reconnect_delays()
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
            self.consuming = True  # readiness (reference/worker.py)
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
            self.consuming = False
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

    async def _on_message(self, message: AbstractIncomingMessage,
                          session: "_Session | None" = None) -> None:
        if self.settings.worker_batch_size > 1:
            self._add_to_batch(message, session)
            return
        self._spawn(self._deliver(message, session))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ----------------------------------------------------------- batch mode (BE-JOB-007)

    def _add_to_batch(self, message: AbstractIncomingMessage, session: "_Session | None") -> None:
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
        elif len(assembler) == 1 and (deadline := assembler.deadline()) is not None:
            # A new batch opened (it has a deadline): dispatch it when its wait is over, full or not.
            self._spawn(self._dispatch_when_due(assembler, assembler.generation, deadline, session))

    async def _dispatch_when_due(self, assembler: BatchAssembler, generation: int, deadline: float,
                                 session: "_Session | None") -> None:
        # The deadline is read when the batch opens: by the time this task runs, the batch may already have filled
        # and gone (the assembler then has no deadline, and `due` says no for this generation).
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if assembler.due(time.monotonic(), generation):
            await self._run_batch(assembler.take(), session)

    async def _run_batch(self, messages: list[AbstractIncomingMessage], session: "_Session | None") -> None:
        self._batch_in_flight += len(messages)
        log.debug("dispatching a batch of %d deliveries", len(messages))

        async def item(message: AbstractIncomingMessage) -> None:
            try:
                await self._deliver(message, session)
            finally:
                self._batch_in_flight -= 1

        outcomes = await asyncio.gather(*(item(message) for message in messages), return_exceptions=True)
        for message, outcome in zip(messages, outcomes):
            if isinstance(outcome, Exception):
                log.error("delivery %s of a batch ended with %s", getattr(message, "message_id", "?"),
                          type(outcome).__name__, exc_info=outcome)

    async def _deliver(self, message: AbstractIncomingMessage, session: "_Session | None") -> None:
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
    async def _slot(self) -> AsyncIterator[None]:
        """A process-wide processing slot (WORKER_CONCURRENCY across every broker session). A delivery of a session
        that ends while it waits gives up its place: it is never processed after its channel is gone."""
        session = _SESSION.get()
        task = asyncio.current_task()
        if session is not None:
            if session.ended.is_set():
                raise SessionEnded()
            if task is not None:
                session.waiting.add(task)
        try:
            await self.slots.acquire()
        finally:
            if session is not None and task is not None:
                session.waiting.discard(task)
        try:
            if session is not None and session.ended.is_set():
                raise SessionEnded()
            yield
        finally:
            self.slots.release()

    async def _forward(self, message: AbstractIncomingMessage, job: JobMessage) -> None:
        """Level 5: a message of another pipeline version (an old relay, a manual or DLQ republish put it on this
        version's queue) is never processed here and never requeued here: it is published (confirmed) to its own
        version's queue, declared if needed, then acked. If that publish fails it is acked all the same: the job's
        row stays `queued` in the database and the sweeper republishes it through the outbox
        (STALE_QUEUED_SECONDS) — no loss, no requeue loop, and prefetch stays bounded."""
        metrics.JOBS.labels("forwarded").inc()
        try:
            channel = self.work_channel
            if channel is None:
                raise ConnectionError("no broker session")
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
        await settle(message, "ack")
    async def _dead_letter(self, message: AbstractIncomingMessage, reason: str) -> None:
        metrics.JOBS.labels("poison").inc()
        log.warning("dead-lettering message %s: %s", message.message_id, reason)
        try:
            headers = dict(message.headers or {})
            headers.update({"x-dead-letter-reason": reason[:500], "x-dead-lettered-by": self.identity,
                            "x-dead-lettered-at": datetime.now(timezone.utc).isoformat()})
            if self.dead_letter_exchange is None:
                raise ConnectionError("no broker session")
            await self.dead_letter_exchange.publish(
                aio_pika.Message(message.body, headers=headers, content_type=message.content_type,
                                 message_id=message.message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=topology.ROUTING_KEY, mandatory=False, timeout=10)
        except Exception as exc:
            log.warning("dead-letter publish failed (%s); rejecting to the queue's DLX", type(exc).__name__)
            await settle(message, "reject")
            return
        # If this ack is lost the redelivery is dead-lettered again: a duplicate in the DLQ, never a loss.
        await settle(message, "ack")


def delivery_count(message: AbstractIncomingMessage) -> int:
    """How many times the broker delivered this message before (quorum queues count in x-delivery-count)."""
    try:
        value = (message.headers or {}).get("x-delivery-count") or 0
        count = int(value) if isinstance(value, (int, float, str)) else 0
    except (TypeError, ValueError, AttributeError):
        count = 0
    if count == 0 and getattr(message, "redelivered", False):
        count = 1
    return count


async def settle(message: AbstractIncomingMessage, how: str) -> None:
    try:
        if how == "ack":
            await message.ack()
        elif how == "nack":
            await message.nack(requeue=True)
        else:
            await message.reject(requeue=False)
    except Exception as exc:  # channel gone: the broker redelivers; the DB state decides then
        log.info("could not %s delivery %s: %s", how, getattr(message, "message_id", "?"), type(exc).__name__)
