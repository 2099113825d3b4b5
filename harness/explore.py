"""`harness explore`: Hypothesis draws fault schedules and small workloads, runs each as a real scenario on one
shared stack, and on a failing verdict shrinks to the smallest schedule and workload that still fail.

A drawn case is a list of fault picks — (kind, time slot, variant) — and an upload count. Each pick becomes a
scenario ``[[faults]]`` entry through the kind's own ``draw`` (chaos/kinds/: roles through the adapter's
@consumers / @recovers_work / window roles, only kinds the adapter can take), fed a ``random.Random(variant)``, at
the slot's time: Hypothesis shrinks a case by deleting picks, lowering the kind's index, the time and the variant
(each toward a simpler, deterministic choice) and the upload count. The scenario is an ordinary one (a TOML file
``harness run FILE`` accepts); a case fails when its verdict is ``invalid``.

The first failing case is shrunk greedily at once (one pick dropped at a time, then the uploads down to the least),
before Hypothesis' own shrink, which with runs of a minute may spend the budget on times and uploads first.
Every case that failed is kept; the smallest (``size_key``: fewest faults, then fewest uploads, then earliest and
simplest picks) is the answer, whether Hypothesis' shrink ended or the budget did (after the budget no case runs:
Hypothesis sees them pass and stops). The answer is replayed once more when the budget allows, and printed as the
exact ``harness run`` command. Seeded: ``--seed`` fixes Hypothesis' draws and every run's seed.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path


from . import soak as soak_mod
from .errors import UsageError
from .run_driver import busy_roles, draw_seed, start_stack

SLOT_SECONDS = 0.25
SPAN = 6.0  # the workload is spread over this many seconds
FAULT_SPAN = 4.0  # faults fall within its first seconds, so work is still coming when they strike
MAX_FAULTS = 3
# How long a case's drain waits at most for jobs not yet terminal — never less than the implementation needs to
# recover a job whose owner died (the runner's drain_budget: its lease and two sweeps, twice, plus 10 s).
DRAIN_SECONDS = 20.0
UPLOADS = (4, 10)
FAILPOINT_TIMEOUT = 25  # a crash window not entered within this (the workload ended) is not waited for longer
VARIANTS = 255


class ExploreError(UsageError):
    """An exploration asked for something it cannot do: exit 2 (harness/errors.py)."""


def parse_budget(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not match:
        raise ExploreError(f"--budget: expected a duration like 90s, 10m or 1h, got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def kinds_for(adapter, level: int, only: list[str] | None = None) -> list[str]:
    kinds, excluded = soak_mod.allowed_kinds(adapter, level)
    if only:
        unknown = [k for k in only if k not in soak_mod.KINDS]
        if unknown:
            raise ExploreError(f"--kinds: unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(soak_mod.KINDS)}")
        refused = [f"{k} ({excluded[k]})" for k in only if k in excluded]
        if refused:
            raise ExploreError("--kinds: this adapter cannot take " + "; ".join(refused))
        kinds = [k for k in kinds if k in only]
    if not kinds:
        raise ExploreError("no fault kind this adapter can take")
    return kinds


# --- a drawn case (pure) ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pick:
    kind: str
    slot: int  # the fault's time: slot × SLOT_SECONDS into the workload
    variant: int  # seeds the kind's own draw (role, window, service, durations)


@dataclass
class Case:
    picks: list[Pick]
    uploads: int
    seed: int
    faults: list[dict] = field(default_factory=list)


def faults_of(adapter, picks: list[Pick]) -> list[dict]:
    """The scenario faults of the picks, in order: each the kind's ``draw`` fed ``Random(variant)`` at its time; a
    role a failpoint is armed on, or one struck by an earlier pick, is not armed again (as in ``harness soak``). A
    pick nothing may take (every consumer held, say) becomes a short latency toxic."""
    consumers = adapter.roles_flagged("consumer")
    faults: list[dict] = []
    for pick in picks:
        at = round(max(1, pick.slot) * SLOT_SECONDS, 2)
        armed, struck = busy_roles(adapter, faults)
        rng = random.Random(pick.variant)
        spare = [] if any(f["action"] == "permute" for f in faults) else consumers
        fault = soak_mod.draw_one(pick.kind, rng, adapter, at, [r for r in adapter.roles if r not in armed], spare,
                                  armed | struck)
        if fault is None:
            fault = {"action": "toxic", "service": "postgres", "toxic": "latency", "params": {"ms": 50}, "at": at,
                     "duration": 0.5}
        if fault["action"] == "failpoint":
            fault["timeout"] = FAILPOINT_TIMEOUT
        faults.append(fault)
    return faults


def scenario_raw(adapter, case: Case, level: int, name: str, drain_seconds: float = DRAIN_SECONDS) -> dict:
    faults = case.faults or faults_of(adapter, case.picks)
    return {
        "name": name,
        "description": f"Drawn by harness explore (seed {case.seed}): {case.uploads} uploads, "
                       f"{len(faults)} faults ({', '.join(soak_mod.describe_fault(f) for f in faults) or 'none'}).",
        "windows": [], "requirements": ["BE-JOB-001", "BE-JOB-002", "BE-JOB-003"], "level": level,
        "exactness": "n/a", "grade": False, "drain_seconds": drain_seconds, "settle_seconds": 1,
        "nemesis_timeout_seconds": 90,
        "workload": {"uploads": case.uploads, "concurrency": 2, "paced": True,
                     "spacing_seconds": round(SPAN / max(1, case.uploads), 3)},
        "faults": faults,
    }


def write_scenario(raw: dict, folder: Path) -> Path:
    """The scenario as a TOML file named after it (``harness run FILE`` loads it)."""
    import tomli_w

    from .schemas import errors

    problems = errors("scenario.schema.json", raw)
    if problems:
        raise ExploreError(f"explore drew an invalid scenario {raw['name']}:\n  " + "\n  ".join(problems))
    path = Path(folder) / f"{raw['name']}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return path


def size_key(case: Case) -> tuple:
    """Smaller is simpler: fewer faults, fewer uploads, then earlier, lower-indexed, lower-variant picks."""
    return (len(case.picks), case.uploads, sum(p.slot for p in case.picks),
            tuple(sorted((p.kind, p.slot, p.variant) for p in case.picks)))


def smallest(cases: list[Case]) -> Case | None:
    return min(cases, key=size_key) if cases else None


def replay_command(path: Path, sut: str, seed: int, level: int, default_level: int) -> str:
    return f"harness run {path} --sut {sut} --seed {seed}" + (f" --level {level}" if level != default_level else "")


# --- the search ---------------------------------------------------------------------------------------------------------

def strategy(kinds: list[str], seed: int, max_faults: int = MAX_FAULTS, uploads: tuple[int, int] = UPLOADS):
    from hypothesis import strategies as st

    pick = st.builds(Pick, st.sampled_from(kinds), st.integers(1, int(FAULT_SPAN / SLOT_SECONDS)),
                     st.integers(0, VARIANTS))
    return st.builds(lambda picks, n: Case(list(picks), n, seed),
                     st.lists(pick, min_size=1, max_size=max_faults), st.integers(*uploads))


class _Failed(Exception):
    pass


class _Smallest(BaseException):
    """Raised once a failing case has one fault and the least uploads: the search stops (a BaseException, as
    ``_OutOfBudget``, so Hypothesis stops at once), the time left goes to the replay."""


class _OutOfBudget(BaseException):
    """Raised once the budget is spent: Hypothesis stops at once (not an Exception, so neither a failure to shrink
    nor something it retries); the failing cases seen so far are kept by ``explore``."""


def explore(adapter, sut: str, *, budget: float, seed: int, level: int | None = None, kinds: list[str] | None = None,
            max_faults: int = MAX_FAULTS, reports_dir: Path | None = None, progress=print, stack=None,
            keep_data: bool = False, confirm: bool = True, drain_seconds: float = DRAIN_SECONDS) -> tuple[dict, Path]:
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hseed

    from .runner import REPORTS_DIR, ScenarioRun
    from .scenarios import Scenario

    level = int(level or adapter.level)
    chosen = kinds_for(adapter, level, kinds)
    began = time.monotonic()
    deadline = began + budget
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = Path(reports_dir or REPORTS_DIR) / f"explore-{stamp}-{adapter.name}-L{level}-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    progress(f"explore {adapter.name} at level {level}, seed {seed}, budget {budget:.0f}s: up to {max_faults} faults "
             f"of {', '.join(chosen)}; {UPLOADS[0]}-{UPLOADS[1]} uploads over {SPAN:g}s")
    progress(f"reports: {out}")
    own_stack = stack is None
    if own_stack:
        stack, _ = start_stack(out / "stack", progress=progress, keep_data=keep_data)  # exit 3 if it fails
    runs: list[dict] = []
    failing: list[tuple[Case, dict]] = []

    def run_case(case: Case, tag: str) -> dict:
        case.faults = faults_of(adapter, case.picks)
        n = len(runs) + 1
        name = f"explore-{n:03d}"
        raw = scenario_raw(adapter, case, level, name, drain_seconds)
        path = write_scenario(raw, out / "cases" / name)
        t = time.monotonic()
        result = ScenarioRun(Scenario(path, raw), adapter, stack, seed, level, run_dir=out / "cases" / name / "run",
                             progress=lambda text: None).execute()
        bad = [v["invariant"] for v in result.get("verdicts") or [] if v["status"] == "invalid"]
        entry = {"n": n, "tag": tag, "scenario": str(path), "verdict": result["verdict"], "invalid": bad,
                 "error": result.get("error"), "uploads": case.uploads, "faults": raw["faults"],
                 "picks": [p.__dict__ for p in case.picks], "seconds": round(time.monotonic() - t, 1),
                 "replay": replay_command(path, sut, seed, level, int(adapter.level))}
        runs.append(entry)
        progress(f"#{n} [{time.monotonic() - began:4.0f}s] {tag}: {result['verdict'].upper()} in {entry['seconds']:.0f}s"
                 f" — {case.uploads} uploads; " + ("; ".join(soak_mod.describe_fault(f) for f in raw["faults"]) or "no faults")
                 + (f" — INVALID: {', '.join(bad)}" if bad else ""))
        return entry

    seen: dict[str, dict] = {}  # a scenario already run (shrinking often redraws one) is not run again
    greedy_steps: list[Case] = []  # the smaller failing cases the greedy pass kept

    def run_once(case: Case) -> dict | None:
        """The case's entry, run now unless an equal scenario ran already; None once the budget is spent."""
        if time.monotonic() >= deadline:
            return None
        case.faults = faults_of(adapter, case.picks)
        same = json.dumps([case.uploads, case.faults], sort_keys=True)
        if same not in seen:
            seen[same] = run_case(case, "shrink" if failing else "draw")
        entry = seen[same]
        if entry["verdict"] == "invalid":
            failing.append((case, entry))
        return entry

    def greedy(best: Case) -> Case:
        """Drop one pick at a time, then the uploads down to the least, keeping every change that still fails, while
        the budget lasts: the smallest failing case then."""
        while time.monotonic() < deadline:
            smaller = [Case(best.picks[:i] + best.picks[i + 1:], best.uploads, seed) for i in range(len(best.picks))
                       if len(best.picks) > 1]
            if best.uploads > UPLOADS[0]:
                smaller.append(Case(list(best.picks), UPLOADS[0], seed))
            for candidate in smaller:
                if run_once(candidate) is None:
                    break
            shrunk = smallest([c for c, _ in failing])
            if shrunk is None or shrunk is best or size_key(shrunk) >= size_key(best):
                break
            best = shrunk
            greedy_steps.append(best)
        return best

    def test(case: Case) -> None:
        best = smallest([c for c, _ in failing])
        if best is not None and len(best.picks) == 1 and best.uploads == UPLOADS[0]:
            raise _Smallest()  # one fault and the least uploads: only its time and variant could still shrink
        first = not failing
        entry = run_once(case)
        if entry is None:
            raise _OutOfBudget()
        if entry["verdict"] == "invalid":
            if first:
                # The first failure is shrunk greedily at once, before Hypothesis' own shrink: with runs of a minute,
                # Hypothesis' first steps shrink the uploads and the faults' times, and a budget spent on them never
                # tried dropping the fault that does not matter (a CI rehearsal of tests/broken/no_outbox: two faults
                # left when 240 s ran out, the one the bug needs among them).
                greedy(case)
            raise _Failed(entry["invalid"])

    searched = settings(database=None, max_examples=500, deadline=None, derandomize=False,
                        phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck),
                        verbosity=Verbosity.quiet, report_multiple_bugs=False, print_blob=False)
    wrapped = hseed(seed)(searched(given(strategy(chosen, seed, max_faults))(test)))
    stopped = "budget"
    try:
        try:
            wrapped()
            stopped = "search exhausted, no failing case"
        except _OutOfBudget:
            stopped = "budget spent while shrinking" if failing else "budget spent, no failing case"
        except _Smallest:
            stopped = "one fault and the least uploads found: nothing smaller to look for"
        except Exception as exc:  # the shrunk failure (or Flaky, when a shrunk case did not fail again)
            stopped = f"shrink done ({type(exc).__name__})"
        best = smallest([c for c, _ in failing])
        # Hypothesis stops shrinking on its own after a few minutes (its shrink time limit): with runs of a minute
        # that is a handful of steps. While the budget lasts, go on greedily from the smallest failing case.
        if best is not None and time.monotonic() < deadline:
            best = greedy(best)
        if greedy_steps:
            stopped += "; greedy shrink"
        answer = next((e for c, e in failing if c is best), None)
        confirmed = None
        if answer is not None and confirm and time.monotonic() < deadline + 120:
            again = run_case(Case(list(best.picks), best.uploads, seed), "replay")
            confirmed = again["verdict"] == "invalid"
    finally:
        if own_stack:
            stack.stop()
    results = {"kind": "explore", "sut": {**adapter.summary(), "given": sut}, "level": level, "seed": seed,
               "budget_seconds": budget, "kinds": chosen, "max_faults": max_faults, "stopped": stopped,
               "seconds": round(time.monotonic() - began, 1), "runs": runs, "failing": len(failing),
               "smallest": answer, "replayed_invalid": confirmed}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return results, out


def run_command(args, progress=print) -> int:
    """`harness explore`: 1 when a failing case was found (its replay printed), 0 when none within the budget."""
    from . import adapter as adapter_mod
    from .adapter_check import check, render

    report = check(args.sut, args.level)
    if not report.ok:
        import sys

        print(render(report), file=sys.stderr)
        raise ExploreError("explore refused: fix the adapter file (harness adapter check FILE lists the same problems)")
    adapter = adapter_mod.load(args.sut)
    seed = draw_seed(args.seed)
    results, out = explore(adapter, args.sut, budget=parse_budget(args.budget), seed=seed, level=args.level,
                           kinds=args.kinds.split(",") if args.kinds else None, max_faults=args.max_faults,
                           reports_dir=Path(args.reports) if args.reports else None, progress=progress,
                           keep_data=args.keep_data, drain_seconds=args.drain)
    print()
    best = results["smallest"]
    print(f"EXPLORE {adapter.name} seed {seed}: {len(results['runs'])} runs in {results['seconds']:.0f}s, "
          f"{results['failing']} failing; stopped: {results['stopped']}")
    if best is None:
        print("  no failing case found")
        print(f"reports: {out}/results.json")
        return 0
    print(f"  smallest failing case: {len(best['faults'])} faults, {best['uploads']} uploads — INVALID: "
          f"{', '.join(best['invalid'])}")
    for f in best["faults"]:
        print(f"    - {soak_mod.describe_fault(f)}")
    if results["replayed_invalid"] is not None:
        print(f"  replayed once more: {'INVALID again' if results['replayed_invalid'] else 'did NOT fail again (flaky)'}")
    print(f"  replay: {best['replay']}")
    print(f"reports: {out}/results.json")
    return 1
