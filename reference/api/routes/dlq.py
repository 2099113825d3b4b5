"""The dead-letter queue, for operators: list (GET /v1/admin/dlq) and replay by key, job or filter
(POST /v1/admin/dlq/replay, POST /v1/admin/dlq/jobs/{job_id}/replay)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from reference import dlq

from reference.api.deps import OperatorDep, PoolDep, SettingsDep
from reference.api.errors import ApiError, ServiceUnavailable
from reference.api.models import DeadLetterList, DlqReplayRequest, DlqReplayResult, ReplayRequest
from reference.api.routes.common import ERRORS, parse_id
from reference.db.pool import Pool
from reference.settings import Settings

log = logging.getLogger("reference.api")
router = APIRouter()


@router.get("/v1/admin/dlq", response_model=DeadLetterList, responses=ERRORS,
            summary="Operator: the dead letters (read without loss: taken unacknowledged, all returned)")
async def list_dead_letters(operator: OperatorDep, settings: SettingsDep, limit: int = 100) -> dict[str, Any]:
    try:
        return await dlq.list_letters(settings, limit)
    except Exception as exc:
        raise ServiceUnavailable("broker_unavailable", f"the dead-letter queue could not be read "
                                 f"({type(exc).__name__})", settings.retry_after_seconds) from None


@router.post("/v1/admin/dlq/replay", response_model=DlqReplayResult, responses=ERRORS,
             summary="Operator: replay dead letters by key, job or filter; audited, idempotent")
async def replay_dead_letters(body: DlqReplayRequest, operator: OperatorDep, settings: SettingsDep,
                              pool: PoolDep, all: bool = False) -> dict[str, Any]:
    selector = dlq.Selector(message_keys=set(body.message_keys), job_ids={str(j) for j in body.job_ids},
                            dead_reason=body.dead_reason, older_than_seconds=body.older_than_seconds,
                            everything=body.all or all, limit=body.limit)
    return await _dlq_replay(selector, body.reason, operator, settings, pool)


@router.post("/v1/admin/dlq/jobs/{job_id}/replay", response_model=DlqReplayResult, responses=ERRORS,
             summary="Operator: replay the dead letters of one job; a second replay is a no-op that says so")
async def replay_dead_letters_of_job(job_id: str, body: ReplayRequest, operator: OperatorDep,
                                     settings: SettingsDep, pool: PoolDep) -> dict[str, Any]:
    parsed = parse_id(job_id)
    return await _dlq_replay(dlq.Selector(job_ids={str(parsed)}), body.reason, operator, settings, pool)


async def _dlq_replay(selector: dlq.Selector, reason: str, operator: str, settings: Settings,
                      pool: Pool) -> dict[str, Any]:
    try:
        return await dlq.replay_letters(settings, pool, selector, operator=operator, reason=reason,
                                        ttl_seconds=settings.job_ttl_seconds, max_attempts=settings.max_attempts,
                                        max_replays=settings.effective_max_replays)
    except dlq.DlqRefused as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
    except ApiError:
        raise
    except Exception as exc:
        log.warning("dead-letter replay failed: %s: %s", type(exc).__name__, exc)
        raise ServiceUnavailable("dlq_unavailable", f"the dead-letter replay could not finish "
                                 f"({type(exc).__name__}); replaying again is safe",
                                 settings.retry_after_seconds) from None
