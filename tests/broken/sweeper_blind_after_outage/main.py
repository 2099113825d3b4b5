"""Broken on purpose: after its own database outage, the sweeper never recovers an expired lease again.

The reference's sweeper, when a lease recovery could not reach the database, waits a short grace (two leases)
once the database answers again, so a worker that was cut off too can revive its own lease; then it recovers
expired leases as before. This variant makes the grace endless: once the database has not answered its lease
recovery (within OUTAGE_SECONDS), it never expires a lease again (staging cleanup, lost-message republishing and
everything else go on).

The bug needs TWO faults to show: an outage the sweeper sees (the database restarted, or its link cut), and a
worker that dies holding a job (a crash or a kill while it processes one) after it. An outage alone loses nothing
(every worker revives its own lease); a crash alone is recovered by the sweeper one lease later. Together, the dead
worker's job is left `processing` forever: accepted work lost. Restarting the sweeper heals it (memory only).

Everything else is the reference.
"""

import sys

from reference import sweeper as sweeper_mod
from reference.cli import main
from reference.db.queries import queries

_reference_expire_leases = sweeper_mod.Sweeper._expire_leases
OUTAGE_SECONDS = 0.5  # the database not answering the sweeper for this long is an outage to it


async def _expire_leases(self) -> int:
    if getattr(self, "_gave_up", False):
        return 0  # THE BUG: the post-outage grace never ends
    try:
        async with self.db.connection(timeout=OUTAGE_SECONDS) as conn:
            await conn.execute(queries().db_now)
    except Exception:
        self._gave_up = True  # an outage of its own: from now on, no lease is ever recovered
        raise
    return await _reference_expire_leases(self)


sweeper_mod.Sweeper._expire_leases = _expire_leases

if __name__ == "__main__":
    sys.exit(main())
