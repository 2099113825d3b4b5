"""FastAPI dependencies as Annotated aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request

from reference.api.errors import ApiError, ServiceUnavailable
from reference.db.pool import Pool
from reference.failpoints import Failpoints
from reference.settings import Settings
from reference.storage import ObjectStore


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_pool(request: Request) -> Pool:
    pool: Pool | None = request.app.state.pool
    if pool is None:
        raise ServiceUnavailable("database_unavailable", "the database is unavailable, retry later",
                                 request.app.state.settings.retry_after_seconds)
    return pool


def get_store(request: Request) -> ObjectStore:
    store: ObjectStore = request.app.state.store
    return store


def get_failpoints(request: Request) -> Failpoints:
    failpoints: Failpoints = request.app.state.failpoints
    return failpoints


SettingsDep = Annotated[Settings, Depends(get_settings)]
PoolDep = Annotated[Pool, Depends(get_pool)]
StoreDep = Annotated[ObjectStore, Depends(get_store)]
FailpointsDep = Annotated[Failpoints, Depends(get_failpoints)]


async def require_operator(
    request: Request,
    settings: SettingsDep,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    """The operator a bearer token names (issue 23 defect 11): a live per-operator token (``operator_tokens``,
    hashed) is ``api:<name>``, the bootstrap OPERATOR_TOKEN is ``api:<OPERATOR_TOKEN_NAME>``; an ``X-Operator``
    header is ignored. 401 without credentials (not counted), 403 with a wrong token (counted and audited), 429 +
    Retry-After once the client sent OPERATOR_AUTH_MAX_FAILURES wrong tokens within OPERATOR_AUTH_WINDOW_SECONDS."""
    from reference import operators

    if not authorization:
        raise ApiError(401, "unauthorized", "operator bearer token required", {"WWW-Authenticate": "Bearer"})
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "unauthorized", "operator bearer token required", {"WWW-Authenticate": "Bearer"})
    client = request.client.host if request.client else "unknown"
    limiter = request.app.state.operator_limiter
    wait = limiter.retry_after(client)
    if wait is not None:
        if not getattr(request.app.state, "operator_locked", {}).get(client):  # the lockout audited once
            request.app.state.operator_locked[client] = True
            await _audit_refusal(request, client, "too_many_failures", 429,
                                 f"{settings.operator_auth_max_failures} wrong tokens: locked for {wait} s")
        raise ApiError(429, "too_many_failures", "too many wrong operator tokens from this client, retry later",
                       {"Retry-After": str(wait)})
    request.app.state.operator_locked.pop(client, None)
    name = operators.bootstrap_identity(token, settings)
    if name is None:
        pool = request.app.state.pool
        if pool is None:
            raise ServiceUnavailable("database_unavailable", "the database is unavailable, retry later",
                                     settings.retry_after_seconds)
        async with pool.connection() as conn:
            name = await operators.lookup(conn, token)
    if name is None:
        failures = limiter.failed(client)
        await _audit_refusal(request, client, "forbidden", 403, f"wrong token ({failures} in the window)")
        raise ApiError(403, "forbidden", "the operator token is not valid")
    return f"api:{name}"


async def _audit_refusal(request: Request, client: str, outcome: str, status: int, detail: str) -> None:
    from reference import metrics, operators

    metrics.OPERATOR_AUTH_REFUSALS.labels(str(status)).inc()
    pool = request.app.state.pool
    if pool is None:
        return
    try:
        async with pool.connection() as conn:
            await operators.audit(conn, operator="unauthenticated", action="authenticate", outcome=outcome,
                                  status=status, detail=f"{request.method} {request.url.path}: {detail}",
                                  client=client)
    except Exception:  # the refusal stands whether or not its audit row could be written
        pass


OperatorDep = Annotated[str, Depends(require_operator)]


async def upload_slot(request: Request) -> AsyncIterator[None]:
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
