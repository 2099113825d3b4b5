"""Async connection pools. Connections are autocommit: every state change is
one statement (see sql/queries.sql); explicit transactions use conn.transaction()."""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool


def connection_kwargs(settings, application_name: str) -> dict:
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


async def open_pool(settings, application_name: str, *, min_size: int = 1, max_size: int = 10,
                    wait: bool = False) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        settings.psycopg_conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs=connection_kwargs(settings, application_name),
        timeout=max(1.0, settings.db_connect_timeout_seconds),
        check=AsyncConnectionPool.check_connection,
        open=False,
        name=application_name,
    )
    await pool.open(wait=wait, timeout=settings.db_connect_timeout_seconds)
    return pool


async def connect(settings, application_name: str) -> AsyncConnection:
    return await AsyncConnection.connect(settings.psycopg_conninfo, **connection_kwargs(settings, application_name))
