import psycopg

from reference.api.routes.attachments import server_timing
from reference.failpoints import FailpointError
from reference.messages import validate
from reference.storage import StorageUnavailable
from reference.tracing import accept_traceparent, accept_tracestate, new_traceparent
from reference.worker_jobs import redact


def test_traceparent_kept_when_valid_else_new():
    valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert accept_traceparent(valid) == valid
    for bad in (None, "", "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"):
        generated = accept_traceparent(bad)
        assert generated != bad and generated.startswith("00-")
    assert new_traceparent() != new_traceparent()


def test_tracestate_only_when_the_message_schema_accepts_it():
    assert accept_tracestate("vendor=abc,other=1") == "vendor=abc,other=1"
    for bad in ("k=http://evil", "k=../x", "K=upper", "x" * 600):
        assert accept_tracestate(bad) is None


def test_generated_trace_context_validates_in_a_message():
    body = {"schema_version": 1, "job_id": "0b7e7c52-3f0e-4a52-9a57-6d2b7c1f9e01", "attempt": 1,
            "attachment_id": "5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e", "pipeline_version": 1,
            "variants": ["thumbnail"], "created_at": "2026-11-29T12:00:00Z", "expires_at": "2026-11-30T12:00:00Z",
            "traceparent": new_traceparent(), "tracestate": accept_tracestate("vendor=abc")}
    validate(body)


def test_redacted_reasons_carry_no_connection_details():
    secret = "postgresql://user:hunter2@db.internal:5432/app"
    reason = redact(psycopg.OperationalError(f"connection to {secret} failed"))
    assert reason == "OperationalError" and "hunter2" not in reason
    assert redact(StorageUnavailable("s3 unreachable: EndpointConnectionError")).startswith("StorageUnavailable")
    assert redact(FailpointError("failpoint x")) == "FailpointError: failpoint x"


def test_server_timing_header_format():
    assert server_timing({"receive": 0.0012, "stage": 0.010}) == "receive;dur=1.20, stage;dur=10.00"
