"""Sweeper lease recovery after its own database outage (issue 10, defect 4): cut-off workers get a grace to
revive their lapsed leases before the sweeper recovers them; lease-expiry retries carry backoff parameters."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg

from reference import sweeper as sweeper_module
from reference.db.queries import queries
from reference.settings import Settings

NAMES = {getattr(queries(), name): name for name in queries().names()}


class FakePool:
    def __init__(self):
        self.down = False
        self.calls: list[tuple[str, dict]] = []

    @contextlib.asynccontextmanager
    async def connection(self):
        if self.down:
            raise psycopg.OperationalError("connection refused")
        pool = self

        class Cursor:
            async def fetchall(self):
                return []

        class Conn:
            async def execute(self, sql, params=None):
                pool.calls.append((NAMES.get(sql, sql), params or {}))
                return Cursor()

        yield Conn()


def test_lease_recovery_waits_after_an_outage_of_its_own_then_recovers_with_backoff(monkeypatch):
    async def scenario():
        settings = Settings(lease_seconds=4.0, lease_renew_seconds=1.0, retry_base_seconds=0.2,
                            retry_cap_seconds=2.0, max_attempts=5)
        monkeypatch.setattr(sweeper_module.ObjectStore, "from_settings", classmethod(lambda cls, *a, **k: None))
        sweeper = sweeper_module.Sweeper(settings)
        sweeper.db = pool = FakePool()
        assert await sweeper._expire_leases() == 0
        assert [name for name, _ in pool.calls] == ["expire_leases"]
        params = pool.calls[0][1]
        assert (params["retry_base_seconds"], params["retry_cap_seconds"], params["max_attempts"]) == (0.2, 2.0, 5)

        pool.down = True
        try:
            await sweeper._expire_leases()
            raise AssertionError("expected the outage to propagate")
        except psycopg.OperationalError:
            pass
        pool.down, pool.calls = False, []
        assert await sweeper._expire_leases() == 0  # back: a grace of two leases, no recovery yet
        assert [name for name, _ in pool.calls] == ["db_now"]
        grace = sweeper._grace_until - asyncio.get_running_loop().time()
        assert 7.5 < grace <= 8.0
        assert await sweeper._expire_leases() == 0 and [name for name, _ in pool.calls] == ["db_now"]
        sweeper._grace_until = asyncio.get_running_loop().time() - 0.01  # the grace is over
        await sweeper._expire_leases()
        assert [name for name, _ in pool.calls] == ["db_now", "expire_leases"]

    asyncio.run(scenario())
