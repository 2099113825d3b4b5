"""The job message (schemas/jobs.schema.json) and its AMQP envelope.

The body carries identifiers and service data only. See
schemas/message-mapping.md for the field → AMQP property mapping.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_VERSION = 1
CONTENT_TYPE = "application/json"
MESSAGE_TYPE = "attachments.job.v1"
SCHEMA_PATH_CANDIDATES = (
    Path(__file__).resolve().parent.parent / "schemas" / "jobs.schema.json",
    Path(__file__).resolve().parent / "schemas" / "jobs.schema.json",
)


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    for path in SCHEMA_PATH_CANDIDATES:
        if path.exists():
            document: dict[str, Any] = json.loads(path.read_text())
            return document
    raise FileNotFoundError("schemas/jobs.schema.json not found next to the reference package")


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    Draft202012Validator.check_schema(schema())
    return Draft202012Validator(schema())


@lru_cache(maxsize=1)
def reading_validator() -> Draft202012Validator:
    """The consumer's view: the contract's fields checked, extra fields allowed (CONTRACT §4: additive)."""
    return Draft202012Validator({**schema(), "additionalProperties": True})


def _carries_location(value: Any) -> bool:
    if isinstance(value, str):
        return "://" in value
    if isinstance(value, dict):
        return any(_carries_location(v) for v in value.values())
    if isinstance(value, list):
        return any(_carries_location(v) for v in value)
    return False


class InvalidMessage(ValueError):
    """The message can never be processed: dead-letter it with this reason."""


def rfc3339(moment: datetime) -> str:
    moment = moment.astimezone(timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}"
    return text + "Z"


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


@dataclass(frozen=True)
class JobMessage:
    job_id: uuid.UUID
    attempt: int
    attachment_id: uuid.UUID
    pipeline_version: int
    variants: tuple[str, ...]
    created_at: datetime
    expires_at: datetime
    traceparent: str | None = None
    tracestate: str | None = None

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "job_id": str(self.job_id),
            "attempt": self.attempt,
            "attachment_id": str(self.attachment_id),
            "pipeline_version": self.pipeline_version,
            "variants": list(self.variants),
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.expires_at),
        }
        if self.traceparent:
            body["traceparent"] = self.traceparent
        if self.tracestate:
            body["tracestate"] = self.tracestate
        return body

    def to_body(self) -> bytes:
        body = self.to_dict()
        validate(body)  # never put a message on the wire that breaks the contract
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    def amqp_properties(self) -> dict[str, Any]:
        """Keyword arguments for aio_pika.Message besides the body."""
        headers: dict[str, Any] = {"x-attempt": self.attempt, "x-schema-version": SCHEMA_VERSION}
        if self.traceparent:
            headers["traceparent"] = self.traceparent
        if self.tracestate:
            headers["tracestate"] = self.tracestate
        return {
            "message_id": str(self.job_id),
            "content_type": CONTENT_TYPE,
            "type": MESSAGE_TYPE,
            "timestamp": self.created_at,
            "headers": headers,
        }


def validate(body: Any) -> None:
    errors = sorted(validator().iter_errors(body), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        raise InvalidMessage(f"schema violation at {where}: {first.message[:200]}")


def parse(body: bytes, message_id: str | None = None) -> JobMessage:
    """Decode and validate a delivery; raises InvalidMessage for poison.

    A tolerant reader: fields the contract adds later are ignored (CONTRACT §4), unless one carries a location
    (a URL), which no message may; the AMQP ``message_id`` is free (it may be fresh per publish), so it is only
    logged by the caller, never compared with ``job_id``."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidMessage(f"body is not JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    errors = sorted(reading_validator().iter_errors(data), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].path) or "(root)"
        raise InvalidMessage(f"schema violation at {where}: {errors[0].message[:200]}")
    extra = {k: v for k, v in data.items() if k not in schema()["properties"]}
    if _carries_location(extra):
        raise InvalidMessage(f"an extra field carries a location: {sorted(extra)[:5]}")
    return JobMessage(
        job_id=uuid.UUID(data["job_id"]),
        attempt=data["attempt"],
        attachment_id=uuid.UUID(data["attachment_id"]),
        pipeline_version=data["pipeline_version"],
        variants=tuple(data["variants"]),
        created_at=parse_rfc3339(data["created_at"]),
        expires_at=parse_rfc3339(data["expires_at"]),
        traceparent=data.get("traceparent"),
        tracestate=data.get("tracestate"),
    )
