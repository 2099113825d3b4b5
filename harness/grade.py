"""`harness grade`: run the catalogue's scenarios for one implementation at one level on one shared stack.

One grade through the modules: harness/grade_plan.py chooses the scenarios (and the skipped ones, with what they
need) and what the level requires; harness/run_driver.py starts the grade's own stack (or takes the one given);
harness/grade_schedule.py runs the scenarios on it (side by side, a service-restarting one alone or beside);
harness/grade_checklist.py judges what they recorded (checklist rows, requirements, the verdict); this module ties
them together, writes the reports (harness/report) and re-checks a stored grade. The names of those modules a
caller imported from here are still importable from here.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

from . import tenants_ahead, timing  # noqa: F401 - tenants_ahead: patched through here by tests
from .defaults import DEFAULT_PARALLEL  # noqa: F401 - re-exported for callers of grade()
from .grade_checklist import (  # noqa: F401 - re-exported: the grade's judging, imported from here by callers
    ALL_REQUIREMENTS, NOT_IN_CATALOGUE, REQUIREMENT_STATUS, _by_scenarios, _item_row, aggregate, checklist_rows,
    items_required_at, proving_verdicts, required_at, requirement_checklist, scenario_entry, skipped_entry,
    unknown_reason, window_missed)
from .grade_plan import expected_seconds, plan, runs_alone  # noqa: F401 - re-exported
from .grade_schedule import Schedule, _run_side_by_side, run_scenarios  # noqa: F401 - re-exported
from .report import write_grade_reports
from .run_driver import own_stack
from .runner import REPORTS_DIR, check_run_dir


def grade(adapter, level: int, seed: int, *, only: list[str] | None = None, stack=None, reports_dir: Path | None = None,
          progress=print, keep_data: bool = False, parallel: int = 1, gate=None) -> tuple[dict, Path]:
    """Grade on one stack. ``parallel`` > 1 runs that many scenarios side by side (each with its own tenant and
    Toxiproxy proxies). A scenario that restarts a service every run depends on runs on a second stack of its own,
    beside the others, when the grade starts its stacks; with a stack given (or one declared exclusive) it runs
    alone, before the others. ``gate`` (grade-many --jobs N, several submissions on one stack): each scenario runs
    under its shared side, one that restarts a service under its exclusive side."""
    began = time.monotonic()
    chosen, skipped, required, required_items = plan(adapter, level, only)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    grade_dir = Path(reports_dir or REPORTS_DIR) / f"grade-{stamp}-{adapter.name}-L{level}-s{seed}"
    grade_dir.mkdir(parents=True, exist_ok=True)
    parallel = max(1, int(parallel))
    progress(f"grading {adapter.name} at level {level}, seed {seed}: {len(chosen)} scenarios, {len(skipped)} skipped"
             + (f", up to {parallel} side by side" if parallel > 1 else ""))
    progress(f"reports: {grade_dir}")
    timings: dict[str, float] = {}
    with own_stack(stack, grade_dir / "stack", progress=progress, keep_data=keep_data, timings=timings) as on:
        ran: Schedule = run_scenarios(chosen, adapter, on, seed, level, grade_dir, timings, progress=progress,
                                      parallel=parallel, own_stack=stack is None, keep_data=keep_data, gate=gate)
    timings.update({f"phase:{k}": v for k, v in ran.phase_totals.items()})
    timings["total"] = round(time.monotonic() - began, 2)
    ordered = [ran.entries[s.name] for s in chosen if s.name in ran.entries]
    results = aggregate(grade_dir, adapter.summary(), level, seed, ordered, skipped, timings, required,
                        required_items)
    results["time_went"] = timing.summarise(
        [(s.name, *ran.run_timings[s.name]) for s in chosen if s.name in ran.run_timings], timings["total"], parallel,
        {"stack_start": timings.get("stack_start"), "stack_stop": timings.get("stack_stop"),
         **ran.time_went_extra(timings)})
    write_grade_reports(grade_dir, results)
    return results, grade_dir


def recheck_grade(grade_dir: Path) -> dict:
    """Recompute every scenario of a stored grade and the aggregate, without services."""
    grade_dir = Path(grade_dir)
    stored = json.loads((grade_dir / "results.json").read_text())
    entries = []
    for entry in stored["scenarios"]:
        result = check_run_dir(grade_dir / entry["run_dir"], write=True)
        entries.append(scenario_entry(result, grade_dir / entry["run_dir"], grade_dir, entry.get("seconds", 0)))
    run = json.loads((grade_dir / stored["scenarios"][0]["run_dir"] / "run.json").read_text()) if entries else {}
    adapter_summary = run.get("adapter") or {**stored["sut"]}
    results = aggregate(grade_dir, adapter_summary, stored["level"], stored.get("seed", 0), entries,
                        stored.get("skipped", []), stored.get("timings", {}), stored.get("required"),
                        stored.get("required_items"))
    if stored.get("time_went"):
        results["time_went"] = stored["time_went"]
    write_grade_reports(grade_dir, results)
    return results
