"""`harness`: list scenarios, run one, grade an implementation, re-check a stored run, manage the stack."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EXIT = {"valid": 0, "invalid": 1, "unknown": 2}


def _progress(text: str) -> None:
    print(text, flush=True)


def _seed(value) -> int:
    if value is not None:
        return int(value)
    return int.from_bytes(os.urandom(4), "big") % 1_000_000


def cmd_scenarios(args) -> int:
    from . import scenarios

    chosen = scenarios.select(scenarios.catalogue(), level=args.level, requirement=args.requirement, window=args.window)
    if args.json:
        print(json.dumps([s.raw for s in chosen], indent=1))
        return 0
    print(f"{'scenario':52} {'lvl':3} {'windows':32} {'requirements':34} needs")
    for s in chosen:
        print(f"{s.name:52} {s.level:<3} {','.join(s.raw['windows']) or '—':32} "
              f"{','.join(s.raw['requirements']):34} {','.join(s.requires) or '—'}")
    print(f"{len(chosen)} scenarios")
    return 0


def _print_verdict(results: dict) -> None:
    for v in results.get("verdicts", []):
        flag = {"valid": "ok     ", "invalid": "INVALID", "unknown": "unknown"}[v["status"]]
        print(f"  {flag} {v['invariant']:20} {v['summary']}")
        if v["status"] != "valid":
            for e in v.get("evidence", [])[:3]:
                print(f"           - {e.get('message')} {e.get('attachment_id') or e.get('job_id') or ''}")


def cmd_run(args) -> int:
    from . import adapter as adapter_mod
    from . import scenarios
    from .runner import ScenarioRun
    from .stack import Stack

    scenario = scenarios.find(args.scenario)
    adapter = adapter_mod.load(args.sut)
    seed = _seed(args.seed)
    print(f"scenario {scenario.name}, implementation {adapter.name}, seed {seed}", flush=True)
    began = time.monotonic()
    stack = Stack.start(Path(args.stack_dir) if args.stack_dir else None)
    print(f"stack up in {time.monotonic() - began:.1f}s", flush=True)
    try:
        run = ScenarioRun(scenario, adapter, stack, seed, args.level, run_dir=args.run_dir, progress=_progress)
        results = run.execute()
    finally:
        stack.stop()
    print(f"verdict: {results['verdict'].upper()}  ({run.run_dir})")
    _print_verdict(results)
    print("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in results.get("timings", {}).items()))
    return EXIT[results["verdict"]]


def cmd_grade(args) -> int:
    from . import adapter as adapter_mod
    from .grade import grade

    adapter = adapter_mod.load(args.sut)
    level = int(args.level or adapter.level)
    seed = _seed(args.seed)
    results, grade_dir = grade(adapter, level, seed, only=args.only.split(",") if args.only else None,
                               reports_dir=Path(args.reports) if args.reports else None, progress=_progress)
    print()
    print(f"GRADE {adapter.name} level {level} seed {seed}: {results['verdict'].upper()}")
    for rid, req in sorted(results["requirements"].items()):
        print(f"  {rid} {req['status']:8} {req['why']}")
    print("where the time went:")
    for key, value in results["timings"].items():
        print(f"  {key:52} {value:7.1f}s")
    print(f"reports: {grade_dir}/summary.md  {grade_dir}/timeline.html  {grade_dir}/junit.xml")
    return EXIT[results["verdict"]]


def cmd_check(args) -> int:
    from .grade import recheck_grade
    from .runner import check_run_dir

    run_dir = Path(args.run_dir)
    stored_path = run_dir / "results.json"
    stored = json.loads(stored_path.read_text()) if stored_path.exists() else None
    if stored and stored.get("kind") == "grade":
        results = recheck_grade(run_dir)
    else:
        results = check_run_dir(run_dir, write=not args.no_write)
    print(f"verdict: {results['verdict'].upper()}")
    _print_verdict(results)
    for scenario in results.get("scenarios", []):
        print(f"  {scenario['verdict']:8} {scenario['name']} (seed {scenario['seed']})")
    if stored is not None:
        same = stored["verdict"] == results["verdict"]
        print(f"stored verdict: {stored['verdict'].upper()} — {'same' if same else 'DIFFERENT'}")
    return EXIT[results["verdict"]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("scenarios", help="list the scenario catalogue")
    p.add_argument("--level", type=int, help="only scenarios proving at most this level")
    p.add_argument("--requirement", help="only scenarios naming this requirement id (BE-JOB-00x)")
    p.add_argument("--window", help="only scenarios hitting this failure window")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_scenarios)

    p = sub.add_parser("run", help="run one scenario (starts a private stack)")
    p.add_argument("scenario")
    p.add_argument("--seed", type=int, help="seed of the workload and fault schedule (default: random, printed)")
    p.add_argument("--sut", default="reference", help="adapter file, folder or name (default: reference)")
    p.add_argument("--level", type=int, choices=[3, 4, 5])
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--stack-dir", type=Path)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("grade", help="grade an implementation: exit 0 valid, 1 invalid, 2 unknown/error")
    p.add_argument("--sut", required=True, help="adapter file, folder or name (e.g. reference)")
    p.add_argument("--level", type=int, choices=[3, 4, 5])
    p.add_argument("--seed", type=int)
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--reports", help="folder for the grade's report folder (default reports/runs)")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("check", help="re-check a stored run (or grade) folder without services")
    p.add_argument("run_dir")
    p.add_argument("--no-write", action="store_true", help="do not rewrite the reports")
    p.set_defaults(func=cmd_check)

    try:
        from .cli_stack import add_stack_commands
    except ImportError:
        add_stack_commands = None
    if add_stack_commands is not None:
        add_stack_commands(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 2
    except Exception as exc:  # configuration errors etc.: exit 2 (unknown/error), with the reason
        print(f"harness: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
