"""HTTP clients of the harness, sharing one TLS context.

httpx builds a new ``ssl.SSLContext`` (loading the whole CA bundle, tens of milliseconds of CPU) for every
``httpx.Client`` and every module-level ``httpx.get``. The harness talks plain HTTP to loopback services, often in
polling loops (a role's health, a service's readiness), and that context was a tenth of its CPU in a grade. Every
client here takes the one context made at import; it still verifies certificates should a URL ever be HTTPS.
"""

from __future__ import annotations

import ssl

import httpx

TLS_CONTEXT = ssl.create_default_context()


def client(**options) -> httpx.Client:
    """``httpx.Client(**options)`` with the shared TLS context."""
    return httpx.Client(verify=TLS_CONTEXT, **options)


def get(url: str, **options) -> httpx.Response:
    """``httpx.get`` with the shared TLS context (a short-lived client; no context built)."""
    request_options = {k: options.pop(k) for k in ("params", "headers", "cookies", "auth", "follow_redirects")
                       if k in options}
    with client(**options) as c:
        return c.get(url, **request_options)
