"""Issue 23 defect 8 (second part): a freshly started sweeper gets the outage grace too.

A sweeper that starts (a deploy, a restart after a crash) just after a database outage never saw the outage: its
first sweep recovered every lease the outage let lapse before the cut-off workers could renew them (each
recovery spends an attempt). Fixed: at its first contact with the database, a sweeper spares the leases that had
already lapsed by then for LEASE_OUTAGE_GRACE leases (their workers revive them: renew_lease revives a lapsed
lease nobody recovered); a lease that lapses after its start is recovered as usual, at once."""

from __future__ import annotations

import asyncio
import contextlib

from reference import sweeper as sweeper_module
from reference.db.queries import queries
from reference.settings import Settings

NAMES = {getattr(queries(), name): name for name in queries().names()}


class FakePool:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    @contextlib.asynccontextmanager
    async def connection(self):
        pool = self

        class Cursor:
            async def fetchall(self):
                return []

        class Conn:
            async def execute(self, sql, params=None):
                pool.calls.append((NAMES.get(sql, sql), dict(params or {})))
                return Cursor()

        yield Conn()


def test_a_fresh_sweeper_spares_leases_that_lapsed_before_it_started(monkeypatch):
    async def scenario():
        settings = Settings(lease_seconds=4.0, lease_renew_seconds=1.0, sweep_interval_seconds=1.0)
        monkeypatch.setattr(sweeper_module.ObjectStore, "from_settings", classmethod(lambda cls, *a, **k: None))
        sweeper = sweeper_module.Sweeper(settings)
        sweeper.db = pool = FakePool()
        loop = asyncio.get_running_loop()

        await sweeper._expire_leases()  # the first contact
        recoveries = [params for name, params in pool.calls if name == "expire_leases"]
        assert recoveries, pool.calls  # leases lapsing from now on are recovered at once
        spared = recoveries[-1].get("spare_lapsed_seconds_ago")
        # Every lease that had lapsed at the first contact is spared: only leases that lapsed after it (0 s ago,
        # within this sweep) may be recovered.
        assert spared is not None and 0 <= spared < 0.5, recoveries[-1]
        assert 7.5 < sweeper._start_grace_until - loop.time() <= 8.0  # two leases

        sweeper._started_contact = loop.time() - 3.0  # three seconds later, still within the grace
        pool.calls = []
        await sweeper._expire_leases()
        (params,) = [params for name, params in pool.calls if name == "expire_leases"]
        assert 2.9 < params["spare_lapsed_seconds_ago"] < 3.5

        sweeper._start_grace_until = loop.time() - 0.01  # the grace is over: every lapsed lease is recovered
        pool.calls = []
        await sweeper._expire_leases()
        (params,) = [params for name, params in pool.calls if name == "expire_leases"]
        assert params["spare_lapsed_seconds_ago"] is None

    asyncio.run(scenario())
