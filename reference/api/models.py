"""Response and request shapes of the HTTP API (DESIGN §4; schemas/openapi.json)."""

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


class EventList(BaseModel):
    events: list[Event]


class ReplayRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=1000)


class ReplayAccepted(BaseModel):
    attachment_id: uuid.UUID
    job_id: uuid.UUID
    attempt: int


class Health(BaseModel):
    status: Literal["ok"]
    role: str
    database: Literal["ok", "unavailable"]
    storage: Literal["ok", "unavailable"]
