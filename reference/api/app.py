"""The FastAPI application: its state (settings, object store, failpoints, upload gate, operator limiter, decode
sandbox), its lifespan (the decode sandbox's processes first, then the database pool), its error handlers, and the
routers of reference/api/routes/, one per resource (attachments, admin, dlq, health).

A broken variant that changes the app wraps ``create_app`` here (the CLI imports it when the API starts); one that
changes a route's helper patches the route's module (e.g. ``routes.attachments._idempotent_answer``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from PIL import Image

from reference import tracing
from reference.api import errors
from reference.api.limits import DecodeSandbox, UploadGate
from reference.api.routes import ROUTERS
from reference.db.pool import open_pool
from reference.failpoints import Failpoints
from reference.operators import FailureLimiter
from reference.settings import Settings
from reference.storage import ObjectStore


def create_app(settings: Settings, *, connect: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        Image.MAX_IMAGE_PIXELS = settings.max_pixels
        app.state.pool = None
        if connect:
            # The decode sandbox's processes first, before any connection is opened.
            await asyncio.to_thread(app.state.decode_sandbox.start)
            # Start even when the database is down: requests then answer 503.
            app.state.pool = await open_pool(settings, "reference-api", min_size=2, max_size=20)
        try:
            yield
        finally:
            if app.state.pool is not None:
                await app.state.pool.close(timeout=5)
            app.state.decode_sandbox.shutdown()

    app = FastAPI(
        title="Reference attachment pipeline",
        version="1.0.0",
        description=("Upload API of the reference pipeline (CONTRACT §3). "
                     "Errors are {\"error\": {\"code\", \"message\"}}."),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = ObjectStore.from_settings(settings) if connect else None
    app.state.failpoints = Failpoints(settings.failpoints)
    app.state.upload_gate = UploadGate(settings.max_concurrent_uploads)
    app.state.operator_limiter = FailureLimiter(settings.operator_auth_max_failures,
                                                settings.operator_auth_window_seconds)
    app.state.operator_locked = {}
    app.state.decode_sandbox = DecodeSandbox(settings.upload_decode_workers, settings.upload_decode_timeout_seconds,
                                             settings.max_pixels, settings.max_side, settings.retry_after_seconds)
    errors.install(app, settings.retry_after_seconds)

    # OpenTelemetry: each /v1/ request in a SERVER span continuing its traceparent (reference/tracing.py).
    app.add_middleware(tracing.TraceRequests)
    for router in ROUTERS:
        app.include_router(router)
    return app
