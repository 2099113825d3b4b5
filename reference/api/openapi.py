"""Writes schemas/openapi.json from the FastAPI app (the HTTP contract's source
of truth; a unit test fails when the app drifts from the committed file).

    python -m reference.api.openapi [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from reference.api.app import create_app
from reference.settings import Settings

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"


def current() -> dict[str, Any]:
    return create_app(Settings(), connect=False).openapi()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render(current())
    if "--check" in argv:
        same = OPENAPI_PATH.exists() and OPENAPI_PATH.read_text() == text
        print("openapi.json is up to date" if same else "openapi.json differs from the app")
        return 0 if same else 1
    OPENAPI_PATH.write_text(text)
    print(f"wrote {OPENAPI_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
