"""What the routers share: the error responses every route documents, and the id in a path."""

from __future__ import annotations

import uuid
from typing import Any

from reference.api.errors import ApiError
from reference.api.models import ErrorResponse

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503)
}


def parse_id(value: str) -> uuid.UUID:
    """An id in a path; anything that is not a UUID names nothing (404, never 422)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError(404, "not_found", "unknown attachment") from None
