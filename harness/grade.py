"""`harness grade`: run the catalogue's scenarios for one implementation at one level on one shared stack."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

from . import scenarios as catalogue_mod
from .checkers import combine
from .report import write_grade_reports
from .runner import REPORTS_DIR, ScenarioRun, check_run_dir

ALL_REQUIREMENTS = [f"BE-JOB-00{i}" for i in range(1, 8)]
# Requirements the catalogue has no scenario for yet: the reason shows in the checklist.
# (BE-JOB-007 is proven by batch-poison-positions and batch-crash-after-partial-commit now.)
NOT_IN_CATALOGUE: dict[str, str] = {}


def required_at(level: int, catalogue_scenarios) -> dict[str, list[str]]:
    """Requirement id -> the graded scenarios (level ≤ ``level``) that name it: a requirement with any is required."""
    out: dict[str, list[str]] = {}
    for s in catalogue_scenarios:
        if s.in_grade and s.level <= level:
            for rid in s.raw["requirements"]:
                out.setdefault(rid, []).append(s.name)
    return out


def proving_verdicts(rid: str, scenario: dict) -> list[dict]:
    """The verdicts of one scenario that can prove ``rid``: its declared checks whose invariant names ``rid``."""
    declared = scenario.get("checks")
    return [v for v in scenario.get("verdicts", []) if rid in (v.get("requirements") or [])
            and (declared is None or v["invariant"] in declared)]


def requirement_checklist(scenario_results: list[dict], skipped: list[dict], required: dict | None = None) -> dict:
    """Per requirement id: pass, fail, unknown, skipped or not required — with why.

    A requirement passes only when every scenario naming it ran valid and, in at least one of them, a check that
    proves it was exercised (a check that had nothing to look at proves nothing). A required requirement that no
    scenario exercised is unknown, never skipped: the grade cannot vouch for it.
    """
    required = required if required is not None else {rid: ["?"] for rid in ALL_REQUIREMENTS}
    out = {}
    for rid in ALL_REQUIREMENTS:
        ran = [s for s in scenario_results if rid in s["requirements"]]
        needed = rid in required
        if not ran:
            reasons = [f"{s['name']}: {s['reason']}" for s in skipped if rid in s.get("requirements", [])]
            why = "; ".join(reasons) if reasons else NOT_IN_CATALOGUE.get(rid, "no scenario in the catalogue names it")
            out[rid] = ({"status": "unknown", "why": f"required at this level but not exercised: {why}",
                         "scenarios": []} if needed else
                        {"status": "skipped", "why": f"not required by this grade: {why}", "scenarios": []})
            continue
        names = [s["name"] for s in ran]
        invalid = [s for s in ran if s["verdict"] == "invalid"]
        unknown = [s for s in ran if s["verdict"] == "unknown"]
        exercised = [f"{s['name']}: {v['invariant']}" for s in ran for v in proving_verdicts(rid, s)
                     if v["status"] == "valid" and v.get("exercised", True)]
        if invalid:
            why = "; ".join(
                f"{s['name']} (seed {s['seed']}): " + ", ".join(v["invariant"] for v in s.get("verdicts", [])
                                                               if v["status"] == "invalid")
                for s in invalid)
            out[rid] = {"status": "fail", "why": why, "scenarios": names}
        elif unknown:
            out[rid] = {"status": "unknown", "why": "; ".join(f"{s['name']}: {s.get('error') or unknown_reason(s)}"
                                                              for s in unknown), "scenarios": names}
        elif not exercised:
            idle = [f"{s['name']}: {v['invariant']} ({v['summary']})" for s in ran for v in proving_verdicts(rid, s)]
            out[rid] = {"status": "unknown", "why": "no check behind it was exercised: " + ("; ".join(idle) or
                        "the scenarios naming it declare no check that proves it"), "scenarios": names}
        else:
            out[rid] = {"status": "pass", "why": f"{len(ran)} scenario{'s' if len(ran) > 1 else ''} valid; exercised "
                                                 f"by {', '.join(exercised)}", "scenarios": names}
    return out


def unknown_reason(scenario: dict) -> str:
    return "; ".join(f"{v['invariant']}: {v['summary']}" for v in scenario.get("verdicts", [])
                     if v["status"] == "unknown") or "unknown verdict"


def scenario_entry(result: dict, run_dir: Path, base: Path, seconds: float) -> dict:
    s = result["scenario"]
    return {"name": s["name"], "verdict": result["verdict"], "seed": result["seed"],
            "run_dir": str(Path(run_dir).relative_to(base)), "level": s["level"], "requirements": s["requirements"],
            "windows": s.get("windows") or [], "exactness": s.get("exactness"), "checks": s.get("checks"),
            "seconds": round(seconds, 2),
            "verdicts": result["verdicts"], "reproduce": result.get("reproduce"), "error": result.get("error")}


REQUIREMENT_STATUS = {"pass": "valid", "fail": "invalid", "unknown": "unknown", "skipped": "valid"}


def aggregate(grade_dir: Path, adapter_summary: dict, level: int, seed: int, entries: list[dict],
              skipped: list[dict], timings: dict, required: dict | None = None) -> dict:
    checklist = requirement_checklist(entries, skipped, required)
    statuses = ([e["verdict"] for e in entries] or ["unknown"]) + [REQUIREMENT_STATUS[r["status"]]
                                                                   for r in checklist.values()]
    return {
        "report_version": 1, "kind": "grade", "run_id": Path(grade_dir).name, "level": level, "seed": seed,
        "sut": {"name": adapter_summary["name"], "path": adapter_summary.get("path"), "level": adapter_summary["level"]},
        "verdict": combine(statuses), "scenarios": entries, "skipped": skipped,
        "requirements": checklist, "required": required or {}, "timings": timings,
    }


def grade(adapter, level: int, seed: int, *, only: list[str] | None = None, stack=None, reports_dir: Path | None = None,
          progress=print, keep_data: bool = False) -> tuple[dict, Path]:
    began = time.monotonic()
    everything = catalogue_mod.catalogue()
    required = required_at(level, everything)
    chosen, skipped_pairs = catalogue_mod.for_grade(everything, adapter, level)
    if only:  # a partial grade: it vouches only for what the chosen scenarios name
        chosen = [s for s in chosen if s.name in only]
        required = required_at(level, [s for s in everything if s.name in only])
    skipped = [{"name": s.name, "reason": why, "level": s.level, "requirements": s.raw["requirements"]}
               for s, why in skipped_pairs]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    grade_dir = Path(reports_dir or REPORTS_DIR) / f"grade-{stamp}-{adapter.name}-L{level}-s{seed}"
    grade_dir.mkdir(parents=True, exist_ok=True)
    progress(f"grading {adapter.name} at level {level}, seed {seed}: {len(chosen)} scenarios, {len(skipped)} skipped")
    progress(f"reports: {grade_dir}")
    timings: dict[str, float] = {}
    own_stack = stack is None
    if own_stack:
        from .stack import Stack

        t = time.monotonic()
        stack = Stack.start(grade_dir / "stack", keep_data=keep_data)
        timings["stack_start"] = round(time.monotonic() - t, 2)
        progress(f"stack up in {timings['stack_start']:.1f}s")
    entries = []
    phase_totals: dict[str, float] = {}
    try:
        for index, scenario in enumerate(chosen, start=1):
            progress(f"--- [{index}/{len(chosen)}] {scenario.name} (level {scenario.level}, "
                     f"{', '.join(scenario.raw['requirements'])})")
            t = time.monotonic()
            run_dir = grade_dir / scenario.name
            result = ScenarioRun(scenario, adapter, stack, seed, level, run_dir=run_dir, progress=progress).execute()
            seconds = time.monotonic() - t
            timings[f"scenario:{scenario.name}"] = round(seconds, 2)
            for phase, value in (result.get("timings") or {}).items():
                if isinstance(value, (int, float)):
                    phase_totals[phase] = round(phase_totals.get(phase, 0) + value, 2)
            entries.append(scenario_entry(result, run_dir, grade_dir, seconds))
            progress(f"    {scenario.name}: {result['verdict'].upper()} in {seconds:.1f}s")
    finally:
        if own_stack:
            t = time.monotonic()
            stack.stop()
            timings["stack_stop"] = round(time.monotonic() - t, 2)
    timings.update({f"phase:{k}": v for k, v in phase_totals.items()})
    timings["total"] = round(time.monotonic() - began, 2)
    results = aggregate(grade_dir, adapter.summary(), level, seed, entries, skipped, timings, required)
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
                        stored.get("skipped", []), stored.get("timings", {}), stored.get("required"))
    write_grade_reports(grade_dir, results)
    return results
