"""Broken on purpose: the status endpoint speaks a state name of its own.

The contract's states are queued, processing, ready and failed (an adapter may map a service's own names to them
with [vocabulary] states). This variant's API reports a queued attachment as `waiting` on
GET /v1/attachments/{id}, and its adapter maps nothing: a client of the contract cannot tell what `waiting` is.
Its events (GET /events) keep the contract's names.

Everything else is the reference.
"""

import json
import re
import sys

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import Response

from reference.api import app as app_mod
from reference.cli import main

STATUS = re.compile(r"^/v1/attachments/[^/]+$")
_create_app = app_mod.create_app


class RenameQueued(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        response = await call_next(request)
        if request.method != "GET" or response.status_code != 200 or not STATUS.match(request.url.path):
            return response
        body = json.loads(b"".join([chunk async for chunk in response.body_iterator]))
        if body.get("state") == "queued":
            body["state"] = "waiting"  # THE BUG
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return Response(json.dumps(body), status_code=200, headers=headers, media_type="application/json")


def _create_app_renaming(settings, **kwargs):
    app = _create_app(settings, **kwargs)
    app.add_middleware(RenameQueued)
    return app


app_mod.create_app = _create_app_renaming

if __name__ == "__main__":
    sys.exit(main())
