"""An implementation's roles on a fresh tenant of a private stack, for load runs: the adapter's setup command, its
roles started (all, or all but the consumers) as supervised process groups, their resident memory, and the upload
helper. The same env as harness/runner.py gives roles, but direct links (no Toxiproxy in the way of a load run)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from harness import http_clients, isolation
from harness.runner import free_port, wait_http_healthy
from harness.supervisor import Supervisor, group_members


def group_rss_kib(pgid: int) -> int:
    """Resident memory of every process in group ``pgid`` (a role and its children: image pools, sandboxes)."""
    total = 0
    for pid in group_members(pgid):
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total


class Deployment:
    """One tenant (database, vhost, bucket) and the implementation's roles on it."""

    def __init__(self, stack, adapter, run_dir: Path, name: str, level: int | None = None,
                 extra_env: dict[str, str] | None = None, say=print):
        self.stack, self.adapter, self.run_dir, self.say = stack, adapter, Path(run_dir), say
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tenant = stack.new_tenant(f"load-{name}-{uuid.uuid4().hex[:6]}")
        self.port = int(adapter.http["port"]) or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.role_tmp = tempfile.mkdtemp(prefix="harness-load-")
        inherited = isolation.base_environ() if isolation.enabled() else os.environ  # isolated: never the grader's
        env = {**inherited, **adapter.env, "HTTP_PORT": str(self.port), "LEVEL": str(level or adapter.level),
               "OPERATOR_TOKEN": adapter.operator_token, "FAILPOINTS": "", "TMPDIR": self.role_tmp,
               **(extra_env or {}), **self.tenant.env(proxied=False)}
        env.pop("VIRTUAL_ENV", None)
        self.env = env
        self.supervisor = Supervisor(self.run_dir / name)
        self.supervisor.prepare_env = adapter.interpolate_env  # the adapter's ${VAR} references
        self.words = adapter.vocabulary  # its upload and status paths, its state names
        for role_name, role in adapter.roles.items():
            command = adapter.resolve_command(role.command)
            for index in range(role.instances):
                instance = role_name if index == 0 else f"{role_name}#{index + 1}"
                self.supervisor.add(instance, role_name, command, {**env, **role.env, **(extra_env or {})})
        self.work_queue = adapter.broker["work_queue"]
        self.management = http_clients.client(base_url=self.tenant.rabbitmq_management_url, timeout=5,
                                              auth=_auth(self.tenant.direct.amqp_url))
        self.vhost = self.tenant.vhost

    def setup(self) -> None:
        setup = self.adapter.setup
        if not setup:
            return
        command = self.adapter.resolve_command(setup["command"])
        with open(self.supervisor.logs / "setup.log", "wb") as log:
            env = self.adapter.interpolate_env({**self.env, **{k: str(v) for k, v in (setup.get("env") or {}).items()}})
            done = subprocess.run(command, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=float(setup.get("timeout_seconds", 120)),
                                  start_new_session=True)
        if done.returncode != 0:
            from harness.supervisor import log_tail

            last = " | ".join(log_tail(self.supervisor.logs / "setup.log", 3).splitlines())
            raise RuntimeError(f"setup command exited {done.returncode} ({last[:300]}); see "
                               f"{self.supervisor.logs}/setup.log")

    def consumer_instances(self) -> list[str]:
        consumers = set(self.adapter.roles_flagged("consumer"))
        return [n for n, i in self.supervisor.instances.items() if i.role in consumers]

    def start(self, consumers: bool) -> None:
        held = set(self.consumer_instances())
        names = [n for n in self.supervisor.instances if consumers == (n in held)]
        for name in names:
            self.supervisor.start(name)
        if not consumers:
            self.wait_healthy()

    def wait_healthy(self) -> None:
        wait_http_healthy(self.adapter, self.base_url)

    def consumer_rss_kib(self) -> int:
        return sum(group_rss_kib(i.pid) for n, i in self.supervisor.instances.items()
                   if n in self.consumer_instances() and i.alive())

    def queue(self) -> dict | None:
        """The work queue as the management API reports it (None while it does not exist)."""
        vhost = urllib.parse.quote(self.vhost, safe="")
        response = self.management.get(f"/api/queues/{vhost}/{urllib.parse.quote(self.work_queue, safe='')}")
        if response.status_code != 200:
            return None
        body = response.json()
        return {"ready": body.get("messages_ready"), "unacked": body.get("messages_unacknowledged"),
                "acked": (body.get("message_stats") or {}).get("ack", 0), "consumers": body.get("consumers")}

    def upload_many(self, files: list[tuple[str, bytes, str]], count: int, concurrency: int = 16,
                    progress=None) -> list[str]:
        """``count`` uploads (cycling through ``files``) by ``concurrency`` threads; 503s are retried after their
        Retry-After. Returns the accepted attachment ids."""
        ids: list[str] = []
        lock = threading.Lock()
        local = threading.local()

        def one(index: int) -> None:
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = http_clients.client(base_url=self.base_url, timeout=30)
            name, body, content_type = files[index % len(files)]
            key = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.tenant.name}/{index}"))
            for _ in range(60):
                try:
                    response = client.post(self.words.upload_path(), files={"file": (name, body, content_type)},
                                           headers={"Idempotency-Key": key})
                except httpx.HTTPError:
                    time.sleep(0.5)
                    continue
                if response.status_code in (200, 201, 202):
                    with lock:
                        ids.append(response.json()["attachment_id"])
                        if progress and len(ids) % 1000 == 0:
                            progress(len(ids))
                    return
                if response.status_code in (429, 503):
                    time.sleep(min(2.0, float(response.headers.get("Retry-After", "0.5") or 0.5)))
                    continue
                raise RuntimeError(f"upload {index} answered {response.status_code}: {response.text[:200]}")
            raise RuntimeError(f"upload {index} not accepted after 60 tries")

        with ThreadPoolExecutor(concurrency, thread_name_prefix="upload") as pool:
            list(pool.map(one, range(count)))
        return ids

    def states(self, ids: list[str], concurrency: int = 8) -> dict[str, str | None]:
        local = threading.local()

        def one(attachment_id: str):
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = http_clients.client(base_url=self.base_url, timeout=10)
            try:
                response = client.get(self.words.status_path(attachment_id))
                return attachment_id, (self.words.state(response.json().get("state")) if response.status_code == 200
                                       else None)
            except httpx.HTTPError:
                return attachment_id, None

        with ThreadPoolExecutor(concurrency, thread_name_prefix="state") as pool:
            return dict(pool.map(one, ids))

    def stop(self) -> None:
        self.supervisor.stop_all()
        self.management.close()
        shutil.rmtree(self.role_tmp, ignore_errors=True)
        try:
            self.stack.close_tenant(self.tenant)
        except Exception:
            pass


def _auth(amqp_url: str) -> tuple[str, str]:
    from harness.broker import management_auth

    return management_auth(amqp_url)
