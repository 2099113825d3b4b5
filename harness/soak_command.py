"""`harness soak`: the command in front of the two soaks — many seeds of random faults (:mod:`harness.soak`) or,
without ``--seeds``, one long run with a random mix of every fault kind (:mod:`harness.soak_long`)."""

from __future__ import annotations

from pathlib import Path

from .soak import NEMESES, SoakError, exit_code, seeds_from, soak
from .run_driver import draw_seed
from .soak_long import soak_long


def run_command(args, progress=print) -> int:
    """`harness soak` from parsed arguments: checks them, runs, prints the totals, returns the exit code."""

    from . import adapter as adapter_mod
    from .adapter_check import check, render

    if args.nemesis not in NEMESES:
        raise SoakError(f"--nemesis must be one of {', '.join(NEMESES)}, got {args.nemesis!r}")
    report = check(args.sut, args.level)
    if not report.ok:
        import sys

        print(render(report), file=sys.stderr)
        raise SoakError("soak refused: fix the adapter file (harness adapter check FILE lists the same problems)")
    adapter = adapter_mod.load(args.sut)
    seed = draw_seed(args.seed)
    if getattr(args, "seeds", None) is None:  # no --seeds: ONE long run (harness/soak_long.py)
        return _run_long(args, adapter, seed, progress)
    seeds = seeds_from(seed, args.seeds)
    results, soak_dir = soak(adapter, args.sut, seeds, uploads=args.uploads, level=args.level, nemesis=args.nemesis,
                             parallel=args.parallel, reports_dir=Path(args.reports) if args.reports else None,
                             progress=progress, keep_data=args.keep_data)
    s = results["summary"]
    fig = s["figures"]
    print()
    print(f"SOAK {adapter.name} level {results['level']}, {len(seeds)} seeds from {seed}: "
          f"{len(s['false_alarms'])} false alarms, {len(s['unknowns'])} unknown verdicts, {len(s['errors'])} run errors")
    print(f"  uploads {fig['uploads']} (accepted {fig['accepted']}, ready {fig['ready']}, failed {fig['failed']}), "
          f"faults {fig['faults_happened']} of {fig['faults_scheduled']} happened, lost {fig['lost']}, duplicates "
          f"{fig['duplicates']}, regressions {fig['regressions']}, time {results['seconds']:.0f}s")
    for alarm in s["false_alarms"]:
        print(f"  FALSE ALARM seed {alarm['seed']}: {alarm['invariant']}: {alarm['summary']}")
        print(f"    replay: {alarm['replay']}")
    print(f"reports: {soak_dir}/summary.md  {soak_dir}/results.json")
    return exit_code(s)


def _run_long(args, adapter, seed: int, progress) -> int:
    results, soak_dir = soak_long(adapter, args.sut, seed, uploads=args.uploads, level=args.level,
                                  nemesis=args.nemesis, reports_dir=Path(args.reports) if args.reports else None,
                                  progress=progress, keep_data=args.keep_data)
    s = results["summary"]
    fig = s["figures"]
    print()
    print(f"LONG SOAK {adapter.name} level {results['level']} seed {seed}: {results['verdict'].upper()}, "
          f"{len(s['false_alarms'])} invalid checkers, {len(s['unknowns'])} unknown")
    print(f"  uploads {fig['uploads']} (accepted {fig['accepted']}, ready {fig['ready']}, failed {fig['failed']})")
    print(f"  faults {fig['faults_happened']} of {fig['faults_scheduled']} happened: "
          + ", ".join(f"{k} {v}" for k, v in s["faults_by_kind"].items()))
    print(f"  lost {fig['lost']}, duplicates {fig['duplicates']}, regressions {fig['regressions']}, "
          f"time {results['seconds']:.0f}s (" + ", ".join(f"{k} {v:.0f}s" for k, v in results["timings"].items())
          + ")")
    for alarm in s["false_alarms"]:
        print(f"  INVALID {alarm['invariant']}: {alarm['summary']}")
    for u in s["unknowns"]:
        print(f"  unknown {u['invariant']}: {u['summary']}")
    print(f"reports: {soak_dir}/summary.md  {soak_dir}/results.json  (re-check: harness check {soak_dir})")
    return exit_code(s)
