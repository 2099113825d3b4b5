"""Response and request shapes of the HTTP API (CONTRACT §3; schemas/openapi.json)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

State = Literal["queued", "processing", "ready", "failed"]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class UploadAccepted(BaseModel):
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    status_url: str


class OriginalObject(BaseModel):
    key: str
    sha256: str
    size: int
    content_type: str


class VariantObject(BaseModel):
    name: str
    key: str
    sha256: str
    size: int
    content_type: str
    width: int
    height: int


class VersionStatus(BaseModel):
    """One pipeline version of an attachment (level 5): its job's state and the variants it published."""

    pipeline_version: int
    job_id: uuid.UUID
    state: State
    attempt: int
    error_code: str | None
    variants: list[VariantObject]
    updated_at: datetime


class AttachmentStatus(BaseModel):
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    state: State
    pipeline_version: int
    attempt: int
    error_code: str | None
    filename: str | None = Field(description="Sanitised client filename, display only")
    original: OriginalObject
    variants: list[VariantObject]
    created_at: datetime
    updated_at: datetime
    versions: list[VersionStatus] = Field(default_factory=list, description=(
        "Level 5: every pipeline version of the attachment, oldest first. The top-level state, pipeline_version "
        "and variants are those of the served version: the newest ready one (at or below the API's cap), else "
        "the oldest."))


class Event(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    seq: int
    at: datetime
    from_: State | None = Field(alias="from")
    to: State
    attempt: int
    reason: str | None
    actor: str
    next_attempt_at: datetime | None = None
    pipeline_version: int | None = Field(None, description="The pipeline version whose job took this transition")


class EventList(BaseModel):
    events: list[Event]


class ReplayRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=1000)
    # Level 5: the pipeline version whose job is replayed; unset, the job the attachment's status shows.
    pipeline_version: int | None = Field(None, ge=1, le=1000)


class ReprocessRequest(BaseModel):
    pipeline_version: int = Field(ge=1, le=1000)
    reason: str = Field(min_length=1, max_length=1000)


class ReprocessAccepted(BaseModel):
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    pipeline_version: int
    attempt: int
    state: State
    created: bool = Field(description="False when the version's job existed already (nothing was written)")


class ReplayAccepted(BaseModel):
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    attempt: int


class DeadLetter(BaseModel):
    message_key: str = Field(description="The AMQP message_id, or sha256:<body hash> when there is none")
    message_id: str | None
    job_id: uuid.UUID | None = Field(description="The job the message maps to; null: unmappable")
    attachment_id: uuid.UUID | None
    attempt: int | None
    mappable: bool
    unmappable_because: str | None
    reason: str = Field(description="Why it was dead-lettered (x-dead-letter-reason, or the broker's x-death)")
    dead_lettered_by: str | None
    first_death_at: datetime | None
    count: int
    size: int


class DeadLetterList(BaseModel):
    queue: str
    depth: int
    listed: int
    complete: bool
    messages: list[DeadLetter]


class DlqReplayRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=1000)
    message_keys: list[str] = Field(default_factory=list, max_length=1000)
    job_ids: list[uuid.UUID] = Field(default_factory=list, max_length=1000)
    dead_reason: str | None = Field(None, max_length=500, description="Replay letters whose reason contains this")
    older_than_seconds: float | None = Field(None, ge=0, description="Replay letters first dead this long ago")
    all: bool = Field(False, description="Replay every dead letter (no other selector needed)")
    limit: int = Field(1000, ge=1, le=1000, description="Dead letters looked at, at most")


class DlqReplayOutcome(BaseModel):
    message_key: str | None
    job_id: uuid.UUID | None
    attachment_id: uuid.UUID | None
    dead_reason: str | None
    outcome: Literal["replayed", "already_replayed", "already_terminal", "in_progress", "unmappable", "not_found"]
    detail: str


class DlqReplayResult(BaseModel):
    request_id: uuid.UUID
    operator: str
    reason: str
    dead_letters_seen: int
    counts: dict[str, int]
    results: list[DlqReplayOutcome]


class Health(BaseModel):
    status: Literal["ok"]
    role: str
    database: Literal["ok", "unavailable"]
    storage: Literal["ok", "unavailable"]
