"""Lease ownership of a claimed job (CONTRACT §8: 30 s, renewed every 10 s).

The database holds the lease (``lease_expires_at``) and the fencing token;
this class keeps a conservative local deadline so the worker stops starting
new effects as soon as it can no longer prove ownership, even while the
database is unreachable. The fenced commit in the database stays the
authority: a local "live" is necessary, never sufficient.

Two ways to lose sight of the lease, handled differently:

* **lapsed** — the local deadline passed because no renewal got through
  (the database was unreachable). Nobody has proven that the job left us: the
  renewal keeps trying, and a renewal that finds the job still ``processing``
  under our fencing token revives the lease (no one can have claimed it: a
  claim needs ``queued`` and increments the token; lease recovery moves it to
  ``queued`` under the same row lock). Effects wait (:meth:`wait_live`) while
  the lease is lapsed; they never run on a lapsed lease.
* **lost** — a renewal was refused (token or state changed): final.
  :class:`LeaseLost` is raised and the job is neither committed nor acked.

So a database outage longer than the lease costs the job nothing when the
lease recovery waited too (see the sweeper's grace after its own outage).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from reference.metrics import LEASE_RENEWALS

log = logging.getLogger("reference.lease")

# While lapsed, renew this often (seconds): the first call that reaches the database revives the lease.
LAPSED_RETRY_SECONDS = 0.25


class LeaseLost(Exception):
    """The lease expired or was taken over; the job must not be committed or acked."""


class LeaseLapsed(LeaseLost):
    """The local deadline passed without a refusal: ownership is in doubt, not lost (see :meth:`Lease.wait_live`)."""


class Lease:
    def __init__(self, *, lease_seconds: float, renew_seconds: float, claimed_at_monotonic: float,
                 renew: Callable[[], Awaitable[bool]], clock: Callable[[], float] = time.monotonic):
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        # Measured from before the claim was sent: never later than the DB's own deadline.
        self.deadline = claimed_at_monotonic + lease_seconds
        self.safety_margin = min(0.5, lease_seconds * 0.1)
        self._renew = renew
        self._clock = clock
        self.lost_reason: str | None = None
        self.lapses = 0
        self._task: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None

    def live(self) -> bool:
        return self.lost_reason is None and self._clock() < self.deadline - self.safety_margin

    def ensure_live(self) -> None:
        if self.lost_reason is not None:
            raise LeaseLost(self.lost_reason)
        if self._clock() >= self.deadline - self.safety_margin:
            raise LeaseLapsed("lease deadline passed")

    async def wait_live(self, stop: asyncio.Event | None = None, timeout: float | None = None) -> None:
        """Return once the lease is live; raise LeaseLost once it is lost (or on ``stop`` or ``timeout`` while it
        is still lapsed). A lapsed lease is revived by the renewal loop as soon as the database answers."""
        give_up = None if timeout is None else self._clock() + timeout
        while True:
            try:
                self.ensure_live()
                return
            except LeaseLapsed:
                if self._task is None or self._task.done():
                    raise
            if stop is not None and stop.is_set():
                raise LeaseLost("stopping while the lease was in doubt")
            if give_up is not None and self._clock() >= give_up:
                raise LeaseLost("lease still in doubt after waiting")
            event = self._event()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), LAPSED_RETRY_SECONDS)
            except asyncio.TimeoutError:
                pass

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def start(self) -> "Lease":
        self._event()
        self._task = asyncio.create_task(self._renew_loop())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _renew_loop(self) -> None:
        lapsed = False
        while self.lost_reason is None:
            await asyncio.sleep(LAPSED_RETRY_SECONDS if lapsed else self.renew_seconds)
            started = self._clock()
            if not lapsed and started >= self.deadline:
                lapsed = True
                self.lapses += 1
                LEASE_RENEWALS.labels("expired").inc()
                log.warning("lease lapsed without a renewal; renewing until the database answers")
            try:
                timeout = self.renew_seconds if lapsed else max(0.1, self.deadline - started)
                renewed = await asyncio.wait_for(self._renew(), timeout=timeout)
            except Exception as exc:  # database unreachable: keep trying (past the deadline: to revive it)
                LEASE_RENEWALS.labels("error").inc()
                log.warning("lease renewal failed: %s", type(exc).__name__)
                continue
            if not renewed:
                self.lost_reason = "lease taken over (fencing token or state changed)"
                LEASE_RENEWALS.labels("lost").inc()
                self._event().set()
                return
            LEASE_RENEWALS.labels("revived" if lapsed else "ok").inc()
            if lapsed:
                log.info("lease revived: the job was still ours")
            lapsed = False
            self.deadline = started + self.lease_seconds
            self._event().set()
