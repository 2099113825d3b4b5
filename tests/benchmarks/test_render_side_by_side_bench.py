"""Render cost and throughput side by side, on the same 1600x1200 JPEGs (issue 13).

Printed as ratios to the limit measured in the same run, never as absolute times:

* the limit: the Pillow work alone (``reference.imaging.render_variants`` with today's settings) in a warm process
  pool sized to the cores;
* the previous render settings (WebP method 4 for every variant, no draft decode) in the same kind of pool, with the
  SSIM of each new variant against the previous output (scikit-image) and the output size ratio;
* the reference end to end and the Go example (examples/go-pipeline) end to end: the consumers are warm, paused
  (SIGSTOP) while the batch is uploaded, resumed, and timed until every attachment reads ``ready`` through the API
  (one reader, the oldest unfinished attachment at a time, so the reading takes little of the CPU it times).

Rounds alternate the four measurements so that a load burst of the shared machine hits them alike; the median of the
per-round ratios is reported with its spread. Short in CI (24 images, 3 rounds); FULL_SIZE=1 (or ``--full``) runs 96
images and 5 rounds; RENDER_BENCH_IMAGES / RENDER_BENCH_ROUNDS override both.
"""

from __future__ import annotations

import functools
import io
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "reference"))
from reference_support import REPO, sample_jpeg  # noqa: E402

from harness import adapter as adapters  # noqa: E402
from load.roles import Deployment  # noqa: E402
from reference import imaging  # noqa: E402
from reference.settings import available_cores  # noqa: E402

pytestmark = pytest.mark.benchmark
VARIANTS = ("thumbnail", "crop", "optimized")
OLD_SETTINGS = {"methods": {name: 4 for name in VARIANTS}, "draft": False}
GO_BINARY = REPO / "examples" / "go-pipeline" / "bin" / "gopipe"
SSIM_FLOOR, SIZE_CEILING = 0.95, 1.01  # no visible loss, equal or smaller output (deterministic: same bytes each run)


class PillowPool:
    """The worker's Pillow work alone, in a warm pool sized to the cores, with the given render settings."""

    def __init__(self, warm_image: bytes, **settings):
        self.render = functools.partial(imaging.render_variants, **settings)
        self.pool = imaging.make_pool(available_cores(), imaging.Limits())
        self.map([warm_image] * available_cores())

    def map(self, images: list[bytes]) -> list:
        return list(self.pool.map(self.render, images, [VARIANTS] * len(images), [imaging.Limits()] * len(images)))

    def rate(self, images: list[bytes]) -> float:
        started = time.perf_counter()
        self.map(images)
        return len(images) / (time.perf_counter() - started)

    def close(self) -> None:
        self.pool.shutdown()


class EndToEnd:
    """An implementation's roles on a fresh tenant (load.roles.Deployment, direct links), consumers warm."""

    def __init__(self, stack, adapter_file: Path, name: str, extra_env: dict[str, str], warm: list[bytes], run_dir):
        self.deployment = Deployment(stack, adapters.load(adapter_file), run_dir, name, extra_env=extra_env,
                                     say=lambda _text: None)
        self.deployment.setup()
        self.deployment.start(consumers=False)
        self.deployment.start(consumers=True)
        self.rate(warm)  # every pool, connection and code path warm before the first timed batch

    def rate(self, images: list[bytes]) -> float:
        consumers = self.deployment.consumer_instances()
        for name in consumers:
            self.deployment.supervisor.pause(name)
        try:
            ids = self.upload(images)
        finally:
            started = time.perf_counter()
            for name in consumers:
                self.deployment.supervisor.resume(name)
        pending = list(ids)
        deadline = time.monotonic() + 300
        # One light reader: the oldest unfinished attachment until it is ready, then the next. Reading every pending
        # attachment in a loop took the CPU of the pipeline it timed (the Pillow-only limit pays no such reader).
        with httpx.Client(base_url=self.deployment.base_url, timeout=10) as client:
            while pending:
                assert time.monotonic() < deadline, f"{len(pending)} of {len(ids)} not ready after 300 s"
                response = client.get(f"/v1/attachments/{pending[0]}")
                state = response.json().get("state") if response.status_code == 200 else None
                assert state not in ("failed", "dead", "rejected"), (pending[0], state)
                if state == "ready":
                    pending.pop(0)
                else:
                    time.sleep(0.05)
        return len(ids) / (time.perf_counter() - started)

    def upload(self, images: list[bytes]) -> list[str]:
        def one(data: bytes) -> str:
            with httpx.Client(base_url=self.deployment.base_url, timeout=30) as client:
                response = client.post("/v1/attachments", files={"file": ("photo.jpg", data, "image/jpeg")},
                                       headers={"Idempotency-Key": str(uuid.uuid4())})
            assert response.status_code in (200, 201, 202), response.text[:200]
            return response.json()["attachment_id"]

        with ThreadPoolExecutor(4) as clients:
            return list(clients.map(one, images))

    def close(self) -> None:
        self.deployment.stop()


def ssim_and_sizes(images: list[bytes]) -> tuple[dict[str, list[float]], float]:
    """SSIM of each new variant against the previous settings' output, per variant; total new/old output size."""
    import numpy as np
    from PIL import Image
    from skimage.metrics import structural_similarity

    def pixels(data: bytes):
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    scores: dict[str, list[float]] = {name: [] for name in VARIANTS}
    new_bytes = old_bytes = 0
    for data in images:
        new = imaging.render_variants(data, VARIANTS, imaging.Limits())
        old = imaging.render_variants(data, VARIANTS, imaging.Limits(), **OLD_SETTINGS)
        assert [v.data for v in new] == [v.data for v in imaging.render_variants(data, VARIANTS, imaging.Limits())]
        for a, b in zip(new, old):
            assert (a.width, a.height) == (b.width, b.height)
            scores[a.name].append(structural_similarity(pixels(a.data), pixels(b.data), channel_axis=2,
                                                        data_range=255))
            new_bytes, old_bytes = new_bytes + len(a.data), old_bytes + len(b.data)
    return scores, new_bytes / old_bytes


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


@pytest.mark.timeout(1800)  # two pipelines and two pools, each warmed; slow on a loaded machine
def test_render_cost_and_throughput_side_by_side(stack, tmp_path, full_size):
    count = int(os.environ.get("RENDER_BENCH_IMAGES") or (96 if full_size else 24))
    rounds = int(os.environ.get("RENDER_BENCH_ROUNDS") or (5 if full_size else 3))
    images = [sample_jpeg(seed, size=(1600, 1200)) for seed in range(count)]
    warm = [sample_jpeg(1000 + seed, size=(1600, 1200)) for seed in range(2)]
    cores = available_cores()

    scores, size_ratio = ssim_and_sizes(images[: min(count, 24 if full_size else 6)])

    reference_env = {"IMAGE_WORKERS": str(cores), "WORKER_CONCURRENCY": str(2 * cores), "LEASE_SECONDS": "30",
                     "LEASE_RENEW_SECONDS": "10", "STAGING_RETENTION_SECONDS": "3600", "LOG_LEVEL": "WARNING"}
    go_env = {"GOPIPE_CONCURRENCY": str(2 * cores), "GOPIPE_LEASE": "30", "GOPIPE_STAGING_RETENTION": "3600"}
    systems: dict[str, EndToEnd] = {}
    limit = old = None
    rates: dict[str, list[float]] = {"limit": [], "old render": [], "reference": [], "go example": []}
    try:
        limit, old = PillowPool(warm[0]), PillowPool(warm[0], **OLD_SETTINGS)
        systems["reference"] = EndToEnd(stack, REPO / "reference" / "adapter.toml", "render-ref", reference_env, warm,
                                        tmp_path / "reference")
        if GO_BINARY.is_file():
            systems["go example"] = EndToEnd(stack, REPO / "examples" / "go-pipeline" / "adapter.toml", "render-go",
                                             go_env, warm, tmp_path / "go")
        for _ in range(rounds):
            rates["limit"].append(limit.rate(images))
            rates["old render"].append(old.rate(images))
            for name, system in systems.items():
                rates[name].append(system.rate(images))
    finally:
        for pool in (limit, old):
            if pool:
                pool.close()
        for system in systems.values():
            system.close()

    ratios = {name: [r / base for r, base in zip(values, rates["limit"])] for name, values in rates.items()
              if name != "limit" and values}
    print(f"\n[render] {count} JPEG 1600x1200 (~{len(images[0]) // 1024} KiB) x {rounds} rounds, cores {cores}, "
          f"load average {os.getloadavg()[0]:.2f}; variants {', '.join(VARIANTS)}; "
          f"methods now {imaging.WEBP_METHODS}, draft gap {imaging.DRAFT_GAP}")
    print("[render] ratio to the limit (Pillow pool, new settings), median of rounds (min, max):")
    for name, values in ratios.items():
        print(f"[render]   {name:11s} {spread(values)}")
    print(f"[render]   new/old Pillow rate: {spread([1 / r for r in ratios['old render']])}")
    for name, values in scores.items():
        print(f"[render] SSIM new vs previous output, {name}: min {min(values):.4f}, mean {statistics.mean(values):.4f}")
    print(f"[render] output size new/previous: {size_ratio:.3f}")
    if "go example" not in systems:
        print(f"[render] go example skipped: {GO_BINARY} is missing (scripts/bootstrap.sh builds it)")
    assert min(min(v) for v in scores.values()) >= SSIM_FLOOR
    assert size_ratio <= SIZE_CEILING
