"""Free loopback ports and readiness probes."""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Protocol

LOOPBACK = "127.0.0.1"


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


class _ListenerPorts:
    """Ports for the listeners the harness starts (services, roles, /metrics), picked BELOW the kernel's ephemeral
    range. A port the OS hands out for ``bind(0)`` — Toxiproxy's proxies for tenants made ahead, every outgoing
    connection's local end — then can never be one we picked and have not bound yet (a role still starting, a
    service restarting on its old port). Shared by every allocator of this process, so parallel scenarios never
    get the same port; the cursor starts at an offset of the PID, so two harness processes rarely walk the same
    ports either."""

    LOW = 15000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._high = _ephemeral_low()
        self._given: set[int] = set()
        self._reseed()

    def after_fork(self) -> None:
        """In a forked child: a lock of its own (another thread of the parent may have held it at the fork) and a
        cursor of its own."""
        self._lock = threading.Lock()
        self._reseed()

    def _reseed(self) -> None:
        """Start the cursor at an offset of this process's PID. Also called in a forked child (grade-many grades each
        submission in one): otherwise it inherits its parent's cursor, and two children walk the same ports at the
        same time — one role's port taken by another child's role before it bound it ("address already in use")."""
        span = max(1, self._high - self.LOW)
        self._cursor = self.LOW + (os.getpid() * 7919) % span

    def take(self) -> int:
        if self._high - self.LOW < 1000:  # an unusual ephemeral range: let the OS pick
            return self._os_pick()
        with self._lock:
            for _ in range(self._high - self.LOW):
                port, self._cursor = self._cursor, self._cursor + 1
                if self._cursor >= self._high:  # wrapped: ports given a whole span ago are bound or long gone
                    self._cursor, self._given = self.LOW, set()
                if port not in self._given and _bindable(port):
                    self._given.add(port)
                    return port
        raise RuntimeError(f"no free loopback port in {self.LOW}-{self._high - 1}")

    def _os_pick(self) -> int:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((LOOPBACK, 0))
                port = s.getsockname()[1]
            with self._lock:
                if port not in self._given and port < 55000:  # weed derives gRPC ports as http+10000 in places
                    self._given.add(port)
                    return port


_LISTENERS = _ListenerPorts()
os.register_at_fork(after_in_child=_LISTENERS.after_fork)


def listener_port() -> int:
    """A free loopback port for a listener the harness is about to start (see _ListenerPorts)."""
    return _LISTENERS.take()


class PortAllocator:
    """Hands out distinct free loopback ports for one stack's services (see _ListenerPorts for where from)."""

    def take(self) -> int:
        return listener_port()


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
