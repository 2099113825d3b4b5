"""The keeper: nothing the harness starts outlives the harness process, even a killed one.

The first process group a harness process starts (a service of the stack, a role of the implementation) also starts
its keeper: a small process in a session of its own that reads one pipe from its starter, a JSON line per change (a
group started, with its leader's start time and mark, or stopped; a data folder or file made or removed). When the
pipe ends (the starter exited, however: SIGKILL, an uncaught error, a lost terminal), the keeper SIGKILLs every
group still registered, removes the paths still registered, and exits.

A group is not always all a service started: an Erlang VM runs its port programs (``erl_child_setup``, and through
it RabbitMQ's epmd starter, a whole second VM) each in a session of its own. So a service is started with a *mark*
in its environment (``HARNESS_SERVICE_MARK``, a random id), which every process it starts inherits whatever its
session: once the group is killed, the processes carrying the mark are killed too (``kill_marked``).

A parent-death signal (``PR_SET_PDEATHSIG``) would not do: it fires when the *thread* that forked exits, and the
stack starts its services from a thread pool; nor does it reach a service's own children (RabbitMQ's ``beam.smp``
under its shell script). A group is found by its id, never by name; a group whose id was reused since (its leader
alive with another start time) is left alone.

``harness stack up`` releases its services and their data folder (``Stack.detach``): they are meant to outlive the
command, and ``harness stack down`` stops them by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_lock = threading.Lock()
_pipe: int | None = None  # the write end; the keeper holds the read end as its stdin
_keeper: subprocess.Popen | None = None  # kept referenced: a collected Popen of a live child warns


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


MARK = "HARNESS_SERVICE_MARK"


def register(pgid: int, mark: str | None = None) -> None:
    """The group ``pgid`` (its leader's pid) dies with this process unless it is released or stopped first; so do
    the processes whose environment carries ``mark``."""
    _send({"group": pgid, "start": start_time(pgid), **({"mark": mark} if mark else {})})


def release(pgid: int | None) -> None:
    """``pgid`` was stopped (or is handed over to someone who will stop it by PID): the keeper forgets it."""
    if pgid is not None and _pipe is not None:
        _send({"released": pgid})


def register_path(path: Path | str) -> None:
    """A data folder (or a file: weed's sockets in /tmp) removed once the groups are killed (a killed stack leaves
    nothing in /tmp)."""
    _send({"path": str(path)})


def release_path(path: Path | str | None) -> None:
    if path is not None and _pipe is not None:
        _send({"released_path": str(path)})


def _send(message: dict) -> None:
    global _pipe, _keeper
    with _lock:
        if _pipe is None:
            read_end, write_end = os.pipe()  # both close-on-exec: no other program holds the pipe open
            try:
                _keeper = subprocess.Popen(
                    # -I: this file alone, with the standard library (no package import, a few MB)
                    [sys.executable, "-I", str(Path(__file__).resolve())], stdin=read_end,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                    cwd="/")
            finally:
                os.close(read_end)
            _pipe = write_end
        try:
            # One line, shorter than PIPE_BUF: written whole, whichever thread writes.
            os.write(_pipe, (json.dumps(message) + "\n").encode())
        except OSError:  # the keeper is gone (killed by hand): nothing left to tell
            pass


def _new_lock_in_child() -> None:
    # A forked child (grade-many's submissions) keeps the pipe, and so its parent's keeper: what it starts (a service
    # of the shared stack restarted by a fault) is the class's, killed when the last of them ends. Only the lock is
    # new, in case another thread of the parent held it at the fork.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


# --- the keeper process --------------------------------------------------------------------------------------------
def keep(lines) -> tuple[dict[int, str | None], list[str], list[str]]:
    """Follow the starter's lines to their end: the groups (pgid -> leader's start time), paths and marks still
    registered then."""
    groups: dict[int, str | None] = {}
    marks: dict[int, str] = {}
    paths: list[str] = []
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "group" in message:
            groups[int(message["group"])] = message.get("start")
            if message.get("mark"):
                marks[int(message["group"])] = message["mark"]
        elif "released" in message:
            groups.pop(int(message["released"]), None)
            marks.pop(int(message["released"]), None)
        elif "path" in message and message["path"] not in paths:
            paths.append(message["path"])
        elif message.get("released_path") in paths:
            paths.remove(message["released_path"])
    return groups, paths, list(marks.values())


def kill_left(groups: dict[int, str | None]) -> list[int]:
    """SIGKILL each group still registered, unless its id may name another process now: its leader alive with
    another start time (the id reused), or a leader that was gone before its start time could be read."""
    killed = []
    for pgid, started in groups.items():
        now = start_time(pgid)
        if started is None or now is not None and now != started:
            continue
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def marked(mark: str) -> list[int]:
    """The live processes whose environment carries ``mark`` (read from /proc: whatever their group or session)."""
    needle = f"\0{MARK}={mark}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = b"\0" + f.read()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if needle in environ or environ.endswith(needle[:-1]):
                found.append(int(entry))
    return found


def kill_marked(mark: str | None, timeout: float = 10.0) -> bool:
    """SIGKILL the processes carrying ``mark`` until none is left (one may start another meanwhile): whether none
    is left. Called once the group is gone, so no new one comes from the service itself."""
    if not mark:
        return True
    deadline = time.monotonic() + timeout
    while pids := marked(mark):
        if time.monotonic() >= deadline:
            return False
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return True


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are for the starter, which then ends
        signal.signal(sig, signal.SIG_IGN)
    groups, paths, marks = keep(sys.stdin)
    killed = kill_left(groups)
    deadline = time.monotonic() + 10  # SIGKILL is not instant: the data goes once nothing writes to it
    while any(group_alive(pgid) for pgid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    for mark in marks:
        kill_marked(mark, timeout=max(1.0, deadline - time.monotonic()))
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
