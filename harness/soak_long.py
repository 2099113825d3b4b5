"""`harness soak --uploads N` without ``--seeds``: ONE long run — N uploads at an even rate, a seeded random mix of
every fault kind the adapter can take spread over the whole run, every checker over the whole history.

The schedule is drawn like a soak seed's (chaos/kinds: each kind's ``draw``, ``allowed``, ``WEIGHT``, ``ONCE``;
roles targeted through the adapter's @consumers / @recovers_work / window roles), but it is long: every allowed kind
at least once, then one more fault every ``FAULT_EVERY`` seconds, each at its own time slot. A fault whose role was
struck in the last ``BUSY_SECONDS`` avoids it (an armed failpoint is not disarmed by a kill). ``permute`` is left out:
it holds every consumer through the whole workload, which in a long run is a backlog of the entire run, not a fault.

The run folder is an ordinary soak folder (``results.json`` kind ``soak``, one run, mode ``long``): ``harness check``
re-checks it without services; the scenario it ran is ``<run>/soak-long-s<seed>.toml``, which ``harness run`` accepts.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from . import soak as soak_mod
from .run_driver import busy_roles, start_stack
from .seeding import stream

RATE = 8.0  # uploads per second: 10 000 uploads over ~21 minutes
FAULT_EVERY = 20.0  # seconds between faults once every kind has had its turn
BUSY_SECONDS = 35.0  # a failpoint waits up to 30 s for its window: a role struck this recently takes no other fault
CONCURRENCY = 4
EXCLUDED = {"permute": "holds every consumer through the whole workload: in a long run, a backlog of the whole run"}
UNTIMED_SLACK = 150.0


def span_of(uploads: int) -> float:
    return max(soak_mod.MIN_SPAN, uploads / RATE)


def kinds_for(adapter, level: int) -> tuple[list[str], dict[str, str]]:
    kinds, excluded = soak_mod.allowed_kinds(adapter, level)
    excluded = {**excluded, **{k: why for k, why in EXCLUDED.items() if k in kinds}}
    return [k for k in kinds if k not in EXCLUDED], excluded


def draw_schedule(adapter, seed: int, uploads: int, level: int | None = None, nemesis: str = "random") -> list[dict]:
    """The long run's faults: the same adapter, seed, uploads and level always give the same list."""
    if nemesis not in soak_mod.NEMESES:
        raise soak_mod.SoakError(f"unknown nemesis {nemesis!r}; one of {', '.join(soak_mod.NEMESES)}")
    if nemesis == "none":
        return []
    level = int(level or adapter.level)
    rng = stream(seed, "soak-long-schedule")
    kinds, _ = kinds_for(adapter, level)
    if not kinds:
        return []
    span = span_of(uploads)
    count = max(len(kinds), int(span // FAULT_EVERY))
    order = list(kinds)
    rng.shuffle(order)  # every kind once, in a seeded order
    repeatable = [k for k in kinds if k not in soak_mod.ONCE]
    while len(order) < count and repeatable:
        order.append(rng.choices(repeatable, weights=[soak_mod.WEIGHTS[k] for k in repeatable])[0])
    lo, hi = 0.05 * span, 0.85 * span
    slot = (hi - lo) / len(order)
    consumers = adapter.roles_flagged("consumer")
    faults: list[dict] = []
    for n, kind in enumerate(order):
        at = round(lo + slot * (n + rng.uniform(0.1, 0.9)), 2)
        recent = [f for f in faults if f.get("at") is not None and at - f["at"] < BUSY_SECONDS]
        armed, struck = busy_roles(adapter, recent)
        roles = [r for r in adapter.roles if r not in armed]
        fault = soak_mod.draw_one(kind, rng, adapter, at, roles, consumers, armed | struck)
        if fault is None:
            fault = {"action": "toxic", "service": rng.choice(soak_mod.SERVICES), "toxic": "latency",
                     "params": {"ms": rng.randint(50, 400)}, "at": at, "duration": round(rng.uniform(0.5, 3), 2)}
        if fault.get("at") is None and fault.get("when") is None or fault["action"] == "replay":
            fault["timeout"] = round(span + UNTIMED_SLACK)  # waits for the end of a long workload
        elif "when" in fault and "timeout" in fault:
            fault["timeout"] = max(float(fault["timeout"]), 60.0)
        faults.append(fault)
    return faults


def workload_of(uploads: int, faults: list[dict]) -> dict:
    w = soak_mod.workload_of(0, uploads, faults)
    total = w["uploads"] + w["bad"] + w["poison"]
    return {**w, "concurrency": CONCURRENCY, "paced": True,
            "spacing_seconds": round(span_of(uploads) / max(1, total), 4)}


def scenario_raw(adapter, seed: int, uploads: int, level: int | None = None, nemesis: str = "random") -> dict:
    level = int(level or adapter.level)
    faults = draw_schedule(adapter, seed, uploads, level, nemesis)
    kinds: dict[str, int] = {}
    for f in faults:
        kinds[f["action"]] = kinds.get(f["action"], 0) + 1
    return {
        "name": f"soak-long-s{seed}",
        "description": f"Long soak, seed {seed}: {uploads} uploads at {RATE:g}/s, {len(faults)} random faults ("
                       + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none") + ").",
        "windows": [], "requirements": ["BE-JOB-001", "BE-JOB-002", "BE-JOB-003"], "level": level,
        "exactness": "n/a", "grade": False, "drain_seconds": 120, "settle_seconds": 2,
        "nemesis_timeout_seconds": 240,
        "workload": workload_of(uploads, faults),
        "faults": faults,
    }


def build_scenario(adapter, seed: int, uploads: int, level: int | None, nemesis: str, folder: Path):
    import tomli_w

    from .scenarios import Scenario, ScenarioError
    from .schemas import errors

    raw = scenario_raw(adapter, seed, uploads, level, nemesis)
    problems = errors("scenario.schema.json", raw)
    if problems:
        raise ScenarioError(f"long soak seed {seed}: drew an invalid scenario:\n  " + "\n  ".join(problems))
    path = Path(folder) / f"{raw['name']}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return Scenario(path, raw)


def replay_command(sut: str, seed: int, uploads: int, level: int, nemesis: str, default_level: int) -> str:
    parts = [f"harness soak --sut {sut} --uploads {uploads} --seed {seed}"]
    if nemesis != "random":
        parts.append(f"--nemesis {nemesis}")
    if level != default_level:
        parts.append(f"--level {level}")
    return " ".join(parts)


def soak_long(adapter, sut: str, seed: int, *, uploads: int, level: int | None = None, nemesis: str = "random",
              reports_dir: Path | None = None, progress=print, keep_data: bool = False, stack=None,
              every: float = 30.0) -> tuple[dict, Path]:
    """Run the long soak on one stack (its own unless given); progress every ``every`` seconds."""
    from .runner import REPORTS_DIR, ScenarioRun

    level = int(level or adapter.level)
    began = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    soak_dir = Path(reports_dir or REPORTS_DIR) / f"soak-{stamp}-{adapter.name}-L{level}-s{seed}-long{uploads}"
    run_dir = soak_dir / f"seed-{seed}"
    scenario = build_scenario(adapter, seed, uploads, level, nemesis, run_dir)
    raw = scenario.raw
    replay = replay_command(sut, seed, uploads, level, nemesis, int(adapter.level))
    _, excluded = kinds_for(adapter, level)
    w = raw["workload"]
    total = w["uploads"] + w["bad"] + w["poison"]
    progress(f"long soak of {adapter.name} at level {level}, seed {seed}: {total} uploads over "
             f"{span_of(uploads):.0f}s ({w['uploads']} good, {w['bad']} bad, {w['poison']} poison), "
             f"{len(raw['faults'])} faults, nemesis {nemesis}")
    for why in sorted(excluded.items()):
        progress(f"  kind left out: {why[0]} ({why[1]})")
    progress(f"  scenario: {run_dir / (raw['name'] + '.toml')}  (harness run FILE --sut {sut} --seed {seed})")
    progress(f"reports: {soak_dir}")
    own_stack = stack is None
    if own_stack:
        stack, _ = start_stack(soak_dir / "stack", progress=progress, keep_data=keep_data)  # exit 3 if it fails
    run = ScenarioRun(scenario, adapter, stack, seed, level, run_dir=run_dir,
                      progress=lambda text: progress(f"  | {text}") if "draining:" not in text else None)
    done = threading.Event()

    def ticker() -> None:
        while not done.wait(every):
            observer = getattr(run, "observer", None)
            if observer is None:
                continue
            ids = observer.ids
            states = [observer.states.get(a) for a in ids]
            lines = getattr(getattr(run, "history", None), "_seq", 0)
            elapsed = time.monotonic() - began
            progress(f"[{elapsed:5.0f}s] accepted {len(ids)}/{total}, ready {states.count('ready')}, failed "
                     f"{states.count('failed')}, pending {sum(s not in ('ready', 'failed') for s in states)}; "
                     f"history lines {lines}")

    thread = threading.Thread(target=ticker, name="soak-progress", daemon=True)
    thread.start()
    t = time.monotonic()
    try:
        result = run.execute()
    finally:
        done.set()
        if own_stack:
            stack.stop()
    seconds = time.monotonic() - t
    entry = soak_mod.seed_entry(seed, result, run_dir, soak_dir, raw, seconds, replay)
    summary = soak_mod.summarize([entry])
    results = {"report_version": 1, "kind": "soak", "mode": "long", "run_id": soak_dir.name,
               "sut": {**adapter.summary(), "given": sut}, "level": level, "nemesis": nemesis, "uploads": uploads,
               "parallel": 1, "seeds": [seed], "seconds": round(time.monotonic() - began, 1),
               "timings": result.get("timings", {}), "excluded_kinds": excluded,
               "runs": [entry], "summary": summary, "verdict": soak_mod.verdict_of(summary)}
    soak_mod.write_reports(soak_dir, results)
    return results, soak_dir

