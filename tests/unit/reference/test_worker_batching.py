"""Batch consumer mode (BE-JOB-007): batch assembly (reference/batching.py), the prefetch ≥ batch rule in the
settings, and the worker's dispatch of a batch — each item handled on its own, acked on its own, a failing item
isolated without holding its neighbours — with the single-delivery path replaced by a recording fake."""
from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from reference import worker as worker_module
from reference.batching import BatchAssembler
from reference.settings import Settings

# ------------------------------------------------------------------ assembly (pure)


def test_a_batch_is_dispatched_when_full():
    assembler = BatchAssembler(size=3, wait_seconds=1.0, capacity=16)
    assert assembler.add("a", now=0.0) is None
    assert assembler.add("b", now=0.1) is None
    assert assembler.add("c", now=0.2) == ["a", "b", "c"]
    assert len(assembler) == 0 and assembler.deadline() is None


def test_a_partial_batch_is_due_after_the_wait_from_its_first_delivery():
    assembler = BatchAssembler(size=4, wait_seconds=0.05, capacity=16)
    assembler.add("a", now=10.0)
    assembler.add("b", now=10.04)
    assert assembler.deadline() == pytest.approx(10.05)
    assert not assembler.due(10.049)
    assert assembler.due(10.05)
    assert assembler.take() == ["a", "b"]
    assert not assembler.due(99.0)  # nothing open


def test_a_batch_that_cannot_grow_is_dispatched_at_once():
    # Prefetch 4, three deliveries still being processed: the broker sends no fifth until one is acked.
    assembler = BatchAssembler(size=4, wait_seconds=10.0, capacity=4)
    assert assembler.add("a", now=0.0, in_flight=3) == ["a"]
    assert assembler.add("b", now=0.0, in_flight=2) is None
    assert assembler.add("c", now=0.0, in_flight=2) == ["b", "c"]


def test_a_timer_armed_for_an_earlier_batch_does_not_flush_a_later_one():
    assembler = BatchAssembler(size=2, wait_seconds=1.0, capacity=2)
    assembler.add("a", now=0.0)
    armed = assembler.generation
    assert assembler.add("b", now=0.5) == ["a", "b"]  # filled before the timer fired
    assembler.add("c", now=0.9)
    assert not assembler.due(1.0, armed)  # the old timer: not its batch
    assert assembler.due(1.9, assembler.generation)


def test_assembler_refuses_a_batch_the_prefetch_cannot_hold():
    with pytest.raises(ValueError, match="prefetch"):
        BatchAssembler(size=8, wait_seconds=0.0, capacity=4)


# ------------------------------------------------------------------ settings


def test_batch_size_defaults_to_one_delivery_at_a_time():
    settings = Settings(worker_concurrency=2)
    assert settings.worker_batch_size == 1 and settings.worker_batch_wait_ms > 0


def test_batch_larger_than_the_prefetch_is_refused_with_a_clear_error():
    with pytest.raises(ValidationError, match="WORKER_BATCH_SIZE .* must not exceed the prefetch"):
        Settings(worker_concurrency=2, worker_batch_size=4)
    with pytest.raises(ValidationError, match="raise PREFETCH"):
        Settings(worker_concurrency=2, prefetch=8, worker_batch_size=16)
    assert Settings(worker_concurrency=2, prefetch=16, worker_batch_size=16).worker_batch_size == 16


# ------------------------------------------------------------------ dispatch (the worker, faked single path)


class Delivery:
    """An incoming delivery that journals how it was settled, and whether ``multiple`` was ever asked."""

    def __init__(self, journal: list, name: str):
        self.journal, self.message_id = journal, name

    async def ack(self, multiple: bool = False):
        self.journal.append(("ack", self.message_id, multiple))

    async def nack(self, multiple: bool = False, requeue: bool = True):
        self.journal.append(("nack", self.message_id, multiple))

    async def reject(self, requeue: bool = False):
        self.journal.append(("reject", self.message_id, False))


@pytest.fixture
def batch_worker(monkeypatch):
    def build(size: int, wait_ms: float, prefetch: int, handle):
        monkeypatch.setattr(worker_module, "RenderPool", lambda *args, **kwargs: type(
            "NoPool", (), {"warm_up": lambda self: None, "shutdown": lambda self: None})())
        monkeypatch.setattr(worker_module.ObjectStore, "from_settings", classmethod(lambda cls, *a, **k: object()))
        worker = worker_module.Worker(Settings(worker_concurrency=prefetch, prefetch=prefetch, image_workers=1,
                                               worker_batch_size=size, worker_batch_wait_ms=wait_ms))
        monkeypatch.setattr(worker, "_handle", handle)
        return worker
    return build


async def _drain(worker) -> None:
    while worker.tasks:
        await asyncio.wait(set(worker.tasks), timeout=5)


def test_each_item_of_a_batch_is_settled_on_its_own_and_a_failing_item_holds_no_neighbour(batch_worker):
    journal: list = []
    release_poison = None

    async def handle(message):
        journal.append(("start", message.message_id, None))
        if message.message_id == "poison":
            await release_poison.wait()  # the poison item is slow to fail (e.g. retried, then dead-lettered)
            await message.reject()
            return
        if message.message_id == "broken":
            raise RuntimeError("an unexpected error escaping one item")
        await asyncio.sleep(0.01)
        await message.ack()

    async def scenario():
        nonlocal release_poison
        release_poison = asyncio.Event()
        worker = batch_worker(4, 1000, 8, handle)
        names = ["first", "poison", "broken", "last"]
        for name in names:
            await worker._on_message(Delivery(journal, name))
        await asyncio.sleep(0.1)
        # The batch was dispatched when full (not after the 1 s wait), and its good items are acked already,
        # while the poison item is still unfinished.
        settled = {(how, name) for how, name, _ in journal if how != "start"}
        assert {name for how, name, _ in journal if how == "start"} == set(names)
        assert settled == {("ack", "first"), ("ack", "last")}
        release_poison.set()
        await _drain(worker)
        assert worker._batch_in_flight == 0
        return worker

    asyncio.run(scenario())
    settles = [entry for entry in journal if entry[0] != "start"]
    assert sorted(settles) == [("ack", "first", False), ("ack", "last", False), ("reject", "poison", False)]
    assert all(multiple is False for _, _, multiple in settles)  # never an ack across another item


def test_a_partial_batch_waits_at_most_the_batch_wait(batch_worker):
    started: list[float] = []

    async def handle(message):
        started.append(asyncio.get_running_loop().time())
        await message.ack()

    async def scenario():
        worker = batch_worker(4, 50, 8, handle)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await worker._on_message(Delivery([], "alone"))
        await asyncio.sleep(0.02)
        assert started == []  # still waiting for company
        await _drain(worker)
        assert 0.04 <= started[0] - sent < 0.5

    asyncio.run(scenario())


def test_batch_size_one_dispatches_each_delivery_at_once(batch_worker):
    started: list[str] = []

    async def handle(message):
        started.append(message.message_id)
        await message.ack()

    async def scenario():
        worker = batch_worker(1, 10_000, 2, handle)
        await worker._on_message(Delivery([], "a"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert started == ["a"] and not worker._assemblers
        await _drain(worker)

    asyncio.run(scenario())


def test_a_batch_that_fills_before_its_timer_runs_leaves_no_failed_task(batch_worker):
    # The timer task of a batch is spawned when the batch opens; when the batch fills before the task first runs,
    # the task must simply find nothing due (it once read the gone batch's deadline and died with a TypeError).
    spawned: list[asyncio.Task] = []

    async def handle(message):
        await message.ack()

    async def scenario():
        worker = batch_worker(2, 1000, 4, handle)
        spawn = worker._spawn

        def keep(coroutine):
            spawn(coroutine)
            spawned.extend(t for t in worker.tasks if t not in spawned)
        worker._spawn = keep
        await worker._on_message(Delivery([], "one"))
        await worker._on_message(Delivery([], "two"))  # full: dispatched before the timer task has run
        await _drain(worker)

    asyncio.run(scenario())
    assert len(spawned) == 2
    assert [t.exception() for t in spawned] == [None, None]
