"""Operator actions on one attachment: replay (POST /v1/admin/attachments/{id}/replay) and reprocessing for
another pipeline version (POST /v1/admin/attachments/{id}/reprocess, level 5)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from reference.api.deps import OperatorDep, PoolDep, SettingsDep
from reference.api.errors import ApiError
from reference.api.models import ReplayAccepted, ReplayRequest, ReprocessAccepted, ReprocessRequest
from reference.api.routes.common import ERRORS, parse_id
from reference.replay import ReplayRefused, replay
from reference.reprocess import ReprocessRefused, reprocess

router = APIRouter()


@router.post("/v1/admin/attachments/{attachment_id}/replay", status_code=202, response_model=ReplayAccepted,
             responses=ERRORS, summary="Operator replay of a failed attachment")
async def replay_attachment(attachment_id: str, body: ReplayRequest, operator: OperatorDep,
                            settings: SettingsDep, pool: PoolDep, request: Request) -> dict[str, Any]:
    parsed = parse_id(attachment_id)
    try:  # one job: the version named, else the one the attachment's status shows (issue 23 defect 5)
        async with pool.connection() as conn:
            done = await replay(conn, parsed, reason=body.reason, operator=operator,
                                ttl_seconds=settings.job_ttl_seconds, max_attempts=settings.max_attempts,
                                max_replays=settings.effective_max_replays,
                                pipeline_version=body.pipeline_version,
                                max_version=settings.served_pipeline_version_max,
                                client=request.client.host if request.client else None)
    except ReplayRefused as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
    return {"attachment_id": done.attachment_id, "job_id": done.job_id, "attempt": done.attempt}


@router.post("/v1/admin/attachments/{attachment_id}/reprocess", status_code=202, response_model=ReprocessAccepted,
             responses={**ERRORS, 200: {"model": ReprocessAccepted,
                                        "description": "The version's job existed already: nothing written"}},
             summary="Operator reprocessing of an attachment for another pipeline version (level 5)")
async def reprocess_attachment(attachment_id: str, body: ReprocessRequest, operator: OperatorDep,
                               settings: SettingsDep, pool: PoolDep, response: Response) -> dict[str, Any]:
    parsed = parse_id(attachment_id)
    try:
        async with pool.connection() as conn:
            done = await reprocess(conn, parsed, pipeline_version=body.pipeline_version, reason=body.reason,
                                   operator=operator, variants=settings.variants,
                                   ttl_seconds=settings.job_ttl_seconds)
    except ReprocessRefused as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
    if not done.created:
        response.status_code = 200
    return {"attachment_id": done.attachment_id, "job_id": done.job_id, "pipeline_version": done.pipeline_version,
            "attempt": done.attempt, "state": done.state, "created": done.created}
