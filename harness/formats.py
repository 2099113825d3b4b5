"""The formats the harness reads from an implementation, parsed as their standards say, not as one language writes
them (CONTRACT §3, §4):

- **Timestamps**: RFC 3339 at any fractional precision (.NET writes 7 digits, Java 9, PostgreSQL 6, many none),
  ``T`` or ``t`` (or a space, as PostgreSQL prints), ``Z``/``z`` or a numeric offset (``+00`` too, as PostgreSQL
  prints it). Precision beyond the
  microsecond is cut, never refused.
- **UUIDs**: case-insensitive (RFC 9562 §4: "input is case insensitive"). The harness compares them in one canonical
  form, lower case, so an implementation printing ``5F1D…`` in its 202 and ``5f1d…`` in its messages names one
  attachment.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# A UUID with an upper-case hex digit somewhere in a text (a history line): only those need canonicalising.
UPPER_UUID_IN_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?\s*(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)?$")


def canonical_uuid(value: Any) -> Any:
    """A UUID string in lower case; anything else unchanged."""
    if isinstance(value, str) and len(value) == 36 and UUID.match(value):
        return value.lower()
    return value


def has_upper_uuid(text: str) -> bool:
    """Whether ``text`` holds a UUID written with an upper-case hex digit (cheap test before a deep copy)."""
    return any(m.group(0) != m.group(0).lower() for m in UPPER_UUID_IN_TEXT.finditer(text)) if text else False


def canonical_ids(value: Any) -> Any:
    """``value`` with every UUID string in it (values and keys, nested tables and lists) in lower case."""
    if isinstance(value, str):
        return canonical_uuid(value)
    if isinstance(value, dict):
        return {canonical_uuid(k): canonical_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical_ids(v) for v in value]
    if isinstance(value, tuple):
        return tuple(canonical_ids(v) for v in value)
    return value


def parse_rfc3339(text: Any) -> datetime | None:
    """An RFC 3339 date-time at any fractional precision -> an aware datetime (naive input: read as UTC, as the
    harness's own histories write it); None when ``text`` is not one."""
    if not isinstance(text, str):
        return None
    m = RFC3339.match(text.strip())
    if not m:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = m.groups()
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    second_i = int(second)
    leap = second_i == 60  # a leap second: the instant after :59
    try:
        if zulu or sign is None:
            tz = timezone.utc
        else:
            offset = timedelta(hours=int(off_h), minutes=int(off_m or 0))
            tz = timezone(-offset if sign == "-" else offset)
        out = datetime(int(year), int(month), int(day), int(hour), int(minute), 59 if leap else second_i, micro,
                       tzinfo=tz)
    except ValueError:
        return None
    return out + timedelta(seconds=1) if leap else out


def epoch(value: Any) -> float | None:
    """RFC 3339 text (any precision) or an epoch number -> epoch seconds; None when it is neither."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    parsed = parse_rfc3339(value)
    return parsed.timestamp() if parsed is not None else None
