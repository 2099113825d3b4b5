"""The whole stack: PostgreSQL, RabbitMQ, SeaweedFS S3 and Toxiproxy in front of each, on free loopback ports.

Everything lives under one run directory; every process is its own process group, stopped by PID.
A `stack.json` in the run directory records PIDs, ports and URLs so `harness stack down` can stop a stack
started by another process.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..toxiproxy import ProxySpec, Toxiproxy
from .ports import LOOPBACK, PortAllocator, port_listening
from .postgres import Postgres
from .process import kill_group_by_pid
from .rabbitmq import RabbitMQ
from .seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS
from .toxiproxy_server import ToxiproxyServer

SERVICES = ("postgres", "rabbitmq", "s3")
DEFAULT_BUCKET = "attachments"


@dataclass(frozen=True)
class ServiceUrls:
    database_url: str
    amqp_url: str
    s3_endpoint_url: str


@dataclass(frozen=True)
class Tenant:
    """A fresh database, vhost and bucket on a shared stack: isolation without a restart."""

    name: str
    direct: ServiceUrls
    proxied: ServiceUrls
    bucket: str
    rabbitmq_management_url: str
    vhost: str

    def env(self, proxied: bool = True) -> dict[str, str]:
        urls = self.proxied if proxied else self.direct
        return {"DATABASE_URL": urls.database_url, "AMQP_URL": urls.amqp_url,
                "S3_ENDPOINT_URL": urls.s3_endpoint_url, "S3_BUCKET": self.bucket,
                "S3_ACCESS_KEY": ACCESS_KEY, "S3_SECRET_KEY": SECRET_KEY}


def default_run_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="harness-stack-"))


def _reachable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def postgres_root(run_dir: Path) -> Path:
    """PostgreSQL runs as the `postgres` OS user, which must traverse every folder above its data.

    When the run directory sits under a private folder (pytest's tmp, /root), the data goes to its own
    temporary folder and the run directory gets a `postgres` link to it, so all of it is still found there.
    """
    link = run_dir / "postgres"
    if link.is_symlink():
        return link.resolve()
    if _reachable_by_others(run_dir):
        return link
    root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
    os.chmod(root, 0o755)
    link.symlink_to(root, target_is_directory=True)
    return root


@dataclass
class Stack:
    run_dir: Path
    postgres: Postgres
    rabbitmq: RabbitMQ
    s3: SeaweedFS
    toxiproxy_server: ToxiproxyServer
    proxy_ports: dict[str, int]
    ready_seconds: dict[str, float] = field(default_factory=dict)

    s3_access_key = ACCESS_KEY
    s3_secret_key = SECRET_KEY

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path | None = None) -> "Stack":
        run_dir = Path(run_dir) if run_dir else default_run_dir()
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(run_dir, 0o755)  # the postgres OS user must reach its data folder
        ports = PortAllocator()
        postgres = Postgres(root=postgres_root(run_dir), port=ports.take())
        rabbitmq = RabbitMQ(root=run_dir / "rabbitmq", amqp_port=ports.take(), management_port=ports.take(),
                            dist_port=ports.take(), epmd_port=ports.take())
        s3 = SeaweedFS.allocate(run_dir / "seaweedfs", ports, DEFAULT_BUCKET)
        proxy_ports = {name: ports.take() for name in SERVICES}
        upstreams = {"postgres": postgres.port, "rabbitmq": rabbitmq.amqp_port, "s3": s3.s3_port}
        toxi = ToxiproxyServer(root=run_dir / "toxiproxy", api_port=ports.take(),
                               proxies=[ProxySpec(n, proxy_ports[n], upstreams[n]) for n in SERVICES])
        return cls(run_dir, postgres, rabbitmq, s3, toxi, proxy_ports)

    @classmethod
    def start(cls, run_dir: Path | None = None, timeout: float = 60) -> "Stack":
        stack = cls.create(run_dir)
        try:
            stack.start_all(timeout)
        except BaseException:
            stack.stop()
            raise
        return stack

    def _services(self) -> dict[str, object]:
        return {"postgres": self.postgres, "rabbitmq": self.rabbitmq, "s3": self.s3, "toxiproxy": self.toxiproxy_server}

    def start_all(self, timeout: float = 60) -> dict[str, float]:
        """Start the four services at once and wait for each; returns seconds-to-ready per service."""
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {name: pool.submit(self._start_one, name, timeout) for name in self._services()}
            for name, future in futures.items():
                self.ready_seconds[name] = future.result()
        self.ready_seconds["total"] = time.monotonic() - began
        self.write_state()
        return self.ready_seconds

    def _start_one(self, name: str, timeout: float) -> float:
        began = time.monotonic()
        service = self._services()[name]
        service.start()
        service.wait_ready(timeout)
        return time.monotonic() - began

    # --- URLs ----------------------------------------------------------------------------------
    @property
    def direct(self) -> ServiceUrls:
        return ServiceUrls(self.postgres.url("postgres"), self.rabbitmq.amqp_url("/"), self.s3.endpoint_url())

    @property
    def proxied(self) -> ServiceUrls:
        return ServiceUrls(self.postgres.url("postgres", port=self.proxy_ports["postgres"]),
                           self.rabbitmq.amqp_url("/", port=self.proxy_ports["rabbitmq"]),
                           self.s3.endpoint_url(port=self.proxy_ports["s3"]))

    @property
    def rabbitmq_management_url(self) -> str:
        return self.rabbitmq.management_url

    @property
    def s3_bucket(self) -> str:
        return self.s3.bucket

    @property
    def toxiproxy(self) -> Toxiproxy:
        return self.toxiproxy_server.client()

    def new_tenant(self, name: str) -> Tenant:
        """A fresh database, vhost and bucket named after `name` (lower-cased, safe characters only)."""
        safe = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "tenant"
        db_name = safe.replace("-", "_")
        bucket = safe if len(safe) >= 3 else f"{safe}-bucket"
        self.postgres.create_database(db_name)
        self.rabbitmq.create_vhost(safe)
        self.s3.create_bucket(bucket)
        pg, rmq, s3 = self.proxy_ports["postgres"], self.proxy_ports["rabbitmq"], self.proxy_ports["s3"]
        return Tenant(
            name=safe, bucket=bucket, vhost=safe, rabbitmq_management_url=self.rabbitmq_management_url,
            direct=ServiceUrls(self.postgres.url(db_name), self.rabbitmq.amqp_url(safe), self.s3.endpoint_url()),
            proxied=ServiceUrls(self.postgres.url(db_name, port=pg), self.rabbitmq.amqp_url(safe, port=rmq),
                                self.s3.endpoint_url(port=s3)))

    # --- service faults the nemesis needs -------------------------------------------------------
    def alive(self, name: str) -> bool:
        process = self._services()[name].process
        return process is not None and process.alive()

    def kill(self, name: str) -> None:
        """SIGKILL a service's whole process group (its data stays)."""
        self._services()[name].process.kill()
        self.write_state()

    def restart(self, name: str, timeout: float = 60) -> float:
        """Start a service again on the same ports with the same data folder; returns seconds to ready."""
        service = self._services()[name]
        if service.process is not None and service.process.alive():
            service.process.stop()
        took = self._start_one(name, timeout)
        self.write_state()
        return took

    # --- teardown ------------------------------------------------------------------------------
    def own_ports(self) -> list[int]:
        ports = [self.postgres.port, self.rabbitmq.amqp_port, self.rabbitmq.management_port,
                 self.rabbitmq.dist_port, self.rabbitmq.epmd_port, self.s3.s3_port, self.toxiproxy_server.api_port]
        return ports + list(self.s3.other_ports.values()) + list(self.proxy_ports.values())

    def pids(self) -> dict[str, int]:
        procs = {name: svc.process for name, svc in self._services().items()}
        procs["epmd"] = self.rabbitmq.epmd_process
        return {name: p.pid for name, p in procs.items() if p is not None and p.pid is not None}

    def stop(self) -> None:
        """Stop everything this stack started, by PID: Toxiproxy first, RabbitMQ before its epmd."""
        for service in (self.toxiproxy_server, self.s3, self.postgres):
            if service.process is not None:
                service.process.stop()
        self.rabbitmq.stop_all()
        self.write_state(stopped=True)

    def listening_ports(self) -> list[int]:
        return [p for p in self.own_ports() if port_listening(p)]

    # --- state file ----------------------------------------------------------------------------
    def describe(self) -> dict:
        return {
            "run_dir": str(self.run_dir),
            "direct": asdict(self.direct),
            "proxied": asdict(self.proxied),
            "rabbitmq_management_url": self.rabbitmq_management_url,
            "s3_bucket": self.s3_bucket, "s3_access_key": ACCESS_KEY, "s3_secret_key": SECRET_KEY,
            "toxiproxy_api": f"http://{LOOPBACK}:{self.toxiproxy_server.api_port}",
            "pids": self.pids(), "ports": self.own_ports(), "ready_seconds": self.ready_seconds,
        }

    def write_state(self, stopped: bool = False) -> None:
        state = self.describe() | {"stopped": stopped}
        (self.run_dir / "stack.json").write_text(json.dumps(state, indent=2))


def stop_from_state(run_dir: Path) -> dict:
    """Stop a stack recorded in `run_dir/stack.json` (started by another process), by its PIDs."""
    state_file = Path(run_dir) / "stack.json"
    state = json.loads(state_file.read_text())
    order = ["toxiproxy", "s3", "postgres", "rabbitmq", "epmd"]
    for name in order:
        pid = state["pids"].get(name)
        if pid:
            kill_group_by_pid(pid, grace=5)
    state["stopped"] = True
    state_file.write_text(json.dumps(state, indent=2))
    return state
