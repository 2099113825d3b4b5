"""Free loopback ports and readiness probes."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Protocol

LOOPBACK = "127.0.0.1"


class PortAllocator:
    """Hands out distinct free loopback ports (the OS picks; we remember, so one stack never gets a port twice)."""

    def __init__(self) -> None:
        self._given: set[int] = set()

    def take(self) -> int:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((LOOPBACK, 0))
                port = s.getsockname()[1]
            # weed derives gRPC ports as http+10000 in places; stay below that range's collisions.
            if port not in self._given and port < 55000:
                self._given.add(port)
                return port


def can_connect(port: int, host: str = LOOPBACK, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_listening(port: int) -> bool:
    """True if anything listens on the loopback port (used to prove nothing of ours is left behind)."""
    return can_connect(port)


class NotReady(RuntimeError):
    pass


class ServiceExited(NotReady):
    """The service's process ended while we waited for it to become ready."""


class StartAbandoned(NotReady):
    """Another service failed to start, or the user interrupted: stop waiting for this one."""


class _Process(Protocol):
    def alive(self) -> bool: ...
    def exit_code(self) -> int | None: ...


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
               on_fail: Callable[[], str] | None = None, process: _Process | None = None,
               abandon: threading.Event | None = None) -> float:
    """Poll `check` until true; returns seconds waited.

    Raises ServiceExited at once when `process` is gone (a dead service never becomes ready: no point waiting out
    the timeout), StartAbandoned when `abandon` is set, NotReady after `timeout`. Messages name `what` and carry
    `on_fail()` (a log tail).
    """
    start = time.monotonic()

    def failure(reason: str) -> str:
        detail = on_fail() if on_fail else ""
        return f"{what} {reason}" + (f"\n--- log tail ---\n{detail}" if detail else "")

    while True:
        if process is not None and not process.alive():
            raise ServiceExited(failure(f"exited (code {process.exit_code()}) while starting"))
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # a probe that raises simply means "not yet"
            pass
        if abandon is not None and abandon.is_set():
            raise StartAbandoned(f"{what}: start abandoned")
        if time.monotonic() - start > timeout:
            raise NotReady(failure(f"not ready after {timeout:.0f}s"))
        if abandon is not None:
            abandon.wait(interval)
        else:
            time.sleep(interval)
