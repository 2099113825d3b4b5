"""Transitions read from the implementation's own database, for a service without ``GET …/events``: the adapter's
``[events] sql`` (docs/CONTRACT.md §9), run by the harness itself in a READ ONLY transaction with a statement
timeout, on the direct (never cut) link to the tenant's database. The rows become the contract's event objects
(``seq``, ``at``, ``from``, ``to``, ``attempt``, ``actor``, ``reason``; ``pipeline_version`` when present), in the
order the query returns them: ``seq`` is the row's position when the query returns none."""

from __future__ import annotations

import threading
from datetime import datetime

STATEMENT_TIMEOUT_MS = 5000
COLUMNS = ("seq", "at", "from", "to", "attempt", "actor", "reason", "pipeline_version")
REQUIRED = ("from", "to", "at")


class EventsQueryError(RuntimeError):
    pass


def _text(value):
    if isinstance(value, datetime):
        from .final_state import utc_text

        if value.tzinfo is None:  # a timestamp without zone: the contract's times are UTC
            return value.isoformat() + "Z"
        return utc_text(value)
    return value


def rows_to_events(names: list[str], rows: list[tuple]) -> list[dict]:
    """The query's rows as the contract's event objects (column names matched case-insensitively; extra columns
    ignored). EventsQueryError when a required column is missing."""
    lower = [str(n).lower() for n in names]
    missing = [c for c in REQUIRED if c not in lower]
    if missing:
        raise EventsQueryError(f"[events] sql returns no column {', '.join(missing)} (it returns {', '.join(names)}; "
                               "name them with AS \"from\", AS \"to\", AS at)")
    out = []
    for position, row in enumerate(rows, start=1):
        record = dict(zip(lower, row))
        event = {c: _text(record[c]) for c in COLUMNS if c in record}
        event.setdefault("seq", position)
        for key in ("attempt", "seq", "pipeline_version"):
            if isinstance(event.get(key), (int, float)) or event.get(key) is None:
                continue
            try:
                event[key] = int(event[key])
            except (TypeError, ValueError):
                pass
        out.append(event)
    return out


def with_credentials_of(direct_url: str, roles_url: str) -> str:
    """``direct_url`` (host, port, database) with the user and password of ``roles_url``."""
    from urllib.parse import urlsplit, urlunsplit

    direct, roles = urlsplit(direct_url), urlsplit(roles_url)
    host = direct.netloc.rsplit("@", 1)[-1]
    credentials = roles.netloc.rsplit("@", 1)[0] if "@" in roles.netloc else ""
    return urlunsplit(direct._replace(netloc=f"{credentials}@{host}" if credentials else host))


class SqlEvents:
    """One connection (opened on first use, reopened after an error), shared by the observer's threads under a lock."""

    def __init__(self, database_url: str, sql: str, timeout_ms: int = STATEMENT_TIMEOUT_MS):
        self.database_url = database_url
        self.sql = sql
        self.timeout_ms = int(timeout_ms)
        self._conn = None
        self._lock = threading.Lock()

    def _connect(self):
        import psycopg

        conn = psycopg.connect(self.database_url, connect_timeout=5, autocommit=False,
                               options=f"-c statement_timeout={self.timeout_ms} -c default_transaction_read_only=on")
        conn.read_only = True
        return conn

    def read(self, attachment_id: str) -> list[dict]:
        """The attachment's events; raises (psycopg's errors, EventsQueryError) when they cannot be read."""
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                with self._conn.transaction():
                    with self._conn.cursor() as cursor:
                        cursor.execute(f"SET LOCAL statement_timeout = {self.timeout_ms}")
                        cursor.execute(self.sql, {"attachment_id": str(attachment_id)})
                        names = [d.name for d in cursor.description or []]
                        rows = cursor.fetchall()
            except EventsQueryError:
                raise
            except Exception:
                self.close_locked()
                raise
        return rows_to_events(names, rows)

    def close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()
