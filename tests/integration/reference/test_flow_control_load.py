"""BE-JOB-004 under load: a backlog drains with unacked deliveries per consumer ≤ prefetch, and memory stays flat.

Also runs the locust upload load for a few seconds (loopback only) to keep load/locustfile.py honest.
CI runs the short size; `--full` runs a larger backlog and a longer locust run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from load.images import corpus
from load.prefetch import evaluate, sample_channels
from reference_support import REPO, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.soak]

PREFETCH = 2


def group_rss_kib(pgid: int) -> int:
    """Resident memory of every process in the role's group (the worker and its image pool)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{entry}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total


def test_backlog_drains_within_prefetch_and_flat_memory(pipeline, tenant, full_size):
    backlog = 300 if full_size else 60
    pipeline.migrate()
    pipeline.start_all(roles=("api", "relay", "sweeper"))
    ids = [pipeline.upload(body, filename=name).json()["attachment_id"]
           for name, body, _ in corpus(5, count=backlog, min_side=1200, max_side=2000)]
    wait_for(lambda: pipeline.queue_depths().get("attachments.jobs.process", 0) >= backlog // 2, 30,
             what="backlog in the queue")

    worker = pipeline.start("worker", PREFETCH=PREFETCH, WORKER_CONCURRENCY=PREFETCH)
    samples, rss = [], []
    deadline = time.monotonic() + (600 if full_size else 180)
    while time.monotonic() < deadline:
        samples += sample_channels(tenant.rabbitmq_management_url, tenant.vhost, "attachments.jobs.process")
        rss.append(group_rss_kib(worker.process.pid))
        if pipeline.sql("select count(*) as n from jobs where state <> 'ready'")[0]["n"] == 0:
            break
        time.sleep(0.05)
    assert all(pipeline.status(i)["state"] == "ready" for i in ids), "backlog did not drain"

    verdict = evaluate(samples)
    quarter = max(1, len(rss) // 4)
    early, late = max(rss[:quarter]), max(rss[-quarter:])
    print(f"\n[load] backlog {backlog}: {verdict}; worker group RSS early {early // 1024} MiB, "
          f"late {late // 1024} MiB (ratio {late / early:.2f})")
    assert verdict.samples >= 5, f"too few samples to judge: {verdict}"
    assert verdict.ok, verdict
    assert verdict.max_unacked >= 1, "the probe never saw a delivery in flight"
    # Flat: the last quarter of the drain uses no more than 1.5x the first quarter's memory.
    assert late <= 1.5 * early, f"worker memory grew with the backlog: {early} KiB -> {late} KiB"


def test_locust_upload_load_is_bounded_and_clean(pipeline, tmp_path, full_size):
    pipeline.migrate()
    pipeline.start_all(roles=("api", "relay", "worker"))
    run_time = "30s" if full_size else "5s"
    csv_prefix = tmp_path / "locust"
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(REPO / "load" / "locustfile.py"), "--headless",
         "--host", pipeline.api_url, "-u", "4", "-r", "4", "--run-time", run_time, "--only-summary",
         "--csv", str(csv_prefix), "--exit-code-on-error", "1"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "LOAD_SEED": "3"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    stats = (tmp_path / "locust_stats.csv").read_text().splitlines()
    upload_row = next(line for line in stats if "POST /v1/attachments" in line).split(",")
    requests, failures = int(upload_row[2]), int(upload_row[3])
    print(f"\n[load] locust {run_time}: {requests} uploads, {failures} failures")
    assert requests > 0 and failures == 0
