"""Broken on purpose: operator replay without authentication.

The contract's replay endpoint answers 401 without a bearer token and 403
with a wrong one. This variant's API lets anyone replay a failed attachment
(the dependency that checks the operator token is overridden, as a debugging
shortcut left in): a replay is no longer a controlled, audited operation.

Everything else is the reference.
"""

import sys

from reference.api import app as app_mod
from reference.api.deps import require_operator
from reference.cli import main

_create_app = app_mod.create_app


def _create_app_without_auth(settings, **kwargs):
    app = _create_app(settings, **kwargs)
    app.dependency_overrides[require_operator] = lambda: "anyone"  # THE BUG
    return app


app_mod.create_app = _create_app_without_auth

if __name__ == "__main__":
    sys.exit(main())
