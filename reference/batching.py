"""Batch assembly of the worker's batch consumer mode (BE-JOB-007), kept pure: no broker, no clock of its own.

A batch is only a dispatch unit. Every item of it is still claimed (lease + fencing token), rendered, committed by
its own fenced statement and acknowledged on its own — never with ``multiple=true``, never by another item's
outcome — so a poison or failing item is retried or dead-lettered like a single delivery (BE-JOB-003) while its
neighbours commit and ack as soon as they are done. What a batch changes is WHEN deliveries start: together.

A batch is dispatched as soon as one of these holds:

* it holds ``size`` deliveries;
* nothing more can arrive: its deliveries plus those already dispatched and not finished fill the prefetch
  window (``capacity``) — the broker hands out no more until one is settled, so waiting would only add latency;
* ``wait_seconds`` passed since its first delivery (the caller's timer asks :meth:`due`).
"""

from __future__ import annotations

from typing import Any


class BatchAssembler:
    def __init__(self, size: int, wait_seconds: float, capacity: int):
        if size < 1:
            raise ValueError("a batch holds at least one delivery")
        if capacity < size:
            raise ValueError(f"the prefetch window ({capacity}) must hold a whole batch ({size})")
        self.size, self.wait_seconds, self.capacity = size, max(0.0, wait_seconds), capacity
        self.items: list[Any] = []
        self.opened_at: float | None = None
        self.generation = 0  # bumped by every take: a timer armed for an earlier batch does not flush a later one

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Any, now: float, in_flight: int = 0) -> list[Any] | None:
        """Add one delivery; the batch to dispatch now (and the assembler starts a new one), or None to wait."""
        if not self.items:
            self.opened_at = now
        self.items.append(item)
        return self.take() if self.full(in_flight) else None

    def full(self, in_flight: int = 0) -> bool:
        return len(self.items) >= self.size or len(self.items) + max(0, in_flight) >= self.capacity

    def deadline(self) -> float | None:
        return None if self.opened_at is None else self.opened_at + self.wait_seconds

    def due(self, now: float, generation: int | None = None) -> bool:
        """Whether the open batch has waited long enough (and, with ``generation``, is still the one the timer
        was armed for)."""
        if not self.items or (generation is not None and generation != self.generation):
            return False
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def take(self) -> list[Any]:
        items, self.items, self.opened_at = self.items, [], None
        self.generation += 1
        return items
