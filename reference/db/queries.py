"""Loads the named statements of sql/queries.sql (``-- name: X`` blocks)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent / "sql"
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse_named_sql(text: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end():end].strip()
        # Drop leading comment lines: they document, they do not execute.
        lines = [line for line in body.splitlines()]
        while lines and lines[0].lstrip().startswith("--"):
            lines.pop(0)
        statement = "\n".join(lines).strip().rstrip(";").strip()
        if match.group(1) in blocks:
            raise ValueError(f"duplicate query name {match.group(1)}")
        blocks[match.group(1)] = statement
    return blocks


class Queries:
    def __init__(self, statements: dict[str, str]):
        self._statements = statements

    def __getattr__(self, name: str) -> str:
        try:
            return self._statements[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r} in queries.sql") from None

    def names(self) -> list[str]:
        return sorted(self._statements)


@lru_cache(maxsize=1)
def queries() -> Queries:
    return Queries(parse_named_sql((SQL_DIR / "queries.sql").read_text()))


def schema_sql(revision: str) -> str:
    return (SQL_DIR / f"schema_{revision}.sql").read_text()
