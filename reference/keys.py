"""Server-generated object keys. None of them contains a client filename."""

from __future__ import annotations

import uuid

STAGING_PREFIX = "staging/"
VARIANTS_PREFIX = "variants/"


def staging_key(attachment_id: uuid.UUID | str) -> str:
    return f"{STAGING_PREFIX}{uuid.UUID(str(attachment_id))}"


def variant_prefix(attachment_id: uuid.UUID | str, pipeline_version: int) -> str:
    """Every variant object of one (attachment_id, pipeline_version) lives under this prefix."""
    return f"{VARIANTS_PREFIX}{uuid.UUID(str(attachment_id))}/v{int(pipeline_version)}/"


def variant_key(attachment_id: uuid.UUID | str, pipeline_version: int, variant: str, extension: str,
                fencing_token: int | None = None) -> str:
    """Deterministic per effect key (attachment_id, pipeline_version, variant) and claim (fencing token).

    The fencing token in the key fences object writes: a claim writes only keys of its own token, so a stale
    owner's late PUT (paused past its lease, with a renderer that may differ) lands on a key that ``ready``
    never points at. A redelivery under the same claim rewrites the same keys; a new claim writes new ones.
    """
    token = "" if fencing_token is None else f"t{int(fencing_token)}/"
    return f"{variant_prefix(attachment_id, pipeline_version)}{token}{variant}.{extension}"


def fencing_token_of_variant_key(key: str) -> int | None:
    """The fencing token a variant key was written under (None for keys without one)."""
    parts = key.split("/")
    if len(parts) == 5 and parts[0] + "/" == VARIANTS_PREFIX and parts[3][:1] == "t" and parts[3][1:].isdigit():
        return int(parts[3][1:])
    return None


def attachment_id_from_staging_key(key: str) -> uuid.UUID | None:
    if not key.startswith(STAGING_PREFIX):
        return None
    try:
        return uuid.UUID(key[len(STAGING_PREFIX):])
    except ValueError:
        return None
