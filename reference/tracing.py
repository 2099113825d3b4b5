"""W3C trace-context propagation and OpenTelemetry spans across API -> relay -> worker -> S3.

The API answers each ``/v1/`` request inside a SERVER span (``TraceRequests``) that continues a valid incoming
``traceparent`` and stores its own context on the outbox row; the relay publishes each row inside a PRODUCER span
whose context becomes the message's ``traceparent`` (body field and AMQP header of the same name, CONTRACT §4); the
worker processes a delivery inside a CONSUMER span that continues that ``traceparent`` (same trace id, parent = the
publish span), with child spans for the S3 fetch and writes and the fenced commit.

Export is off by default (``TRACING_EXPORTER=none``): spans come from the globally installed OpenTelemetry tracer
provider, a no-op unless the host installed one, and a no-op span passes the parent's context on unchanged, so the
trace id still travels. ``console`` installs the SDK with a console exporter (stdout). Tracing never breaks
processing: a malformed ``traceparent`` starts a new trace, and an error of the tracing library is swallowed."""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("reference.tracing")

TRACER_NAME = "reference"
EXPORTERS = ("none", "console")
_PROPAGATOR = TraceContextTextMapPropagator()
_provider: trace.TracerProvider | None = None

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
TRACESTATE = re.compile(
    r"^[a-z0-9_\-*@]{1,256}=[\x21-\x2b\x2d-\x3c\x3e-\x7e]{0,256}"
    r"(,[ \t]*[a-z0-9_\-*@]{1,256}=[\x21-\x2b\x2d-\x3c\x3e-\x7e]{0,256}){0,31}$"
)
FORBIDDEN_IN_TRACESTATE = re.compile(r"(://|\.\./|/)")


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def accept_traceparent(value: str | None) -> str:
    if value and TRACEPARENT.match(value.strip()) and value.strip()[3:35] != "0" * 32:
        return value.strip()
    return new_traceparent()


def accept_tracestate(value: str | None) -> str | None:
    """Only a tracestate that the message schema accepts travels on."""
    if not value:
        return None
    value = value.strip()
    if len(value) > 512 or not TRACESTATE.match(value) or FORBIDDEN_IN_TRACESTATE.search(value):
        return None
    return value


def configure(exporter: str | SpanExporter = "none", role: str = "reference") -> None:
    """Install the process's tracer provider: ``none`` (the default) leaves the global one (a no-op unless the
    host installed one); ``console`` the SDK with a batching console exporter; a SpanExporter (tests) the SDK
    exporting each span as it ends."""
    global _provider
    if isinstance(exporter, str) and exporter == "none":
        _provider = None
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"reference-{role}"}))
    if isinstance(exporter, str):
        if exporter != "console":
            raise ValueError(f"unknown TRACING_EXPORTER {exporter!r} (one of {', '.join(EXPORTERS)})")
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider = provider


def tracer() -> Tracer:
    return (_provider or trace.get_tracer_provider()).get_tracer(TRACER_NAME)


def parent_context(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The context a span continues: the given traceparent's, or an empty one (a new trace) when it is missing
    or malformed."""
    carrier: dict[str, str] = {}
    if traceparent:
        carrier["traceparent"] = traceparent.strip()
        if tracestate:
            carrier["tracestate"] = tracestate
    try:
        return _PROPAGATOR.extract(carrier, context=Context())
    except Exception:  # noqa: BLE001 - tracing never breaks processing
        return Context()


def start_span(name: str, *, kind: SpanKind = SpanKind.INTERNAL, parent: Context | None = None,
               attributes: Mapping[str, Any] | None = None) -> Span:
    """A started span (the caller ends it with ``end_span``); never raises: on a tracing error, a no-op span."""
    try:
        return tracer().start_span(name, context=parent, kind=kind, attributes=_attributes(attributes))
    except Exception:  # noqa: BLE001
        log.debug("tracing: span %s not started", name, exc_info=True)
        return INVALID_SPAN


def end_span(span: Span, error: BaseException | None = None) -> None:
    try:
        if error is not None and span.is_recording():
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {str(error)[:200]}"))
        span.end()
    except Exception:  # noqa: BLE001
        log.debug("tracing: span not ended", exc_info=True)


@contextmanager
def span(name: str, *, kind: SpanKind = SpanKind.INTERNAL, parent: Context | None = None,
         attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A span that is the current one inside the block (its children's parent); an exception leaving the block
    is recorded on it and goes on."""
    current = start_span(name, kind=kind, parent=parent, attributes=attributes)
    with trace.use_span(current, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        try:
            yield current
        except BaseException as exc:
            end_span(current, exc if isinstance(exc, Exception) else None)
            raise
    end_span(current)


def carrier_of(span: Span) -> dict[str, str]:
    """``{"traceparent", "tracestate"?}`` naming ``span`` as the parent; empty for a span without a valid
    context (a no-op span with no parent)."""
    carrier: dict[str, str] = {}
    try:
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span, Context()))
    except Exception:  # noqa: BLE001
        return {}
    return carrier


def trace_id_of(span: Span) -> str | None:
    """The span's trace id as the 32 hex digits of a traceparent (what log lines name as ``trace_id``)."""
    context = span.get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    return {key: value if isinstance(value, (str, bool, int, float)) else str(value)
            for key, value in attributes.items() if value is not None}


class TraceRequests:
    """ASGI middleware: every HTTP request under ``/v1/`` is answered inside a SERVER span that continues the
    request's valid ``traceparent`` (a malformed one starts a new trace), named after its route once routed."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = str(scope.get("method", "GET"))
        parent = parent_context(headers.get("traceparent"), headers.get("tracestate"))
        status: list[int] = []

        async def send_status(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message.get("status", 0)))
            await send(message)

        with span(method, kind=SpanKind.SERVER, parent=parent,
                  attributes={"http.request.method": method, "url.path": scope.get("path")}) as current:
            try:
                await self.app(scope, receive, send_status)
            finally:
                try:
                    route = getattr(scope.get("route"), "path", None)
                    if route and current.is_recording():
                        current.update_name(f"{method} {route}")
                        current.set_attribute("http.route", route)
                    if status and current.is_recording():
                        current.set_attribute("http.response.status_code", status[0])
                        if status[0] >= 500:
                            current.set_status(Status(StatusCode.ERROR))
                except Exception:  # noqa: BLE001
                    pass


def request_traceparent(fallback: str | None) -> str:
    """The traceparent an upload stores for its message: the current span's (the API's request span), else the
    request's own when valid (tracing off), else a new trace's."""
    carrier = carrier_of(trace.get_current_span())
    return carrier.get("traceparent") or accept_traceparent(fallback)


def current_trace_id() -> str | None:
    return trace_id_of(trace.get_current_span())


def set_attribute(span: Span, key: str, value: str | bool | int | float) -> None:
    try:
        if span.is_recording():
            span.set_attribute(key, value)
    except Exception:  # noqa: BLE001
        pass


def message_trace(headers: Mapping[str, Any] | None, job: Any) -> tuple[str | None, str | None]:
    """The trace context a delivery continues: its AMQP ``traceparent`` header (the messaging convention), else the
    body's field; a header that is not text is ignored."""
    header = (headers or {}).get("traceparent")
    if isinstance(header, bytes):
        header = header.decode("latin-1", "replace")
    if isinstance(header, str) and TRACEPARENT.match(header.strip()):
        state = (headers or {}).get("tracestate")
        if isinstance(state, bytes):
            state = state.decode("latin-1", "replace")
        return header, accept_tracestate(state if isinstance(state, str) else None)
    return getattr(job, "traceparent", None), getattr(job, "tracestate", None)
