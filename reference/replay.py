"""Operator replay (level 4): failed -> queued of one job with an audit row, a new attempt, the same job_id and
effect keys; every outcome, refused ones too, in ``operator_audit``. Shared by the CLI, the admin endpoint and the
dead-letter replay (reference/dlq.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from reference.db.queries import queries
from reference.metrics import REPLAYS

if TYPE_CHECKING:
    from reference.db.pool import Connection


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


async def replay(conn: Connection, attachment_id: uuid.UUID | None, *, reason: str, operator: str, ttl_seconds: float,
                 max_attempts: int, max_replays: int, job_id: uuid.UUID | None = None,
                 pipeline_version: int | None = None, max_version: int | None = None, action: str = "replay",
                 client: str | None = None) -> Replayed:
    """failed → queued of ONE job (issue 23 defect 5): ``job_id`` when given, else the attachment's job of
    ``pipeline_version``, else the job the attachment's status shows (the served one under ``max_version``).
    Every outcome, accepted or refused, leaves an ``operator_audit`` row (defect 11); a replay whose new round of
    ``max_attempts`` could pass the message schema's attempt maximum, or one past ``max_replays``, is refused
    (409 replay_limit)."""
    from reference.settings import SCHEMA_ATTEMPT_MAX

    reason, operator = reason.strip(), operator.strip()
    if not operator:
        raise ReplayRefused(400, "operator_required", "a replay needs an operator name")
    audit: dict[str, Any] = {"operator": operator[:200], "action": action, "attachment_id": attachment_id, "job_id": job_id,
             "reason": reason[:1000] or None, "client": client}

    async def refuse(status: int, code: str, message: str) -> NoReturn:
        REPLAYS.labels("refused").inc()
        await conn.execute(queries().operator_audit, {**audit, "outcome": code, "status": status, "detail": message})
        raise ReplayRefused(status, code, message)

    if not reason:
        await refuse(400, "reason_required", "a replay needs a reason")
    if attachment_id is None and job_id is not None:
        found = await (await conn.execute("SELECT attachment_id FROM jobs WHERE job_id = %s", (job_id,))).fetchone()
        attachment_id = audit["attachment_id"] = found["attachment_id"] if found else None
    target = None
    if attachment_id is not None:
        target = await (await conn.execute(queries().replay_target, {
            "attachment_id": attachment_id, "job_id": job_id, "pipeline_version": pipeline_version,
            "max_version": max_version})).fetchone()
    if target is None:
        if pipeline_version is not None and attachment_id is not None:
            await refuse(404, "not_found", f"the attachment has no job for pipeline version {pipeline_version}")
        await refuse(404, "not_found", "unknown attachment" if job_id is None else "unknown job")
    audit["job_id"] = target["job_id"]
    cursor = await conn.execute(queries().replay_job, {
        "job_id": target["job_id"], "reason": reason[:1000], "operator": operator[:200],
        "ttl_seconds": ttl_seconds, "max_attempts": max_attempts, "attempt_max": SCHEMA_ATTEMPT_MAX,
        "max_replays": max_replays,
    })
    row = await cursor.fetchone()
    if row is not None:
        REPLAYS.labels("accepted").inc()
        await conn.execute(queries().operator_audit, {
            **audit, "outcome": "accepted", "status": 202,
            "detail": f"failed → queued, attempt {row['attempt'] - 1} → {row['attempt']} "
                      f"(pipeline version {target['pipeline_version']})"})
        return Replayed(row["attachment_id"], row["job_id"], row["attempt"])
    # Refused: read the job again (a concurrent replay may have moved it since the target was read).
    now = await (await conn.execute(queries().replay_target, {
        "attachment_id": attachment_id, "job_id": target["job_id"], "pipeline_version": None,
        "max_version": None})).fetchone()
    if now is None:
        await refuse(404, "not_found", "unknown job")
    if now["state"] == "failed" and now["original_released"]:
        await refuse(409, "original_released", "the original was released after the failed retention")
    if now["state"] == "failed":
        await refuse(409, "replay_limit",
                     f"the job was replayed MAX_REPLAYS ({max_replays}) times, or a new round of MAX_ATTEMPTS "
                     f"({max_attempts}) from attempt {now['attempt']} would pass the job message schema's attempt "
                     f"maximum ({SCHEMA_ATTEMPT_MAX})")
    await refuse(409, "not_failed", f"only failed jobs can be replayed (state is {now['state']})")
    raise AssertionError("unreachable")  # pragma: no cover
