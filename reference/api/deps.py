"""FastAPI dependencies as Annotated aliases."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request
from psycopg_pool import AsyncConnectionPool

from reference.api.errors import ApiError, ServiceUnavailable
from reference.failpoints import Failpoints
from reference.settings import Settings
from reference.storage import ObjectStore


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_pool(request: Request) -> AsyncConnectionPool:
    pool = request.app.state.pool
    if pool is None:
        raise ServiceUnavailable("database_unavailable", "the database is unavailable, retry later",
                                 request.app.state.settings.retry_after_seconds)
    return pool


def get_store(request: Request) -> ObjectStore:
    return request.app.state.store


def get_failpoints(request: Request) -> Failpoints:
    return request.app.state.failpoints


SettingsDep = Annotated[Settings, Depends(get_settings)]
PoolDep = Annotated[AsyncConnectionPool, Depends(get_pool)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]
FailpointsDep = Annotated[Failpoints, Depends(get_failpoints)]


def require_operator(
    settings: SettingsDep,
    authorization: Annotated[str | None, Header()] = None,
    x_operator: Annotated[str | None, Header()] = None,
) -> str:
    """Bearer OPERATOR_TOKEN: 401 without credentials, 403 with wrong ones.
    With no OPERATOR_TOKEN configured every token is wrong (admin disabled)."""
    if not authorization:
        raise ApiError(401, "unauthorized", "operator bearer token required", {"WWW-Authenticate": "Bearer"})
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "operator bearer token required", {"WWW-Authenticate": "Bearer"})
    expected = settings.operator_token
    if not expected or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise ApiError(403, "forbidden", "the operator token is not valid")
    name = (x_operator or "").strip()
    return f"api:{name[:100]}" if name else "api"


OperatorDep = Annotated[str, Depends(require_operator)]


async def upload_slot(request: Request):
    """One of MAX_CONCURRENT_UPLOADS slots for the whole upload, taken before its body is read; none free:
    503 + Retry-After (not accepted, the client retries later with the same Idempotency-Key)."""
    from reference import metrics

    gate = request.app.state.upload_gate
    if not gate.try_enter():
        metrics.UPLOADS.labels("too_many_uploads").inc()
        raise ServiceUnavailable("too_many_uploads", "too many uploads in progress, retry later",
                                 request.app.state.settings.retry_after_seconds)
    try:
        yield
    finally:
        gate.leave()


UploadSlotDep = Annotated[None, Depends(upload_slot)]
