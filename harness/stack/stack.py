"""The whole stack: PostgreSQL, RabbitMQ, SeaweedFS S3 and Toxiproxy in front of each, on free loopback ports.

Two folders:
- the run directory (any path, any depth) keeps what a person reads afterwards: `stack.json` and `logs/`;
- the data folder (`data_dir`, a short temporary folder such as /tmp/hs-k2j4x9ab) holds the services' data and
  Unix sockets. It is removed when the stack stops, unless `keep_data` (for a post-mortem).

Every process is its own process group, stopped by PID. `stack.json` in the run directory records PIDs, ports, URLs
and the data folder so `harness stack down` can stop a stack started by another process; it is rewritten as soon as
a process starts, so even a start that was itself killed can be cleaned up.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from ..paths import state_dir
from ..toxiproxy import ProxySpec, Toxiproxy
from . import keeper
from .data_dir import new_data_dir, remove_data_dir
from .ports import LOOPBACK, PortAllocator, StartAbandoned, port_listening
from .postgres import Postgres
from .process import ServiceProcess, signals_deferred, stop_group_by_pid
from .rabbitmq import RabbitMQ
from .seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS, remove_sockets
from .toxiproxy_server import ToxiproxyServer

SERVICES = ("postgres", "rabbitmq", "s3")
DEFAULT_BUCKET = "attachments"


@dataclass(frozen=True)
class ServiceUrls:
    database_url: str
    amqp_url: str
    s3_endpoint_url: str
    # A RabbitMQ cluster: every node's URL, comma-separated, the first being amqp_url ("" on a single node).
    amqp_urls: str = ""


@dataclass(frozen=True)
class Tenant:
    """A fresh database, vhost and bucket on a shared stack: isolation without a restart."""

    name: str
    direct: ServiceUrls
    proxied: ServiceUrls
    bucket: str
    rabbitmq_management_url: str
    vhost: str
    # service -> the Toxiproxy proxy its proxied URL goes through: the run's own proxies, or the stack's shared ones
    proxy_names: dict[str, str] = field(default_factory=lambda: {name: name for name in SERVICES})
    # A RabbitMQ cluster: every node's management API (the first is rabbitmq_management_url).
    rabbitmq_management_urls: tuple[str, ...] = ()
    # The database was cloned from this template (the adapter's setup already ran in it); "" when made empty.
    template: str = ""
    # The tenant's own S3 key (its bucket only), what its proxied environment gives the roles; the direct
    # environment, the harness's own reads, keeps the stack's admin key.
    s3_access_key: str = ACCESS_KEY
    s3_secret_key: str = SECRET_KEY

    def env(self, proxied: bool = True) -> dict[str, str]:
        """The contract's variables. Proxied (what a submission's roles get): through Toxiproxy, with the tenant's
        own database role, broker user and S3 key, none of which reaches another tenant. Direct (the harness's own
        observers): the services' own ports, as the stack's administrator."""
        urls = self.proxied if proxied else self.direct
        env = {"DATABASE_URL": urls.database_url, "AMQP_URL": urls.amqp_url,
               "S3_ENDPOINT_URL": urls.s3_endpoint_url, "S3_BUCKET": self.bucket,
               "S3_ACCESS_KEY": self.s3_access_key if proxied else ACCESS_KEY,
               "S3_SECRET_KEY": self.s3_secret_key if proxied else SECRET_KEY}
        if urls.amqp_urls:  # a cluster: every broker, each through its own proxy (docs/CONTRACT.md §2)
            env["AMQP_URLS"] = urls.amqp_urls
        return env


@dataclass
class DatabaseTemplate:
    """A database the adapter's setup command ran in once ([setup] template = true), which tenants are cloned from
    (``CREATE DATABASE … TEMPLATE``). Made once per stack per key (``Stack.database_template``), kept while the stack
    lives; ``ok`` False (its setup failed, or it could not be made) means tenants are made empty, as without it."""

    key: str
    database: str
    ok: bool = False
    done: bool = False
    setup_seconds: float = 0.0  # the setup command's time, once
    make_seconds: float = 0.0  # the template made: its tenant, the setup command, sealed
    log_path: str = ""
    error: str = ""
    clones: int = 0
    clone_seconds: float = 0.0
    clone_errors: list[str] = field(default_factory=list)
    # Held while the template is made and around every clone: CREATE DATABASE … TEMPLATE needs no other session on
    # it, so tenants made in parallel copy it one at a time.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stats(self) -> dict:
        return {"key": self.key[:16], "database": self.database, "ok": self.ok, "setup_seconds": round(self.setup_seconds, 2),
                "make_seconds": round(self.make_seconds, 2), "clones": self.clones,
                "clone_seconds": round(self.clone_seconds, 2), **({"error": self.error} if self.error else {}),
                **({"clone_errors": self.clone_errors[:5]} if self.clone_errors else {})}


# Toxiproxy first (clients see their connections end), RabbitMQ before its epmd.
STOP_ORDER = ("toxiproxy", "s3", "postgres", "rabbitmq", "epmd")


def stop_order(names) -> list[str]:
    """STOP_ORDER with a cluster's other nodes (rabbitmq-2, ...) after the first node, before epmd."""
    extra = sorted((n for n in names if n.startswith("rabbitmq-")), key=lambda n: int(n.rsplit("-", 1)[1]))
    order = list(STOP_ORDER)
    return order[:order.index("epmd")] + extra + ["epmd"]


def stop_plan(name: str, keep_data: bool) -> dict:
    """How one process group is stopped: the signal, seconds of grace before SIGKILL, to the leader alone or not."""
    if name == "postgres":
        # Fast shutdown, sent to the postmaster alone: its children run in sessions of their own and are stopped
        # by it; a SIGKILLed postmaster would leave its shared memory behind in /dev/shm.
        return {"sig": signal.SIGINT, "grace": 10.0, "leader_only": True}
    if name == "epmd" or not keep_data:
        # The data is removed next: nothing to flush, no reason to wait (a graceful RabbitMQ stop takes ~13 s).
        return {"sig": signal.SIGKILL, "grace": 0.0, "leader_only": False}
    return {"sig": signal.SIGTERM, "grace": 20.0 if name.startswith("rabbitmq") else 5.0, "leader_only": False}


def default_run_dir() -> Path:
    """A new folder under the checkout's `.run/stacks/` (an installed harness: the current directory's): the logs
    outlive the stack, and /tmp is no place for them."""
    root = state_dir() / "stacks"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=datetime.now().strftime("%Y%m%dT%H%M%S-"), dir=root))


@dataclass
class Stack:
    run_dir: Path
    data_dir: Path
    postgres: Postgres
    rabbitmq: RabbitMQ
    s3: SeaweedFS
    toxiproxy_server: ToxiproxyServer
    proxy_ports: dict[str, int]
    keep_data: bool = False
    ready_seconds: dict[str, float] = field(default_factory=dict)
    # A RabbitMQ cluster's other nodes ("rabbitmq-2", ...); `rabbitmq` is its first node. Empty: one node.
    rabbitmq_peers: list[RabbitMQ] = field(default_factory=list)
    _state_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # [setup] template = true: key -> the database template made on this stack (``database_template``)
    _templates: dict[str, DatabaseTemplate] = field(default_factory=dict, repr=False)
    _templates_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    s3_access_key = ACCESS_KEY
    s3_secret_key = SECRET_KEY

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path | None = None, keep_data: bool = False, rabbitmq_nodes: int = 1) -> "Stack":
        """Folders and ports, nothing started. `run_dir` may be at any depth: no socket or data goes there."""
        run_dir = Path(run_dir) if run_dir else default_run_dir()
        log_dir = run_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        data_dir = new_data_dir(run_dir)
        if not keep_data:
            keeper.register_path(data_dir)
        try:
            ports = PortAllocator()
            postgres = Postgres(root=data_dir / "postgres", log_dir=log_dir, port=ports.take())
            cookie = secrets.token_hex(16) if rabbitmq_nodes > 1 else None  # private to this stack's cluster
            rabbitmq = RabbitMQ(root=data_dir / "rabbitmq", log_dir=log_dir, amqp_port=ports.take(),
                                management_port=ports.take(), dist_port=ports.take(), epmd_port=ports.take(),
                                cookie=cookie)
            peers = [RabbitMQ(root=data_dir / f"rabbitmq-{i}", log_dir=log_dir, amqp_port=ports.take(),
                              management_port=ports.take(), dist_port=ports.take(), epmd_port=rabbitmq.epmd_port,
                              label=f"rabbitmq-{i}", cookie=cookie, seeds=(rabbitmq.node_name,), own_epmd=False)
                     for i in range(2, rabbitmq_nodes + 1)]
            s3 = SeaweedFS.allocate(data_dir / "seaweedfs", log_dir, ports, DEFAULT_BUCKET)
            names = [*SERVICES, *(p.label for p in peers)]
            proxy_ports = {name: ports.take() for name in names}
            upstreams = {"postgres": postgres.port, "rabbitmq": rabbitmq.amqp_port, "s3": s3.s3_port,
                         **{p.label: p.amqp_port for p in peers}}
            toxi = ToxiproxyServer(log_dir=log_dir, api_port=ports.take(),
                                   proxies=[ProxySpec(n, proxy_ports[n], upstreams[n]) for n in names])
            stack = cls(run_dir, data_dir, postgres, rabbitmq, s3, toxi, proxy_ports, keep_data=keep_data,
                        rabbitmq_peers=peers)
            stack.unix_socket_paths()  # refuses, before anything starts, a socket path the kernel cannot bind
            stack.write_state()
        except BaseException:
            remove_data_dir(data_dir)
            raise
        return stack

    @classmethod
    def start(cls, run_dir: Path | None = None, timeout: float = 60, keep_data: bool = False,
              rabbitmq_nodes: int = 1) -> "Stack":
        """Create and start; on any failure or interrupt, everything started so far is stopped before raising."""
        stack = cls.create(run_dir, keep_data, rabbitmq_nodes)
        try:
            stack.start_all(timeout)
        except BaseException:
            stack.stop()
            raise
        return stack

    def _services(self) -> dict[str, object]:
        return {"postgres": self.postgres, "rabbitmq": self.rabbitmq, "s3": self.s3, "toxiproxy": self.toxiproxy_server,
                **{p.label: p for p in self.rabbitmq_peers}}

    @property
    def rabbitmq_nodes(self) -> list[RabbitMQ]:
        """Every RabbitMQ node, the first (service "rabbitmq") first."""
        return [self.rabbitmq, *self.rabbitmq_peers]

    def service_names(self) -> list[str]:
        """The services a fault may stop and the heal brings back: a cluster's every node among them."""
        return [*SERVICES, *(p.label for p in self.rabbitmq_peers)]

    def _upstreams(self) -> dict[str, int]:
        return {"postgres": self.postgres.port, "rabbitmq": self.rabbitmq.amqp_port, "s3": self.s3.s3_port,
                **{p.label: p.amqp_port for p in self.rabbitmq_peers}}

    def unix_socket_paths(self) -> list[Path]:
        """Every Unix socket the services bind: all in the short data folder (each checked against the limit)."""
        return [self.postgres.socket_path, *self.s3.socket_paths.values()]

    def start_all(self, timeout: float = 60) -> dict[str, float]:
        """Start the four services at once and wait for each; returns seconds-to-ready per service.

        The first failure (a service that exits, or one not ready in time) ends the wait for the others at once.
        """
        began = time.monotonic()
        abandon = threading.Event()
        pool = ThreadPoolExecutor(max_workers=len(self._services()), thread_name_prefix="stack-start")
        self._first_node_ready = threading.Event()
        futures = {name: pool.submit(self._start_one, name, timeout, abandon) for name in self._services()}
        try:
            wait(futures.values(), return_when=FIRST_EXCEPTION)
            failed = [f.exception() for f in futures.values() if f.done() and f.exception() is not None]
            if failed:
                raise failed[0]
            for name, future in futures.items():
                self.ready_seconds[name] = future.result()
            if self.rabbitmq_peers:
                self.ready_seconds["rabbitmq-cluster"] = self.wait_cluster(timeout, abandon)
        finally:
            # Also on Ctrl-C: the other starts stop waiting, and every process they spawned is recorded on its
            # service before anyone stops the stack.
            abandon.set()
            with signals_deferred():
                pool.shutdown(wait=True)
        self.ready_seconds["total"] = time.monotonic() - began
        self.write_state()
        return self.ready_seconds

    def _start_one(self, name: str, timeout: float, abandon: threading.Event | None = None) -> float:
        began = time.monotonic()
        service = self._services()[name]
        first_boot = getattr(self, "_first_node_ready", None)
        if name.startswith("rabbitmq-") and first_boot is not None and not first_boot.is_set():
            # A joining node's first boot needs the first node up (its only seed); a restart does not.
            while not first_boot.wait(0.1):
                if (abandon is not None and abandon.is_set()) or time.monotonic() - began > timeout:
                    raise StartAbandoned(f"{name}: start abandoned (the first RabbitMQ node never came up)")
        if abandon is not None and abandon.is_set():
            raise StartAbandoned(f"{name}: start abandoned")
        service.start()
        self.write_state()  # its PID on record at once: `harness stack down` can stop even an interrupted start
        service.wait_ready(timeout, abandon=abandon)
        if name == "rabbitmq" and first_boot is not None:
            first_boot.set()
        return time.monotonic() - began

    def wait_cluster(self, timeout: float = 60, abandon: threading.Event | None = None) -> float:
        """Wait until the first node sees every node of the cluster running; returns the seconds waited."""
        from .ports import wait_until

        began = time.monotonic()
        want = sorted(n.node_name for n in self.rabbitmq_nodes)

        def joined() -> bool:
            try:
                return self.rabbitmq.cluster_nodes() == want
            except Exception:
                return False
        wait_until(joined, timeout, f"RabbitMQ cluster of {len(want)} nodes", interval=0.2, abandon=abandon)
        return time.monotonic() - began

    # --- URLs ----------------------------------------------------------------------------------
    @property
    def direct(self) -> ServiceUrls:
        return ServiceUrls(self.postgres.url("postgres"), self.rabbitmq.amqp_url("/"), self.s3.endpoint_url(),
                           self._amqp_urls("/"))

    def _amqp_urls(self, vhost: str, ports: dict[str, int] | None = None, **credentials: str) -> str:
        """A cluster's every node (through ``ports``, the proxies, when given), comma-separated; "" for one node."""
        if not self.rabbitmq_peers:
            return ""
        return ",".join(node.amqp_url(vhost, port=(ports or {}).get(node.label), **credentials)
                        for node in self.rabbitmq_nodes)

    @property
    def proxied(self) -> ServiceUrls:
        return ServiceUrls(self.postgres.url("postgres", port=self.proxy_ports["postgres"]),
                           self.rabbitmq.amqp_url("/", port=self.proxy_ports["rabbitmq"]),
                           self.s3.endpoint_url(port=self.proxy_ports["s3"]), self._amqp_urls("/", self.proxy_ports))

    @property
    def rabbitmq_management_url(self) -> str:
        return self.rabbitmq.management_url

    @property
    def s3_bucket(self) -> str:
        return self.s3.bucket

    @property
    def toxiproxy(self) -> Toxiproxy:
        return self.toxiproxy_server.client()

    def new_tenant(self, name: str, private_proxies: bool = False, template: DatabaseTemplate | None = None) -> Tenant:
        """A fresh database, vhost and bucket named after `name` (lower-cased, safe characters only). With
        ``private_proxies`` its proxied URLs go through Toxiproxy proxies of its own (removed by ``close_tenant``),
        so its network faults reach no other tenant. With a ``template`` that is ``ok``, the database is a copy of
        it (the tenant's ``template`` names it); should the copy fail, the database is made empty, as without one."""
        safe = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "tenant"
        db_name = safe.replace("-", "_")
        bucket = safe if len(safe) >= 3 else f"{safe}-bucket"
        # Credentials of its own for each service: its roles reach its own database, vhost and bucket only.
        db_password, amqp_password = secrets.token_hex(12), secrets.token_hex(12)
        self.postgres.create_role(db_name, db_password)
        cloned = self._clone_database(db_name, template) if template is not None and template.ok else ""
        if not cloned:
            self.postgres.create_database(db_name, owner=db_name)
        self.rabbitmq.create_vhost(safe)
        self.rabbitmq.create_user(safe, amqp_password, safe)
        self.s3.create_bucket(bucket)
        s3_access_key, s3_secret_key = self.s3.create_credentials(bucket)
        names = {service: service for service in self.service_names()}
        ports = dict(self.proxy_ports)
        if private_proxies:
            upstreams = self._upstreams()
            names = {service: f"{safe}-{service}" for service in self.service_names()}
            try:
                for service in self.service_names():
                    ports[service] = self.toxiproxy.create_proxy(names[service], upstreams[service])
            except BaseException:
                self.toxiproxy.scoped(names).close()
                raise
        pg, rmq, s3 = ports["postgres"], ports["rabbitmq"], ports["s3"]
        return Tenant(
            name=safe, bucket=bucket, vhost=safe, rabbitmq_management_url=self.rabbitmq_management_url,
            direct=ServiceUrls(self.postgres.url(db_name), self.rabbitmq.amqp_url(safe), self.s3.endpoint_url(),
                               self._amqp_urls(safe)),
            proxied=ServiceUrls(self.postgres.url(db_name, port=pg, user=db_name, password=db_password),
                                self.rabbitmq.amqp_url(safe, port=rmq, user=safe, password=amqp_password),
                                self.s3.endpoint_url(port=s3),
                                self._amqp_urls(safe, ports, user=safe, password=amqp_password)),
            proxy_names=names,
            rabbitmq_management_urls=tuple(n.management_url for n in self.rabbitmq_nodes) if self.rabbitmq_peers else (),
            template=cloned, s3_access_key=s3_access_key, s3_secret_key=s3_secret_key)

    # --- database templates ([setup] template = true) -----------------------------------------
    def _clone_database(self, db_name: str, template: DatabaseTemplate) -> str:
        """``db_name`` as a copy of ``template``; the template's name, or "" when the copy failed."""
        with template.lock:  # one copy at a time: CREATE DATABASE … TEMPLATE refuses a template in use
            began = time.monotonic()
            try:
                self.postgres.create_database(db_name, template=template.database, owner=db_name)
            except Exception as exc:
                template.clone_errors.append(f"{db_name}: {type(exc).__name__}: {exc}")
                return ""
            template.clones += 1
            template.clone_seconds += time.monotonic() - began
        return template.database

    def database_template(self, key: str, make) -> tuple[DatabaseTemplate, bool]:
        """The database template for ``key`` on this stack, made on first use: a tenant of its own (database, vhost,
        bucket, private proxies: the shape a run's tenant has) in which ``make(tenant)`` runs the adapter's setup
        command and returns ``(ok, setup seconds, log path)``; then its proxies are removed and the database is
        sealed (``Postgres.seal_template``). Returns the template and whether this call made it. A template whose
        making failed is kept as not ``ok``: it is not tried again, and tenants are made empty."""
        with self._templates_lock:
            template = self._templates.get(key)
            if template is None:
                template = self._templates[key] = DatabaseTemplate(key, f"tpl_{key[:16]}")
        with template.lock:
            if template.done:
                return template, False
            began = time.monotonic()
            try:
                tenant = self.new_tenant(f"tpl-{key[:16]}", private_proxies=True)
                try:
                    ok, template.setup_seconds, template.log_path = make(tenant)
                finally:
                    self.close_tenant(tenant)
                if ok:
                    self.postgres.seal_template(template.database)
                    template.ok = True
                else:
                    template.error = f"the setup command failed in the template (see {template.log_path})"
            except Exception as exc:  # its tenants are made empty, their runs run the setup themselves
                template.error = f"{type(exc).__name__}: {exc}"
            template.make_seconds = time.monotonic() - began
            template.done = True
            return template, True

    def template_stats(self, keys=None) -> list[dict]:
        """What each database template made on this stack cost and served (only those of ``keys``, when given)."""
        with self._templates_lock:
            return [t.stats() for t in self._templates.values() if t.done and (keys is None or t.key in keys)]

    def drop_templates(self) -> None:
        """Drop every database template made on this stack (the stack is stopping); best effort."""
        with self._templates_lock:
            templates = [t for t in self._templates.values() if t.ok]
        for template in templates:
            with template.lock:
                try:
                    self.postgres.drop_template(template.database)
                    template.ok = False
                except Exception as exc:
                    print(f"[stack] could not drop the database template {template.database}: {exc}",
                          file=sys.stderr)

    def role_proxy(self, tenant: Tenant, role: str, service: str) -> int:
        """A proxy of its own for one role's link to ``service`` (every instance of the role goes through it), so a
        fault can reach that role alone while the others keep their links. Registered in the tenant's proxies as
        ``service@role`` (faults, heal and ``close_tenant`` cover it); returns the port it listens on."""
        upstreams = self._upstreams()
        name = f"{tenant.name}-{service}-{re.sub(r'[^a-z0-9]+', '-', role.lower())}"
        port = self.toxiproxy.create_proxy(name, upstreams[service])
        tenant.proxy_names[f"{service}@{role}"] = name
        return port

    def tenant_toxiproxy(self, tenant: Tenant):
        """Network faults for one tenant, on the proxies its roles connect through and no others."""
        return self.toxiproxy.scoped(tenant.proxy_names)

    def close_tenant(self, tenant: Tenant) -> None:
        """Remove the tenant's private proxies and its S3 key (its database, vhost and bucket stay for a post-mortem,
        read with the stack's own credentials): a key left in the store slows every later tenant's (see
        ``SeaweedFS.remove_credentials``). Closing twice is harmless."""
        private = {s: n for s, n in tenant.proxy_names.items() if n != s}
        try:
            if private:
                self.toxiproxy.scoped(private).close()
        finally:
            if tenant.s3_access_key != ACCESS_KEY:
                self.s3.remove_credentials(tenant.bucket)

    # --- service faults the nemesis needs -------------------------------------------------------
    def alive(self, name: str) -> bool:
        process = self._services()[name].process
        return process is not None and process.alive()

    def kill(self, name: str) -> None:
        """SIGKILL a service's whole process group (its data stays)."""
        self._services()[name].process.kill()
        self.write_state()

    def stop_service(self, name: str) -> None:
        """Stop a service the way its operator would (SIGTERM, its data kept), as in a node restart."""
        self._services()[name].process.stop(**stop_plan(name, keep_data=True))
        self.write_state()

    def restart(self, name: str, timeout: float = 60) -> float:
        """Start a service again on the same ports with the same data folder; returns seconds to ready."""
        service = self._services()[name]
        if service.process is not None and service.process.alive():
            service.process.stop(**stop_plan(name, keep_data=True))  # its data must survive
        took = self._start_one(name, timeout)
        self.write_state()
        return took

    # --- teardown ------------------------------------------------------------------------------
    def own_ports(self) -> list[int]:
        ports = [self.postgres.port, self.rabbitmq.amqp_port, self.rabbitmq.management_port,
                 self.rabbitmq.dist_port, self.rabbitmq.epmd_port, self.s3.s3_port, self.toxiproxy_server.api_port]
        for node in self.rabbitmq_peers:
            ports += [node.amqp_port, node.management_port, node.dist_port]
        return ports + list(self.s3.other_ports.values()) + list(self.proxy_ports.values())

    def processes(self) -> dict[str, ServiceProcess | None]:
        procs = {name: svc.process for name, svc in self._services().items()}
        procs["epmd"] = self.rabbitmq.epmd_process
        return procs

    def detach(self) -> None:
        """Hand the services over to whoever stops them by PID (``harness stack down`` reads stack.json): they
        outlive this process, where otherwise its keeper kills them when it ends."""
        for pid in self.pids().values():
            keeper.release(pid)
        for path in (self.data_dir, *self.s3.stray_sockets):
            keeper.release_path(path)

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes().items() if p is not None and p.pid is not None}

    def marks(self) -> dict[str, str]:
        """Each started service's mark: what it started outside its group carries it (keeper.kill_marked)."""
        return {name: p.mark for name, p in self.processes().items() if p is not None and p.pid is not None}

    def stop(self) -> None:
        """Stop everything this stack started, by PID, then remove the data folder (unless `keep_data`).

        Safe to call twice, and not cut short by a second Ctrl-C.
        """
        errors = []
        if self._templates and self.alive("postgres"):
            self.drop_templates()
        with signals_deferred():
            processes = self.processes()
            for name in stop_order(processes):
                process = processes[name]
                try:
                    if process is not None:
                        process.stop(**stop_plan(name, self.keep_data))
                except Exception as exc:  # stop the others regardless
                    errors.append(f"{name}: {type(exc).__name__}: {exc}")
            self.s3.remove_stray_sockets()
            self.write_state(stopped=True)
            release_data_dir(self.data_dir, self.keep_data)
        if errors:
            raise RuntimeError("stopping the stack: " + "; ".join(errors))

    def listening_ports(self) -> list[int]:
        return [p for p in self.own_ports() if port_listening(p)]

    # --- state file ----------------------------------------------------------------------------
    def describe(self) -> dict:
        return {
            "run_dir": str(self.run_dir),
            "logs": str(self.run_dir / "logs"),
            "data_dir": str(self.data_dir), "keep_data": self.keep_data,
            "direct": asdict(self.direct),
            "proxied": asdict(self.proxied),
            "rabbitmq_management_url": self.rabbitmq_management_url,
            **({"rabbitmq_nodes": [{"service": n.label, "node": n.node_name, "amqp_port": n.amqp_port,
                                    "management_url": n.management_url, "dist_port": n.dist_port,
                                    "proxy_port": self.proxy_ports[n.label]} for n in self.rabbitmq_nodes]}
               if self.rabbitmq_peers else {}),
            "s3_bucket": self.s3_bucket, "s3_access_key": ACCESS_KEY, "s3_secret_key": SECRET_KEY,
            "toxiproxy_api": f"http://{LOOPBACK}:{self.toxiproxy_server.api_port}",
            "pids": self.pids(), "marks": self.marks(), "ports": self.own_ports(), "ready_seconds": self.ready_seconds,
            "stray_sockets": [str(p) for p in self.s3.stray_sockets],
        }

    def write_state(self, stopped: bool = False) -> None:
        with self._state_lock:  # services start in parallel threads, each recording its PID
            _write_json_atomically(self.run_dir / "stack.json", self.describe() | {"stopped": stopped})


def _write_json_atomically(path: Path, state: dict) -> None:
    # `harness stack down` or a test may read it while a start is still writing it.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(state, indent=2))
    os.replace(partial, path)


def release_data_dir(data_dir: Path | str | None, keep_data: bool) -> None:
    keeper.release_path(data_dir)
    if keep_data:
        print(f"[stack] service data kept for a post-mortem in {data_dir} (remove it when done)", file=sys.stderr)
    elif not remove_data_dir(data_dir):
        print(f"[stack] could not remove the data folder {data_dir}", file=sys.stderr)


def stop_from_state(run_dir: Path) -> dict:
    """Stop a stack recorded in `run_dir/stack.json` (started by another process), by its PIDs, and remove its
    data folder unless it was started with `keep_data`."""
    state_file = Path(run_dir) / "stack.json"
    state = json.loads(state_file.read_text())
    keep_data = bool(state.get("keep_data"))
    with signals_deferred():
        if not state.get("stopped"):  # PIDs of a stopped stack may belong to someone else by now
            for name in stop_order(state["pids"]):
                pid = state["pids"].get(name)
                if pid:
                    stop_group_by_pid(pid, **stop_plan(name, keep_data), mark=state.get("marks", {}).get(name))
            remove_sockets(state.get("stray_sockets", []))
        state["stopped"] = True
        _write_json_atomically(state_file, state)
        release_data_dir(state.get("data_dir"), keep_data)
    return state
