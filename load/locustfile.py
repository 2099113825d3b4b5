"""Upload load against an attachment API on this machine.

    .venv/bin/locust -f load/locustfile.py --headless --host http://127.0.0.1:8000 -u 8 -r 4 --run-time 30s

Bounded by --run-time (required) and loopback-only. LOAD_SEED picks the image corpus (default 1).
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


@events.init.add_listener
def _check_target(environment, **_kwargs):
    require_loopback(environment.host or "")
    if not environment.parsed_options or not environment.parsed_options.run_time:
        raise SystemExit("give --run-time: load runs here are bounded in time")
    print(f"[load] seed {SEED}, {len(CORPUS)} images, target {environment.host}")


class Uploader(HttpUser):
    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        self.rng = random.Random(f"{SEED}-{id(self)}")

    @task(10)
    def upload(self) -> None:
        name, body, content_type = self.rng.choice(CORPUS)
        headers = {"Idempotency-Key": str(uuid.UUID(int=self.rng.getrandbits(128)))}
        with self.client.post("/v1/attachments", files={"file": (name, body, content_type)}, headers=headers,
                              name="POST /v1/attachments", catch_response=True) as response:
            if response.status_code == 202:
                self.last_status_url = response.json()["status_url"]
                response.success()
            elif response.status_code == 503:
                response.failure("503 (backpressure)")

    @task(3)
    def poll(self) -> None:
        status_url = getattr(self, "last_status_url", None)
        if status_url:
            self.client.get(status_url, name="GET /v1/attachments/{id}")
