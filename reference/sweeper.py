"""Sweeper (level 4): recovers stuck work and cleans staging.

Every SWEEP_INTERVAL_SECONDS:

1. processing jobs whose lease expired (worker died or paused) → queued as a
   new attempt with a new outbox row, so the relay republishes (or failed when
   the attempt budget is spent);
2. queued jobs with no message in flight for STALE_QUEUED_SECONDS get a new
   outbox row (safety net for a message lost at the broker);
3. failed jobs older than FAILED_RETENTION_SECONDS release their original;
4. staging objects older than STAGING_RETENTION_SECONDS are deleted when no
   attachment records them (upload died after staging: never accepted) or
   when their attachment released them. Objects of live work are never
   touched: the API refuses to record an upload whose staging object is older
   than half the retention.
5. idempotency keys and published outbox rows past their retention are pruned.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone

from reference import metrics
from reference.db.pool import open_pool
from reference.db.queries import queries
from reference.keys import STAGING_PREFIX
from reference.runtime import sleep_or_stop
from reference.storage import ObjectStore

log = logging.getLogger("reference.sweeper")
BATCH = 500
PRUNE_EVERY_SECONDS = 300.0


class Sweeper:
    def __init__(self, settings):
        self.settings = settings
        self.store = ObjectStore.from_settings(settings)
        self.db = None
        self._last_prune = float("-inf")
        self._last_staging_sweep = float("-inf")
        # Listing staging/ costs O(objects): at most every minute, more often only
        # when the retention itself is short (tests, the fault harness).
        self.staging_sweep_every = max(settings.sweep_interval_seconds,
                                       min(60.0, settings.staging_retention_seconds / 4))

    async def run(self, stop: asyncio.Event) -> None:
        self.db = await open_pool(self.settings, "reference-sweeper", min_size=1, max_size=2)
        try:
            while not stop.is_set():
                try:
                    await self.sweep_once()
                except Exception as exc:
                    log.warning("sweep failed (%s: %s); next sweep in %.1fs", type(exc).__name__, exc,
                                self.settings.sweep_interval_seconds)
                await sleep_or_stop(stop, self.settings.sweep_interval_seconds)
        finally:
            await self.db.close(timeout=2)

    async def sweep_once(self) -> dict[str, int]:
        counts = {
            "leases_expired": await self._repeat(queries().expire_leases, {
                "batch": BATCH, "max_attempts": self.settings.max_attempts}),
            "queued_republished": await self._repeat(queries().republish_stale_queued, {
                "batch": BATCH, "stale_seconds": self.settings.stale_queued_seconds}),
            "originals_released": await self._repeat(queries().release_failed_originals, {
                "batch": BATCH, "retention_seconds": self.settings.failed_retention_seconds}),
        }
        loop_time = asyncio.get_running_loop().time()
        if loop_time - self._last_staging_sweep >= self.staging_sweep_every:
            self._last_staging_sweep = loop_time
            counts["staging_deleted"] = await self.sweep_staging()
        if loop_time - self._last_prune >= min(PRUNE_EVERY_SECONDS, self.settings.sweep_interval_seconds * 30):
            self._last_prune = loop_time
            async with self.db.connection() as conn:
                await conn.execute(queries().prune_idempotency_keys,
                                   {"ttl_seconds": self.settings.idempotency_ttl_seconds})
                await conn.execute(queries().prune_outbox,
                                   {"retention_seconds": self.settings.outbox_retention_seconds})
        for action, count in counts.items():
            if count:
                metrics.SWEEPS.labels(action).inc(count)
                log.info("sweep: %s %d", action, count)
        return counts

    async def _repeat(self, sql: str, params: dict) -> int:
        total = 0
        while True:
            async with self.db.connection() as conn:
                cursor = await conn.execute(sql, params)
                rows = await cursor.fetchall()
            total += len(rows)
            if len(rows) < params["batch"]:
                return total

    async def sweep_staging(self) -> int:
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=self.settings.staging_retention_seconds)
        candidates = await asyncio.to_thread(
            lambda: [obj.key for obj in self.store.list_prefix(STAGING_PREFIX) if obj.last_modified < cutoff])
        deleted = 0
        for start in range(0, len(candidates), BATCH):
            keys = candidates[start:start + BATCH]
            async with self.db.connection() as conn:
                cursor = await conn.execute(queries().staging_owners, {"keys": keys})
                owners = {row["original_key"]: row["released"] for row in await cursor.fetchall()}
            for key in keys:
                if key in owners and not owners[key]:
                    continue  # live or kept original of a recorded attachment
                await asyncio.to_thread(self.store.delete, key)
                deleted += 1
                log.info("deleted staging object %s (%s)", key, "released" if key in owners else "never recorded")
        return deleted
