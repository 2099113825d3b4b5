"""Drives the reference roles as subprocesses (each its own process group) against
a fresh tenant of the real stack, and observes them only through the HTTP API,
the database, S3 and the broker."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import httpx
import psycopg
from psycopg.rows import dict_row
from PIL import Image

from harness.stack.process import group_members
from reference.storage import ObjectStore

REPO = Path(__file__).resolve().parents[3]
SHORT_TIMINGS = {
    "LEASE_SECONDS": "4", "LEASE_RENEW_SECONDS": "1", "SWEEP_INTERVAL_SECONDS": "1",
    "RETRY_BASE_SECONDS": "0.2", "RETRY_CAP_SECONDS": "2", "MAX_ATTEMPTS": "5", "RELAY_POLL_SECONDS": "0.5",
    "STAGING_RETENTION_SECONDS": "3", "WORKER_CONCURRENCY": "2", "IMAGE_WORKERS": "1",
    "SHUTDOWN_GRACE_SECONDS": "8", "OPERATOR_TOKEN": "op-token", "LOG_LEVEL": "INFO",
}
READY_MARKERS = {"worker": "consuming attachments.jobs.process", "relay": "relay connected"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Role:
    name: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)  # the role's own group: never anything else
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        self.process.wait(10)

    def wait_exit(self, timeout: float) -> int:
        return self.process.wait(timeout)


@dataclass
class Pipeline:
    tenant: object
    workdir: Path
    env: dict
    roles: dict = field(default_factory=dict)
    counter: int = 0
    _http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        """One keep-alive client, as a real client would use (a new httpx client per
        request costs tens of milliseconds of TLS-context setup)."""
        if self._http is None:
            self._http = httpx.Client(timeout=30)
        return self._http

    # ------------------------------------------------------------------ processes
    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.env['HTTP_PORT']}"

    def command(self, *args: str, extra_env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "reference.cli", *args], env={**self.env, **(extra_env or {})},
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)

    def migrate(self) -> None:
        done = self.command("migrate")
        assert done.returncode == 0, done.stderr[-3000:]

    def start(self, role: str, name: str | None = None, wait: bool = True, **env) -> Role:
        name = name or role
        self.counter += 1
        log_path = self.workdir / f"{name}-{self.counter}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "reference.cli", role], env={**self.env, **{k: str(v) for k, v in env.items()}},
            stdout=log_path.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        started = Role(name, process, log_path)
        self.roles[name] = started
        if wait:
            self.wait_ready(started)
        return started

    def wait_ready(self, role: Role, timeout: float = 30) -> None:
        kind = role.process.args[-1]

        def ready():
            if not role.alive():
                raise AssertionError(f"{role.name} exited {role.process.returncode}:\n{role.log()[-3000:]}")
            if kind == "api":
                try:
                    return httpx.get(self.api_url + "/healthz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False
            marker = READY_MARKERS.get(kind)
            return marker is None or marker in role.log()

        wait_for(ready, timeout, what=f"{role.name} ready")

    def start_all(self, roles=("api", "relay", "worker", "sweeper"), **env_by_role) -> None:
        """Start several roles at once (their imports overlap), then wait for each.
        ``env_by_role`` maps a role name to its extra environment."""
        started = [self.start(role, wait=False, **env_by_role.get(role, {})) for role in roles]
        for role in started:
            self.wait_ready(role)

    def stop_all(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        for role in list(self.roles.values()):
            # Also a role that ended by itself (a crash failpoint, a test's SIGTERM): what it left in its group
            # (render processes) goes. A group with members keeps its id, so it names nothing else.
            if role.alive() or group_members(role.process.pid):
                role.signal_group(signal.SIGKILL)
                try:
                    role.process.wait(10)
                except subprocess.TimeoutExpired:
                    pass

    # ------------------------------------------------------------------ HTTP
    def upload(self, data: bytes, filename: str = "photo.jpg", headers: dict | None = None,
               timeout: float = 30) -> httpx.Response:
        return self.http.post(self.api_url + "/v1/attachments",
                              files={"file": (filename, data, "application/octet-stream")},
                              headers=headers or {}, timeout=timeout)

    def status(self, attachment_id: str) -> dict:
        response = self.http.get(f"{self.api_url}/v1/attachments/{attachment_id}", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, attachment_id: str) -> list[dict]:
        response = self.http.get(f"{self.api_url}/v1/attachments/{attachment_id}/events", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()["events"]

    def wait_state(self, attachment_id: str, states=("ready",), timeout: float = 45) -> dict:
        return wait_for(lambda: (s := self.status(attachment_id))["state"] in states and s, timeout,
                        interval=0.2, what=f"{attachment_id} in {states}")

    # ------------------------------------------------------------------ direct observation
    def sql(self, query: str, params=None) -> list[dict]:
        with psycopg.connect(self.tenant.direct.database_url, row_factory=dict_row, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    @property
    def store(self) -> ObjectStore:
        return ObjectStore(self.tenant.direct.s3_endpoint_url, self.tenant.bucket, self.env["S3_ACCESS_KEY"],
                           self.env["S3_SECRET_KEY"])

    def amqp(self, coroutine_factory):
        async def run():
            connection = await aio_pika.connect(self.tenant.direct.amqp_url)
            async with connection:
                channel = await connection.channel()
                return await coroutine_factory(channel)

        return asyncio.run(run())

    def queue_depths(self) -> dict[str, int]:
        async def depths(channel):
            out = {}
            for name in ("attachments.jobs.process", "attachments.jobs.dead"):
                queue = await channel.declare_queue(name, passive=True)
                out[name] = queue.declaration_result.message_count
            return out

        return self.amqp(depths)

    def publish_raw(self, body: bytes, **properties) -> None:
        async def publish(channel):
            exchange = await channel.get_exchange("attachments.jobs")
            await exchange.publish(aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                                    **properties), "jobs.process")

        self.amqp(publish)

    def dead_letters(self) -> list[aio_pika.abc.AbstractIncomingMessage]:
        async def drain(channel):
            queue = await channel.declare_queue("attachments.jobs.dead", passive=True)
            out = []
            # unacked gets: closing the connection returns every message to the queue
            while (message := await queue.get(no_ack=False, fail=False)) is not None and len(out) < 100:
                out.append({"body": message.body, "headers": dict(message.headers or {})})
            return out

        return self.amqp(drain)

    # ------------------------------------------------------------------ invariants
    def assert_exactly_once(self, attachment_id: str) -> dict:
        """ready once, one result row per effect key, objects match their checksums,
        and the events are a path of CONTRACT §5 without regression."""
        status = self.status(attachment_id)
        assert status["state"] == "ready", status
        rows = self.sql("SELECT variant, count(*) AS n FROM results WHERE attachment_id = %s GROUP BY variant",
                        (attachment_id,))
        assert rows and all(row["n"] == 1 for row in rows), rows
        expected = json.loads(self.env.get("EXPECT_VARIANTS", '["thumbnail", "crop", "optimized"]'))
        assert sorted(v["name"] for v in status["variants"]) == sorted(expected)
        import hashlib

        for variant in status["variants"]:
            # variants/<attachment>/v<version>/t<fencing token>/<variant>.webp: a key per claim fences writes
            prefix, token, name = variant["key"].rsplit("/", 2)
            assert prefix == f"variants/{attachment_id}/v1" and token[:1] == "t" and token[1:].isdigit()
            assert name == f"{variant['name']}.webp"
            data = self.store.get_bytes(variant["key"])
            assert hashlib.sha256(data).hexdigest() == variant["sha256"] and len(data) == variant["size"]
        original = self.store.get_bytes(status["original"]["key"])
        assert hashlib.sha256(original).hexdigest() == status["original"]["sha256"]
        assert_event_path(self.events(attachment_id))
        return status


ALLOWED = {(None, "queued"), ("queued", "processing"), ("processing", "queued"), ("processing", "ready"),
           ("processing", "failed"), ("failed", "queued")}


def assert_event_path(events: list[dict]) -> None:
    assert events and events[0]["from"] is None and events[0]["to"] == "queued", events
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    for previous, current in zip(events, events[1:]):
        assert current["from"] == previous["to"], events  # a path: each step starts where the last ended
    for event in events:
        assert (event["from"], event["to"]) in ALLOWED, event
    assert sum(1 for e in events if e["to"] == "ready") <= 1
    if any(e["to"] == "ready" for e in events):
        assert events[-1]["to"] == "ready"  # nothing after ready


def sample_jpeg(seed: int = 0, size=(640, 480)) -> bytes:
    """A deterministic photo-like JPEG: the same seed gives the same bytes."""
    rng = random.Random(seed)
    noise = Image.frombytes("L", size, rng.randbytes(size[0] * size[1]))
    gradient = Image.linear_gradient("L").resize(size)
    image = Image.merge("RGB", (Image.blend(gradient, noise, 0.35), gradient.transpose(Image.Transpose.ROTATE_90)
                                .resize(size), noise))
    image.paste((seed * 37 % 255, 80, 160), (0, 0, size[0] // 3, size[1] // 3))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def roles_from(pipeline: Pipeline, monkeypatch) -> None:
    """Run the roles from REFERENCE_UNDER_TEST (a checkout of another commit, e.g. the unfixed /work/base) when it
    is set: its folder becomes the roles' working directory (``python -m`` puts the working directory first on
    sys.path, ahead of PYTHONPATH) and leads their PYTHONPATH. Migrations already ran from this checkout."""
    other = os.environ.get("REFERENCE_UNDER_TEST")
    if not other:
        return
    monkeypatch.setattr(sys.modules[__name__], "REPO", Path(other))
    pipeline.env["PYTHONPATH"] = other + os.pathsep + pipeline.env.get("PYTHONPATH", "")
