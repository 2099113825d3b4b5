"""The FastAPI application: upload intake, status, events, replay, health, metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from datetime import timezone
from typing import Annotated

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse
from PIL import Image

from reference import metrics
from reference.api import errors
from reference.api.deps import FailpointsDep, OperatorDep, PoolDep, SettingsDep, StoreDep, UploadSlotDep
from reference.api.limits import DecodeSandbox, UploadGate, needs_decode
from reference.api.errors import ApiError, ServiceUnavailable
from reference.api.models import (
    AttachmentStatus,
    DeadLetterList,
    DlqReplayRequest,
    DlqReplayResult,
    ErrorResponse,
    EventList,
    Health,
    ReplayAccepted,
    ReplayRequest,
    ReprocessAccepted,
    ReprocessRequest,
    UploadAccepted,
)
from reference.api.upload_stream import FILE_FIELD, receive_file
from reference.db.pool import open_pool
from reference.db.queries import queries
from reference.failpoints import FailpointError, Failpoints
from reference.inspection import inspect_image, sanitize_filename
from reference.operators import FailureLimiter
from reference.keys import staging_key
from reference.replay import ReplayRefused, replay
from reference.reprocess import ReprocessRefused, reprocess
from reference.settings import Settings
from reference.storage import ObjectStore, StorageUnavailable
from reference.tracing import accept_traceparent, accept_tracestate

log = logging.getLogger("reference.api")
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")

ERRORS = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503)
}
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [FILE_FIELD],
                    "properties": {FILE_FIELD: {"type": "string", "format": "binary"}},
                }
            }
        },
    }
}


def create_app(settings: Settings, *, connect: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
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

    @app.post("/v1/attachments", status_code=202, response_model=UploadAccepted, responses=ERRORS,
              openapi_extra=UPLOAD_BODY, summary="Upload an image; 202 after durable handoff")
    async def create_attachment(
        request: Request,
        settings: SettingsDep,
        _slot: UploadSlotDep,
        pool: PoolDep,
        store: StoreDep,
        failpoints: FailpointsDep,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        traceparent: Annotated[str | None, Header()] = None,
        tracestate: Annotated[str | None, Header()] = None,
    ):
        started = time.perf_counter()
        if idempotency_key is not None and not IDEMPOTENCY_KEY.match(idempotency_key):
            raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-200 visible ASCII characters")
        phases: dict[str, float] = {}
        try:
            upload = await receive_file(request, settings.max_upload_bytes,
                                        total_seconds=settings.upload_receive_timeout_seconds,
                                        idle_seconds=settings.upload_idle_timeout_seconds)
            phases["receive"] = time.perf_counter() - started
        except Exception as exc:
            metrics.UPLOADS.labels(getattr(exc, "code", "error")).inc()
            raise
        try:
            if needs_decode(upload.spool, upload.kind, upload.size, upload.tail):
                # A decode (slow path): isolated in a sandbox process with a time limit, never on an API thread.
                header = await request.app.state.decode_sandbox.inspect(upload.spool, upload.kind, upload.size,
                                                                        upload.tail)
            else:  # header only, no pixel decoding
                header = await asyncio.to_thread(inspect_image, upload.spool, upload.kind, upload.size, upload.tail,
                                                 max_pixels=settings.max_pixels, max_side=settings.max_side)
            phases["inspect"] = time.perf_counter() - started - sum(phases.values())
            if idempotency_key is not None:
                earlier = await _idempotent_answer(pool, idempotency_key, upload.sha256)
                if earlier is not None:
                    metrics.UPLOADS.labels("idempotent_replay").inc()
                    return JSONResponse(earlier, status_code=202)

            attachment_id, job_id = uuid.uuid4(), uuid.uuid4()
            key = staging_key(attachment_id)
            # The staging record comes BEFORE the PUT and is dated by the database: the
            # staging sweep and record_upload judge its age by that one clock, never by
            # this process's clock or the store's LastModified.
            staged_monotonic = time.monotonic()
            async with pool.connection() as conn:
                await conn.execute(queries().stage_upload, {"object_key": key})
            await asyncio.to_thread(store.put_file, key, upload.spool, upload.size, header.content_type, upload.sha256)
            phases["stage"] = time.perf_counter() - started - sum(phases.values())
            try:
                await failpoints.ahit("after_staging_before_record")
            except FailpointError:
                raise ServiceUnavailable("failpoint", "injected error", settings.retry_after_seconds) from None

            answer = {
                "attachment_id": str(attachment_id),
                "job_id": str(job_id),
                "status_url": f"/v1/attachments/{attachment_id}",
            }
            max_age = settings.staging_retention_seconds / 2
            if time.monotonic() - staged_monotonic >= max_age:
                raise ServiceUnavailable("staging_too_old", "the upload took too long, retry",
                                         settings.retry_after_seconds)
            async with pool.connection() as conn:
                # The statement re-checks the age of the staging record with the database's
                # clock at the moment it runs, and refuses one the staging sweep has doomed.
                cursor = await conn.execute(queries().record_upload, {
                    "max_age_seconds": max_age,
                    "idempotency_key": idempotency_key, "response": json.dumps(answer),
                    "attachment_id": attachment_id, "original_key": key, "sha256": upload.sha256,
                    "size": upload.size, "content_type": header.content_type,
                    "width": header.width, "height": header.height,
                    "filename": sanitize_filename(upload.filename),
                    "job_id": job_id, "pipeline_version": settings.pipeline_version,
                    "variants": list(settings.variants), "ttl_seconds": settings.job_ttl_seconds,
                    "traceparent": accept_traceparent(traceparent), "tracestate": accept_tracestate(tracestate),
                })
                outcome = await cursor.fetchone()
            if not outcome["fresh"]:
                # An unrecorded staging object older than STAGING_RETENTION_SECONDS is
                # deleted by the sweeper: never record one that may already be gone.
                raise ServiceUnavailable("staging_too_old", "the upload took too long, retry",
                                         settings.retry_after_seconds)
            if not outcome["recorded"]:  # a concurrent twin holds the key
                await _discard(store, key)
                earlier = await _idempotent_answer(pool, idempotency_key, upload.sha256)
                metrics.UPLOADS.labels("idempotent_replay").inc()
                return JSONResponse(earlier, status_code=202)
            phases["record"] = time.perf_counter() - started - sum(phases.values())
            metrics.UPLOADS.labels("accepted").inc()
            metrics.UPLOAD_SECONDS.observe(time.perf_counter() - started)
            return JSONResponse(answer, status_code=202, headers={"Server-Timing": server_timing(phases)})
        except ApiError as exc:
            metrics.UPLOADS.labels(exc.code).inc()
            raise
        except Exception as exc:
            metrics.UPLOADS.labels(getattr(exc, "code", type(exc).__name__)).inc()
            raise
        finally:
            upload.close()

    @app.get("/v1/attachments/{attachment_id}", response_model=AttachmentStatus, responses=ERRORS,
             summary="State, original and variants of an attachment")
    async def get_attachment(attachment_id: str, pool: PoolDep, settings: SettingsDep):
        parsed = _parse_id(attachment_id)
        async with pool.connection() as conn:
            cursor = await conn.execute(queries().get_attachment, {
                "attachment_id": parsed, "max_version": settings.served_pipeline_version_max})
            row = await cursor.fetchone()
            if row is None:
                raise ApiError(404, "not_found", "unknown attachment")
            cursor = await conn.execute(queries().get_results, {
                "attachment_id": parsed, "pipeline_version": row["pipeline_version"], "variants": row["variants"],
            })
            results = await cursor.fetchall()
            cursor = await conn.execute(queries().get_versions, {"attachment_id": parsed})
            versions = await cursor.fetchall()
        return {
            "attachment_id": row["attachment_id"],
            "job_id": row["job_id"],
            "state": row["state"],
            "pipeline_version": row["pipeline_version"],
            "attempt": row["attempt"],
            "error_code": row["error_code"],
            "filename": row["display_filename"],
            "original": {
                "key": row["original_key"], "sha256": row["original_sha256"].strip(),
                "size": row["original_size"], "content_type": row["content_type"],
            },
            "variants": [
                {"name": r["variant"], "key": r["object_key"], "sha256": r["sha256"].strip(), "size": r["size"],
                 "content_type": r["content_type"], "width": r["width"], "height": r["height"]}
                for r in results
            ],
            "created_at": row["created_at"].astimezone(timezone.utc),
            "updated_at": row["updated_at"].astimezone(timezone.utc),
            "versions": [
                {"pipeline_version": v["pipeline_version"], "job_id": v["job_id"], "state": v["state"],
                 "attempt": v["attempt"], "error_code": v["error_code"], "variants": v["results"],
                 "updated_at": v["updated_at"].astimezone(timezone.utc)}
                for v in versions
            ],
        }

    @app.get("/v1/attachments/{attachment_id}/events", response_model=EventList, responses=ERRORS,
             summary="State transitions of an attachment in commit order")
    async def get_events(attachment_id: str, pool: PoolDep):
        parsed = _parse_id(attachment_id)
        async with pool.connection() as conn:
            cursor = await conn.execute(queries().get_events, {"attachment_id": parsed})
            rows = await cursor.fetchall()
        if not rows:
            raise ApiError(404, "not_found", "unknown attachment")
        return {"events": [
            {"seq": r["seq"], "at": r["at"].astimezone(timezone.utc), "from": r["from_state"], "to": r["to_state"],
             "attempt": r["attempt"], "reason": r["reason"], "actor": r["actor"],
             "next_attempt_at": r["next_attempt_at"].astimezone(timezone.utc) if r["next_attempt_at"] else None,
             "pipeline_version": r["pipeline_version"]}
            for r in rows
        ]}

    @app.post("/v1/admin/attachments/{attachment_id}/replay", status_code=202, response_model=ReplayAccepted,
              responses=ERRORS, summary="Operator replay of a failed attachment")
    async def replay_attachment(attachment_id: str, body: ReplayRequest, operator: OperatorDep,
                                settings: SettingsDep, pool: PoolDep, request: Request):
        parsed = _parse_id(attachment_id)
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

    @app.post("/v1/admin/attachments/{attachment_id}/reprocess", status_code=202, response_model=ReprocessAccepted,
              responses={**ERRORS, 200: {"model": ReprocessAccepted,
                                         "description": "The version's job existed already: nothing written"}},
              summary="Operator reprocessing of an attachment for another pipeline version (level 5)")
    async def reprocess_attachment(attachment_id: str, body: ReprocessRequest, operator: OperatorDep,
                                   settings: SettingsDep, pool: PoolDep, response: Response):
        parsed = _parse_id(attachment_id)
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

    @app.get("/v1/admin/dlq", response_model=DeadLetterList, responses=ERRORS,
             summary="Operator: the dead letters (read without loss: taken unacknowledged, all returned)")
    async def list_dead_letters(operator: OperatorDep, settings: SettingsDep, limit: int = 100):
        from reference import dlq

        try:
            return await dlq.list_letters(settings, limit)
        except Exception as exc:
            raise ServiceUnavailable("broker_unavailable", f"the dead-letter queue could not be read "
                                     f"({type(exc).__name__})", settings.retry_after_seconds) from None

    @app.post("/v1/admin/dlq/replay", response_model=DlqReplayResult, responses=ERRORS,
              summary="Operator: replay dead letters by key, job or filter; audited, idempotent")
    async def replay_dead_letters(body: DlqReplayRequest, operator: OperatorDep, settings: SettingsDep,
                                  pool: PoolDep, all: bool = False):
        from reference import dlq

        selector = dlq.Selector(message_keys=set(body.message_keys), job_ids={str(j) for j in body.job_ids},
                                dead_reason=body.dead_reason, older_than_seconds=body.older_than_seconds,
                                everything=body.all or all, limit=body.limit)
        return await _dlq_replay(dlq, selector, body.reason, operator, settings, pool)

    @app.post("/v1/admin/dlq/jobs/{job_id}/replay", response_model=DlqReplayResult, responses=ERRORS,
              summary="Operator: replay the dead letters of one job; a second replay is a no-op that says so")
    async def replay_dead_letters_of_job(job_id: str, body: ReplayRequest, operator: OperatorDep,
                                         settings: SettingsDep, pool: PoolDep):
        from reference import dlq

        parsed = _parse_id(job_id)
        return await _dlq_replay(dlq, dlq.Selector(job_ids={str(parsed)}), body.reason, operator, settings, pool)

    async def _dlq_replay(dlq, selector, reason: str, operator: str, settings: Settings, pool):
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

    @app.get("/healthz", response_model=Health, summary="Liveness, with the reachability of the database and store")
    async def healthz(request: Request):
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

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics_endpoint():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


def server_timing(phases: dict[str, float]) -> str:
    """Where the accept latency went (W3C Server-Timing, milliseconds)."""
    return ", ".join(f"{name};dur={seconds * 1000:.2f}" for name, seconds in phases.items())


def _parse_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError(404, "not_found", "unknown attachment") from None


async def _idempotent_answer(pool, key: str, request_sha256: str) -> dict | None:
    async with pool.connection() as conn:
        cursor = await conn.execute(queries().idempotency_get, {"key": key})
        row = await cursor.fetchone()
    if row is None:
        return None
    if row["request_sha256"].strip() != request_sha256:
        raise ApiError(409, "idempotency_key_reused", "this Idempotency-Key was used with a different body")
    return row["response"]


async def _discard(store: ObjectStore, key: str) -> None:
    try:
        await asyncio.to_thread(store.delete, key)
    except StorageUnavailable:
        pass  # the staging sweep removes it after the retention
