"""Operations: liveness with the reachability of the database and the store (GET /healthz) and the Prometheus
metrics (GET /metrics)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response

from reference import metrics
from reference.api.models import Health

router = APIRouter()


@router.get("/healthz", response_model=Health, summary="Liveness, with the reachability of the database and store")
async def healthz(request: Request) -> dict[str, Any]:
    database = storage = "unavailable"
    pool = request.app.state.pool
    if pool is not None:
        try:
            async with pool.connection(timeout=1.0) as conn:
                await conn.execute("SELECT 1")
            database = "ok"
        except Exception:
            pass
    store = request.app.state.store
    if store is not None:
        try:
            await asyncio.wait_for(asyncio.to_thread(store.ping), 2.0)
            storage = "ok"
        except Exception:
            pass
    return {"status": "ok", "role": "api", "database": database, "storage": storage}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}})
async def metrics_endpoint() -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
