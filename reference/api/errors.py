"""Error envelope {"error": {"code", "message"}} for every non-2xx answer."""

from __future__ import annotations

import logging

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference.inspection import UploadRejected
from reference.storage import StorageUnavailable

log = logging.getLogger("reference.api")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class ServiceUnavailable(ApiError):
    def __init__(self, code: str, message: str, retry_after: int = 2):
        super().__init__(503, code, message, {"Retry-After": str(retry_after)})


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def install(app: FastAPI, retry_after_seconds: int) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(UploadRejected)
    async def _rejected(_: Request, exc: UploadRejected) -> JSONResponse:
        # 408: the rest of the body is never read, so the connection cannot carry another request.
        return error_response(exc.status, exc.code, exc.message, {"Connection": "close"} if exc.status == 408 else None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error_response(400, "invalid_request", f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))

    # The database or the object store is down: never a 202, always a retryable 503.
    async def _database(_: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", type(exc).__name__)
        return error_response(503, "database_unavailable", "the database is unavailable, retry later",
                              {"Retry-After": str(retry_after_seconds)})

    app.add_exception_handler(psycopg.OperationalError, _database)  # includes pool timeouts
    app.add_exception_handler(psycopg.InterfaceError, _database)
    # A database that refuses writes for now (read-only: a failover, maintenance; SQLSTATE 25006) is down for this
    # request, not a bug of it: 503 with Retry-After, as the worker waits it out (issue 23 defect 9).
    app.add_exception_handler(psycopg.errors.ReadOnlySqlTransaction, _database)

    @app.exception_handler(StorageUnavailable)
    async def _storage(_: Request, exc: StorageUnavailable) -> JSONResponse:
        log.warning("object store unavailable: %s", exc)
        return error_response(503, "storage_unavailable", "the object store is unavailable, retry later",
                              {"Retry-After": str(retry_after_seconds)})

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error")
