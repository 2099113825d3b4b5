"""Batch consumer benchmark (BE-JOB-007): jobs finished per second with WORKER_BATCH_SIZE 1, 4 and 16 over the same
images, printed as ratios to batch 1 measured in the same run (rounds alternate the sizes, the median round ratio
resists the load bursts of a shared machine). Also printed: the share of a job's time its claim takes (the worker's
own timings), the most that batching the claims into one round trip could save. No timing is asserted.

Short by default (CI: a few dozen small images); ``--full`` or FULL_SIZE=1 for a longer run.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "reference"))
from reference_support import REPO, SHORT_TIMINGS, Pipeline, free_port, sample_jpeg, wait_for  # noqa: E402

from reference.settings import available_cores  # noqa: E402

pytestmark = pytest.mark.benchmark
BATCH_SIZES = (1, 4, 16)
TIMINGS = re.compile(r"ready \(attempt \d+\) in (?P<total>[\d.]+)s: .*?\bclaim (?P<claim>[\d.]+)")


@pytest.fixture
def batch_bench(tenant, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAILPOINTS", "LEVEL", "PREFETCH", "WORKER_BATCH"))}
    env.update(tenant.env(proxied=False))  # Toxiproxy is a test device, not part of the system
    env.update(SHORT_TIMINGS)
    # One prefetch for every size (it must hold the largest batch): only the batching differs between runs.
    env.update(HTTP_PORT=str(free_port()), IMAGE_WORKERS=str(available_cores()),
               WORKER_CONCURRENCY=str(2 * available_cores()), PREFETCH=str(max(BATCH_SIZES)),
               LEASE_SECONDS="30", LEASE_RENEW_SECONDS="10", STAGING_RETENTION_SECONDS="3600")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    system = Pipeline(tenant, tmp_path, env)
    system.migrate()
    yield system
    system.stop_all()


def timed_round(bench, images: list[bytes], batch_size: int) -> float:
    """Upload the images with no worker running, then start a worker with this batch size: jobs/s from its first
    claim to its last ready (the whole backlog waits, so every batch can fill)."""
    with ThreadPoolExecutor(4) as clients:
        responses = list(clients.map(bench.upload, images))
    assert all(r.status_code == 202 for r in responses)
    ids = [uuid.UUID(r.json()["attachment_id"]) for r in responses]
    wait_for(lambda: bench.queue_depths().get("attachments.jobs.process", 0) >= len(ids), 60, interval=0.2,
             what="backlog published")
    worker = bench.start("worker", name=f"worker-b{batch_size}", WORKER_BATCH_SIZE=batch_size,
                         WORKER_BATCH_WAIT_MS=50)
    try:
        wait_for(lambda: bench.sql("SELECT count(*) AS n FROM jobs WHERE state = 'ready' AND attachment_id = ANY(%s)",
                                   (ids,))[0]["n"] == len(ids), 300, interval=0.2, what="backlog ready")
    finally:
        worker.kill()
    span = bench.sql("SELECT EXTRACT(EPOCH FROM max(at) FILTER (WHERE to_state = 'ready') - "
                     "min(at) FILTER (WHERE to_state = 'processing'))::float8 AS s "
                     "FROM attachment_events WHERE attachment_id = ANY(%s)", (ids,))[0]["s"]
    claim_shares.extend(float(m["claim"]) / float(m["total"]) for m in TIMINGS.finditer(worker.log())
                        if float(m["total"]) > 0)
    return len(ids) / span


claim_shares: list[float] = []


def test_batch_sizes_jobs_per_second_against_batch_one_in_the_same_run(batch_bench, full_size):
    rounds, count, size = (3, 64, (1600, 1200)) if full_size else (2, 24, (640, 480))
    images = [sample_jpeg(seed, size=size) for seed in range(count)]
    batch_bench.start_all(roles=("api", "relay"))
    timed_round(batch_bench, images[:4], 1)  # warm the API, relay and database
    claim_shares.clear()
    rates: dict[int, list[float]] = {b: [] for b in BATCH_SIZES}
    for _ in range(rounds):
        for b in BATCH_SIZES:
            rates[b].append(timed_round(batch_bench, images, b))
    ratios = {b: statistics.median(r / base for r, base in zip(rates[b], rates[1])) for b in BATCH_SIZES}
    print(f"\n[bench] batch consumer: {count} x {size[0]}x{size[1]} JPEG per round, {rounds} rounds, cores "
          f"{available_cores()}, WORKER_CONCURRENCY {2 * available_cores()}, PREFETCH {max(BATCH_SIZES)}, "
          f"load average {os.getloadavg()[0]:.2f}")
    for b in BATCH_SIZES:
        print(f"[bench] WORKER_BATCH_SIZE {b:>2}: jobs/s per round " + ", ".join(f"{r:.2f}" for r in rates[b])
              + f" -> ratio to batch 1 (median of rounds): {ratios[b]:.2f}")
    if claim_shares:
        print(f"[bench] claim share of a job's time (worker timings, median of {len(claim_shares)} jobs): "
              f"{statistics.median(claim_shares) * 100:.1f} % — the ceiling of what one claim round trip per batch "
              f"could save")
    assert all(r > 0 for b in BATCH_SIZES for r in rates[b])
