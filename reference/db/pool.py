"""Async connection pools. Connections are autocommit: every state change is
one statement (see sql/queries.sql); explicit transactions use conn.transaction()."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

if TYPE_CHECKING:
    from reference.settings import Settings

# Every connection of the reference returns rows as dicts (dict_row): the types say so.
Connection: TypeAlias = AsyncConnection[DictRow]
Pool: TypeAlias = AsyncConnectionPool[AsyncConnection[DictRow]]


def connection_kwargs(settings: Settings, application_name: str) -> dict[str, Any]:
    statement_ms = int(settings.db_statement_timeout_seconds * 1000)
    return {
        "autocommit": True,
        "row_factory": dict_row,
        "connect_timeout": max(1, int(round(settings.db_connect_timeout_seconds))),
        "application_name": application_name[:63],
        "options": f"-c statement_timeout={statement_ms} -c idle_in_transaction_session_timeout={statement_ms * 4}",
        # TCP keepalives: a connection cut by a network fault is noticed.
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


async def open_pool(settings: Settings, application_name: str, *, min_size: int = 1, max_size: int = 10,
                    wait: bool = False) -> Pool:
    async def check(conn: Connection) -> None:
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception:
            # One dead connection means the server most likely ended them all (a restart, a failover, sessions
            # terminated). Left alone, the pool would meet the others one by one, waiting 0, 1, then 2 s between
            # them, and a request would time out (503) with the database up again. Check every idle one now: the
            # dead are replaced at once, and this request is served by a fresh connection.
            await pool.check()
            raise

    pool: Pool = AsyncConnectionPool(
        settings.psycopg_conninfo,
        connection_class=AsyncConnection[DictRow],
        min_size=min_size,
        max_size=max_size,
        kwargs=connection_kwargs(settings, application_name),
        timeout=max(1.0, settings.db_connect_timeout_seconds),
        check=check,
        open=False,
        name=application_name,
    )
    await pool.open(wait=wait, timeout=settings.db_connect_timeout_seconds)
    return pool


async def connect(settings: Settings, application_name: str) -> Connection:
    kwargs = connection_kwargs(settings, application_name)
    del kwargs["row_factory"]  # named below, so that the connection's type says its rows are dicts
    return await AsyncConnection.connect(settings.psycopg_conninfo, row_factory=dict_row, **kwargs)
