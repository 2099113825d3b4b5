"""Re-check a stored run: its verdicts recomputed from history.jsonl, final.json and run.json alone (the runner
does this at the end of every run; ``harness recheck`` and the grade do it for stored runs). Re-exported by
``harness.runner``."""

from __future__ import annotations

import json
from pathlib import Path

from . import checkers
from .history import History


def check_run_dir(run_dir: Path, write: bool = True) -> dict:
    """Recompute the verdicts of a stored run from history.jsonl + final.json + run.json alone."""
    run_dir = Path(run_dir)
    history = History.load(run_dir / "history.jsonl")
    final = json.loads((run_dir / "final.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    verdicts = checkers.run_checks(history, final, run)
    declared = (run.get("scenario") or {}).get("checks")
    statuses = [v.status for v in verdicts if checkers.counts(v, declared)]
    if run.get("error"):
        statuses.append(checkers.UNKNOWN)
    results = {
        "report_version": 1,
        "kind": "scenario",
        "run_id": run["run_id"],
        "scenario": {k: run["scenario"].get(k) for k in ("name", "description", "windows", "requirements",
                                                          "verifies", "level", "exactness", "checks")},
        "seed": run["seed"],
        "level": run["level"],
        "sut": {"name": run["adapter"]["name"], "path": run["adapter"].get("path"), "level": run["adapter"]["level"]},
        "verdict": checkers.combine(statuses),
        "error": run.get("error"),
        "verdicts": [v.to_dict() for v in verdicts],
        "window_hits": run.get("window_hits", []),
        "timings": run.get("timings", {}),
        "timings_detail": run.get("timings_detail", {}),
        "history_lines": len(history),
        "reproduce": f"harness run {run['scenario']['name']} --seed {run['seed']} --sut {run['adapter'].get('path') or run['adapter']['name']} --level {run['level']}",
    }
    if write:
        from .report import write_scenario_reports

        write_scenario_reports(run_dir, results)
    return results
