"""Access to the JSON schemas: the repository's schemas/ folder, shipped in the wheel as package data (paths.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator

from .paths import checkout_root, data_dir

# The repository the harness runs from, or None when it runs from an installed wheel (see paths.py).
REPO_ROOT: Path | None = checkout_root()


def schemas_dir() -> Path:
    return data_dir("schemas")


@lru_cache(maxsize=None)
def validator(name: str) -> Draft202012Validator:
    schema = json.loads((schemas_dir() / name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def errors(name: str, document) -> list[str]:
    """Human-readable validation errors of ``document`` against schemas/``name`` (empty when valid)."""
    found = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in found]


class SchemaDocument:
    """A TOML document (adapter, scenario) validated against its schema: its file and its parsed content.

    Subclasses are frozen dataclasses with `path` and `raw`; the fields every such document has live here.
    """

    path: Path
    raw: dict

    @property
    def name(self) -> str:
        return self.raw["name"]

    @property
    def level(self) -> int:
        return int(self.raw["level"])
