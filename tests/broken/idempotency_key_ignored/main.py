"""Broken on purpose: the Idempotency-Key header is never read.

The contract's upload answers the same key with the same bytes with the same attachment_id and job_id, and
refuses the same key with other bytes (409). This variant's API drops the header before the route sees it (as a
proxy that strips unknown headers, or an API that never wired the header up): every upload, a client's retry or
repeat included, is a new attachment, and a key reused for other bytes is accepted.

Everything else is the reference.
"""

import sys

from reference.api import app as app_mod
from reference.cli import main

_create_app = app_mod.create_app


class _IgnoreIdempotencyKey:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":  # THE BUG: the header never reaches the upload route
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"idempotency-key"]}
        await self.app(scope, receive, send)


def _create_app_ignoring_the_key(settings, **kwargs):
    app = _create_app(settings, **kwargs)
    app.add_middleware(_IgnoreIdempotencyKey)
    return app


app_mod.create_app = _create_app_ignoring_the_key

if __name__ == "__main__":
    sys.exit(main())
