"""`harness load prefetch`: the prefetch load curve (BE-JOB-004 under a large backlog).

For each prefetch: a fresh tenant on one private stack, the implementation's roles started from its adapter except
the consumers, the backlog uploaded through the API (concurrently: uploads must not be the bottleneck) and left
in the work queue, then the consumer roles started with the adapter's prefetch variable (``[limits] prefetch_env``)
set. Every ``interval`` seconds until the queue is empty: each consumer channel's prefetch and unacked count and the
queue's counts (management API), the consumer roles' RSS (/proc, whole process groups). Then every attachment's
state is read once through the API. Results in reports/runs/<id>/ (load/curve.py says what each file holds).
"""
from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from harness.broker import amqp_queue_depth
from harness.prefetch import read_consumers

from . import curve, curve_chart
from .images import corpus
from .roles import Deployment

TERMINAL = ("ready", "failed")
IMAGE_SIDES = (32, 96)


class LoadError(ValueError):
    pass


def prefetch_env(adapter) -> str:
    name = (adapter.raw.get("limits") or {}).get("prefetch_env")
    if not name:
        raise LoadError(f"adapter {adapter.name} declares no [limits] prefetch_env: the load curve cannot set the "
                        "consumers' prefetch (add the variable's name, e.g. prefetch_env = \"PREFETCH\")")
    return name


def run_id(kind: str, seed: int) -> str:
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-load-{kind}-s{seed}-{os.getpid() % 10000:04d}"


def machine() -> str:
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return f"{platform.node()}, {os.cpu_count()} cores, load average {load} at start (a shared, noisy machine)"


def one_prefetch(stack, adapter, prefetch: int, backlog: int, seed: int, run_dir: Path, say, interval: float = 0.5,
                 stall_seconds: float = 120.0, level: int | None = None,
                 extra_env: dict[str, str] | None = None) -> tuple[list[curve.Tick], dict]:
    variable = prefetch_env(adapter)
    files = corpus(seed, count=48, min_side=IMAGE_SIDES[0], max_side=IMAGE_SIDES[1])
    deployment = Deployment(stack, adapter, run_dir / "logs", f"p{prefetch}", level,
                            {**(extra_env or {}), variable: str(prefetch)}, say)
    ticks: list[curve.Tick] = []
    try:
        deployment.setup()
        deployment.start(consumers=False)
        say(f"[prefetch {prefetch}] roles up without consumers ({', '.join(deployment.consumer_instances())} held); "
            f"uploading {backlog}")
        began = time.monotonic()
        ids = deployment.upload_many(files, backlog, progress=lambda n: say(f"[prefetch {prefetch}] {n} uploaded "
                                                                            f"({time.monotonic() - began:.0f}s)"))
        upload_seconds = time.monotonic() - began
        say(f"[prefetch {prefetch}] {len(ids)} accepted in {upload_seconds:.1f}s "
            f"({len(ids) / max(upload_seconds, 1e-9):.0f}/s); waiting for the backlog in the work queue")
        last, last_change = -1, time.monotonic()
        while True:
            q = deployment.queue() or {}
            ready = q.get("ready") or 0
            if ready >= backlog:
                break
            if ready != last:
                last, last_change = ready, time.monotonic()
            if time.monotonic() - last_change > 30:
                raise LoadError(f"the work queue holds {ready} of {backlog} after 30 s without change (is it "
                                "declared only by the consumers?)")
            time.sleep(0.5)
        say(f"[prefetch {prefetch}] backlog of {ready} in the queue; releasing the consumers")
        deployment.start(consumers=True)
        released = time.monotonic()
        drained_at, last_report = None, 0.0
        last_left, last_progress = None, released
        while True:
            now = time.monotonic()
            try:
                channels = read_consumers(deployment.management, deployment.vhost, deployment.work_queue)
                q = deployment.queue() or {}
                exact = amqp_queue_depth(deployment.tenant.direct.amqp_url, deployment.work_queue)
                if exact is not None:  # the management API's counts lag under load; a passive declare does not
                    q["ready"] = exact["ready"]
            except Exception as exc:  # a management hiccup: this tick is skipped, not the run
                say(f"[prefetch {prefetch}] sample failed: {exc!r}")
                time.sleep(interval)
                continue
            out_of_queue = backlog - (q.get("ready") or 0) - (q.get("unacked") or 0)
            finished = max(0, out_of_queue, ticks[-1].acked if ticks else 0)  # never counts down
            tick = curve.Tick(prefetch, now - released, q.get("ready"), q.get("unacked"), finished,
                              deployment.consumer_rss_kib(),
                              {s.channel: (s.prefetch, s.unacked) for s in channels})
            ticks.append(tick)
            left = (q.get("ready") or 0) + (q.get("unacked") or 0)
            if left != last_left:
                last_left, last_progress = left, now
            if now - last_report >= 10:
                last_report = now
                say(f"[prefetch {prefetch}] t={tick.t:5.0f}s left {left} acked {tick.acked} "
                    f"max unacked/consumer {tick.max_unacked} rss {tick.rss_kib // 1024} MiB")
            if left == 0 and q.get("ready") is not None:
                drained_at = drained_at or now
                if now - drained_at >= 2 * interval:
                    break
            else:
                drained_at = None
            if now - last_progress > stall_seconds:
                say(f"[prefetch {prefetch}] no progress for {stall_seconds:.0f}s: giving up")
                break
            time.sleep(max(0.0, interval - (time.monotonic() - now)))
        drain_seconds = (drained_at - released) if drained_at else None
        states = deployment.states(ids)
        for _ in range(20):
            pending = [a for a, s in states.items() if s not in TERMINAL]
            if not pending:
                break
            time.sleep(1)
            states.update(deployment.states(pending))
        counts = {s: list(states.values()).count(s) for s in set(states.values())}
        say(f"[prefetch {prefetch}] drained in {drain_seconds if drain_seconds is None else round(drain_seconds, 1)}s;"
            f" states {counts}")
        summary = curve.summarize(prefetch, ticks, backlog, drain_seconds is not None and
                                  all(s in TERMINAL for s in states.values()), drain_seconds, upload_seconds)
        summary["states"] = counts
        return ticks, summary
    finally:
        deployment.stop()


def run(stack, adapter, prefetches: list[int], backlog: int, seed: int, run_dir: Path, say=print,
        interval: float = 0.5, level: int | None = None, extra_env: dict[str, str] | None = None) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"kind": "load-prefetch", "sut": adapter.name, "seed": seed, "backlog": backlog, "prefetches": prefetches,
            "prefetch_env": prefetch_env(adapter), "consumers": adapter.roles_flagged("consumer"),
            "images": f"{len(prefetches) and 48} seeded JPEG/PNG/WebP images of {IMAGE_SIDES[0]}-{IMAGE_SIDES[1]} px "
                      "a side (load/images.py), cycled", "machine": machine(),
            "started": datetime.now(timezone.utc).isoformat(), "env_overrides": extra_env or {}}
    by_prefetch: dict[int, list[curve.Tick]] = {}
    summaries = []
    for prefetch in prefetches:
        try:
            ticks, summary = one_prefetch(stack, adapter, prefetch, backlog, seed, run_dir, say, interval, level=level,
                                          extra_env=extra_env)
        except (LoadError, RuntimeError, TimeoutError) as exc:  # e.g. the implementation refuses this prefetch
            say(f"[prefetch {prefetch}] not measured: {exc}")
            ticks, summary = [], {**curve.summarize(prefetch, [], backlog, False, None), "error": str(exc)}
        by_prefetch[prefetch] = ticks
        summaries.append(summary)
        write(run_dir, meta, by_prefetch, summaries)  # a partial result survives an interrupted run
    return write(run_dir, meta, by_prefetch, summaries)


def write(run_dir: Path, meta: dict, by_prefetch: dict[int, list[curve.Tick]], summaries: list[dict]) -> dict:
    rows = [r for p in sorted(by_prefetch) for r in curve.tick_rows(by_prefetch[p])]
    (run_dir / "samples.csv").write_text(curve.to_csv(rows, curve.TICK_FIELDS))
    (run_dir / "summary.csv").write_text(curve.to_csv(summaries, curve.SUMMARY_FIELDS))
    check_rows = curve.checks(summaries, by_prefetch)
    result = {**meta, "summaries": summaries, "checks": check_rows, "verdict": curve.verdict(check_rows)}
    (run_dir / "checks.json").write_text(json.dumps(result, indent=1, default=str))
    prims = curve_chart.primitives(by_prefetch, f"{meta['sut']}: backlog {meta['backlog']}, seed {meta['seed']}")
    svg = curve_chart.to_svg(prims)
    (run_dir / "curve.svg").write_text(svg)
    (run_dir / "curve.png").write_bytes(curve_chart.to_png(prims))
    markdown = curve.page_markdown(meta, summaries, check_rows)
    (run_dir / "summary.md").write_text(markdown)
    (run_dir / "index.html").write_text(curve.page_html(markdown, svg))
    return result
