"""A typed wrapper over `toxiproxy-python`, with request timeouts and errors on every 4xx/5xx.

The library keeps its server address in class attributes and calls `requests` with no timeout; a hung
Toxiproxy would hang the harness. We route its HTTP calls through a shim that adds a timeout and raises,
and we talk to one server per wrapper (set under a lock before each call).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

import requests
import toxiproxy.api as _api
from toxiproxy import Toxiproxy as _Server

Stream = Literal["upstream", "downstream"]
DEFAULT_TIMEOUT = 5.0


class ToxiproxyError(RuntimeError):
    """Toxiproxy answered with an error status, or did not answer in time."""


class _TimedRequests:
    """Stands in for the `requests` module inside toxiproxy.api: same calls, plus a timeout and raise-on-error."""

    timeout = DEFAULT_TIMEOUT

    def _call(self, method: str, url: str, **kwargs):
        kwargs.setdefault("timeout", self.timeout)
        try:
            response = requests.request(method, url, **kwargs)
        except requests.RequestException as exc:
            raise ToxiproxyError(f"{method.upper()} {url}: {exc}") from exc
        if response.status_code >= 400:
            raise ToxiproxyError(f"{method.upper()} {url} -> {response.status_code}: {response.text.strip()}")
        return response

    def get(self, url, **kwargs):
        return self._call("get", url, **kwargs)

    def post(self, url, **kwargs):
        return self._call("post", url, **kwargs)

    def delete(self, url, **kwargs):
        return self._call("delete", url, **kwargs)


_api.requests = _TimedRequests()
_lock = threading.RLock()


@dataclass(frozen=True)
class ProxySpec:
    name: str
    listen_port: int
    upstream_port: int


class Toxiproxy:
    """One Toxiproxy server. Fault names match CONTRACT §10: cut, blackhole, reset_peer, latency, limit_data."""

    def __init__(self, host: str, port: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.host, self.port = host, port
        _TimedRequests.timeout = timeout
        self._server = _Server()

    def _bind(self) -> None:
        self._server.update_api_consumer(self.host, self.port)

    def _proxy(self, name: str):
        with _lock:
            self._bind()
            proxy = self._server.get_proxy(name)
        if proxy is None:
            raise ToxiproxyError(f"no proxy named {name!r} on {self.host}:{self.port}")
        return proxy

    # --- set-up ---------------------------------------------------------------------------------
    def version(self) -> str:
        with _lock:
            self._bind()
            return _api.APIConsumer.get("/version").text.strip()

    def ensure_proxy(self, spec: ProxySpec) -> None:
        with _lock:
            self._bind()
            self._server.populate([{"name": spec.name, "listen": f"127.0.0.1:{spec.listen_port}",
                                    "upstream": f"127.0.0.1:{spec.upstream_port}"}])

    def create_proxy(self, name: str, upstream_port: int, listen_port: int = 0) -> int:
        """A new enabled proxy; with ``listen_port`` 0 Toxiproxy binds a free port itself (no race with another
        process taking it first). Returns the port it listens on."""
        with _lock:
            self._bind()
            answer = _api.APIConsumer.post("/proxies", json={"name": name, "listen": f"127.0.0.1:{listen_port}",
                                                             "upstream": f"127.0.0.1:{upstream_port}",
                                                             "enabled": True}).json()
        return int(str(answer["listen"]).rsplit(":", 1)[1])

    def delete_proxy(self, name: str) -> None:
        """Remove a proxy: its listener closes and its open connections drop."""
        with _lock:
            self._bind()
            _api.APIConsumer.delete(f"/proxies/{name}")

    def scoped(self, names: dict[str, str]) -> "ScopedToxiproxy":
        """A view that acts on the proxies ``names`` maps each service to, and on nothing else."""
        return ScopedToxiproxy(self, names)

    def proxies(self) -> dict[str, dict]:
        with _lock:
            self._bind()
            return _api.APIConsumer.get("/proxies").json()

    # --- faults ---------------------------------------------------------------------------------
    def cut(self, name: str) -> None:
        """Disable the proxy: open connections drop and new ones are refused."""
        with _lock:
            self._proxy(name).disable()

    def restore(self, name: str) -> None:
        with _lock:
            self._proxy(name).enable()

    def _add(self, name: str, toxic_type: str, attributes: dict, stream: Stream = "downstream",
             toxic_name: str | None = None) -> str:
        toxic_name = toxic_name or f"{toxic_type}_{stream}"
        with _lock:
            self._proxy(name).add_toxic(type=toxic_type, stream=stream, name=toxic_name, attributes=attributes)
        return toxic_name

    def blackhole(self, name: str, stream: Stream = "downstream") -> str:
        """Connections stay open but no data passes (timeout toxic with timeout 0)."""
        return self._add(name, "timeout", {"timeout": 0}, stream)

    def reset_peer(self, name: str, after_ms: int = 0, stream: Stream = "downstream") -> str:
        """Connections are reset with RST (after `after_ms`)."""
        return self._add(name, "reset_peer", {"timeout": after_ms}, stream)

    def latency(self, name: str, ms: int, jitter_ms: int = 0, stream: Stream = "downstream") -> str:
        return self._add(name, "latency", {"latency": ms, "jitter": jitter_ms}, stream)

    def limit_data(self, name: str, bytes_: int, stream: Stream = "downstream") -> str:
        """Close the connection after `bytes_` bytes have passed."""
        return self._add(name, "limit_data", {"bytes": bytes_}, stream)

    def remove_toxic(self, name: str, toxic_name: str) -> None:
        with _lock:
            self._proxy(name).destroy_toxic(toxic_name)

    def toxics(self, name: str) -> list[str]:
        with _lock:
            return sorted(self._proxy(name).toxics())

    def reset(self) -> None:
        """Re-enable every proxy and remove every toxic, so no fault leaks into the next test."""
        with _lock:
            self._bind()
            self._server.reset()

    def is_clean(self) -> bool:
        return all(p["enabled"] and not p.get("toxics") for p in self.proxies().values())


class ScopedToxiproxy:
    """The faults of one run, on that run's own proxies (``service -> proxy name``): a cut or a reset here never
    touches another run sharing the Toxiproxy server, so runs can go side by side on one stack."""

    def __init__(self, server: Toxiproxy, names: dict[str, str]) -> None:
        self.server, self.names = server, dict(names)

    def _name(self, service: str) -> str:
        try:
            return self.names[service]
        except KeyError:
            raise ToxiproxyError(f"no proxy for service {service!r} in this run (has: {sorted(self.names)})") from None

    def cut(self, service: str) -> None:
        self.server.cut(self._name(service))

    def restore(self, service: str) -> None:
        self.server.restore(self._name(service))

    def blackhole(self, service: str, stream: Stream = "downstream") -> str:
        return self.server.blackhole(self._name(service), stream)

    def reset_peer(self, service: str, after_ms: int = 0, stream: Stream = "downstream") -> str:
        return self.server.reset_peer(self._name(service), after_ms, stream)

    def latency(self, service: str, ms: int, jitter_ms: int = 0, stream: Stream = "downstream") -> str:
        return self.server.latency(self._name(service), ms, jitter_ms, stream)

    def limit_data(self, service: str, bytes_: int, stream: Stream = "downstream") -> str:
        return self.server.limit_data(self._name(service), bytes_, stream)

    def remove_toxic(self, service: str, toxic_name: str) -> None:
        self.server.remove_toxic(self._name(service), toxic_name)

    def toxics(self, service: str) -> list[str]:
        return self.server.toxics(self._name(service))

    def reset(self) -> None:
        """Re-enable this run's proxies and remove their toxics (Toxiproxy's own reset would clear every run's)."""
        for _service, name in self.names.items():
            for toxic in self.server.toxics(name):
                self.server.remove_toxic(name, toxic)
            self.server.restore(name)

    def is_clean(self) -> bool:
        mine = set(self.names.values())
        return all(p["enabled"] and not p.get("toxics") for n, p in self.server.proxies().items() if n in mine)

    # --- what is in force (tamper evidence: chaos/network.py compares it with what the harness set) -----------
    def states(self) -> dict[str, dict | None]:
        """service -> the state of its proxy as Toxiproxy reports it now (one GET): ``enabled``, ``listen``,
        ``upstream`` and ``toxics`` (toxic name -> type, stream, toxicity, attributes); None for a proxy gone."""
        proxies = self.server.proxies()
        out: dict[str, dict | None] = {}
        for service, name in self.names.items():
            proxy = proxies.get(name)
            out[service] = None if proxy is None else {
                "enabled": bool(proxy.get("enabled")), "listen": proxy.get("listen"),
                "upstream": proxy.get("upstream"),
                "toxics": {t.get("name"): {"type": t.get("type"), "stream": t.get("stream"),
                                           "toxicity": t.get("toxicity", 1.0), "attributes": t.get("attributes") or {}}
                           for t in proxy.get("toxics") or []}}
        return out

    def close(self) -> None:
        """Delete this run's proxies (their ports close)."""
        for name in self.names.values():
            try:
                self.server.delete_proxy(name)
            except ToxiproxyError:
                pass


def probe_refused(listen: str | None, timeout: float = 0.5) -> bool | None:
    """A TCP connection to a proxy's listen address (``host:port``): True when refused (a cut proxy), False when it
    was accepted, None when it could not be told (no address, a timeout, another error). A socket that connected to
    itself (TCP simultaneous open: its ephemeral source port drawn equal to the closed port) counts as refused."""
    import socket

    if not listen or ":" not in str(listen):
        return None
    host, port = str(listen).rsplit(":", 1)
    host = "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host.strip("[]")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except ConnectionRefusedError:
        return True
    except OSError:
        return None
    try:
        return sock.getsockname() == sock.getpeername()
    finally:
        sock.close()
