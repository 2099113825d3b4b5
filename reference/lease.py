"""Lease ownership of a claimed job (DESIGN §7: 30 s, renewed every 10 s).

The database holds the lease (``lease_expires_at``) and the fencing token;
this class keeps a conservative local deadline so the worker stops starting
new effects as soon as it can no longer prove ownership, even while the
database is unreachable. The fenced commit in the database stays the
authority: a local "live" is necessary, never sufficient.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from reference.metrics import LEASE_RENEWALS

log = logging.getLogger("reference.lease")


class LeaseLost(Exception):
    """The lease expired or was taken over; the job must not be committed or acked."""


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
        self._task: asyncio.Task | None = None

    def live(self) -> bool:
        return self.lost_reason is None and self._clock() < self.deadline - self.safety_margin

    def ensure_live(self) -> None:
        if self.lost_reason is not None:
            raise LeaseLost(self.lost_reason)
        if self._clock() >= self.deadline - self.safety_margin:
            self.lost_reason = "lease deadline passed"
            raise LeaseLost(self.lost_reason)

    def start(self) -> "Lease":
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
        while self.lost_reason is None:
            await asyncio.sleep(self.renew_seconds)
            started = self._clock()
            if started >= self.deadline:
                self.lost_reason = "lease deadline passed"
                LEASE_RENEWALS.labels("expired").inc()
                return
            try:
                renewed = await asyncio.wait_for(self._renew(), timeout=max(0.1, self.deadline - started))
            except Exception as exc:  # database unreachable: keep trying until the deadline
                LEASE_RENEWALS.labels("error").inc()
                log.warning("lease renewal failed: %s", type(exc).__name__)
                continue
            if not renewed:
                self.lost_reason = "lease taken over (fencing token or state changed)"
                LEASE_RENEWALS.labels("lost").inc()
                return
            LEASE_RENEWALS.labels("ok").inc()
            self.deadline = started + self.lease_seconds
