"""The two other ways to get services: URLs from the environment, or testcontainers when Docker is reachable."""
from __future__ import annotations

import os
import socket
import urllib.parse
from dataclasses import dataclass

ENV_URLS = ("DATABASE_URL", "AMQP_URL", "S3_ENDPOINT_URL")


@dataclass(frozen=True)
class BackendStatus:
    backend: str
    available: bool
    reason: str


def external_urls(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Validate the externally provided URLs: present, loopback-only (tests never leave this machine), reachable."""
    environ = dict(os.environ if environ is None else environ)
    missing = [name for name in ENV_URLS if not environ.get(name)]
    if missing:
        raise ValueError(f"--external needs {', '.join(missing)} in the environment")
    urls = {name: environ[name] for name in ENV_URLS}
    for name, url in urls.items():
        parsed = urllib.parse.urlsplit(url)
        if parsed.hostname not in ("127.0.0.1", "localhost", "::1") and not (parsed.hostname or "").startswith("127."):
            raise ValueError(f"{name} must point at a loopback address, got {parsed.hostname!r}")
        port = parsed.port or {"postgresql": 5432, "amqp": 5672, "http": 80}.get(parsed.scheme, 0)
        try:
            socket.create_connection((parsed.hostname, port), timeout=2).close()
        except OSError as exc:
            raise ValueError(f"{name} ({parsed.hostname}:{port}) is not reachable: {exc}") from exc
    return urls


def _docker_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://")


def docker_status() -> BackendStatus:
    """testcontainers needs a Docker daemon; say plainly why it is skipped when there is none."""
    socket_path = _docker_socket()
    try:
        import docker  # installed with the `containers` extra (testcontainers)
    except ImportError:
        if not os.path.exists(socket_path):
            return BackendStatus("testcontainers", False, f"no Docker daemon reachable ({socket_path} does not exist)")
        return BackendStatus("testcontainers", False, "testcontainers is not installed (pip install '.[containers]')")
    try:
        docker.from_env(timeout=3).ping()
    except Exception as exc:  # the docker SDK raises several unrelated types here
        return BackendStatus("testcontainers", False, f"no Docker daemon reachable: {type(exc).__name__}: {exc}")
    return BackendStatus("testcontainers", True, "Docker daemon reachable")
