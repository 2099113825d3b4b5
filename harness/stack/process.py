"""A service process we started ourselves: its own process group, a log file, stopped by PID."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from harness.stack import keeper


@dataclass
class ServiceProcess:
    """One started process group. The group leader's PID is the handle; nothing is ever found by name."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    user: str | None = None
    cwd: Path | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    # In the environment of the service and of all it starts, even in sessions of their own (keeper.kill_marked).
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)

    def start(self) -> "ServiceProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # start_new_session: the service and every child it spawns share one process group that we
        # can signal as a whole, the way a container runtime would.
        env = dict(os.environ if self.env is None else self.env) | {keeper.MARK: self.mark}
        self.popen = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=self.cwd, user=self.user, start_new_session=True,
        )
        log.close()
        keeper.register(self.popen.pid, self.mark)
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def signal_group(self, sig: int) -> None:
        if self.popen is not None:
            signal_group(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group, reap the leader, then kill what the service started outside its group."""
        self.signal_group(signal.SIGKILL)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if wait_group_gone(self.pid) and keeper.kill_marked(self.mark):
            keeper.release(self.pid)

    def stop(self, grace: float = 10.0, sig: int = signal.SIGTERM, leader_only: bool = False) -> None:
        """Send `sig` to the group (or to its leader alone), then SIGKILL whatever is left after `grace` seconds."""
        if self.popen is None:
            return
        if grace > 0 and sig != signal.SIGKILL and self.alive():
            send_stop_signal(self.popen.pid, sig, leader_only)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def run_group(argv: list[str], env: dict[str, str] | None, stdout, timeout: float) -> int:
    """``subprocess.run`` of a command in a process group of its own that dies with this process (the keeper), and
    whose every member is killed at the end or at ``timeout`` (then ``subprocess.TimeoutExpired``, as run raises)."""
    popen = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    keeper.register(popen.pid)
    try:
        return popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_group(popen.pid, signal.SIGKILL)
        popen.wait()
        raise
    finally:
        if wait_group_gone(popen.pid):  # what it left running in its group goes too
            keeper.release(popen.pid)


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a whole process group we started; a group that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_members(pgid: int | None) -> list[int]:
    """PIDs whose process group is `pgid` (read from /proc, so it also sees re-parented children)."""
    if pgid is None:
        return []
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Field 5 is the pgid; the command name (field 2) may contain spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_group_gone(pgid: int | None, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass
        time.sleep(0.05)
    return not group_members(pgid)


def send_stop_signal(pgid: int, sig: int, leader_only: bool = False) -> None:
    """`sig` to the whole group, or to its leader alone (PostgreSQL's postmaster must be the one to stop its children)."""
    try:
        if leader_only:
            os.kill(pgid, sig)
        else:
            os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop_group_by_pid(pgid: int, grace: float = 5.0, sig: int = signal.SIGTERM, leader_only: bool = False,
                      mark: str | None = None) -> None:
    """Stop a group we started in another process (known from the stack's state file); SIGKILL after `grace`; then
    the processes carrying its `mark` (started outside the group)."""
    if grace > 0 and sig != signal.SIGKILL and group_members(pgid):
        send_stop_signal(pgid, sig, leader_only)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and group_members(pgid):
            time.sleep(0.1)
    if wait_group_gone(pgid):
        keeper.kill_marked(mark)


# --- signals -------------------------------------------------------------------------------------------------
def interrupt_on_ctrl_c() -> None:
    """SIGINT raises KeyboardInterrupt, whatever was inherited: a process started in the background by a
    non-interactive shell (nohup, a CI runner's script, ``cmd &``) inherits SIGINT as *ignored*, and Python then
    keeps it ignored — a grader's Ctrl-C or SIGINT would stop nothing. Only the main thread may set it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def raise_keyboard_interrupt_on_sigterm() -> None:
    """SIGTERM behaves like Ctrl-C: Python's default ends the process without running any `finally`, which
    would leave every service (each in its own session, so not signalled with us) running."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while cleanup runs, so a second Ctrl-C cannot leave half the stack running.

    A signal that arrived meanwhile is raised as KeyboardInterrupt afterwards, unless an exception is already
    on its way out. Only the main thread receives signals, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if received:
        raise KeyboardInterrupt(f"signal {received[0]} during cleanup")
