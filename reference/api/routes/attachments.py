"""Attachments: upload (POST /v1/attachments), status (GET /v1/attachments/{id}) and events
(GET /v1/attachments/{id}/events)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import timezone
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse

from reference import metrics
from reference.api.deps import FailpointsDep, PoolDep, SettingsDep, StoreDep, UploadSlotDep
from reference.api.errors import ApiError, ServiceUnavailable
from reference.api.limits import needs_decode
from reference.api.models import AttachmentStatus, EventList, UploadAccepted
from reference.api.routes.common import ERRORS, parse_id
from reference.api.upload_stream import FILE_FIELD, receive_file
from reference.db.pool import Pool
from reference.db.queries import queries
from reference.failpoints import FailpointError
from reference.inspection import inspect_image, sanitize_filename
from reference.keys import staging_key
from reference.storage import ObjectStore, StorageUnavailable
from reference.tracing import accept_tracestate, request_traceparent

router = APIRouter()

IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
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


@router.post("/v1/attachments", status_code=202, response_model=UploadAccepted, responses=ERRORS,
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
) -> JSONResponse:
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
                "traceparent": request_traceparent(traceparent), "tracestate": accept_tracestate(tracestate),
            })
            outcome = await cursor.fetchone()
        if outcome is None:
            raise RuntimeError("record_upload returned no row")
        if not outcome["fresh"]:
            # An unrecorded staging object older than STAGING_RETENTION_SECONDS is
            # deleted by the sweeper: never record one that may already be gone.
            raise ServiceUnavailable("staging_too_old", "the upload took too long, retry",
                                     settings.retry_after_seconds)
        if not outcome["recorded"]:  # a concurrent twin holds the key
            assert idempotency_key is not None  # only a key another upload recorded leaves this one unrecorded
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


@router.get("/v1/attachments/{attachment_id}", response_model=AttachmentStatus, responses=ERRORS,
            summary="State, original and variants of an attachment")
async def get_attachment(attachment_id: str, pool: PoolDep, settings: SettingsDep) -> dict[str, Any]:
    parsed = parse_id(attachment_id)
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


@router.get("/v1/attachments/{attachment_id}/events", response_model=EventList, responses=ERRORS,
            summary="State transitions of an attachment in commit order")
async def get_events(attachment_id: str, pool: PoolDep) -> dict[str, Any]:
    parsed = parse_id(attachment_id)
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


def server_timing(phases: dict[str, float]) -> str:
    """Where the accept latency went (W3C Server-Timing, milliseconds)."""
    return ", ".join(f"{name};dur={seconds * 1000:.2f}" for name, seconds in phases.items())


async def _idempotent_answer(pool: Pool, key: str, request_sha256: str) -> dict[str, Any] | None:
    async with pool.connection() as conn:
        cursor = await conn.execute(queries().idempotency_get, {"key": key})
        row = await cursor.fetchone()
    if row is None:
        return None
    if row["request_sha256"].strip() != request_sha256:
        raise ApiError(409, "idempotency_key_reused", "this Idempotency-Key was used with a different body")
    response: dict[str, Any] = row["response"]
    return response


async def _discard(store: ObjectStore, key: str) -> None:
    try:
        await asyncio.to_thread(store.delete, key)
    except StorageUnavailable:
        pass  # the staging sweep removes it after the retention
