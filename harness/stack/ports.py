"""Free loopback ports and readiness probes."""
from __future__ import annotations

import socket
import time
from typing import Callable

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


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05,
               on_fail: Callable[[], str] | None = None) -> float:
    """Poll `check` until true; returns seconds waited. Raises NotReady naming `what` (and a log tail)."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # a probe that raises simply means "not yet"
            pass
        if time.monotonic() - start > timeout:
            detail = on_fail() if on_fail else ""
            raise NotReady(f"{what} not ready after {timeout:.0f}s" + (f"\n--- log tail ---\n{detail}" if detail else ""))
        time.sleep(interval)
