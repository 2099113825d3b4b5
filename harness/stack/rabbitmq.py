"""A private RabbitMQ node with its own epmd, ports, cookie and data (quorum queues, management API).

Its data (mnesia, queues, cookie, config) lives in the stack's data folder; its logs in the run directory.
Erlang distribution and epmd use TCP on loopback only, so no Unix socket path is involved.

A cluster (``harness stack up --rabbitmq-nodes 3``) is several such nodes sharing one private epmd (run by the
first node) and one private Erlang cookie; the later nodes join the first by classic-config peer discovery at their
first boot (a restarted node finds its cluster in its own data).
"""
from __future__ import annotations

import os
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .. import http_clients
from .ports import LOOPBACK, can_connect, wait_until
from .process import ServiceProcess
from .tools import epmd, rabbitmq_bindir

USER = "harness"
PASSWORD = "harness"
# What a tenant's broker user may configure, write and read in its vhost: everything but the harness's names.
TENANT_RESOURCES = r"^(?!harness\.).*"

CONFIG = """\
listeners.tcp.1 = {ip}:{amqp_port}
management.tcp.ip = {ip}
management.tcp.port = {management_port}
loopback_users = none
default_user = {user}
default_pass = {password}
default_user_tags.administrator = true
log.console = false
log.file.level = warning
collect_statistics_interval = 500
"""

# Appended for a node that joins a cluster at its first boot: the first node is its only seed.
CLUSTER_CONFIG = """\
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.discovery_retry_limit = 60
cluster_formation.discovery_retry_interval = 500
"""


@dataclass
class RabbitMQ:
    root: Path  # in the stack's data folder
    log_dir: Path  # in the run directory
    amqp_port: int
    management_port: int
    dist_port: int
    epmd_port: int
    process: ServiceProcess | None = None
    epmd_process: ServiceProcess | None = None
    # Cluster mode: the service name ("rabbitmq", "rabbitmq-2", ...), the shared cookie, the nodes it joins at its
    # first boot, and whether it runs the shared epmd (the first node) or uses the one already there.
    label: str = "rabbitmq"
    cookie: str | None = None
    seeds: tuple[str, ...] = ()
    own_epmd: bool = True

    @property
    def name(self) -> str:
        return self.label

    @property
    def node_name(self) -> str:
        # The node name embeds the AMQP port so it stays the same across restarts of this node.
        return f"harness-{self.amqp_port}@localhost"

    def amqp_url(self, vhost: str = "/", port: int | None = None, user: str = USER, password: str = PASSWORD) -> str:
        return f"amqp://{user}:{password}@{LOOPBACK}:{port or self.amqp_port}/{urllib.parse.quote(vhost, safe='')}"

    @property
    def management_url(self) -> str:
        return f"http://{LOOPBACK}:{self.management_port}"

    def _env(self) -> dict[str, str]:
        home = self.root / "home"
        return {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),  # the Erlang cookie lives here, private to this node
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOOPBACK,
            # Every Erlang VM this node starts (the node, and the helper VM RabbitMQ runs to make sure an epmd is up)
            # uses ours and never starts one itself: `epmd -daemon` leaves the node's process group for a session of
            # its own, so one started as the stack stops (an interrupted boot) took the port and outlived the stack.
            "ERL_FLAGS": "-start_epmd false",
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.root / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.node_log_dir),
            "RABBITMQ_PID_FILE": str(self.root / "rabbitmq.pid"),
            # A crash dump can be tens of MB: it stays with the data (kept with --keep-data), not in the report.
            "ERL_CRASH_DUMP": str(self.root / "erl_crash.dump"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    @property
    def node_log_dir(self) -> Path:
        return self.log_dir / self.label

    def init(self) -> None:
        for folder in (self.root / "home", self.root / "mnesia", self.node_log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        config = CONFIG.format(
            ip=LOOPBACK, amqp_port=self.amqp_port, management_port=self.management_port, user=USER, password=PASSWORD)
        if self.seeds:
            config += CLUSTER_CONFIG + "".join(f"cluster_formation.classic_config.nodes.{i} = {seed}\n"
                                               for i, seed in enumerate(self.seeds, 1))
        (self.root / "rabbitmq.conf").write_text(config)
        if self.cookie:  # every node of a cluster (and its CLI tools, same HOME) shares this private cookie
            cookie = self.root / "home" / ".erlang.cookie"
            if not cookie.exists():
                cookie.write_text(self.cookie)
                cookie.chmod(0o400)
        (self.root / "advanced.config").write_text("[].\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        (self.root / "enabled_plugins").write_text("[rabbitmq_management].\n")

    def start(self) -> None:
        self.init()
        env = self._env()
        if self.own_epmd and (self.epmd_process is None or not self.epmd_process.alive()):
            # Our own epmd in the foreground, so it is ours to stop by PID (erl would daemonise a shared one).
            self.epmd_process = ServiceProcess(
                name="epmd", argv=[str(epmd()), "-port", str(self.epmd_port), "-address", LOOPBACK],
                log_path=self.log_dir / "epmd.log", env=env, cwd=self.root).start()
            wait_until(lambda: can_connect(self.epmd_port), 10, "epmd", on_fail=self.epmd_process.tail,
                       process=self.epmd_process)
        self.process = ServiceProcess(
            name=self.name, argv=[str(rabbitmq_bindir() / "rabbitmq-server")],
            log_path=self.log_dir / f"{self.label}.log", env=env, cwd=self.root).start()

    def ready(self) -> bool:
        if not can_connect(self.amqp_port):
            return False
        response = http_clients.get(f"{self.management_url}/api/overview", auth=(USER, PASSWORD), timeout=1)
        return response.status_code == 200

    def wait_ready(self, timeout: float = 60, abandon: threading.Event | None = None) -> float:
        def tail() -> str:
            logs = sorted(self.node_log_dir.glob("*.log"))
            extra = "\n".join(p.read_text(errors="replace")[-2000:] for p in logs)
            return (self.process.tail() if self.process else "") + "\n" + extra
        return wait_until(self.ready, timeout, "RabbitMQ", interval=0.1, on_fail=tail, process=self.process,
                          abandon=abandon)

    def create_vhost(self, vhost: str) -> None:
        quoted = urllib.parse.quote(vhost, safe="")
        with http_clients.client(base_url=self.management_url, auth=(USER, PASSWORD), timeout=10) as client:
            client.put(f"/api/vhosts/{quoted}").raise_for_status()
            client.put(f"/api/permissions/{quoted}/{USER}",
                       json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()

    def create_user(self, user: str, password: str, vhost: str) -> None:
        """A broker user of a tenant's own (no tags: no management API, no policies), allowed only in ``vhost``,
        and there on every resource but the harness's own (``harness.``: the tap's queue), which it can neither
        delete, bind, read nor consume from."""
        quoted_user, quoted_vhost = urllib.parse.quote(user, safe=""), urllib.parse.quote(vhost, safe="")
        with http_clients.client(base_url=self.management_url, auth=(USER, PASSWORD), timeout=10) as client:
            client.put(f"/api/users/{quoted_user}", json={"password": password, "tags": ""}).raise_for_status()
            client.put(f"/api/permissions/{quoted_vhost}/{quoted_user}",
                       json={"configure": TENANT_RESOURCES, "write": TENANT_RESOURCES,
                             "read": TENANT_RESOURCES}).raise_for_status()

    def cluster_nodes(self) -> list[str]:
        """The running nodes of the cluster this node sees (management API)."""
        response = http_clients.get(f"{self.management_url}/api/nodes", auth=(USER, PASSWORD), timeout=2)
        response.raise_for_status()
        return sorted(n["name"] for n in response.json() if n.get("running"))
