"""Reports of a run folder: results.json (validated), junit.xml, summary.md, timeline.html; a grade folder
also gets index.html (checklist, per-scenario timelines and plots)."""

from __future__ import annotations

import json
from pathlib import Path

from ..history import History
from ..schemas import errors
from . import html, junit, summary, timeline


class ReportError(ValueError):
    pass


def write_results(run_dir: Path, results: dict) -> None:
    problems = errors("report.schema.json", results)
    if problems:
        raise ReportError("results.json does not match schemas/report.schema.json:\n  " + "\n  ".join(problems))
    (Path(run_dir) / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True, default=str))


def write_scenario_reports(run_dir: Path, results: dict) -> None:
    run_dir = Path(run_dir)
    write_results(run_dir, results)
    (run_dir / "junit.xml").write_text(junit.render(results))
    (run_dir / "summary.md").write_text(summary.scenario_md(results))
    history = History.load(run_dir / "history.jsonl")
    final = json.loads((run_dir / "final.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "timeline.html").write_text(timeline.build(history, final, run, results))


def write_grade_reports(grade_dir: Path, results: dict) -> None:
    grade_dir = Path(grade_dir)
    write_results(grade_dir, results)
    (grade_dir / "junit.xml").write_text(junit.render(results))
    (grade_dir / "summary.md").write_text(summary.grade_md(results))
    (grade_dir / "timeline.html").write_text(timeline.grade_index(results))
    (grade_dir / "index.html").write_text(html.grade_page(grade_dir, results))  # checklist, timelines, plots
