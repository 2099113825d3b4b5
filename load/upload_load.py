"""`harness load upload`: locust, headless, against the implementation's API on a private stack, with good, bad and
hostile files (load/locustfile.py); its CSV and HTML stats kept in the run folder. The accept latency (p50 / p99 of
the good uploads) is compared with a baseline measured in the same run on the same stack: one bare S3 PUT of a
corpus image plus one PostgreSQL insert and commit, in a loop (boto3 + psycopg), printed as ratios.
"""
from __future__ import annotations

import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .images import corpus
from .roles import Deployment

GOOD_ROW = "POST /v1/attachments"


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def baseline(env: dict[str, str], bucket: str, ops: int, seed: int) -> dict:
    """``ops`` times: one S3 PUT of a corpus image, then one INSERT + COMMIT; latencies in ms."""
    import boto3
    import psycopg
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], aws_access_key_id=env["S3_ACCESS_KEY"],
                      aws_secret_access_key=env["S3_SECRET_KEY"], region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    images = corpus(seed, count=16)
    took = []
    with psycopg.connect(env["DATABASE_URL"]) as db:
        db.execute("create table if not exists load_baseline (id bigserial primary key, key text not null, "
                   "at timestamptz not null default now())")
        db.commit()
        for i in range(ops):
            name, body, content_type = images[i % len(images)]
            began = time.perf_counter()
            s3.put_object(Bucket=bucket, Key=f"load-baseline/{i}-{name}", Body=body, ContentType=content_type)
            db.execute("insert into load_baseline (key) values (%s)", (f"load-baseline/{i}-{name}",))
            db.commit()
            took.append((time.perf_counter() - began) * 1000)
    return {"ops": ops, "p50_ms": round(percentile(took, 0.5), 2), "p99_ms": round(percentile(took, 0.99), 2),
            "mean_ms": round(statistics.fmean(took), 2)}


def locust_rows(stats_csv: Path) -> dict[str, dict]:
    """The rows of locust's ``*_stats.csv`` by name (Type + Name), numbers as floats where they parse."""
    rows = {}
    with open(stats_csv, newline="") as f:
        for row in csv.DictReader(f):
            parsed = {}
            for k, v in row.items():
                try:
                    parsed[k] = float(v)
                except (TypeError, ValueError):
                    parsed[k] = v
            rows[row["Name"]] = parsed
    return rows


def compare(rows: dict[str, dict], base: dict) -> dict:
    """Accept latency of the good uploads against the baseline: ratios of p50 and p99 (None when unknown)."""
    good = rows.get(GOOD_ROW) or {}
    p50, p99 = good.get("50%"), good.get("99%")
    def ratio(a, b):
        return round(a / b, 2) if isinstance(a, float) and b else None
    def count(v):
        return int(v) if isinstance(v, float) else v
    return {"requests": count(good.get("Request Count")), "failures": count(good.get("Failure Count")),
            "p50_ms": p50, "p99_ms": p99, "baseline_p50_ms": base.get("p50_ms"), "baseline_p99_ms": base.get("p99_ms"),
            "p50_ratio": ratio(p50, base.get("p50_ms")), "p99_ratio": ratio(p99, base.get("p99_ms")),
            "per_kind": {name: {"requests": count(r.get("Request Count")), "failures": count(r.get("Failure Count")),
                                "p50_ms": r.get("50%"), "p99_ms": r.get("99%")}
                         for name, r in rows.items() if name != "Aggregated"}}


def summary_markdown(meta: dict, result: dict) -> str:
    c = result["comparison"]
    lines = [f"# Upload load — {meta['sut']}", "",
             f"seed {meta['seed']}; locust {meta['users']} users for {meta['seconds']} s (good, bad, hostile files); "
             f"baseline: {result['baseline']['ops']} × (bare S3 PUT + one DB insert/commit), same stack, same run.",
             "", "| | p50 ms | p99 ms |", "|---|---|---|",
             f"| accept ({GOOD_ROW}) | {c['p50_ms']} | {c['p99_ms']} |",
             f"| baseline PUT + commit | {c['baseline_p50_ms']} | {c['baseline_p99_ms']} |",
             f"| ratio | {c['p50_ratio']} | {c['p99_ratio']} |", "",
             "| request | count | failures | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {r['requests']} | {r['failures']} | {r['p50_ms']} | {r['p99_ms']} |"
              for n, r in c["per_kind"].items()]
    lines += ["", "Files: locust_stats.csv, locust_stats_history.csv, locust_failures.csv, locust.html, "
              "result.json. Absolute times depend on the (shared, noisy) machine; the ratios are the figure.", ""]
    return "\n".join(lines)


def run(stack, adapter, users: int, seconds: int, seed: int, run_dir: Path, say=print, baseline_ops: int = 300,
        level: int | None = None) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(stack, adapter, run_dir / "logs", "upload", level, None, say)
    try:
        deployment.setup()
        deployment.start(consumers=False)
        deployment.start(consumers=True)
        say(f"roles up at {deployment.base_url}; baseline: {baseline_ops} × (S3 PUT + commit)")
        base = baseline(deployment.env, deployment.tenant.bucket, baseline_ops, seed)
        say(f"baseline p50 {base['p50_ms']} ms, p99 {base['p99_ms']} ms; locust {users} users for {seconds}s")
        locust = Path(sys.executable).parent / "locust"
        locustfile = Path(__file__).with_name("locustfile.py")
        command = [str(locust), "-f", str(locustfile), "--headless", "--host", deployment.base_url,
                   "-u", str(users), "-r", str(max(1, users)), "--run-time", f"{seconds}s", "--stop-timeout", "5",
                   "--csv", str(run_dir / "locust"), "--csv-full-history", "--html", str(run_dir / "locust.html"),
                   "--only-summary"]
        env = {**os.environ, "LOAD_SEED": str(seed), "LOAD_UPLOAD_PATH": adapter.vocabulary.upload_path()}
        repo = locustfile.parent.parent
        env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(run_dir / "locust.log", "wb") as log:
            done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=seconds + 120,
                                  cwd=repo)
        stats = run_dir / "locust_stats.csv"
        if not stats.exists():
            raise RuntimeError(f"locust exited {done.returncode} without stats; see {run_dir}/locust.log")
        comparison = compare(locust_rows(stats), base)
    finally:
        deployment.stop()
    meta = {"kind": "load-upload", "sut": adapter.name, "seed": seed, "users": users, "seconds": seconds}
    ok = bool(comparison["requests"]) and comparison["p50_ratio"] is not None
    result = {**meta, "baseline": base, "comparison": comparison, "locust_exit": done.returncode, "ok": ok}
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    (run_dir / "summary.md").write_text(summary_markdown(meta, result))
    say(f"accept p50 {comparison['p50_ms']} ms = {comparison['p50_ratio']}× baseline; p99 {comparison['p99_ms']} ms "
        f"= {comparison['p99_ratio']}× baseline ({comparison['requests']} good uploads, "
        f"{comparison['failures']} failures)" if ok else "no accept latency measured")
    for name, r in comparison["per_kind"].items():
        say(f"  {name:34} {r['requests']} requests, {r['failures']} failures, p50 {r['p50_ms']} ms, "
            f"p99 {r['p99_ms']} ms")
    return result
