"""Server-generated object keys. None of them contains a client filename."""

from __future__ import annotations

import uuid

STAGING_PREFIX = "staging/"
VARIANTS_PREFIX = "variants/"


def staging_key(attachment_id: uuid.UUID | str) -> str:
    return f"{STAGING_PREFIX}{uuid.UUID(str(attachment_id))}"


def variant_key(attachment_id: uuid.UUID | str, pipeline_version: int, variant: str, extension: str) -> str:
    """Deterministic per effect key (attachment_id, pipeline_version, variant)."""
    return f"{VARIANTS_PREFIX}{uuid.UUID(str(attachment_id))}/v{int(pipeline_version)}/{variant}.{extension}"


def attachment_id_from_staging_key(key: str) -> uuid.UUID | None:
    if not key.startswith(STAGING_PREFIX):
        return None
    try:
        return uuid.UUID(key[len(STAGING_PREFIX):])
    except ValueError:
        return None
