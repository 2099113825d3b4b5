"""Operators of the admin API (issue 23 defect 11): who they are, and how often a wrong token may be tried.

* Per-operator tokens: ``reference operator-token create NAME`` makes a random token, prints it once and stores only
  its SHA-256 in ``operator_tokens``; ``revoke NAME`` ends it; ``list`` shows names and dates, never a token. The
  admin API takes the identity from the token it was given (``api:NAME``); an ``X-Operator`` header is ignored.
* The bootstrap token: ``OPERATOR_TOKEN`` (empty: none) is accepted as the operator ``OPERATOR_TOKEN_NAME``
  (``bootstrap``), so a fresh installation — and the harness, which passes its adapter's ``[admin] operator_token``
  as ``OPERATOR_TOKEN`` — can use the admin API before any token is made. Leave it empty in production once the
  operators have their own.
* Failed attempts: a client (peer address) that presented ``OPERATOR_AUTH_MAX_FAILURES`` wrong tokens within
  ``OPERATOR_AUTH_WINDOW_SECONDS`` is answered 429 with ``Retry-After`` (the seconds until its oldest failure leaves
  the window) for every token, right or wrong, until then. A request without credentials (401) is not a guess and is
  not counted. The count is per API process (several processes each allow as many).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import math
import re
import secrets
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reference.db.pool import Connection
    from reference.settings import Settings

NAME = re.compile(r"^[A-Za-z0-9._@-]{1,100}$")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return "op_" + secrets.token_urlsafe(32)


def bootstrap_identity(token: str, settings: Settings) -> str | None:
    """The bootstrap token's operator name when ``token`` is OPERATOR_TOKEN (compared in constant time)."""
    expected = settings.operator_token
    if expected and hmac.compare_digest(token.encode("utf-8"), expected.encode("utf-8")):
        return str(settings.operator_token_name)
    return None


class FailureLimiter:
    """Wrong tokens per client within a sliding window; pure apart from the clock it is given."""

    def __init__(self, max_failures: int, window_seconds: float, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = 10_000):
        self.max_failures, self.window = max_failures, window_seconds
        self.clock, self.max_clients = clock, max_clients
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, client: str) -> collections.deque[float]:
        now = self.clock()
        failures = self._failures.get(client)
        if failures is None:
            return collections.deque()
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[client]
        return failures

    def retry_after(self, client: str) -> int | None:
        """Seconds the client must wait (None: it may try)."""
        failures = self._recent(client)
        if len(failures) < self.max_failures:
            return None
        return max(1, math.ceil(failures[0] + self.window - self.clock()))

    def failed(self, client: str) -> int:
        """Record one wrong token; returns the client's failures in the window."""
        if client not in self._failures and len(self._failures) >= self.max_clients:
            oldest = min(self._failures, key=lambda c: self._failures[c][-1] if self._failures[c] else 0)
            del self._failures[oldest]  # bounded memory: the client whose last failure is oldest goes
        failures = self._failures.setdefault(client, collections.deque())
        failures.append(self.clock())
        while len(failures) > self.max_failures:
            failures.popleft()
        return len(failures)


async def create(conn: Connection, name: str, created_by: str) -> dict[str, Any]:
    if not NAME.match(name or ""):
        raise ValueError("an operator name is 1-100 characters of letters, digits and . _ @ -")
    token = new_token()
    row = await (await conn.execute("INSERT INTO operator_tokens (name, token_sha256, created_by) "
                                    "VALUES (%s, %s, %s) RETURNING name, created_at",
                                    (name, token_hash(token), created_by))).fetchone()
    assert row is not None  # INSERT ... RETURNING
    await audit(conn, operator=created_by, action="token_create", outcome="created", status=0,
                detail=f"token for {name}")
    return {"operator": row["name"], "token": token, "created_at": row["created_at"].isoformat()}


async def revoke(conn: Connection, name: str, revoked_by: str) -> dict[str, Any]:
    rows = await (await conn.execute("UPDATE operator_tokens SET revoked_at = now() "
                                     "WHERE name = %s AND revoked_at IS NULL RETURNING id", (name,))).fetchall()
    await audit(conn, operator=revoked_by, action="token_revoke", outcome="revoked" if rows else "not_found",
                status=0, detail=f"token of {name}")
    return {"operator": name, "revoked": len(rows)}


async def listing(conn: Connection) -> list[dict[str, Any]]:
    rows = await (await conn.execute("SELECT name, created_at, created_by, revoked_at, last_used_at "
                                     "FROM operator_tokens ORDER BY name, created_at")).fetchall()
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()} for row in rows]


async def lookup(conn: Connection, token: str) -> str | None:
    """The live token's operator name (its last use recorded), or None."""
    row = await (await conn.execute("UPDATE operator_tokens SET last_used_at = now() "
                                    "WHERE token_sha256 = %s AND revoked_at IS NULL RETURNING name",
                                    (token_hash(token),))).fetchone()
    return str(row["name"]) if row else None


async def audit(conn: Connection, *, operator: str, action: str, outcome: str, status: int,
                attachment_id: uuid.UUID | str | None = None, job_id: uuid.UUID | str | None = None,
                detail: str | None = None, reason: str | None = None, client: str | None = None) -> None:
    await conn.execute(
        "INSERT INTO operator_audit (operator, action, attachment_id, job_id, outcome, status, detail, reason, client) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (operator[:200], action, attachment_id, job_id, outcome, status, detail, reason, client))
