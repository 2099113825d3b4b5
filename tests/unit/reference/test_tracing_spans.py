"""OpenTelemetry spans of the reference (reference/tracing.py): API -> relay -> worker -> S3 in one trace.

The SDK's InMemorySpanExporter records every span that ends. The relay and the worker run with the service-free
fakes of test_relay_decisions.py and test_worker_decisions.py; the API's request span with a bare ASGI app
behind ``TraceRequests``. Hand-made trace contexts; no seed is involved (every id is fixed or made by the SDK)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from reference import tracing
from reference.messages import parse

from test_relay_decisions import Batch, outbox_row
from test_worker_decisions import Harness, claim_row, job_message

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
API_SPAN_ID = "00f067aa0ba902b7"
API_TRACEPARENT = f"00-{TRACE_ID}-{API_SPAN_ID}-01"
PUBLISH_SPAN_ID = "b7ad6b7169203331"
PUBLISH_TRACEPARENT = f"00-{TRACE_ID}-{PUBLISH_SPAN_ID}-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.configure(exporter, "test")
    yield exporter
    tracing.configure("none")


def ids(span: ReadableSpan) -> tuple[str, str, str | None]:
    """(trace id, span id, parent span id) as hex."""
    parent = format_span_id(span.parent.span_id) if span.parent else None
    return format_trace_id(span.context.trace_id), format_span_id(span.context.span_id), parent


def only(exporter: InMemorySpanExporter, kind: SpanKind) -> ReadableSpan:
    [span] = [s for s in exporter.get_finished_spans() if s.kind == kind]
    return span


# ------------------------------------------------------------------ relay


def test_relay_publish_is_a_producer_span_of_the_rows_trace_injected_as_the_messages_traceparent(spans):
    row = {**outbox_row(1), "traceparent": API_TRACEPARENT, "tracestate": "vendor=1"}
    batch = Batch([(row, "ack")])

    assert batch.drain() == 1

    producer = only(spans, SpanKind.PRODUCER)
    trace_id, span_id, parent = ids(producer)
    assert (trace_id, parent) == (TRACE_ID, API_SPAN_ID)  # continues the API's request span
    [(message, *_)] = batch.exchange.published
    expected = f"00-{TRACE_ID}-{span_id}-01"
    assert message.headers["traceparent"] == expected  # the W3C header names the publish span as parent
    job = parse(message.body, message.message_id)
    assert job.traceparent == expected and job.tracestate == "vendor=1" == message.headers["tracestate"]
    assert producer.attributes["reference.job_id"] == str(row["job_id"])


def test_relay_ends_the_publish_span_with_an_error_when_the_broker_refuses(spans):
    batch = Batch([({**outbox_row(1), "traceparent": API_TRACEPARENT}, "nack")])

    batch.drain()

    producer = only(spans, SpanKind.PRODUCER)
    assert not producer.status.is_ok and producer.events[0].name == "exception"


def test_relay_with_tracing_off_passes_the_rows_traceparent_on_unchanged():
    tracing.configure("none")
    batch = Batch([({**outbox_row(1), "traceparent": API_TRACEPARENT}, "ack")])

    batch.drain()

    [(message, *_)] = batch.exchange.published
    assert message.headers["traceparent"] == API_TRACEPARENT == parse(message.body).traceparent


# ------------------------------------------------------------------ worker


def traced_delivery(harness: Harness, header: Any, body_traceparent: str | None = PUBLISH_TRACEPARENT):
    job = job_message()
    job = type(job)(**{**job.__dict__, "traceparent": body_traceparent})
    delivery = harness.delivery(job)
    delivery.headers = {"x-attempt": 1, "traceparent": header}
    return delivery


def claimed_trace_ids(caplog) -> list[str | None]:
    return [getattr(r, "trace_id", None) for r in caplog.records if r.getMessage().startswith("claimed job")]


def test_worker_consumer_span_continues_the_messages_traceparent_with_s3_and_commit_children(monkeypatch, spans,
                                                                                             caplog):
    harness = Harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row()
    caplog.set_level(logging.INFO, logger="reference.worker")

    delivery = harness.handle(traced_delivery(harness, PUBLISH_TRACEPARENT))

    assert harness.settlements() == ["ack"]
    consumer = only(spans, SpanKind.CONSUMER)
    trace_id, consumer_id, parent = ids(consumer)
    assert (trace_id, parent) == (TRACE_ID, PUBLISH_SPAN_ID)  # same trace, parent = the relay's publish span
    children = {s.name: ids(s) for s in spans.get_finished_spans() if s is not consumer}
    assert set(children) == {"s3 get original", "render", "s3 put variant", "commit"}
    assert all(child[0] == TRACE_ID and child[2] == consumer_id for child in children.values())
    puts = [s for s in spans.get_finished_spans() if s.name == "s3 put variant"]
    assert sorted(s.attributes["reference.variant"] for s in puts) == ["crop", "optimized", "thumbnail"]
    assert [s.kind for s in puts] == [SpanKind.CLIENT] * 3
    assert claimed_trace_ids(caplog) == [TRACE_ID]  # the log lines name the span's trace
    assert delivery.journal[-1] == "ack"


def test_worker_prefers_the_amqp_header_and_falls_back_to_the_body(monkeypatch, spans):
    harness = Harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row()

    harness.handle(traced_delivery(harness, header=b"not-a-traceparent"))

    assert ids(only(spans, SpanKind.CONSUMER))[::2] == (TRACE_ID, PUBLISH_SPAN_ID)


def test_worker_starts_a_new_trace_for_a_malformed_traceparent_and_processes_the_job(monkeypatch, spans, caplog):
    harness = Harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row()
    caplog.set_level(logging.INFO, logger="reference.worker")
    zero_trace = f"00-{'0' * 32}-{PUBLISH_SPAN_ID}-01"  # passes the message schema, invalid in W3C trace-context

    harness.handle(traced_delivery(harness, header="00-zz-garbage", body_traceparent=zero_trace))

    assert harness.settlements() == ["ack"]
    consumer = only(spans, SpanKind.CONSUMER)
    trace_id, _, parent = ids(consumer)
    assert parent is None and trace_id != "0" * 32
    assert claimed_trace_ids(caplog) == [trace_id]


def test_a_failing_tracer_never_breaks_processing(monkeypatch, spans):
    def broken() -> Any:
        raise RuntimeError("tracer exploded")

    monkeypatch.setattr(tracing, "tracer", broken)
    harness = Harness(monkeypatch)
    harness.db.answers["claim_job"] = claim_row()

    harness.handle(traced_delivery(harness, PUBLISH_TRACEPARENT))

    assert harness.settlements() == ["ack"] and harness.ran("commit_result")
    assert spans.get_finished_spans() == ()


# ------------------------------------------------------------------ API


def serve(headers: dict[str, str], path: str = "/v1/attachments") -> tuple[str, list[int]]:
    """One request through TraceRequests to an app that answers 202 with the traceparent the upload stores."""
    stored: list[str] = []
    statuses: list[int] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        stored.append(tracing.request_traceparent(headers.get("traceparent")))
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(tracing.TraceRequests(app)(scope, receive, send))
    return stored[0], statuses


def test_api_request_span_continues_the_clients_traceparent_and_is_what_the_outbox_stores(spans):
    stored, statuses = serve({"traceparent": API_TRACEPARENT})

    server = only(spans, SpanKind.SERVER)
    trace_id, span_id, parent = ids(server)
    assert (trace_id, parent) == (TRACE_ID, API_SPAN_ID)
    assert stored == f"00-{TRACE_ID}-{span_id}-01"  # the relay's publish span will be its child
    assert statuses == [202] and server.attributes["http.response.status_code"] == 202


def test_api_starts_a_new_trace_for_a_malformed_traceparent(spans):
    stored, _ = serve({"traceparent": "00-" + "x" * 32 + "-" + API_SPAN_ID + "-01"})

    server = only(spans, SpanKind.SERVER)
    trace_id, span_id, parent = ids(server)
    # A new root's flags may carry the W3C level-2 "random trace id" bit besides "sampled" (01 or 03).
    assert parent is None and trace_id != TRACE_ID and stored[:52] == f"00-{trace_id}-{span_id}"


def test_api_with_tracing_off_keeps_a_valid_traceparent_and_starts_one_otherwise():
    tracing.configure("none")
    assert serve({"traceparent": API_TRACEPARENT})[0] == API_TRACEPARENT
    started = serve({"traceparent": "garbage"})[0]
    assert tracing.TRACEPARENT.match(started) and started[3:35] != TRACE_ID


def test_console_is_the_only_named_exporter():
    with pytest.raises(ValueError, match="TRACING_EXPORTER"):
        tracing.configure("otlp")
    tracing.configure("none")


def test_settings_default_to_no_export_and_refuse_an_unknown_exporter_at_start(monkeypatch):
    from pydantic import ValidationError

    from reference.settings import Settings

    assert Settings().tracing_exporter == "none"
    monkeypatch.setenv("TRACING_EXPORTER", "otlp")
    with pytest.raises(ValidationError, match="tracing_exporter"):
        Settings()
