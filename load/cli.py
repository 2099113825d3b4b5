"""`harness load prefetch|upload`: load runs on a private stack (registered by harness/cli.py when load is
installed). Each prints its seed and progress and writes its folder under reports/runs/."""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def _prefetches(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {value!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("each prefetch must be at least 1")
    return out


def add_load_commands(subparsers) -> None:
    load = subparsers.add_parser("load", help="load runs: the prefetch curve (BE-JOB-004) and upload latency (locust)")
    actions = load.add_subparsers(dest="load_action", required=True)

    p = actions.add_parser("prefetch", help="fill a backlog with consumers held, release them and sample unacked "
                                            "per consumer, consumer RSS and jobs/s until drained, per prefetch")
    p.add_argument("--sut", default="reference", help="adapter file, folder or name (default: reference)")
    p.add_argument("--backlog", type=int, default=10000)
    p.add_argument("--prefetch", type=_prefetches, default=[1, 4, 16, 64], help="comma-separated (default 1,4,16,64)")
    p.add_argument("--seed", type=int)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set a variable for every role on top of the adapter's [env] (repeatable; recorded)")
    p.add_argument("--level", type=int, choices=[3, 4, 5], help="LEVEL given to the roles (default: the adapter's)")
    p.add_argument("--run-dir", type=Path)
    p.set_defaults(func=cmd_prefetch)

    u = actions.add_parser("upload", help="locust, headless, against the API with good, bad and hostile files; "
                                          "accept latency compared with a bare S3 PUT + one DB commit")
    u.add_argument("--sut", default="reference")
    u.add_argument("--users", type=int, default=20)
    u.add_argument("--seconds", type=int, default=30)
    u.add_argument("--seed", type=int)
    u.add_argument("--baseline", type=int, default=300, help="bare S3 PUT + commit operations (default 300)")
    u.add_argument("--level", type=int, choices=[3, 4, 5], help="LEVEL given to the roles (default: the adapter's)")
    u.add_argument("--run-dir", type=Path)
    u.set_defaults(func=cmd_upload)


def _seed(value) -> int:
    from harness.run_driver import draw_seed  # the seed drawing every harness command shares

    return draw_seed(value)


def _say(text: str) -> None:
    print(text, flush=True)


def cmd_prefetch(args) -> int:
    from harness import adapter as adapter_mod
    from harness.paths import reports_dir
    from harness.run_driver import start_stack

    from .prefetch_curve import prefetch_env, run, run_id

    adapter = adapter_mod.load(args.sut)
    prefetch_env(adapter)  # refuse before any service starts
    seed = _seed(args.seed)
    run_dir = Path(args.run_dir or reports_dir() / run_id("prefetch", seed))
    print(f"load prefetch: {adapter.name}, backlog {args.backlog}, prefetch {args.prefetch}, seed {seed}, "
          f"folder {run_dir}", flush=True)
    began = time.monotonic()
    stack, _ = start_stack(None, progress=_say)  # the harness's run driver: a stack that fails to start is exit 3
    try:
        result = run(stack, adapter, args.prefetch, args.backlog, seed, run_dir, _say, args.interval,
                     level=args.level, extra_env=dict(e.split("=", 1) for e in args.env))
    finally:
        stack.stop()
    for s in result["summaries"]:
        print(f"  prefetch {s['prefetch']:3}: max unacked {s['max_unacked']}, RSS ratio {s['rss_ratio']}, "
              f"{s['jobs_per_s']} jobs/s, drain {s['drain_seconds']} s")
    for c in result["checks"]:
        print(f"  {c['status']:7} {c['check']:24} prefetch {c['prefetch']}: {c['detail']}")
    print(f"verdict {result['verdict'].upper()} in {time.monotonic() - began:.0f}s; report {run_dir}/index.html "
          f"(seed {seed})")
    return {"pass": 0, "fail": 1}.get(result["verdict"], 2)


def cmd_upload(args) -> int:
    from harness import adapter as adapter_mod
    from harness.paths import reports_dir
    from harness.run_driver import start_stack

    from .prefetch_curve import run_id
    from .upload_load import run

    adapter = adapter_mod.load(args.sut)
    seed = _seed(args.seed)
    run_dir = Path(args.run_dir or reports_dir() / run_id("upload", seed))
    print(f"load upload: {adapter.name}, {args.users} users for {args.seconds}s, seed {seed}, folder {run_dir}",
          flush=True)
    stack, _ = start_stack(None, progress=_say)
    try:
        result = run(stack, adapter, args.users, args.seconds, seed, run_dir, _say, baseline_ops=args.baseline,
                     level=args.level)
    finally:
        stack.stop()
    print(f"report {run_dir}/summary.md (seed {seed})")
    return 0 if result.get("ok") else 1
