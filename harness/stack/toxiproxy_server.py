"""The Toxiproxy server process, with one proxy in front of each service. TCP only; it keeps no data."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from .. import http_clients
from ..toxiproxy import ProxySpec, Toxiproxy
from .ports import LOOPBACK, wait_until
from .process import ServiceProcess
from .tools import toxiproxy_server


@dataclass
class ToxiproxyServer:
    log_dir: Path  # in the run directory
    api_port: int
    proxies: list[ProxySpec]
    process: ServiceProcess | None = None

    name = "toxiproxy"

    def start(self) -> None:
        self.process = ServiceProcess(
            name=self.name, argv=[str(toxiproxy_server()), "-host", LOOPBACK, "-port", str(self.api_port)],
            log_path=self.log_dir / "toxiproxy.log").start()

    def ready(self) -> bool:
        return http_clients.get(f"http://{LOOPBACK}:{self.api_port}/version", timeout=1).status_code == 200

    def wait_ready(self, timeout: float = 15, abandon: threading.Event | None = None) -> float:
        waited = wait_until(self.ready, timeout, "Toxiproxy", process=self.process, abandon=abandon,
                            on_fail=lambda: self.process.tail() if self.process else "")
        client = self.client()
        for spec in self.proxies:
            client.ensure_proxy(spec)
        return waited

    def client(self) -> Toxiproxy:
        return Toxiproxy(LOOPBACK, self.api_port)
