"""HTTP contract checks that need no services: the committed OpenAPI file,
error envelopes, upload rejections (which happen before any DB/S3 call), auth."""

import io
import json
import struct
import zlib

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from reference.api.app import create_app
from reference.api.openapi import OPENAPI_PATH, current, render
from reference.settings import Settings


class Untouchable:
    """A pool/store that fails the test if a rejected upload reaches it."""

    def __getattr__(self, name):
        raise AssertionError(f"rejected upload touched a backend: {name}")


@pytest.fixture
def client():
    app = create_app(Settings(max_upload_bytes=200_000, operator_token="op-secret"), connect=False)
    with TestClient(app) as test_client:
        app.state.pool = Untouchable()
        app.state.store = Untouchable()
        yield test_client
        app.state.pool = None


def jpeg(size=(300, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise(size, 60).convert("RGB").save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def png_header(width, height) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


def test_committed_openapi_matches_the_app():
    assert OPENAPI_PATH.read_text() == render(current()), "run: python -m reference.api.openapi"


def test_openapi_keeps_the_design_shapes():
    doc = current()
    schemas = doc["components"]["schemas"]
    assert set(schemas["UploadAccepted"]["required"]) == {"attachment_id", "job_id", "status_url"}
    assert {"attachment_id", "state", "pipeline_version", "attempt", "error_code", "original", "variants",
            "created_at", "updated_at"} <= set(schemas["AttachmentStatus"]["required"])
    assert {"seq", "at", "from", "to", "attempt", "reason", "actor"} <= set(schemas["Event"]["properties"])
    assert set(schemas["VariantObject"]["required"]) >= {"name", "key", "sha256", "size", "content_type"}
    responses = set(doc["paths"]["/v1/attachments"]["post"]["responses"])
    assert responses >= {"202", "400", "409", "413", "415", "422", "503"}


@pytest.mark.parametrize("content,status,code", [
    (b"", 400, "empty_file"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'><script/></svg>", 415, "unsupported_media_type"),
    (b"GIF8", 415, "unsupported_media_type"),
    (png_header(20_000, 20_000), 422, "too_many_pixels"),
    (jpeg()[:20000], 422, "truncated_image"),
    (b"\xff\xd8\xff" + b"\x00" * 300_000, 413, "too_large"),
])
def test_bad_uploads_are_rejected_before_any_backend(client, content, status, code):
    response = client.post("/v1/attachments", files={"file": ("../../x.jpg", content, "image/jpeg")})
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert set(response.json()["error"]) == {"code", "message"}


def test_missing_file_field_and_non_multipart(client):
    response = client.post("/v1/attachments", files={"other": ("a.jpg", jpeg(), "image/jpeg")})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "missing_file")
    response = client.post("/v1/attachments", content=jpeg(), headers={"content-type": "image/jpeg"})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_multipart")


def test_declared_oversize_body_is_refused_before_reading(client):
    response = client.post("/v1/attachments", content=b"x" * 10,
                           headers={"content-type": "multipart/form-data; boundary=b", "content-length": "99999999"})
    assert response.status_code == 413


def test_bad_idempotency_key(client):
    response = client.post("/v1/attachments", files={"file": ("a.jpg", jpeg(), "image/jpeg")},
                           headers={"Idempotency-Key": "bad key with spaces"})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_idempotency_key")


class _Cursor:
    def __init__(self, row):
        self.row = row

    async def fetchone(self):
        return self.row


class OperatorTokensPool:
    """The database side of the admin API's authentication: ``tokens`` maps a token's SHA-256 to its operator;
    every statement is recorded (the audit rows among them)."""

    def __init__(self, tokens: dict[str, str] | None = None):
        self.tokens, self.statements = dict(tokens or {}), []

    def connection(self, *args, **kwargs):
        import contextlib

        pool = self

        class Connection:
            async def execute(self, sql, params=None):
                pool.statements.append((sql, params))
                if "FROM operator_tokens" in sql or "UPDATE operator_tokens" in sql:
                    name = pool.tokens.get(params[0])
                    return _Cursor({"name": name} if name else None)
                return _Cursor(None)

        @contextlib.asynccontextmanager
        async def connect():
            yield Connection()

        return connect()

    def audited(self) -> list[tuple]:
        return [p for sql, p in self.statements if "INSERT INTO operator_audit" in sql]


def test_replay_auth(client):
    client.app.state.pool = OperatorTokensPool()
    url = "/v1/admin/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/replay"
    assert client.post(url, json={"reason": "x"}).status_code == 401
    assert client.post(url, json={"reason": "x"}, headers={"Authorization": "Basic abc"}).status_code == 401
    response = client.post(url, json={"reason": "x"}, headers={"Authorization": "Bearer wrong"})
    assert (response.status_code, response.json()["error"]["code"]) == (403, "forbidden")
    audited = client.app.state.pool.audited()  # the wrong token is audited; the missing ones are not guesses
    assert [(a[0], a[1], a[4], a[5]) for a in audited] == [("unauthenticated", "authenticate", "forbidden", 403)]


def test_admin_without_operator_token_takes_only_per_operator_tokens():
    """No OPERATOR_TOKEN: no bootstrap token; a token is valid only as a live per-operator token of the database."""
    app = create_app(Settings(operator_token=""), connect=False)
    with TestClient(app) as test_client:
        app.state.pool = OperatorTokensPool()
        response = test_client.post("/v1/admin/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/replay",
                                    json={"reason": "x"}, headers={"Authorization": "Bearer "})
        assert response.status_code == 401
        response = test_client.post("/v1/admin/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/replay",
                                    json={"reason": "x"}, headers={"Authorization": "Bearer anything"})
        assert response.status_code == 403
        app.state.pool = None


def test_the_operator_is_who_the_token_names_never_x_operator():
    """Issue 23 defect 11: the identity is the token's (per-operator: api:<name>; the bootstrap OPERATOR_TOKEN:
    api:<OPERATOR_TOKEN_NAME>); whatever X-Operator says is ignored."""
    import asyncio

    from starlette.requests import Request

    from reference.api.deps import require_operator
    from reference.operators import token_hash

    app = create_app(Settings(operator_token="boot-secret"), connect=False)
    app.state.pool = OperatorTokensPool({token_hash("op_alice"): "alice"})
    scope = {"type": "http", "method": "POST", "path": "/v1/admin/dlq", "headers": [], "query_string": b"",
             "client": ("10.0.0.7", 5000), "app": app}

    def who(token):
        return asyncio.run(require_operator(Request(scope), app.state.settings, f"Bearer {token}"))

    assert who("op_alice") == "api:alice"
    assert who("boot-secret") == "api:bootstrap"
    assert Settings(operator_token="t", operator_token_name="ops-oncall").operator_token_name == "ops-oncall"
    with TestClient(app) as test_client:
        app.state.pool = OperatorTokensPool({token_hash("op_alice"): "alice"})
        answer = test_client.get("/v1/admin/dlq", headers={"Authorization": "Bearer nope", "X-Operator": "alice"})
        assert answer.status_code == 403  # a name in a header is no credential
        app.state.pool = None


def test_wrong_tokens_are_limited_per_client_with_retry_after():
    """Issue 23 defect 11: after OPERATOR_AUTH_MAX_FAILURES wrong tokens, 429 + Retry-After for every token (the
    right one too) until the oldest failure leaves the window; a request without credentials is not counted."""
    app = create_app(Settings(operator_token="boot-secret", operator_auth_max_failures=3,
                              operator_auth_window_seconds=60), connect=False)
    url = "/v1/admin/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/replay"
    with TestClient(app) as test_client:
        app.state.pool = pool = OperatorTokensPool()
        for _ in range(5):
            assert test_client.post(url, json={"reason": "x"}).status_code == 401  # not counted
        codes = [test_client.post(url, json={"reason": "x"}, headers={"Authorization": f"Bearer guess-{n}"})
                 .status_code for n in range(3)]
        assert codes == [403, 403, 403]
        locked = test_client.post(url, json={"reason": "x"}, headers={"Authorization": "Bearer boot-secret"})
        assert locked.status_code == 429 and locked.json()["error"]["code"] == "too_many_failures"
        assert 1 <= int(locked.headers["retry-after"]) <= 60
        again = test_client.post(url, json={"reason": "x"}, headers={"Authorization": "Bearer guess-9"})
        assert again.status_code == 429
        assert [(a[4], a[5]) for a in pool.audited()] == [("forbidden", 403)] * 3 + [("too_many_failures", 429)]
        app.state.pool = None


def test_the_failure_limiter_forgets_failures_past_the_window():
    from reference.operators import FailureLimiter

    now = [100.0]
    limiter = FailureLimiter(2, 10.0, clock=lambda: now[0])
    assert limiter.retry_after("a") is None
    limiter.failed("a")
    now[0] = 104.0
    limiter.failed("a")
    assert limiter.retry_after("a") == 6 and limiter.retry_after("b") is None  # per client
    now[0] = 110.5  # the first failure left the window
    assert limiter.retry_after("a") is None
    limiter.failed("a")
    assert limiter.retry_after("a") == 4
    small = FailureLimiter(1, 10.0, clock=lambda: now[0], max_clients=2)
    for client in ("x", "y", "z"):
        small.failed(client)
    assert len(small._failures) == 2  # bounded memory


def test_unknown_routes_use_the_error_envelope(client):
    response = client.get("/v1/nope")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_database_missing_answers_503_with_retry_after():
    app = create_app(Settings(), connect=False)
    with TestClient(app) as test_client:
        response = test_client.get("/v1/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e")
        assert response.status_code == 503 and "retry-after" in response.headers
        assert json.loads(response.text)["error"]["code"] == "database_unavailable"


class _RefusingConnection:
    def __init__(self, error: Exception):
        self.error = error

    async def execute(self, *args, **kwargs):
        raise self.error

    def transaction(self):
        raise self.error

    def cursor(self, *args, **kwargs):
        raise self.error


class _RefusingPool:
    """A pool whose every statement fails with ``error`` (a read-only database: after a failover, maintenance)."""

    def __init__(self, error: Exception):
        self.error = error

    def connection(self, *args, **kwargs):
        import contextlib

        @contextlib.asynccontextmanager
        async def connect():
            yield _RefusingConnection(self.error)

        return connect()


@pytest.mark.parametrize("error", [
    __import__("psycopg").errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
    __import__("psycopg").errors.AdminShutdown("terminating connection due to administrator command"),
], ids=["read-only", "admin-shutdown"])
def test_a_database_that_refuses_writes_for_now_answers_503_with_retry_after(error):
    """Issue 23 defect 9: a read-only database (SQLSTATE 25006) is a dependency that is down for now, not a bug of
    the request: 503 with Retry-After, like an unreachable one — never a 500."""
    app = create_app(Settings(operator_token="op-secret", retry_after_seconds=3), connect=False)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        app.state.pool = _RefusingPool(error)
        try:
            response = test_client.get("/v1/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e")
            assert response.status_code == 503, response.text
            assert response.headers.get("retry-after") == "3"
            assert response.json()["error"]["code"] == "database_unavailable"
            replay = test_client.post("/v1/admin/attachments/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/replay",
                                      json={"reason": "drill"},
                                      headers={"Authorization": "Bearer op-secret", "X-Operator": "alice"})
            assert replay.status_code == 503 and replay.headers.get("retry-after") == "3", replay.text
        finally:
            app.state.pool = None


def test_a_trickling_sender_is_cut_off_at_the_total_receive_deadline():
    """Issue 23 defect 10: a sender that keeps sending a few bytes (never idle long enough for the idle limit)
    still meets the total deadline: 408 request_timeout, well before its body could end."""
    import asyncio
    import time

    from starlette.requests import Request

    from reference.api.upload_stream import receive_file
    from reference.inspection import UploadRejected

    async def scenario():
        sent = []

        async def receive():
            await asyncio.sleep(0.05)
            body = b"x" * 16 if sent else (b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"'
                                           b"\r\nContent-Type: image/jpeg\r\n\r\n\xff\xd8\xff\xe0" + b"\0" * 32)
            sent.append(body)
            return {"type": "http.request", "body": body, "more_body": True}  # a JPEG's bytes, forever

        scope = {"type": "http", "method": "POST", "path": "/v1/attachments", "headers": [
            (b"content-type", b"multipart/form-data; boundary=b")]}
        started = time.monotonic()
        with pytest.raises(UploadRejected) as refused:
            await receive_file(Request(scope, receive), 10_000_000, total_seconds=0.6, idle_seconds=5.0)
        return refused.value, time.monotonic() - started

    refused, took = asyncio.run(scenario())
    assert (refused.status, refused.code) == (408, "request_timeout") and took < 3.0, (refused.status, took)
