"""Broken on purpose: staging cleanup by age alone.

The reference removes a staged original only when no record was ever
committed for it (its staging row is still there after the retention). This
variant does what a quick cron job does: list ``staging/`` and delete every
object older than the retention — including the originals of accepted
uploads, queued, processing or ready.

Everything else is the reference.
"""

import asyncio
import logging
import sys
from datetime import datetime, timedelta, timezone

from reference import sweeper as sweeper_mod
from reference.cli import main
from reference.keys import STAGING_PREFIX

log = logging.getLogger("reference.sweeper")


async def _sweep_staging_by_age(self) -> int:
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=self.settings.staging_retention_seconds)
    listed = await asyncio.to_thread(lambda: list(self.store.list_prefix(STAGING_PREFIX)))
    old = [o.key for o in listed if o.last_modified < cutoff]  # THE BUG: old is not the same as unreferenced
    for key in old:
        await asyncio.to_thread(self.store.delete, key)
        log.info("deleted staging object %s (older than the retention)", key)
    return len(old)


sweeper_mod.Sweeper.sweep_staging = _sweep_staging_by_age

if __name__ == "__main__":
    sys.exit(main())
