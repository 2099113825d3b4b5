"""Operator replay (level 4): failed -> queued with an audit row, a new attempt,
the same job_id and effect keys. Shared by the CLI and the admin endpoint."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from reference.db.queries import queries
from reference.metrics import REPLAYS


class OperatorRefused(Exception):
    """An operator operation refused: the HTTP status, a stable error code and a message (CLI and admin API)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class ReplayRefused(OperatorRefused):
    pass


@dataclass(frozen=True)
class Replayed:
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    attempt: int


async def replay(conn, attachment_id: uuid.UUID, *, reason: str, operator: str, ttl_seconds: float) -> Replayed:
    reason, operator = reason.strip(), operator.strip()
    if not reason:
        raise ReplayRefused(400, "reason_required", "a replay needs a reason")
    if not operator:
        raise ReplayRefused(400, "operator_required", "a replay needs an operator name")
    cursor = await conn.execute(queries().replay_job, {
        "attachment_id": attachment_id, "reason": reason[:1000], "operator": operator[:200],
        "ttl_seconds": ttl_seconds,
    })
    row = await cursor.fetchone()
    if row is not None:
        REPLAYS.labels("accepted").inc()
        return Replayed(row["attachment_id"], row["job_id"], row["attempt"])
    cursor = await conn.execute(queries().get_attachment, {"attachment_id": attachment_id, "max_version": None})
    current = await cursor.fetchone()
    REPLAYS.labels("refused").inc()
    if current is None:
        raise ReplayRefused(404, "not_found", "unknown attachment")
    if current["state"] == "failed":
        raise ReplayRefused(409, "original_released", "the original was released after the failed retention")
    raise ReplayRefused(409, "not_failed", f"only failed attachments can be replayed (state is {current['state']})")
