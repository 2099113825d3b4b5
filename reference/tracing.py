"""W3C trace-context propagation: the API keeps a valid incoming traceparent
(or starts a trace) and the relay copies it into the message and its headers."""

from __future__ import annotations

import re
import secrets

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
