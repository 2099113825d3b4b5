"""Operator reprocessing for another pipeline version (level 5, docs/CONTRACT.md): a new job for
(attachment_id, pipeline_version) with an audit row (who, when, why), its event and outbox row, in one statement.
Idempotent: asking again for a version that has a job returns that job and writes nothing. Shared by the CLI
(`reference reprocess`) and the admin endpoint (`POST /v1/admin/attachments/{id}/reprocess`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reference.db.queries import queries
from reference.replay import OperatorRefused

if TYPE_CHECKING:
    from reference.db.pool import Connection


class ReprocessRefused(OperatorRefused):
    pass


@dataclass(frozen=True)
class Reprocessed:
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    pipeline_version: int
    attempt: int
    state: str
    created: bool  # False: the version's job existed already (idempotent repeat, nothing written)


async def reprocess(conn: Connection, attachment_id: uuid.UUID, *, pipeline_version: int, reason: str, operator: str,
                    variants: tuple[str, ...], ttl_seconds: float) -> Reprocessed:
    """Every outcome, refused ones too, leaves an ``operator_audit`` row (issue 23 defect 11)."""
    from reference import operators

    audit: dict[str, Any] = {"operator": operator.strip() or "unknown", "action": "reprocess", "attachment_id": attachment_id,
             "reason": reason.strip()[:1000] or None}
    try:
        done = await _reprocess(conn, attachment_id, pipeline_version=pipeline_version, reason=reason,
                                operator=operator, variants=variants, ttl_seconds=ttl_seconds)
    except ReprocessRefused as exc:
        await operators.audit(conn, **audit, outcome=exc.code, status=exc.status, detail=exc.message)
        raise
    await operators.audit(conn, **audit, job_id=done.job_id, outcome="created" if done.created else "exists",
                          status=202 if done.created else 200,
                          detail=f"pipeline version {done.pipeline_version}: job {done.state}")
    return done


async def _reprocess(conn: Connection, attachment_id: uuid.UUID, *, pipeline_version: int, reason: str, operator: str,
                    variants: tuple[str, ...], ttl_seconds: float) -> Reprocessed:
    reason, operator = reason.strip(), operator.strip()
    if not reason:
        raise ReprocessRefused(400, "reason_required", "reprocessing needs a reason")
    if not operator:
        raise ReprocessRefused(400, "operator_required", "reprocessing needs an operator name")
    if not 1 <= int(pipeline_version) <= 1000:
        raise ReprocessRefused(400, "bad_pipeline_version", "pipeline_version must be 1..1000")
    cursor = await conn.execute(queries().reprocess_job, {
        "attachment_id": attachment_id, "job_id": uuid.uuid4(), "pipeline_version": int(pipeline_version),
        "variants": list(variants), "ttl_seconds": ttl_seconds, "reason": reason[:1000], "operator": operator[:200],
    })
    row = await cursor.fetchone()
    if row is not None:
        return Reprocessed(row["attachment_id"], row["job_id"], row["pipeline_version"], row["attempt"], "queued",
                           True)
    cursor = await conn.execute(queries().version_job, {"attachment_id": attachment_id,
                                                        "pipeline_version": int(pipeline_version)})
    existing = await cursor.fetchone()
    if existing is not None:
        return Reprocessed(existing["attachment_id"], existing["job_id"], existing["pipeline_version"],
                           existing["attempt"], existing["state"], False)
    cursor = await conn.execute(queries().get_attachment, {"attachment_id": attachment_id, "max_version": None})
    if await cursor.fetchone() is None:
        raise ReprocessRefused(404, "not_found", "unknown attachment")
    raise ReprocessRefused(409, "original_released", "the original was released; nothing to reprocess from")
