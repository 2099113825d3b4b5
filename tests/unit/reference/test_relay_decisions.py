"""Decision logic of one relay batch (Relay._drain_once / _publish), without services.

The Relay is built with the real Settings and real Failpoints; the database connection and the exchange are
in-memory fakes. Publisher-confirm outcomes are produced the way aio-pika/aiormq deliver them: ``Basic.Ack``
returned, a broker nack raised as ``DeliveryError``, an unroutable return raised as ``PublishError``
(``on_return_raises=True``), a lost confirm as ``TimeoutError``. One journal records the fetch transaction,
every publish and confirm and every statement, so the tests can check that a row is marked published only
after its positive confirm, inside the transaction that locked it.
"""
from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import aio_pika
import pytest
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from reference import topology
from reference.db.queries import queries
from reference.failpoints import FailpointError
from reference.messages import parse
from reference.relay import CONTENDED_WAIT_SECONDS, PUBLISH_TIMEOUT_SECONDS, UNPUBLISHABLE_ERROR_CODE, Relay
from reference.settings import Settings

from reference_fakes import RecordingBackoff

STATEMENT_NAMES = {getattr(queries(), name): name for name in queries().names()}


# ------------------------------------------------------------------ fakes


class FakeCursor:
    def __init__(self, rows: list[dict]):
        self.rows = rows

    async def fetchall(self) -> list[dict]:
        return self.rows

    async def fetchone(self) -> dict | None:
        return self.rows[0] if self.rows else None


class FakeTransaction:
    def __init__(self, connection: "FakeConnection"):
        self.connection = connection

    async def __aenter__(self):
        self.connection.journal.append("begin")
        return self

    async def __aexit__(self, exc_type, exc, tb):
        self.connection.journal.append("rollback" if exc_type else "commit")
        return False


class FakeConnection:
    """A psycopg AsyncConnection as _drain_once uses it: transaction() and execute() of named statements."""

    def __init__(self, journal: list[str], due_rows: list[dict]):
        self.journal = journal
        self.due_rows = due_rows
        self.calls: list[tuple[str, dict | None]] = []

    def transaction(self) -> FakeTransaction:
        return FakeTransaction(self)

    async def execute(self, sql: str, params: dict | None = None) -> FakeCursor:
        name = STATEMENT_NAMES[sql]
        self.journal.append(f"db:{name}")
        self.calls.append((name, params))
        return FakeCursor(self.due_rows if name == "outbox_fetch" else [])

    def params(self, name: str) -> list[dict]:
        return [params for called, params in self.calls if called == name]


def unroutable(message: aio_pika.Message) -> aio_pika.exceptions.PublishError:
    frame = Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange=topology.EXCHANGE,
                         routing_key=topology.ROUTING_KEY)
    delivered = DeliveredMessage(delivery=frame, header=ContentHeader(), body=message.body, channel=None)
    return aio_pika.exceptions.PublishError(delivered, frame)


class FakeExchange:
    """Confirms each publish according to ``outcomes[message_id]``; journals ``publish:<row>`` when the
    message is handed over and ``confirm:<row>`` / ``<outcome>:<row>`` when the broker's answer arrives."""

    def __init__(self, journal: list[str], outcomes: dict[str, str], row_of: dict[str, int]):
        self.journal = journal
        self.outcomes = outcomes
        self.row_of = row_of
        self.published: list[tuple[aio_pika.Message, str, bool, float]] = []

    async def publish(self, message, routing_key, *, mandatory, timeout):
        row = self.row_of[message.message_id]
        self.journal.append(f"publish:{row}")
        self.published.append((message, routing_key, mandatory, timeout))
        await asyncio.sleep(0.01)  # the confirm arrives later than the publish
        outcome = self.outcomes[message.message_id]
        if outcome == "ack":
            self.journal.append(f"confirm:{row}")
            return Basic.Ack(delivery_tag=row)
        self.journal.append(f"{outcome}:{row}")
        if outcome == "nack":
            raise aio_pika.exceptions.DeliveryError(None, Basic.Nack(delivery_tag=row))
        if outcome == "nack-frame":  # a client that returns the Nack frame instead of raising
            return Basic.Nack(delivery_tag=row)
        if outcome == "return":
            raise unroutable(message)
        if outcome == "timeout":
            raise asyncio.TimeoutError()
        raise AssertionError(f"unknown outcome {outcome}")


def outbox_row(row_id: int, *, publish_attempts: int = 0, variants=("thumbnail", "crop", "optimized"),
               attempt: int = 1) -> dict:
    now = datetime.now(timezone.utc)
    return {"id": row_id, "job_id": uuid.uuid4(), "attempt": attempt, "publish_attempts": publish_attempts,
            "attachment_id": uuid.uuid4(), "pipeline_version": 1, "variants": list(variants),
            "created_at": now, "expires_at": now + timedelta(hours=1), "traceparent": None, "tracestate": None}


class Batch:
    """One _drain_once over ``rows``, each answered with its outcome."""

    def __init__(self, rows_and_outcomes: list[tuple[dict, str]], *, failpoints: str = "", batch_size: int = 100):
        self.journal: list[str] = []
        self.rows = [row for row, _ in rows_and_outcomes]
        self.relay = Relay(Settings(failpoints=failpoints, relay_batch_size=batch_size, retry_base_seconds=1.0,
                                    retry_cap_seconds=600.0))
        self.work = FakeConnection(self.journal, self.rows)
        self.exchange = FakeExchange(self.journal, {str(row["job_id"]): outcome for row, outcome in rows_and_outcomes},
                                     {str(row["job_id"]): row["id"] for row in self.rows})

    def drain(self) -> int:
        return asyncio.run(self.relay._drain_once(self.work, self.exchange))

    def marked(self) -> list[int]:
        return [row_id for params in self.work.params("outbox_mark_published") for row_id in params["ids"]]

    def deferred(self) -> list[int]:
        return [row_id for params in self.work.params("outbox_defer") for row_id in params["ids"]]


# ------------------------------------------------------------------ positive confirms


def test_confirmed_rows_are_marked_published_after_their_confirms_inside_the_fetch_transaction():
    """Marking follows every positive confirm and commits with the lock taken by the fetch."""
    batch = Batch([(outbox_row(1), "ack"), (outbox_row(2), "ack")])

    assert batch.drain() == 2

    assert batch.marked() == [1, 2] and batch.deferred() == []
    journal = batch.journal
    assert journal[:2] == ["begin", "db:outbox_fetch"] and journal[-2:] == ["db:outbox_mark_published", "commit"]
    assert journal.index("db:outbox_mark_published") > max(journal.index("confirm:1"), journal.index("confirm:2"))
    assert batch.work.params("outbox_fetch") == [{"limit": 100}]


def test_published_message_is_persistent_mandatory_and_names_its_job():
    """Mandatory + persistent + confirm is what makes a confirm mean 'queued durably'."""
    row = outbox_row(1)
    batch = Batch([(row, "ack")])

    batch.drain()

    [(message, routing_key, mandatory, timeout)] = batch.exchange.published
    assert routing_key == topology.ROUTING_KEY and mandatory is True and timeout == PUBLISH_TIMEOUT_SECONDS
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.message_id == str(row["job_id"])
    job = parse(message.body, message.message_id)
    assert (job.job_id, job.attempt, job.attachment_id) == (row["job_id"], 1, row["attachment_id"])


def test_no_due_rows_publishes_nothing():
    batch = Batch([])

    assert batch.drain() == 0

    assert batch.journal == ["begin", "db:outbox_fetch", "commit"]
    assert batch.exchange.published == []


# ------------------------------------------------------------------ refused by the broker


@pytest.mark.parametrize("outcome", ["nack", "nack-frame", "return"],
                         ids=["nack-raised", "nack-frame-returned", "unroutable-return"])
def test_refused_row_stays_unpublished_and_is_deferred_with_backoff(outcome):
    """Only a positive confirm publishes a row; a refused one is pushed back by the row backoff, counted by
    its publish_attempts, while the confirmed neighbour in the same batch is still marked."""
    batch = Batch([(outbox_row(1), "ack"), (outbox_row(2, publish_attempts=3), outcome)])
    batch.relay.row_backoff = RecordingBackoff(12.5)

    assert batch.drain() == 1

    assert batch.marked() == [1] and batch.deferred() == [2]
    [defer] = batch.work.params("outbox_defer")
    assert defer["delay_seconds"] == 12.5 and defer["error"]
    assert batch.relay.row_backoff.asked == [3]
    assert batch.journal[-1] == "commit"


def test_batch_with_every_row_refused_marks_nothing():
    batch = Batch([(outbox_row(1), "nack"), (outbox_row(2), "return")])

    assert batch.drain() == 0

    assert "db:outbox_mark_published" not in batch.journal
    assert sorted(batch.deferred()) == [1, 2]


def test_real_row_backoff_delay_stays_under_its_full_jitter_ceiling():
    """First refusal of a row (publish_attempts 0) with base 1 s: deferred by 0..1 s."""
    batch = Batch([(outbox_row(1), "nack")])

    batch.drain()

    [defer] = batch.work.params("outbox_defer")
    assert 0.0 <= defer["delay_seconds"] <= 1.0


def test_row_whose_message_breaks_the_contract_is_settled_dead_not_deferred():
    """A row that cannot make a valid message never reaches the broker, and is not deferred either (it would
    fail the schema on every later try): it is buried, in the fetch transaction, with its job's error_code;
    its valid neighbour is still published and marked (issue 10, defect 9)."""
    batch = Batch([(outbox_row(1, variants=()), "ack"), (outbox_row(2), "ack"),
                   (outbox_row(3, attempt=1001), "ack")])

    assert batch.drain() == 3  # progress: the drain loop fetches again at once

    assert [batch.exchange.row_of[m.message_id] for m, *_ in batch.exchange.published] == [2]
    assert batch.marked() == [2] and batch.deferred() == []
    buried = batch.work.params("outbox_bury_unpublishable")
    assert [p["id"] for p in buried] == [1, 3]
    assert {p["error_code"] for p in buried} == {UNPUBLISHABLE_ERROR_CODE}
    assert "variants" in buried[0]["error"] and "attempt" in buried[1]["error"]
    assert batch.journal[-1] == "commit"


def test_a_row_unroutable_past_the_give_up_time_is_settled_dead_and_a_young_one_deferred():
    """Issue 23 defect 6: a row the broker returns for want of a route (a pipeline version no worker declared) is
    deferred while it is young (a worker of that version may still start), and settled for good once it is older
    than OUTBOX_UNROUTABLE_GIVE_UP_SECONDS: its job ends failed/unroutable, never deferred without end. A refusal
    that is not a missing route (a nack: the queue is full) is deferred whatever the row's age."""
    young, old, full = (dict(outbox_row(1), age_seconds=5.0), dict(outbox_row(2), age_seconds=4000.0),
                        dict(outbox_row(3), age_seconds=4000.0))
    batch = Batch([(young, "return"), (old, "return"), (full, "nack")])

    assert batch.drain() == 1  # the settled row is progress

    assert sorted(batch.deferred()) == [1, 3]
    buried = batch.work.params("outbox_bury_unpublishable")
    assert [(p["id"], p["error_code"]) for p in buried] == [(2, "unroutable")] and "NO_ROUTE" in buried[0]["error"]


# ------------------------------------------------------------------ no answer


def test_confirm_timeout_leaves_the_row_untouched_and_ends_the_session():
    """A lost confirm is unknown, not refused: the row is neither marked nor deferred (it is due again at once,
    the worker deduplicates), its confirmed neighbour is still committed, and the session ends to reconnect."""
    batch = Batch([(outbox_row(1), "ack"), (outbox_row(2), "timeout")])

    with pytest.raises(asyncio.TimeoutError):
        batch.drain()

    assert batch.marked() == [1] and batch.deferred() == []
    assert batch.journal[-2:] == ["db:outbox_mark_published", "commit"]


# ------------------------------------------------------------------ crash windows


def test_failpoint_between_confirm_and_mark_rolls_back_so_rows_stay_unpublished():
    """Confirmed but not yet recorded: the rollback keeps the rows due, to be published again."""
    batch = Batch([(outbox_row(1), "ack")], failpoints="after_publish_before_confirm=error")

    with pytest.raises(FailpointError):
        batch.drain()

    assert "confirm:1" in batch.journal
    assert batch.marked() == [] and batch.journal[-1] == "rollback"


def test_failpoint_before_publish_publishes_nothing_and_rolls_back():
    batch = Batch([(outbox_row(1), "ack")], failpoints="after_commit_before_publish=error")

    with pytest.raises(FailpointError):
        batch.drain()

    assert batch.exchange.published == []
    assert batch.journal == ["begin", "db:outbox_fetch", "rollback"]


# ------------------------------------------------------------------ waiting between batches


class NextDueConnection:
    """Answers outbox_next_due with a fixed number of seconds (negative: overdue)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds

    async def execute(self, sql: str, params: dict | None = None) -> FakeCursor:
        assert STATEMENT_NAMES[sql] == "outbox_next_due"
        return FakeCursor([{"seconds": self.seconds}])


def timed_wait(seconds_due: float | None, floor: float) -> float:
    async def scenario() -> float:
        relay = Relay(Settings(relay_poll_seconds=5.0))
        wake, stop = asyncio.Event(), asyncio.Event()
        listener = asyncio.create_task(asyncio.sleep(60))
        began = asyncio.get_running_loop().time()
        await relay._wait(NextDueConnection(seconds_due), wake, stop, listener, floor=floor)
        listener.cancel()
        return asyncio.get_running_loop().time() - began

    return asyncio.run(scenario())


def test_overdue_rows_after_a_productive_batch_are_fetched_at_once():
    assert timed_wait(-0.5, floor=0.0) < 1.0


def test_rows_locked_by_another_relay_do_not_make_this_one_spin():
    """Due rows that the last drain could not fetch are held by another relay (SKIP LOCKED): wait, don't spin."""
    assert timed_wait(-0.5, floor=CONTENDED_WAIT_SECONDS) >= CONTENDED_WAIT_SECONDS * 0.9


def test_a_notify_ends_the_contended_wait_early():
    async def scenario() -> float:
        relay = Relay(Settings(relay_poll_seconds=1.0))
        wake, stop = asyncio.Event(), asyncio.Event()
        listener = asyncio.create_task(asyncio.sleep(60))
        asyncio.get_running_loop().call_later(0.02, wake.set)
        began = asyncio.get_running_loop().time()
        await relay._wait(NextDueConnection(-0.5), wake, stop, listener, floor=5.0)
        listener.cancel()
        return asyncio.get_running_loop().time() - began

    assert asyncio.run(scenario()) < 1.0
