"""Upload load against an attachment API on this machine.

    .venv/bin/locust -f load/locustfile.py --headless --host http://127.0.0.1:8000 -u 8 -r 4 --run-time 30s

Bounded by --run-time (required) and loopback-only. LOAD_SEED picks the image corpus (default 1). Besides good
images (weight 10) it sends bad files (weight 2: text, empty, HTML under image names) and hostile ones (weight 1: the
harness's decompression bombs, huge dimensions, frame bombs, truncated progressive JPEGs, polyglots, mislabeled
images; harness/workload.py), each under its own name in the stats; LOAD_MIX=good sends good images only.
"""
from __future__ import annotations

import os
import random
import uuid

from locust import HttpUser, between, events, task

from load.images import corpus
from load.targets import require_loopback

SEED = int(os.environ.get("LOAD_SEED", "1"))
CORPUS = corpus(SEED)
MIX = os.environ.get("LOAD_MIX", "all")
# The service's own upload path (the adapter's [paths] upload; `harness load upload` sets it). The stats keep the
# contract's row names either way.
UPLOAD_PATH = os.environ.get("LOAD_UPLOAD_PATH", "/v1/attachments")


def _bad_and_hostile(seed: int) -> tuple[list, list]:
    """Seeded bad files (3) and one hostile file of each kind (made once: a bomb takes a moment to build)."""
    from harness import workload

    rng = random.Random(f"{seed}-bad")
    bad = []
    for i in range(3):
        data, ext, content_type = workload.bad_input(rng)[:3]
        bad.append((f"bad-{i}.{ext}", data, content_type))
    rng = random.Random(f"{seed}-hostile")
    hostile = []
    for kind in workload.HOSTILE_KINDS:
        made = getattr(workload, f"{kind}_input")(rng)
        data, ext, content_type = made[0], made[-2], made[-1]  # mislabeled: (bytes, real, claimed ext, claimed type)
        hostile.append((f"{kind}.{ext}", data, content_type))
    return bad, hostile


BAD, HOSTILE = _bad_and_hostile(SEED) if MIX != "good" else ([], [])


@events.init.add_listener
def _check_target(environment, **_kwargs):
    require_loopback(environment.host or "")
    if not environment.parsed_options or not environment.parsed_options.run_time:
        raise SystemExit("give --run-time: load runs here are bounded in time")
    print(f"[load] seed {SEED}, {len(CORPUS)} images, {len(BAD)} bad, {len(HOSTILE)} hostile, target {environment.host}")


class Uploader(HttpUser):
    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        self.rng = random.Random(f"{SEED}-{id(self)}")

    @task(10)
    def upload(self) -> None:
        name, body, content_type = self.rng.choice(CORPUS)
        headers = {"Idempotency-Key": str(uuid.UUID(int=self.rng.getrandbits(128)))}
        with self.client.post(UPLOAD_PATH, files={"file": (name, body, content_type)}, headers=headers,
                              name="POST /v1/attachments", catch_response=True) as response:
            if response.status_code == 202:
                self.last_status_url = response.json()["status_url"]
                response.success()
            elif response.status_code == 503:
                response.failure("503 (backpressure)")

    def _send(self, files: list, label: str) -> None:
        if not files:
            return
        name, body, content_type = self.rng.choice(files)
        headers = {"Idempotency-Key": str(uuid.UUID(int=self.rng.getrandbits(128)))}
        with self.client.post(UPLOAD_PATH, files={"file": (name, body, content_type)}, headers=headers,
                              name=f"POST /v1/attachments [{label}]", catch_response=True) as response:
            if response.status_code == 503 or response.status_code >= 500:
                response.failure(f"{response.status_code}")
            else:  # refused (4xx) or accepted (202, to end failed or ready): both are answers
                response.success()

    @task(2)
    def upload_bad(self) -> None:
        self._send(BAD, "bad")

    @task(1)
    def upload_hostile(self) -> None:
        self._send(HOSTILE, "hostile")

    @task(3)
    def poll(self) -> None:
        status_url = getattr(self, "last_status_url", None)
        if status_url:
            self.client.get(status_url, name="GET /v1/attachments/{id}")
