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
        assert [name for name, _ in pool.calls] == ["db_now", "expire_leases"]  # a probe first, then recovery
        params = pool.calls[1][1]
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
        assert await sweeper._expire_leases() == 0 and [name for name, _ in pool.calls] == ["db_now", "db_now"]
        sweeper._grace_until = asyncio.get_running_loop().time() - 0.01  # the grace is over
        await sweeper._expire_leases()
        assert [name for name, _ in pool.calls] == ["db_now", "db_now", "db_now", "expire_leases"]

    asyncio.run(scenario())


def test_an_outage_the_pool_waited_out_still_gives_cut_off_workers_their_grace(monkeypatch):
    # A connection pool that waits for the database raises nothing: the sweep that was waiting simply goes on
    # when the cut heals. Its first call must see that it had no answer for longer than an interval plus a
    # renew period, and recover nothing yet (it once recovered every lease the cut let lapse, at once).
    async def scenario():
        settings = Settings(lease_seconds=4.0, lease_renew_seconds=1.0, sweep_interval_seconds=1.0)
        monkeypatch.setattr(sweeper_module.ObjectStore, "from_settings", classmethod(lambda cls, *a, **k: None))
        sweeper = sweeper_module.Sweeper(settings)
        sweeper.db = pool = FakePool()
        await sweeper._expire_leases()
        assert [name for name, _ in pool.calls] == ["db_now", "expire_leases"]
        loop = asyncio.get_running_loop()
        sweeper._last_contact = loop.time() - 1.5  # an ordinary interval: recovery goes on
        pool.calls = []
        await sweeper._expire_leases()
        assert [name for name, _ in pool.calls] == ["db_now", "expire_leases"]
        sweeper._last_contact = loop.time() - 6.0  # 6 s without an answer, and no error seen
        pool.calls = []
        assert await sweeper._expire_leases() == 0
        assert [name for name, _ in pool.calls] == ["db_now"]
        assert 7.5 < sweeper._grace_until - loop.time() <= 8.0

    asyncio.run(scenario())


def test_a_version_queue_that_does_not_exist_keeps_the_broker_connection():
    """Issue 23 defect 6: the passive declare of a queue nobody declared (a pipeline version without workers)
    closes that channel only; the sweeper keeps its connection instead of reconnecting on every sweep."""
    import aio_pika

    class Channel:
        is_closed = True  # the broker closed it with the 404

        async def declare_queue(self, name, passive):
            raise aio_pika.exceptions.ChannelNotFoundEntity(404, f"NOT_FOUND - no queue '{name}'")

    class Connection:
        is_closed = False
        closed = 0

        async def channel(self):
            return Channel()

        async def close(self):
            Connection.closed += 1

    sweeper = sweeper_module.Sweeper.__new__(sweeper_module.Sweeper)
    connection = sweeper._amqp = Connection()
    assert asyncio.run(sweeper._work_queue_ready("attachments.jobs.process.v7")) is None
    assert sweeper._amqp is connection and Connection.closed == 0
