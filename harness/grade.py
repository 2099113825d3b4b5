"""`harness grade`: run the catalogue's scenarios for one implementation at one level on one shared stack."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path

from . import scenarios as catalogue_mod
from .checklist import BY_ID as CHECKLIST_ITEMS
from .checklist import ITEMS, capability_hint, satisfies, shown_status
from .checkers import combine
from .defaults import DEFAULT_PARALLEL  # noqa: F401 - re-exported for callers of grade()
from .report import write_grade_reports
from .run_setup import template_key
from .runner import REPORTS_DIR, ScenarioRun, check_run_dir, database_template, prepare_ahead
from . import tenants_ahead, timing

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




def runs_alone(scenario) -> str | None:
    """Why a scenario may not share the stack with another run (None when it may): it restarts a service every
    run depends on, or it says so (``exclusive = true``, e.g. for a measurement another run's load would skew)."""
    if scenario.raw.get("exclusive"):
        return "declared exclusive"
    for fault in scenario.raw.get("faults") or []:
        if fault.get("action") == "restart_service":
            return f"restarts {fault.get('service', 'a service')}"
    return None


def expected_seconds(scenario, timings: dict) -> float:
    """A rough length, to start the longest shared scenarios first so the last one to finish is a short one: the
    seconds its faults are scheduled to last (holds, pauses, outages, probes, scaled to the implementation's
    timings) plus a little per upload. Scenarios of one upload and a long pause are among the longest."""
    from .nemesis import resolve_schedule

    w = scenario.raw.get("workload") or {}
    uploads = int(w.get("uploads", 0)) + int(w.get("bad", 0)) + int(w.get("poison", 0))
    try:
        steps = resolve_schedule(list(scenario.raw.get("faults") or []), 0,
                                 {**timings, **(scenario.raw.get("timings") or {})})
    except Exception:  # a schedule this estimate cannot read: order it by its uploads alone
        steps = []
    faulted = 0.0
    for step in steps:
        for key in ("at", "duration", "probe_seconds"):
            value = step.get(key)
            if isinstance(value, (int, float)):
                faulted += float(value)
    return faulted + 0.3 * uploads


def plan(adapter, level: int, only: list[str] | None = None):
    """What a grade runs for this adapter: the chosen scenarios, the skipped ones (with reasons), the required
    requirements and the required checklist rows."""
    everything = catalogue_mod.catalogue()
    required = required_at(level, everything)
    required_items = items_required_at(level, everything)
    chosen, skipped_pairs = catalogue_mod.for_grade(everything, adapter, level)
    if only:  # a partial grade: it vouches only for what the chosen scenarios name and provoke
        chosen = [s for s in chosen if s.name in only]
        named = [s for s in everything if s.name in only]
        required = required_at(level, named)
        required_items = {k: v for k, v in items_required_at(level, named).items() if v}
    return chosen, [skipped_entry(s, why) for s, why in skipped_pairs], required, required_items


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
    own_stack = stack is None
    if own_stack:
        from .stack import Stack

        from .errors import InfrastructureError

        t = time.monotonic()
        try:
            stack = Stack.start(grade_dir / "stack", keep_data=keep_data)
        except Exception as exc:  # the grader's own services: exit 3 (retried once by the CLI), not the SUT's fault
            raise InfrastructureError("the stack (PostgreSQL, RabbitMQ, SeaweedFS, Toxiproxy) did not start", exc) \
                from exc
        timings["stack_start"] = round(time.monotonic() - t, 2)
        progress(f"stack up in {timings['stack_start']:.1f}s")
    entries: dict[str, dict] = {}
    phase_totals: dict[str, float] = {}
    lock = threading.Lock()
    active: dict[str, ScenarioRun] = {}
    started = iter(range(1, len(chosen) + 1))
    run_timings: dict[str, tuple[dict, dict]] = {}
    alone = [s for s in chosen if parallel > 1 and runs_alone(s)]
    # Restarting a service of its own second stack disturbs no other run: these run one after another on it, side by
    # side with the shared scenarios, instead of holding every other run back while they restart the shared one.
    beside = [s for s in alone if own_stack and not s.raw.get("exclusive")]
    alone = [s for s in alone if s not in beside]

    def run_one(scenario, on_stack=None) -> None:
        with lock:
            index = next(started)
        progress(f"--- [{index}/{len(chosen)}] {scenario.name} (level {scenario.level}, "
                 f"{', '.join(scenario.raw['requirements'])})")
        t = time.monotonic()
        run_dir = grade_dir / scenario.name
        run = ScenarioRun(scenario, adapter, on_stack or stack, seed, level, run_dir=run_dir, progress=progress)
        exclusive = ahead is not None and scenario in alone
        if exclusive:
            ahead.hold()
        run.tenants_ahead = ahead
        with lock:
            active[scenario.name] = run
        try:
            if gate is None:
                result = run.execute()
            else:  # grade-many --jobs N: a scenario that restarts a shared service runs with no other submission's
                with (gate.exclusive() if runs_alone(scenario) else gate.shared()):
                    result = run.execute()
        finally:
            if exclusive:
                ahead.resume()
            with lock:
                active.pop(scenario.name, None)
        seconds = time.monotonic() - t
        with lock:
            timings[f"scenario:{scenario.name}"] = round(seconds, 2)
            for phase, value in (result.get("timings") or {}).items():
                if isinstance(value, (int, float)):
                    phase_totals[phase] = round(phase_totals.get(phase, 0) + value, 2)
            entries[scenario.name] = scenario_entry(result, run_dir, grade_dir, seconds)
            run_timings[scenario.name] = (result.get("timings") or {}, result.get("timings_detail") or {})
        progress(f"    {scenario.name}: {result['verdict'].upper()} in {seconds:.1f}s")

    shared = (sorted((s for s in chosen if s not in alone and s not in beside),
                     key=lambda s: expected_seconds(s, adapter.timings),
                     reverse=True) if parallel > 1 else chosen)
    # The next scenarios' tenants (and their setup commands) are made while the running ones work and drain
    # (harness/tenants_ahead.py), in the order they start; a scenario that restarts a service makes its own, with
    # nothing being made meanwhile.
    by_name = {s.name: s for s in shared}
    ahead = (tenants_ahead.TenantsAhead(stack, seed, [s.name for s in shared], depth=2, held=bool(alone),
                                        prepare=lambda name, tenant: prepare_ahead(adapter, by_name[name], level,
                                                                                   tenant),
                                        # [setup] template = true: the setup command once per stack, tenants cloned
                                        template=(lambda name: database_template(adapter, by_name[name], level, stack))
                                        if getattr(adapter, "setup_template", False) else None)
             if tenants_ahead.enabled() and gate is None else None)  # under grade-many's gate a neighbour's
    # service restart could break a tenant made ahead: each run makes its own
    beside_pool = ThreadPoolExecutor(1, thread_name_prefix="beside") if beside else None
    templates: list[dict] = []  # [setup] template = true: each stack's database templates, for "where the time went"
    opted_in = getattr(adapter, "setup_template", False)
    template_keys = {template_key(adapter, s, level) for s in chosen} if opted_in else set()
    fallback: list = []  # the second stack's scenarios, when it could not start: alone on the first, at the end

    def run_beside() -> None:
        from .stack import Stack

        t = time.monotonic()
        try:
            second = Stack.start(grade_dir / "stack-beside", keep_data=keep_data)
        except Exception as exc:
            progress(f"second stack did not start ({exc}); {', '.join(s.name for s in beside)} will run alone on "
                     "the first stack, after the others")
            fallback.extend(beside)
            return
        timings["stack_beside_start"] = round(time.monotonic() - t, 2)
        try:
            for scenario in beside:
                run_one(scenario, on_stack=second)
        finally:
            if template_keys:
                templates.extend(second.template_stats(template_keys))
            second.stop()

    try:
        beside_done = beside_pool.submit(run_beside) if beside_pool else None
        for scenario in alone:
            run_one(scenario)
        if ahead is not None and alone:
            ahead.resume()  # the services are no longer restarted: the shared scenarios' tenants are made ahead
        try:
            if parallel == 1:
                for scenario in shared:
                    run_one(scenario)
            else:  # on a failure it aborts every active run, the one on the second stack too
                _run_side_by_side(shared, run_one, parallel, active, lock)
        finally:
            if beside_pool:
                beside_pool.shutdown(wait=True)
        if beside_done is not None:
            beside_done.result()  # its failure is the grade's, as for any scenario
        for scenario in fallback:
            alone.append(scenario)  # holds the tenants made ahead while it restarts a shared service
            run_one(scenario)
    finally:
        ahead_stats = ahead.close() if ahead is not None else None
        if template_keys and hasattr(stack, "template_stats"):
            templates.extend(stack.template_stats(template_keys))
        if own_stack:
            t = time.monotonic()
            stack.stop()
            timings["stack_stop"] = round(time.monotonic() - t, 2)
    timings.update({f"phase:{k}": v for k, v in phase_totals.items()})
    timings["total"] = round(time.monotonic() - began, 2)
    ordered = [entries[s.name] for s in chosen if s.name in entries]
    results = aggregate(grade_dir, adapter.summary(), level, seed, ordered, skipped, timings, required,
                        required_items)
    results["time_went"] = timing.summarise(
        [(s.name, *run_timings[s.name]) for s in chosen if s.name in run_timings], timings["total"], parallel,
        {"stack_start": timings.get("stack_start"), "stack_stop": timings.get("stack_stop"),
         **({"beside": {"scenarios": [s.name for s in beside if s not in fallback],
                        "stack_start": timings.get("stack_beside_start")}} if beside else {}),
         **({"tenants_ahead": ahead_stats} if ahead_stats else {}),
         **({"templates": templates} if templates else {})})
    write_grade_reports(grade_dir, results)
    return results, grade_dir


def _run_side_by_side(scenarios, run_one, parallel: int, active: dict, lock) -> None:
    """Run ``scenarios`` ``parallel`` at a time. On an interrupt (Ctrl-C, a grade time limit) every running scenario
    is told to stop, its roles are stopped, and its thread is waited for before the interrupt goes on."""
    pool = ThreadPoolExecutor(parallel, thread_name_prefix="scenario")
    futures = [pool.submit(run_one, s) for s in scenarios]
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)  # a failure is seen at once, not in submit order
        for future in done:
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        with lock:
            running = list(active.values())
        for run in running:
            run.abort()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


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
