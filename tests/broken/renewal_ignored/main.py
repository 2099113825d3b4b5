"""Broken on purpose: a lease renewal that fails is taken as renewed.

The reference renews its lease every LEASE_RENEW_SECONDS; when a renewal cannot reach the database its local
deadline is left alone, so once the lease runs out the worker starts no new effect until a renewal gets through
(and a refused one loses the job). This variant swallows the renewal's error the way a careless "best effort"
heartbeat does: an error counts as a renewal, the local deadline moves on, and the worker keeps writing the job's
variants to S3 while it holds no lease any more — after the sweeper has already handed the job to someone else.

Everything else is the reference: a refused renewal (the database answered "not yours") still loses the lease,
and the database still fences the stale commit.
"""

import asyncio
import logging
import sys

from reference import lease as lease_mod
from reference.cli import main

log = logging.getLogger("reference.lease")


async def _renew_loop_ignoring_errors(self) -> None:
    while self.lost_reason is None:
        await asyncio.sleep(self.renew_seconds)
        started = self._clock()
        try:
            renewed = await asyncio.wait_for(self._renew(), timeout=self.renew_seconds)
        except Exception as exc:  # THE BUG: the database did not answer, and the lease is taken as renewed
            log.warning("lease renewal failed (%s); carrying on as renewed", type(exc).__name__)
            self.deadline = started + self.lease_seconds
            self._event().set()
            continue
        if not renewed:
            self.lost_reason = "lease taken over (fencing token or state changed)"
            self._event().set()
            return
        self.deadline = started + self.lease_seconds
        self._event().set()


lease_mod.Lease._renew_loop = _renew_loop_ignoring_errors

if __name__ == "__main__":
    sys.exit(main())
