"""`harness soak`: rerun a (presumed correct) implementation under many seeds, each with a random fault schedule.

Each seed draws, from its own seeded stream, a handful of faults among every kind the runner knows (a failpoint at
a documented window, SIGKILL or SIGSTOP of a role, a toxic on a service, a service restart, a republish, an extra
consumer instance, injected unprocessable messages, a held role, a permuted work queue, an operator replay), kept
to what the adapter's capabilities, roles and level allow. The schedule and the workload (N uploads spread over
time) make an ordinary scenario, built in memory and run by the runner like any catalogue scenario on one shared
stack, every checker over the whole history. The scenario is also written into the seed's run folder (a TOML file
``harness run`` accepts), so one seed replays exactly with ``harness soak … --seeds 1 --seed K``.

On a correct implementation every ``invalid`` is a false alarm of the harness (or a real bug): the report lists each
with its evidence. Unknowns are counted apart. Results: ``results.json`` and ``summary.md`` in the soak folder.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from chaos import kinds as fault_kinds

from .errors import UsageError
from .run_driver import busy_roles, start_stack
from .seeding import stream

NEMESES = ("random", "none")
DEFAULT_UPLOADS = 30
DEFAULT_SEEDS = 20
CONCURRENCY = 2
SECONDS_PER_UPLOAD = 0.5  # the workload is spread over this many seconds per upload (at least MIN_SPAN)
MIN_SPAN = 5.0
FAULTS_PER_SEED = (2, 4)
SERVICES = ("postgres", "rabbitmq", "s3")
# Every fault kind (chaos/kinds/, one module each) with a ``draw``, in a fixed order: the draw picks among the allowed
# ones in this order, so a recorded seed replays the same; a kind added later comes after these, by name. How often
# each is drawn (WEIGHT) and which at most once per seed (ONCE) are the kinds' own: the faults that hit the failure
# windows most, a permute (every consumer held through the whole workload) and a replay (waits for the end) seldom.
ORDER = ("failpoint", "sigkill", "sigstop", "toxic", "restart_service", "republish", "start_instance", "inject",
         "hold", "permute", "replay")
KINDS = tuple([a for a in ORDER if hasattr(fault_kinds.REGISTRY.get(a), "draw")]
              + sorted(a for a, m in fault_kinds.REGISTRY.items() if a not in ORDER and hasattr(m, "draw")))
ONCE = frozenset(a for a in KINDS if getattr(fault_kinds.get(a), "ONCE", False))
WEIGHTS = {a: fault_kinds.get(a).WEIGHT for a in KINDS}
FIGURES = ("uploads", "accepted", "ready", "failed", "faults_scheduled", "faults_happened", "lost", "duplicates",
           "regressions")


class SoakError(UsageError):
    """A soak asked for something it cannot do: exit 2 (harness/errors.py)."""


# --- drawing a schedule ---------------------------------------------------------------------------------------------

def allowed_kinds(adapter, level: int) -> tuple[list[str], dict[str, str]]:
    """The fault kinds this adapter can take at ``level``, and why each other kind is left out (each kind's
    ``allowed``)."""
    excluded: dict[str, str] = {}
    for kind in KINDS:
        hook = getattr(fault_kinds.get(kind), "allowed", None)
        why = hook(adapter, level) if hook is not None else None
        if why:
            excluded[kind] = why
    return [k for k in KINDS if k not in excluded], excluded


def documented_windows(adapter) -> list[str]:
    return fault_kinds.get("failpoint").windows(adapter)


def draw_schedule(adapter, seed: int, uploads: int = DEFAULT_UPLOADS, level: int | None = None,
                  nemesis: str = "random") -> list[dict]:
    """The faults of one seed (scenario ``[[faults]]`` entries): the same adapter, seed, uploads and level always
    give the same list."""
    if nemesis not in NEMESES:
        raise SoakError(f"unknown nemesis {nemesis!r}; one of {', '.join(NEMESES)}")
    if nemesis == "none":
        return []
    level = int(level or adapter.level)
    rng = stream(seed, "soak-schedule")
    kinds, _ = allowed_kinds(adapter, level)
    span = span_of(uploads)
    count = rng.randint(*FAULTS_PER_SEED)
    drawn: list[str] = []
    for _ in range(count):
        choices = [k for k in kinds if not (k in ONCE and k in drawn)]
        drawn.append(rng.choices(choices, weights=[WEIGHTS[k] for k in choices])[0])
    consumers = adapter.roles_flagged("consumer")
    spare = consumers if "permute" not in drawn else []  # consumers held all through a permute: leave them be
    roles = [r for r in adapter.roles if "permute" not in drawn or r not in consumers]
    faults: list[dict] = []
    for kind in drawn:
        at = round(rng.uniform(0.3, max(0.6, 0.7 * span)), 2)
        # A role armed with a failpoint takes no other process fault: arming restarts it with FAILPOINTS set, and
        # a second arm, a kill (restarted without failpoints) or a hold would disarm it before its window came.
        armed, struck = busy_roles(adapter, faults)
        fault = draw_one(kind, rng, adapter, at, [r for r in roles if r not in armed], spare, armed | struck)
        if fault is None:  # nothing this kind may target in this seed (e.g. every consumer held by a permute)
            fault = {"action": "toxic", "service": rng.choice(SERVICES), "toxic": "latency",
                     "params": {"ms": rng.randint(50, 400)}, "at": at, "duration": round(rng.uniform(0.5, 3), 2)}
        faults.append(fault)
    return faults


def draw_one(kind: str, rng, adapter, at: float, roles: list[str], consumers: list[str],
              busy: set = frozenset()) -> dict | None:
    """One fault of ``kind`` (its module's ``draw``). ``roles``: those a process fault may target; ``busy``: roles a
    failpoint may not be armed on (already armed, killed, paused or held in this seed)."""
    if kind not in KINDS:
        raise SoakError(f"unknown fault kind {kind!r}")
    return fault_kinds.get(kind).draw(rng, fault_kinds.Pick(adapter, at, roles, consumers, set(busy)))


def span_of(uploads: int) -> float:
    """Seconds the workload is spread over; the faults are drawn within its first 70%."""
    return max(MIN_SPAN, SECONDS_PER_UPLOAD * uploads)


def spacing_for(uploads: int) -> float:
    """The workload's ``spacing_seconds`` that spreads ``uploads`` over ``span_of(uploads)``. The runner's upload
    threads (CONCURRENCY of them) each wait ``spacing × index`` once they pick up upload ``index``, so upload ``i``
    starts at about spacing × i² / (2 × CONCURRENCY), not at spacing × i."""
    return round(2 * CONCURRENCY * span_of(uploads) / max(1, uploads) ** 2, 4)


def workload_of(seed: int, uploads: int, faults: list[dict]) -> dict:
    """``uploads`` in all, spread over ``span_of(uploads)`` seconds: mostly good images, a few bad and poison ones
    (at least one poison when an operator replay is drawn, so it has something to replay)."""
    poison = uploads // 15
    if any(f["action"] == "replay" for f in faults) and uploads > 1:
        poison = max(1, poison)
    bad = uploads // 15
    good = max(0, uploads - poison - bad)
    return {"uploads": good, "bad": bad, "poison": poison, "concurrency": CONCURRENCY,
            "spacing_seconds": spacing_for(uploads)}


def scenario_raw(adapter, seed: int, uploads: int = DEFAULT_UPLOADS, level: int | None = None,
                 nemesis: str = "random") -> dict:
    """The scenario of one soak seed (schemas/scenario.schema.json), as a catalogue file would hold it."""
    level = int(level or adapter.level)
    faults = draw_schedule(adapter, seed, uploads, level, nemesis)
    kinds = ", ".join(f["action"] for f in faults) or "no faults"
    return {
        "name": f"soak-s{seed}",
        "description": f"Soak seed {seed}: {uploads} uploads spread over time, random faults ({kinds}).",
        "windows": [],
        "requirements": ["BE-JOB-001", "BE-JOB-002", "BE-JOB-003"],
        "level": level,
        "exactness": "n/a",
        "grade": False,
        "drain_seconds": 60,
        "settle_seconds": 1,
        "nemesis_timeout_seconds": 180,
        "workload": workload_of(seed, uploads, faults),
        "faults": faults,
    }


def build_scenario(adapter, seed: int, uploads: int = DEFAULT_UPLOADS, level: int | None = None,
                   nemesis: str = "random", folder: Path | None = None):
    """A Scenario object of one seed, validated against the scenario schema; written as ``soak-s<seed>.toml``
    into ``folder`` when given (``harness run`` accepts that file)."""
    import tomli_w

    from .scenarios import Scenario, ScenarioError
    from .schemas import errors

    raw = scenario_raw(adapter, seed, uploads, level, nemesis)
    problems = errors("scenario.schema.json", raw)
    if problems:
        raise ScenarioError(f"soak seed {seed}: drew an invalid scenario:\n  " + "\n  ".join(problems))
    path = Path(folder or ".") / f"{raw['name']}.toml"
    if folder is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return Scenario(path, raw)


def seeds_from(seed: int, count: int) -> list[int]:
    return [int(seed) + k for k in range(int(count))]


def replay_command(sut: str, seed: int, uploads: int, level: int, nemesis: str, default_level: int) -> str:
    parts = [f"harness soak --sut {sut} --seeds 1 --seed {seed}"]
    if uploads != DEFAULT_UPLOADS:
        parts.append(f"--uploads {uploads}")
    if nemesis != "random":
        parts.append(f"--nemesis {nemesis}")
    if level != default_level:
        parts.append(f"--level {level}")
    return " ".join(parts)


def runs_alone(raw: dict) -> str | None:
    for fault in raw["faults"]:
        if fault["action"] == "restart_service":
            return f"restarts {fault['service']}"
    return None


# --- one seed's figures and the report ------------------------------------------------------------------------------

def _bad_count(verdicts: dict, name: str):
    v = verdicts.get(name)
    if v is None or v["status"] == "unknown":
        return None
    return len(v.get("evidence") or []) if v["status"] == "invalid" else 0


def seed_entry(seed: int, result: dict, run_dir: Path, base: Path, raw: dict, seconds: float, replay: str) -> dict:
    """What the soak report keeps of one seed's run: verdict per checker, false alarms with evidence, figures."""
    verdicts = {v["invariant"]: v for v in result.get("verdicts") or []}
    final_path = Path(run_dir) / "final.json"
    final = json.loads(final_path.read_text()) if final_path.exists() else {}
    states = [(a.get("body") or {}).get("state") for a in (final.get("attachments") or {}).values()]
    coverage = verdicts.get("fault_coverage") or {}
    scheduled = len(raw["faults"])
    missing = len(coverage.get("evidence") or []) if coverage.get("status") == "unknown" else 0
    w = raw["workload"]
    figures = {
        "uploads": int(w["uploads"]) + int(w.get("bad", 0)) + int(w.get("poison", 0)),
        "accepted": len(states), "ready": states.count("ready"), "failed": states.count("failed"),
        "faults_scheduled": scheduled, "faults_happened": scheduled - missing,
        "lost": _bad_count(verdicts, "lost_accepted_work"),
        "duplicates": _bad_count(verdicts, "duplicate_effects"),
        "regressions": _bad_count(verdicts, "state_regression"),
    }

    def brief(v):
        return {"invariant": v["invariant"], "summary": v["summary"], "evidence": (v.get("evidence") or [])[:5]}

    try:
        shown = str(Path(run_dir).relative_to(base))
    except ValueError:
        shown = str(run_dir)
    return {
        "seed": seed, "run_dir": shown, "verdict": result["verdict"], "error": result.get("error"),
        "seconds": round(seconds, 1), "faults": raw["faults"], "workload": raw["workload"],
        "checkers": {name: v["status"] + ("" if v.get("exercised", True) or v["status"] != "valid" else " (idle)")
                     for name, v in verdicts.items()},
        # tampered counts as a false alarm too: a correct implementation's run must never be called tampered
        "invalid": [brief(v) for v in verdicts.values() if v["status"] in ("invalid", "tampered")],
        "unknown": [brief(v) for v in verdicts.values() if v["status"] == "unknown"],
        "figures": figures, "replay": replay, "scenario_file": f"{shown}/{raw['name']}.toml",
    }


def summarize(entries: list[dict]) -> dict:
    """Totals over the seeds: false alarms (every invalid), unknowns, figures, faults by kind, per checker counts."""
    totals = {k: 0 for k in FIGURES}
    undecided = {k: 0 for k in ("lost", "duplicates", "regressions")}
    for e in entries:
        for k in FIGURES:
            value = e["figures"].get(k)
            if value is None:
                undecided[k] = undecided.get(k, 0) + 1
            else:
                totals[k] += int(value)
    kinds: dict[str, int] = {}
    for e in entries:
        for f in e["faults"]:
            kinds[f["action"]] = kinds.get(f["action"], 0) + 1
    checkers: dict[str, dict[str, int]] = {}
    for e in entries:
        for name, status in e["checkers"].items():
            row = checkers.setdefault(name, {"valid": 0, "idle": 0, "invalid": 0, "unknown": 0})
            key = "idle" if status.endswith("(idle)") else status
            row[key] = row.get(key, 0) + 1  # "tampered" too: the harness's faults changed under a seed's run
    false_alarms = [{"seed": e["seed"], "run_dir": e["run_dir"], "replay": e["replay"], **v}
                    for e in entries for v in e["invalid"]]
    unknowns = [{"seed": e["seed"], "invariant": v["invariant"], "summary": v["summary"]}
                for e in entries for v in e["unknown"]]
    errors = [{"seed": e["seed"], "error": e["error"]} for e in entries if e.get("error")]
    return {"seeds": len(entries), "false_alarms": false_alarms, "unknowns": unknowns, "errors": errors,
            "figures": totals, "figures_undecided": {k: v for k, v in undecided.items() if v},
            "faults_by_kind": dict(sorted(kinds.items())), "checkers": dict(sorted(checkers.items())),
            "verdicts": {s: sum(e["verdict"] == s for e in entries)
                         for s in ("valid", "invalid", "unknown", "tampered")}}


def exit_code(summary: dict) -> int:
    """1 with any false alarm, 2 when a seed's run did not complete (or no seed ran), else 0 (unknowns reported)."""
    if summary["false_alarms"]:
        return 1
    if summary["errors"] or not summary["seeds"]:
        return 2
    return 0


def render_summary(results: dict) -> str:
    s = results["summary"]
    fig = s["figures"]
    lines = [f"# Soak: {results['sut']['name']}, {s['seeds']} seeds", "",
             f"- seeds: {', '.join(str(e['seed']) for e in results['runs'])} (level {results['level']}, nemesis "
             f"{results['nemesis']}, {results['uploads']} uploads each, parallel {results['parallel']})",
             f"- **false alarms: {len(s['false_alarms'])}** (every `invalid` on a correct implementation); "
             f"unknown verdicts: {len(s['unknowns'])}; run errors: {len(s['errors'])}",
             f"- uploads {fig['uploads']} (accepted {fig['accepted']}, ready {fig['ready']}, failed {fig['failed']}); "
             f"faults scheduled {fig['faults_scheduled']}, happened {fig['faults_happened']}",
             f"- lost {fig['lost']}, duplicates {fig['duplicates']}, regressions {fig['regressions']}"
             + (f" (undecided in: {s['figures_undecided']})" if s["figures_undecided"] else ""),
             f"- faults by kind: {', '.join(f'{k} {v}' for k, v in s['faults_by_kind'].items()) or 'none'}",
             f"- time: {results['seconds']:.0f}s", "",
             "| seed | verdict | faults | uploads | accepted | ready | failed | lost | dup | regr | invalid | unknown | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in results["runs"]:
        f = e["figures"]
        show = lambda v: "?" if v is None else str(v)  # noqa: E731
        lines.append(f"| {e['seed']} | {e['verdict']} | {', '.join(x['action'] for x in e['faults']) or '—'} | "
                     f"{f['uploads']} | {f['accepted']} | {f['ready']} | {f['failed']} | {show(f['lost'])} | "
                     f"{show(f['duplicates'])} | {show(f['regressions'])} | "
                     f"{', '.join(v['invariant'] for v in e['invalid']) or '—'} | "
                     f"{', '.join(v['invariant'] for v in e['unknown']) or '—'} | {e['seconds']:.0f} |")
    lines += ["", "## Checkers over the seeds", "", "| checker | valid | valid, nothing to judge | invalid | unknown |",
              "|---|---|---|---|---|"]
    for name, row in s["checkers"].items():
        lines.append(f"| `{name}` | {row['valid']} | {row['idle']} | {row['invalid']} | {row['unknown']} |")
    lines += ["", "## False alarms", ""]
    if not s["false_alarms"]:
        lines.append("None.")
    for alarm in s["false_alarms"]:
        lines.append(f"- seed {alarm['seed']}: `{alarm['invariant']}`: {alarm['summary']} (run `{alarm['run_dir']}`; "
                     f"replay: `{alarm['replay']}`)")
        for ev in alarm["evidence"]:
            lines.append(f"  - {ev.get('message', ev)}")
    if s["unknowns"]:
        lines += ["", "## Unknown verdicts", ""]
        lines += [f"- seed {u['seed']}: `{u['invariant']}`: {u['summary']}" for u in s["unknowns"]]
    if s["errors"]:
        lines += ["", "## Run errors", ""] + [f"- seed {x['seed']}: {x['error']}" for x in s["errors"]]
    lines += ["", "## Replay one seed", ""] + [f"- `{e['replay']}`" for e in results["runs"]]
    return "\n".join(lines) + "\n"


def write_reports(soak_dir: Path, results: dict) -> None:
    (Path(soak_dir) / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    (Path(soak_dir) / "summary.md").write_text(render_summary(results), encoding="utf-8")


def recheck(soak_dir: Path) -> dict:
    """Recompute every seed of a stored soak from its run folder, without services, and rewrite the reports."""
    from .runner import check_run_dir
    from .scenarios import load_file

    soak_dir = Path(soak_dir)
    stored = json.loads((soak_dir / "results.json").read_text())
    runs = []
    for e in stored["runs"]:
        result = check_run_dir(soak_dir / e["run_dir"], write=True)
        raw = load_file(soak_dir / e["scenario_file"]).raw
        runs.append(seed_entry(e["seed"], result, soak_dir / e["run_dir"], soak_dir, raw, e["seconds"], e["replay"]))
    summary = summarize(runs)
    results = {**stored, "runs": runs, "summary": summary, "verdict": verdict_of(summary)}
    write_reports(soak_dir, results)
    return results


def verdict_of(summary: dict) -> str:
    return "invalid" if summary["false_alarms"] else ("unknown" if summary["errors"] or summary["unknowns"]
                                                      else "valid")


# --- running it -----------------------------------------------------------------------------------------------------

def soak(adapter, sut: str, seeds: list[int], *, uploads: int = DEFAULT_UPLOADS, level: int | None = None,
         nemesis: str = "random", parallel: int = 1, reports_dir: Path | None = None, progress=print,
         keep_data: bool = False, stack=None) -> tuple[dict, Path]:
    """Run one scenario per seed on one shared stack (``parallel`` side by side; one restarting a service alone)."""
    from .grade_schedule import _run_side_by_side
    from .runner import REPORTS_DIR, ScenarioRun

    level = int(level or adapter.level)
    began = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    soak_dir = Path(reports_dir or REPORTS_DIR) / f"soak-{stamp}-{adapter.name}-L{level}-s{seeds[0]}x{len(seeds)}"
    soak_dir.mkdir(parents=True, exist_ok=True)
    plans = []
    for seed in seeds:
        run_dir = soak_dir / f"seed-{seed}"
        scenario = build_scenario(adapter, seed, uploads, level, nemesis, folder=run_dir)
        replay = replay_command(sut, seed, uploads, level, nemesis, int(adapter.level))
        plans.append((seed, scenario, run_dir, replay))
    progress(f"soak of {adapter.name} at level {level}: {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
             f"{uploads} uploads each, nemesis {nemesis}, up to {parallel} side by side")
    for seed, scenario, _, replay in plans:
        faults = "; ".join(describe_fault(f) for f in scenario.raw["faults"]) or "no faults"
        progress(f"  seed {seed}: {faults}")
        progress(f"    replay: {replay}")
    progress(f"reports: {soak_dir}")
    own_stack = stack is None
    if own_stack:
        stack, _ = start_stack(soak_dir / "stack", progress=progress, keep_data=keep_data)  # exit 3 if it fails
    entries: dict[int, dict] = {}
    lock = threading.Lock()
    active: dict[str, ScenarioRun] = {}
    quiet = lambda text: None  # noqa: E731 - a seed's own lines would drown the soak's progress

    def run_one(plan) -> None:
        seed, scenario, run_dir, replay = plan
        t = time.monotonic()
        run = ScenarioRun(scenario, adapter, stack, seed, level, run_dir=run_dir, progress=quiet)
        with lock:
            active[scenario.name] = run
        try:
            result = run.execute()
        finally:
            with lock:
                active.pop(scenario.name, None)
        seconds = time.monotonic() - t
        entry = seed_entry(seed, result, run_dir, soak_dir, scenario.raw, seconds, replay)
        with lock:
            entries[seed] = entry
            done = len(entries)
        elapsed = time.monotonic() - began
        eta = elapsed / done * (len(plans) - done)
        bad = ", ".join(v["invariant"] for v in entry["invalid"])
        unknown = ", ".join(v["invariant"] for v in entry["unknown"])
        progress(f"seed {done}/{len(plans)} (seed {seed}): {result['verdict'].upper()} in {seconds:.0f}s"
                 + (f" — INVALID: {bad}" if bad else "") + (f" — unknown: {unknown}" if unknown else "")
                 + f"; elapsed {elapsed:.0f}s, ETA {eta:.0f}s")
        for v in entry["invalid"]:
            progress(f"    {v['invariant']}: {v['summary']}")
            for ev in v["evidence"][:3]:
                progress(f"      - {ev.get('message', ev)}")
            progress(f"    replay: {replay}")

    alone = [p for p in plans if parallel > 1 and runs_alone(p[1].raw)]
    shared = [p for p in plans if p not in alone]
    try:
        for plan in alone:
            run_one(plan)
        if parallel == 1:
            for plan in shared:
                run_one(plan)
        elif shared:
            _run_side_by_side(shared, run_one, parallel, active, lock)
    finally:
        if own_stack:
            stack.stop()
    runs = [entries[seed] for seed in seeds if seed in entries]
    summary = summarize(runs)
    results = {"report_version": 1, "kind": "soak", "run_id": soak_dir.name,
               "sut": {**adapter.summary(), "given": sut}, "level": level, "nemesis": nemesis, "uploads": uploads,
               "parallel": parallel, "seeds": seeds, "seconds": round(time.monotonic() - began, 1),
               "runs": runs, "summary": summary, "verdict": verdict_of(summary)}
    write_reports(soak_dir, results)
    return results, soak_dir


def describe_fault(fault: dict) -> str:
    what = {"failpoint": lambda: f"failpoint {fault.get('window')}",
            "sigkill": lambda: f"sigkill {fault.get('role')}", "sigstop": lambda: f"sigstop {fault.get('role')}",
            "toxic": lambda: f"{fault.get('toxic')} on {fault.get('service')}"
                             + (f" of {fault['role']}" if fault.get("role") else ""),
            "restart_service": lambda: f"restart {fault.get('service')}",
            "hold": lambda: f"hold {', '.join(fault.get('hold') or [])}",
            "start_instance": lambda: f"start another {fault.get('role')}"}.get(fault["action"],
                                                                                lambda: fault["action"])()
    return what + (f" at {fault['at']}s" if fault.get("at") is not None else "")
