"""`harness`: list scenarios, run one, grade an implementation, re-check a stored run, write and check adapter
files, manage the stack."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .defaults import DEFAULT_PARALLEL

from .errors import EXIT_BY_VERDICT as EXIT  # 0 valid, 1 invalid or tampered, 2 unknown / not proven (errors.py)
KEEP_DATA_HELP = "keep the services' data folder (normally removed with the stack) for a post-mortem; its path is printed"


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value}")
    return number


def _progress(text: str) -> None:
    print(text, flush=True)


def _seed(value) -> int:
    from .run_driver import draw_seed  # the one seed drawing of every command (printed by each)

    return draw_seed(value)


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
        from .checklist import shown_status

        # A valid check that was not exercised proved nothing: shown as such, never "ok" (harness/checklist.py).
        flag = {"valid": "ok     ", "invalid": "INVALID", "unknown": "unknown", "tampered": "TAMPERED",
                "not exercised": "not exercised:"}[shown_status(v)]
        print(f"  {flag} {v['invariant']:20} {v['summary']}")
        if v["status"] != "valid":
            for e in v.get("evidence", [])[:3]:
                print(f"           - {e.get('message')} {e.get('attachment_id') or e.get('job_id') or ''}")


def cmd_run(args) -> int:
    from . import adapter as adapter_mod
    from . import scenarios
    from .runner import ScenarioRun

    scenario = scenarios.find(args.scenario)
    adapter = adapter_mod.load(args.sut)
    seed = _seed(args.seed)
    print(f"scenario {scenario.name}, implementation {adapter.name}, seed {seed}", flush=True)
    from .run_driver import start_stack

    # the grader's own services (a cluster scenario: a private cluster of that many nodes): exit 3 after one retry
    stack, _ = start_stack(Path(args.stack_dir) if args.stack_dir else None, progress=_progress,
                           keep_data=args.keep_data, rabbitmq_nodes=scenario.rabbitmq_nodes, retry=True)
    try:
        run = ScenarioRun(scenario, adapter, stack, seed, args.level, run_dir=args.run_dir, progress=_progress)
        results = run.execute()
    finally:
        stack.stop()
    print(f"verdict: {results['verdict'].upper()}  ({run.run_dir})")
    _print_verdict(results)
    print("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in results.get("timings", {}).items()))
    if results.get("timings_detail"):  # the phases' parts (harness/timing.py)
        print("parts: " + ", ".join(f"{k} {v:.1f}s" for k, v in results["timings_detail"].items()))
    return EXIT[results["verdict"]]


def cmd_grade(args) -> int:
    from . import adapter as adapter_mod
    from .adapter_check import check, render
    from .grade import grade

    profile = None
    if getattr(args, "profile", None):  # the course's level, scenario set, capabilities and timing bounds
        from .course_profile import ProfileError, load as load_profile, refusal

        try:
            profile = load_profile(args.profile)
        except ProfileError as exc:
            print(f"harness: {exc}", file=sys.stderr)
            return 2
        if args.level and args.level != profile.level:
            print(f"harness: --level {args.level} differs from the course profile's level {profile.level}",
                  file=sys.stderr)
            return 2
        args.level = profile.level
        args.only = args.only or (",".join(profile.scenarios) if profile.scenarios else None)
    report = check(args.sut, args.level)  # before any service starts: the same problems `adapter check` prints
    if not report.ok:
        print(render(report), file=sys.stderr)
        print("harness: grade refused: fix the adapter file (harness adapter check FILE lists the same problems)",
              file=sys.stderr)
        return 2
    adapter = adapter_mod.load(args.sut)
    if profile is not None:
        reasons = refusal(profile, adapter)
        if reasons:
            print(f"harness: grade refused by the course profile {profile.name}:", file=sys.stderr)
            for reason in reasons:
                print(f"  - {reason}", file=sys.stderr)
            return 2
    level = int(args.level or adapter.level)
    seed = _seed(args.seed)
    from .errors import retry_once

    results, grade_dir = retry_once(  # a stack that did not start, a full disk: once more, then exit 3
        lambda: grade(adapter, level, seed, only=args.only.split(",") if args.only else None,
                      reports_dir=Path(args.reports) if args.reports else None, progress=_progress,
                      keep_data=args.keep_data, parallel=args.parallel), _progress, "the grade")
    print()
    print(f"GRADE {adapter.name} level {level} seed {seed}: {results['verdict'].upper()}")
    for rid, req in sorted(results["requirements"].items()):
        print(f"  {rid} {req['status']:12} {req['why']}")
    rows = results.get("checklist") or {}
    if rows:
        print("checklist (the seeds' verification items):")
        for item_id, row in rows.items():
            print(f"  {item_id} {row['status']:12} {row['meaning']}"
                  + ("" if row["status"] in ("pass", "not required") else f" — {row['why']}"))
    print("where the time went:")
    for key, value in results["timings"].items():
        print(f"  {key:52} {value:7.1f}s")
    from .timing import table_lines

    for line in table_lines(results.get("time_went") or {}):  # per phase and part, over every scenario
        print(f"  {line}")
    print(f"reports: {grade_dir}/summary.md  {grade_dir}/timeline.html  {grade_dir}/junit.xml")
    return EXIT[results["verdict"]]


def cmd_grade_many(args) -> int:
    from .grade_many import run_command

    return run_command(args, _seed(args.seed), _progress)


def cmd_soak(args) -> int:
    from .soak_command import run_command

    return run_command(args, _progress)  # a SoakError is a HarnessError: main() prints it, exit 2


def cmd_explore(args) -> int:
    from .explore import run_command

    return run_command(args, _progress)  # an ExploreError is a HarnessError: main() prints it, exit 2


def cmd_mutate(args) -> int:
    from .mutate import run_command

    seed = _seed(args.seed)
    return run_command(args, seed, _progress)


def cmd_check(args) -> int:
    from .recheck import recheck

    run_dir = Path(args.run_dir)
    stored_path = run_dir / "results.json"
    stored = json.loads(stored_path.read_text()) if stored_path.exists() else None
    kind, results = recheck(run_dir, write=not args.no_write)  # a run, a grade or a soak, by what it stored
    if kind == "soak":
        from .soak import exit_code

        s = results["summary"]
        print(f"soak re-checked: {s['seeds']} seeds, {len(s['false_alarms'])} false alarms, "
              f"{len(s['unknowns'])} unknown verdicts (was {len(stored['summary']['false_alarms'])} false alarms)")
        for alarm in s["false_alarms"]:
            print(f"  FALSE ALARM seed {alarm['seed']}: {alarm['invariant']}: {alarm['summary']}")
        return exit_code(s)
    print(f"verdict: {results['verdict'].upper()}")
    _print_verdict(results)
    for scenario in results.get("scenarios", []):
        print(f"  {scenario['verdict']:8} {scenario['name']} (seed {scenario['seed']})")
    if stored is not None:
        same = stored["verdict"] == results["verdict"]
        print(f"stored verdict: {stored['verdict'].upper()} — {'same' if same else 'DIFFERENT'}")
    return EXIT[results["verdict"]]


def cmd_adapter_init(args) -> int:
    from .adapter_check import init

    try:
        path = init(args.path, force=args.force)
    except FileExistsError as exc:
        print(f"harness: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}: replace every CHANGE-ME, then run: harness adapter check {path}")
    return 0


def cmd_adapter_check(args) -> int:
    from .adapter_check import check, render

    report = check(args.file, args.level)
    print(render(report))
    return 0 if report.ok else 1


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
    p.add_argument("--keep-data", action="store_true", help=KEEP_DATA_HELP)
    _isolation_switch(p, "off")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("grade", help="grade an implementation: exit 0 valid, 1 invalid or tampered, 2 unknown or "
                                     "not proven, 3 the grader's infrastructure failed (retried once)")
    p.add_argument("--sut", required=True, help="adapter file, folder or name (e.g. reference)")
    p.add_argument("--level", type=int, choices=[3, 4, 5])
    p.add_argument("--seed", type=int)
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--reports", help="folder for the grade's report folder (default: reports/runs under the "
                                     "checkout, else under the current directory)")
    p.add_argument("--keep-data", action="store_true", help=KEEP_DATA_HELP)
    p.add_argument("--profile", metavar="FILE",
                   help="a course profile (TOML, schemas/course-profile.schema.json): its level, scenario set, "
                        "required capabilities and timing bounds; an adapter that claims otherwise is refused (exit 2)")
    p.add_argument("--parallel", type=_positive_int, default=DEFAULT_PARALLEL,
                   help=f"scenarios side by side on the stack, each with its own database, vhost, bucket and "
                        f"proxies; one that restarts a service runs alone (default {DEFAULT_PARALLEL}; 1 = one "
                        f"after another)")
    _isolation_switch(p, "off")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("grade-many", help="grade a class of submissions on one shared stack (--jobs N side by side, "
                                          "--shard i/n for a CI matrix; `grade-many merge DIR...` joins shards): "
                                          "one class table (CSV, sortable HTML) and a feedback page each; exit 0 all "
                                          "valid, 1 any invalid or tampered, 2 else, 3 the grader's infrastructure")
    p.add_argument("submissions", nargs="+", metavar="DIR_OR_ADAPTER",
                   help="an adapter file, a folder holding adapter.toml, or a folder of submissions (each sub-folder "
                        "holding an adapter.toml is one)")
    p.add_argument("--level", type=int, choices=[3, 4, 5],
                   help="the level every submission is graded at (required unless a --profile sets it)")
    p.add_argument("--seed", type=int, help="base seed used for every submission (default: random, printed)")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="submissions graded side by side on the one stack, each scenario on its own tenant; one "
                        "that restarts a shared service runs with no other (default 1)")
    p.add_argument("--shard", metavar="I/N",
                   help="grade only the I-th of N deterministic slices of the sorted submission list (a CI matrix "
                        "job); join the shards' folders with `harness grade-many merge DIR...`")
    p.add_argument("--profile", metavar="FILE",
                   help="a course profile (TOML, schemas/course-profile.schema.json): level, timing bounds, "
                        "required capabilities and scenario set; an adapter that claims otherwise is refused")
    p.add_argument("--timeout-per-submission", type=float, default=None, metavar="S",
                   help="seconds one submission's grade may take before it is stopped (default: the course "
                        "profile's, else 1800)")
    p.add_argument("--only", help="comma-separated scenario names, for every submission")
    p.add_argument("--reports", help="folder for the run's folder (default: reports/runs under the checkout, else "
                                     "under the current directory)")
    p.add_argument("--verbose", action="store_true", help="also print every scenario's own progress lines")
    _isolation_switch(p, "on")
    p.set_defaults(func=cmd_grade_many)

    p = sub.add_parser("soak", help="rerun a correct implementation under many seeds, each with a random fault "
                                    "schedule; every invalid is a false alarm: exit 0 none, 1 any, 2 a run error")
    p.add_argument("--sut", required=True, help="adapter file, folder or name (e.g. reference)")
    p.add_argument("--seeds", type=_positive_int, default=None,
                   help="how many seeds, each its own short run (e.g. 20); without it: ONE long run of --uploads "
                        "uploads at an even rate with faults of every kind spread over it (harness/soak_long.py)")
    p.add_argument("--seed", type=int, help="first seed; the others follow it (S, S+1, ...; default: random, printed)")
    p.add_argument("--uploads", type=_positive_int, default=30, help="uploads per seed, spread over time (default 30)")
    p.add_argument("--nemesis", default="random", choices=["random", "none"],
                   help="random: a seeded random fault schedule per seed (default); none: no faults (a baseline)")
    p.add_argument("--level", type=int, choices=[3, 4, 5])
    p.add_argument("--parallel", type=_positive_int, default=2,
                   help="seeds side by side on the stack (default 2); a seed that restarts a service runs alone")
    p.add_argument("--reports", help="folder for the soak's folder (default: reports/runs under the checkout, else "
                                     "under the current directory)")
    p.add_argument("--keep-data", action="store_true", help=KEEP_DATA_HELP)
    p.set_defaults(func=cmd_soak)

    p = sub.add_parser("mutate", help="grade mutants of an implementation (harness/mutations/SUT.toml: one text "
                                      "change each) on their covering scenarios, one shared stack; prints the "
                                      "score killed / (killed + survived): exit 0 all killed, 1 a survivor, 2 else")
    p.add_argument("--sut", default="reference", help="the catalogue's name (harness/mutations/NAME.toml) or path")
    p.add_argument("--only", help="comma-separated mutant names")
    p.add_argument("--seed", type=int, help="seed of every grade (default: random, printed)")
    p.add_argument("--jobs", type=_positive_int, default=1, help="mutants graded side by side on the one stack")
    p.add_argument("--reports", help="folder for the run's folder (default: reports/runs under the checkout)")
    p.set_defaults(func=cmd_mutate)

    p = sub.add_parser("explore", help="Hypothesis draws fault schedules and small workloads, runs each on one "
                                       "shared stack, shrinks a failing one and prints its `harness run` replay: "
                                       "exit 1 found, 0 none within the budget, 2 error")
    p.add_argument("--sut", required=True, help="adapter file, folder or name")
    p.add_argument("--budget", default="10m", help="wall time of the search and shrink, e.g. 90s, 10m (default 10m)")
    p.add_argument("--seed", type=int, help="seed of Hypothesis' draws and of every run (default: random, printed)")
    p.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: every kind the adapter takes)")
    p.add_argument("--max-faults", type=_positive_int, default=3, help="faults per case at most (default 3)")
    p.add_argument("--drain", type=_positive_float, default=20.0,
                   help="seconds each case's drain waits at most for unfinished jobs (default 20), never less than "
                        "the adapter's lease and two sweeps, twice, plus 10 s")
    p.add_argument("--level", type=int, choices=[3, 4, 5])
    p.add_argument("--reports", help="folder for the explore folder (default: reports/runs under the checkout)")
    p.add_argument("--keep-data", action="store_true", help=KEEP_DATA_HELP)
    p.set_defaults(func=cmd_explore)

    p = sub.add_parser("check", help="re-check a stored run (or grade) folder without services")
    p.add_argument("run_dir")
    p.add_argument("--no-write", action="store_true", help="do not rewrite the reports")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("adapter", help="write or check an adapter file (how the harness runs an implementation)")
    actions = p.add_subparsers(dest="adapter_action", required=True)
    a = actions.add_parser("init", help="write a commented adapter skeleton with every field")
    a.add_argument("path", nargs="?", type=Path, default=Path("adapter.toml"),
                   help="file to write, or a folder to write adapter.toml in (default: ./adapter.toml)")
    a.add_argument("--force", action="store_true", help="overwrite an existing file")
    a.set_defaults(func=cmd_adapter_init)
    a = actions.add_parser("check", help="validate an adapter file before any service starts: exit 0 clean, "
                                         "1 with problems (one line each)")
    a.add_argument("file", help="adapter file, folder or name")
    a.add_argument("--level", type=int, choices=[3, 4, 5],
                   help="plan the grade at this level (default: the level the adapter claims)")
    a.set_defaults(func=cmd_adapter_check)

    try:
        from .cli_stack import add_stack_commands
    except ImportError:
        add_stack_commands = None
    if add_stack_commands is not None:
        add_stack_commands(sub)
    try:  # `harness load prefetch|upload` (load/cli.py), when the load package is installed
        from load.cli import add_load_commands
    except ImportError:
        add_load_commands = None
    if add_load_commands is not None:
        add_load_commands(sub)
    return parser


def _isolation_switch(p, default: str) -> None:
    """--isolate / --no-isolation (harness/isolation.py, docs/guides/grade-untrusted.md)."""
    p.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                   help="run the submission's roles isolated: a user of their own, cgroup limits, network rules, "
                        f"private /tmp (needs root, cgroups, nftables; default {default})")
    p.add_argument("--no-isolation", dest="isolate", action="store_false",
                   help="run the roles as the harness's own user, unlimited: only for code you trust")


def _set_isolation(args) -> str | None:
    """Apply the switch for this command; the reason isolation cannot be set up when it was asked for."""
    from . import isolation

    on = args.isolate if args.isolate is not None else args.command == "grade-many"
    isolation.set_mode(on)
    if on:
        problems = isolation.check()
        if problems:
            return "; ".join(problems)
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "isolate", "absent") != "absent":
        problem = _set_isolation(args)
        if problem:  # the grader's own infrastructure: exit 3, never a silent unisolated run
            print(f"harness: isolation of the submission was asked for but cannot be set up: {problem}. "
                  "Run as root on a machine with cgroups and nftables, or pass --no-isolation for code you trust.",
                  file=sys.stderr)
            from . import isolation

            isolation.set_mode(None)
            return 3
    from .stack.process import interrupt_on_ctrl_c, raise_keyboard_interrupt_on_sigterm

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupt_on_ctrl_c()  # set, not assumed: started in the background, SIGINT arrives ignored
    raise_keyboard_interrupt_on_sigterm()  # so a SIGTERM, like Ctrl-C, stops every service we started
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("harness: interrupted; everything it started was stopped", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        return 0
    except Exception as exc:  # configuration errors etc.: exit 2 (unknown/error), with the reason
        from .errors import EXIT_INFRASTRUCTURE, HarnessError, is_infrastructure

        if isinstance(exc, HarnessError) and not is_infrastructure(exc):  # said in one line, its own exit code
            print(f"harness: {exc}", file=sys.stderr)
            return exc.exit_code
        if is_infrastructure(exc):  # the grader's own infrastructure (already retried once): exit 3
            print(f"harness: infrastructure failure (not the implementation's): {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return EXIT_INFRASTRUCTURE
        print(f"harness: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():  # an in-process caller (a test) keeps its own handling
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if getattr(args, "isolate", "absent") != "absent":
            from . import isolation

            isolation.set_mode(None)  # an in-process caller's next command starts from the default


if __name__ == "__main__":
    sys.exit(main())
