"""A grade's judging: the checklist rows and the requirements from the scenarios' verdicts, and the grade's
aggregate — pure functions over recorded results (``harness check`` recomputes them from a stored grade).

The data flow of one grade: harness/grade_plan.py chooses the scenarios, harness/grade_schedule.py runs them on the
stack(s), this module judges what they recorded, harness/grade.py ties the three together and writes the reports.
"""

from __future__ import annotations

from pathlib import Path

from .checklist import BY_ID as CHECKLIST_ITEMS
from .checklist import ITEMS, capability_hint, satisfies, shown_status
from .checkers import combine

ALL_REQUIREMENTS = [f"BE-JOB-00{i}" for i in range(1, 8)]
# Requirements the catalogue has no scenario for yet: the reason shows in the checklist.
# (BE-JOB-007 is proven by batch-poison-positions, batch-crash-after-partial-commit and batch-whole-redelivered now.)
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


def items_required_at(level: int, catalogue_scenarios) -> dict[str, list[str]]:
    """Checklist row id -> the graded scenarios (level ≤ ``level``) that provoke it, for every row the level
    requires (an empty list: the catalogue has nothing that provokes it — the row is missing)."""
    out: dict[str, list[str]] = {item.id: [] for item in ITEMS if item.level <= level}
    for s in catalogue_scenarios:
        if s.in_grade and s.level <= level:
            for item_id in s.raw.get("verifies") or []:
                if item_id in out:
                    out[item_id].append(s.name)
    return out


def window_missed(scenario: dict) -> str | None:
    """Why a scenario proves no row: its timed kill landed outside the window it aimed at (fault_coverage valid but
    not exercised, with ``window_missed`` evidence); None otherwise."""
    for v in scenario.get("verdicts") or []:
        if v["invariant"] == "fault_coverage" and v["status"] == "valid" and not v.get("exercised", True) and any(
                e.get("window_missed") for e in v.get("evidence") or []):
            return f"fault_coverage: {v['summary']}"
    return None


def _item_row(item, ran: list[dict], skipped: list[dict], required: bool) -> dict:
    """One checklist row. It passes only when a scenario provoking it ran, none of the row's checks was invalid or
    unknown there, and every claim of its proof was observed (an exercised, valid verdict of the claim's check that
    proves the event the row names: harness/checklist.py); a scenario invalid by another check leaves the row to its
    own checks (that scenario fails the grade, and its own rows, anyway). Nothing observed: ``not proven``, with the
    capability a skipped scenario behind it needs."""
    base = {"requirement": item.requirement, "meaning": item.meaning, "seed": item.seed, "level": item.level,
            "checks": list(item.checks), "scenarios": [s["name"] for s in ran]}
    behind = [s for s in skipped if item.id in (s.get("verifies") or [])]
    if not required:
        return {**base, "status": "not required", "why": f"not required by this grade (required from level {item.level}; "
                                                          "a partial grade requires only the rows its scenarios name)"}
    if not ran:
        if behind:
            return {**base, "status": "not proven", "why": "every scenario behind it was skipped: " + "; ".join(
                f"{s['name']} ({s['reason']}: {capability_hint(s)})" for s in behind)}
        return {**base, "status": "missing", "why": "no scenario of this grade provokes it"}
    tampered = [f"{s['name']} (seed {s['seed']}): {unknown_reason(s, 'tampered')}" for s in ran
                if s.get("verdict") == "tampered"]
    if tampered:  # the harness's faults were changed under the run: nothing it shows can pass a row
        return {**base, "status": "tampered", "why": "; ".join(tampered)}
    invalid, unknown, idle = [], [], []
    met: dict[int, list[str]] = {}  # claim index -> what met it
    for s in ran:
        if s.get("error"):
            unknown.append(f"{s['name']}: run error: {s['error']}")
        missed = window_missed(s)
        if missed:  # its timed kill landed outside the window: nothing it observed is about this row's event
            idle.append(f"{s['name']} (seed {s['seed']}): {missed}")
        declared = s.get("checks")
        for v in s.get("verdicts") or []:
            if missed and v["status"] == "valid":
                continue
            if v["invariant"] not in item.checks or (declared is not None and v["invariant"] not in declared):
                continue
            label = f"{s['name']} (seed {s['seed']}): {v['invariant']}"
            if v["status"] == "invalid":
                invalid.append(f"{label}: {v['summary']}")
            elif v["status"] == "unknown":
                unknown.append(f"{label}: {v['summary']}")
            elif not v.get("exercised", True):
                idle.append(f"{label} not exercised ({v['summary']})")
            for index, claim in enumerate(item.claims):
                hit = next((alt for alt in claim if satisfies(alt, v)), None)
                if hit is not None:
                    met.setdefault(index, []).append(label + (f" [{hit.partition(':')[2]}]" if ":" in hit else ""))
                elif v["status"] == "valid" and v.get("exercised", True) and any(
                        alt.partition(":")[0] == v["invariant"] for alt in claim):
                    idle.append(f"{label} valid but did not observe {' or '.join(claim)} ({v['summary']})")
    also = "; ".join(f"{s['name']} ({s['reason']}: {capability_hint(s)})" for s in behind)
    if invalid:
        return {**base, "status": "fail", "why": "; ".join(invalid)}
    if unknown:
        return {**base, "status": "unknown", "why": "; ".join(unknown)}
    unmet = [" or ".join(claim) for index, claim in enumerate(item.claims) if index not in met]
    if unmet:
        return {**base, "status": "not proven", "why": "not observed: " + "; ".join(unmet) + (
            ": " + "; ".join(idle) if idle else " (no scenario that ran exercised it)") + (
            f"; skipped behind it: {also}" if also else "")}
    return {**base, "status": "pass", "why": "observed: " + ", ".join(x for i in sorted(met) for x in met[i]) + (
        f" (also behind it, skipped: {also})" if also else "")}


def checklist_rows(scenario_results: list[dict], skipped: list[dict], required_items: dict | None = None) -> dict:
    """Per checklist row (the seeds' verification items): pass, fail, unknown, not proven, missing, or not required
    (by this grade's level); see harness/checklist.py."""
    required_items = required_items if required_items is not None else {item.id: [] for item in ITEMS}
    return {item.id: _item_row(item, [s for s in scenario_results if item.id in (s.get("verifies") or [])],
                               skipped, item.id in required_items) for item in ITEMS}


def requirement_checklist(scenario_results: list[dict], skipped: list[dict], required: dict | None = None,
                          rows: dict | None = None) -> dict:
    """Per requirement id: pass, fail, unknown or not required — with why.

    With checklist rows, a requirement passes only when every row of it this grade requires passes. A scenario
    that names the requirement without provoking one of its rows still counts against it when it is invalid or
    unknown. Without rows (or with none required, e.g. a partial grade), a requirement passes when every
    scenario naming it ran valid and, in at least one of them, a check that proves it was exercised (a check that
    had nothing to look at proves nothing). A required requirement that nothing exercised is unknown, never
    not required: the grade cannot vouch for it.
    """
    required = required if required is not None else {rid: ["?"] for rid in ALL_REQUIREMENTS}
    out = {}
    for rid in ALL_REQUIREMENTS:
        own = {item_id: row for item_id, row in (rows or {}).items()
               if CHECKLIST_ITEMS[item_id].requirement == rid and row["status"] != "not required"}
        by_scenarios = _by_scenarios(rid, scenario_results, skipped, rid in required or bool(own))
        if not own:
            out[rid] = by_scenarios
            continue
        failing = [f"{item_id} {row['status']}: {row['why']}" for item_id, row in own.items()
                   if row["status"] != "pass"]
        names = sorted({n for row in own.values() for n in row["scenarios"]} | set(by_scenarios["scenarios"]))
        if by_scenarios["scenarios"] and by_scenarios["status"] in ("fail", "unknown", "tampered") and not by_scenarios["why"].startswith("no check") \
                and not (by_scenarios["status"] == "tampered" and by_scenarios["why"] in "; ".join(failing)):
            failing.append(by_scenarios["why"])  # a scenario naming it went wrong, whichever row it provokes
        if not failing:
            out[rid] = {"status": "pass", "why": f"all {len(own)} checklist rows pass ({', '.join(sorted(own))})",
                        "scenarios": names}
            continue
        worst = "fail" if by_scenarios["status"] == "fail" or any(row["status"] == "fail" for row in own.values()) \
            else "unknown"
        if by_scenarios["status"] == "tampered" or any(row["status"] == "tampered" for row in own.values()):
            worst = "tampered"
        out[rid] = {"status": worst, "why": "; ".join(failing), "scenarios": names}
    return out


def _by_scenarios(rid: str, scenario_results: list[dict], skipped: list[dict], needed: bool) -> dict:
    ran = [s for s in scenario_results if rid in s["requirements"]]
    if not ran:
        reasons = [f"{s['name']}: {s['reason']}" for s in skipped if rid in s.get("requirements", [])]
        why = "; ".join(reasons) if reasons else NOT_IN_CATALOGUE.get(rid, "no scenario in the catalogue names it")
        return ({"status": "unknown", "why": f"required at this level but not exercised: {why}", "scenarios": []}
                if needed else {"status": "not required", "why": f"not required by this grade: {why}",
                                "scenarios": []})
    names = [s["name"] for s in ran]
    tampered = [s for s in ran if s["verdict"] == "tampered"]
    if tampered:
        return {"status": "tampered", "why": "; ".join(f"{s['name']} (seed {s['seed']}): {unknown_reason(s, 'tampered')}"
                                                       for s in tampered), "scenarios": names}
    invalid = [s for s in ran if s["verdict"] == "invalid"]
    unknown = [s for s in ran if s["verdict"] == "unknown"]
    exercised = [f"{s['name']}: {v['invariant']}" for s in ran if not window_missed(s) for v in proving_verdicts(rid, s)
                 if v["status"] == "valid" and v.get("exercised", True)]
    if invalid:
        why = "; ".join(
            f"{s['name']} (seed {s['seed']}): " + ", ".join(v["invariant"] for v in s.get("verdicts", [])
                                                           if v["status"] == "invalid")
            for s in invalid)
        return {"status": "fail", "why": why, "scenarios": names}
    if unknown:
        return {"status": "unknown", "why": "; ".join(f"{s['name']}: {s.get('error') or unknown_reason(s)}"
                                                      for s in unknown), "scenarios": names}
    if not exercised:
        idle = [f"{s['name']}: {v['invariant']} ({v['summary']})" for s in ran for v in proving_verdicts(rid, s)]
        return {"status": "unknown", "why": "no check behind it was exercised: " + ("; ".join(idle) or
                "the scenarios naming it declare no check that proves it"), "scenarios": names}
    return {"status": "pass", "why": f"{len(ran)} scenario{'s' if len(ran) > 1 else ''} valid; exercised "
                                     f"by {', '.join(exercised)}", "scenarios": names}


def unknown_reason(scenario: dict, status: str = "unknown") -> str:
    return "; ".join(f"{v['invariant']}: {v['summary']}" for v in scenario.get("verdicts", [])
                     if v["status"] == status) or f"{status} verdict"


def scenario_entry(result: dict, run_dir: Path, base: Path, seconds: float) -> dict:
    s = result["scenario"]
    return {"name": s["name"], "verdict": result["verdict"], "seed": result["seed"],
            "run_dir": str(Path(run_dir).relative_to(base)), "level": s["level"], "requirements": s["requirements"],
            "verifies": s.get("verifies") or [], "windows": s.get("windows") or [], "exactness": s.get("exactness"), "checks": s.get("checks"),
            "seconds": round(seconds, 2),
            # each verdict with the word every report shows for it ("not exercised" for a valid check that proved nothing)
            "verdicts": [{**v, "shown": shown_status(v)} for v in result["verdicts"]],
            "reproduce": result.get("reproduce"), "error": result.get("error")}


def skipped_entry(scenario, why: str) -> dict:
    """A scenario the grade skipped, with what the implementation must declare (or the grade provide) for it to run:
    a row proven only by skipped scenarios is ``not proven`` and says so."""
    needs = [c for c in scenario.requires if why.startswith("adapter lacks") and c in why]
    if "RabbitMQ cluster" in why:
        needs.append(f"a {scenario.rabbitmq_nodes}-node RabbitMQ cluster (`harness run {scenario.name}` starts one)")
    return {"name": scenario.name, "reason": why, "level": scenario.level,
            "requirements": scenario.raw["requirements"], "verifies": scenario.raw.get("verifies") or [],
            **({"needs": needs} if needs else {})}


# A requirement's status -> what it adds to the grade's verdict (not required: nothing to vouch for, no doubt).
REQUIREMENT_STATUS = {"pass": "valid", "fail": "invalid", "unknown": "unknown", "not required": "valid",
                      "tampered": "tampered"}


def aggregate(grade_dir: Path, adapter_summary: dict, level: int, seed: int, entries: list[dict],
              skipped: list[dict], timings: dict, required: dict | None = None,
              required_items: dict | None = None) -> dict:
    rows = checklist_rows(entries, skipped, required_items) if required_items is not None else None
    checklist = requirement_checklist(entries, skipped, required, rows)
    statuses = ([e["verdict"] for e in entries] or ["unknown"]) + [REQUIREMENT_STATUS[r["status"]]
                                                                   for r in checklist.values()]
    return {
        "report_version": 1, "kind": "grade", "run_id": Path(grade_dir).name, "level": level, "seed": seed,
        "sut": {"name": adapter_summary["name"], "path": adapter_summary.get("path"), "level": adapter_summary["level"]},
        "verdict": combine(statuses), "scenarios": entries, "skipped": skipped,
        "requirements": checklist, "required": required or {}, "timings": timings,
        **({"checklist": rows, "required_items": required_items} if rows is not None else {}),
    }
