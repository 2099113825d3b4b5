"""Judge a stored folder again without services: a run, a grade or a soak, by what it stored (``harness check``).

Above the commands' modules (it dispatches to grade's and soak's own re-check), so that harness/run_driver.py, which
the commands import, imports none of them."""

from __future__ import annotations

import json
from pathlib import Path

from .grade import recheck_grade
from .runner import check_run_dir
from .soak import recheck as recheck_soak


def stored_kind(folder: Path) -> str:
    """What a stored folder holds: ``soak``, ``grade`` or ``run`` (one scenario's run)."""
    stored = Path(folder) / "results.json"
    try:
        kind = json.loads(stored.read_text()).get("kind") if stored.is_file() else None
    except (OSError, ValueError):
        kind = None
    return kind if kind in ("soak", "grade") else "run"


def recheck(folder: Path, write: bool = True) -> tuple[str, dict]:
    """Judge a stored folder again from its recorded histories, without services: ``(kind, results)``."""
    kind = stored_kind(folder)
    if kind == "soak":
        return kind, recheck_soak(Path(folder))
    if kind == "grade":
        return kind, recheck_grade(Path(folder))
    return kind, check_run_dir(Path(folder), write=write)
