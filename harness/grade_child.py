"""One submission's grade in a CHILD PROCESS of its own (grade-many), and what lets several share one stack.

The child is forked from the grade-many process, so it starts with the shared stack, the adapter and the isolation
mode in hand. It leads a process group of its own and is a subreaper (``PR_SET_CHILD_SUBREAPER``): a role or setup
command that leaves an orphan leaves it to the child, so everything the grade started stays among the child's
descendants, where it can be found and stopped.

- The services belong to the parent: a fault that kills, stops or restarts one (``alive``, ``kill``,
  ``stop_service``, ``restart``, ``pids``) asks the parent over a pipe (:class:`StackInChild`), so a restarted service
  is still the parent's and outlives the child. Everything else of the stack (URLs, tenants, Toxiproxy) is a network
  client and works in the child as it is.
- Progress lines go to the parent over the same pipe; the outcome (``done`` with the results, ``did not start``,
  ``timeout``, ``error``) is the child's last message.
- Stopping: the parent sends SIGTERM; the child's grade is interrupted (:class:`SubmissionTimeout` in its main
  thread, so the grade's own teardown stops its roles), then the child kills by PID every descendant still running
  (each process group it leads), collects them and exits. A child that does not exit in time is frozen and killed
  with its whole tree by the parent (:func:`kill_tree`).

:class:`FileGate` is the run gate across those processes (``--jobs N``): shared and exclusive sides as ``flock``
locks on a file, released by the kernel when a holder dies — a killed submission never leaves the gate closed.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
# Stack methods the child asks the parent for: they act on the service processes, which are the parent's children.
STACK_CALLS = ("alive", "kill", "stop_service", "restart", "pids")


class SubmissionTimeout(BaseException):
    """Raised in a grade's process when its submission is past its time limit (never caught as an Exception)."""


class DidNotStart(BaseException):
    """Raised in a grade's process when a scenario could not even start the submission."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --- processes: a tree, by PID --------------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> dict[int, list[str]]:
    """Every live (not zombie) process below ``root``, by parent links read from /proc: pid -> stat fields."""
    by_parent: dict[int, list[tuple[int, list[str]]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if not fields:
            continue
        try:
            by_parent.setdefault(int(fields[1]), []).append((int(entry), fields))
        except (IndexError, ValueError):
            continue
    out: dict[int, list[str]] = {}
    todo = [root]
    while todo:
        for pid, fields in by_parent.get(todo.pop(), []):
            if pid not in out:
                out[pid] = fields
                todo.append(pid)
    return {pid: fields for pid, fields in out.items() if fields[0] != "Z"}


def _kill(pid: int, fields: list[str]) -> bool:
    try:
        if int(fields[2]) == pid:  # it leads its process group (a role, a setup command): the whole group
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError, ValueError, IndexError):
        return False


def kill_descendants(labels: dict[int, str], say, rounds: int = 10) -> list[str]:
    """In the child: SIGKILL every descendant (its process group when it leads one) until two looks find none, and
    collect them, so none is left running or as a zombie. ``labels``: pid -> what it is (``role worker``)."""
    done: list[str] = []
    me = os.getpid()
    quiet = 0
    for _ in range(rounds):
        left = descendants(me)
        for pid, fields in left.items():
            if _kill(pid, fields):
                done.append(f"{labels.get(pid, 'process')} pid {pid}")
        _reap_all(2.0 if left else 0.0)
        quiet = 0 if left else quiet + 1
        if quiet >= 2:
            break
        time.sleep(0.2)
    if done:
        say(f"    killed by PID: {', '.join(dict.fromkeys(done))}")
    return done


def _reap_all(timeout: float) -> None:
    """Collect every exited child of this process (killed roles, orphans it adopted as a subreaper)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def kill_tree(root: int, say, labels: dict[int, str] | None = None) -> list[str]:
    """In the parent, for a child that did not stop: freeze it and everything below it (SIGSTOP, so nothing forks
    meanwhile), then SIGKILL them all, the child last."""
    labels = labels or {}
    try:
        os.kill(root, signal.SIGSTOP)
    except ProcessLookupError:
        return []
    frozen: dict[int, list[str]] = {}
    for _ in range(10):
        found = {pid: f for pid, f in descendants(root).items() if pid not in frozen}
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        frozen.update(found)
    done = [f"{labels.get(pid, 'process')} pid {pid}" for pid, fields in frozen.items() if _kill(pid, fields)]
    try:
        os.killpg(root, signal.SIGKILL)
    except ProcessLookupError:
        pass
    done.append(f"the grade's process pid {root}")
    say(f"    killed by PID: {', '.join(done)}")
    return done


# --- the gate across processes --------------------------------------------------------------------------------------

class FileGate:
    """Several submissions on one stack (``--jobs N``), each in its own process: scenarios run under the shared side,
    side by side; a scenario that restarts a shared service (and the tidy-up between submissions) under the
    exclusive side, alone. An exclusive request waiting holds the turnstile, so new shared holders wait behind it.
    Each acquisition opens the files anew (its own lock) and waits in ``flock`` (a stop signal's handler ends the
    wait), and a holder that dies releases its lock with its descriptors."""

    def __init__(self, folder: Path | None = None):
        self._dir = Path(tempfile.mkdtemp(prefix="harness-gate-", dir=folder))
        self._gate, self._turnstile = self._dir / "gate", self._dir / "turnstile"
        for path in (self._gate, self._turnstile):
            path.touch()
        self._open: set[int] = set()  # descriptors this process holds: a forked child closes its copies
        self._lock = threading.Lock()
        # the lock files go when the gate does (or at exit), whoever made it; a forked child ends by os._exit and so
        # never removes what its parent still uses
        self._remove = weakref.finalize(self, shutil.rmtree, str(self._dir), True)

    def _take(self, path: Path, mode: int) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        with self._lock:
            self._open.add(fd)
        try:  # blocking: a signal's handler that raises (the child's stop) ends the wait, as any other
            fcntl.flock(fd, mode)
            return fd
        except BaseException:
            self._release(fd)
            raise

    def _release(self, fd: int) -> None:
        with self._lock:
            self._open.discard(fd)
        try:
            os.close(fd)  # closing the last descriptor of it releases the lock
        except OSError:
            pass

    def close(self) -> None:
        """Remove the lock files (the run is over)."""
        self._remove()

    def forget_inherited(self) -> None:
        """In a forked child: close the parent's descriptors it inherited (closing a copy releases nothing of the
        parent's, but holding one would keep the parent's lock alive for as long as the child lives)."""
        for fd in list(self._open):
            try:
                os.close(fd)
            except OSError:
                pass
        self._open = set()
        self._lock = threading.Lock()

    @contextmanager
    def shared(self):
        self._release(self._take(self._turnstile, fcntl.LOCK_EX))  # behind any exclusive request waiting
        fd = self._take(self._gate, fcntl.LOCK_SH)
        try:
            yield
        finally:
            self._release(fd)

    @contextmanager
    def exclusive(self):
        turnstile = self._take(self._turnstile, fcntl.LOCK_EX)
        try:
            fd = self._take(self._gate, fcntl.LOCK_EX)
        finally:
            self._release(turnstile)
        try:
            yield
        finally:
            self._release(fd)


# --- the child's side -----------------------------------------------------------------------------------------------

class Channel:
    """The child's end of the pipe: one message at a time (fault threads and the grade share it)."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, message) -> None:
        with self.lock:
            self.conn.send(message)

    def call(self, name: str, *args, **kwargs):
        with self.lock:
            self.conn.send(("call", name, args, kwargs))
            kind, value = self.conn.recv()
        if kind == "raise":
            raise value
        return value


class StackInChild:
    """The shared stack as the child sees it: the service processes' methods asked of the parent, the rest its own."""

    def __init__(self, stack, channel: Channel):
        self._stack, self._channel = stack, channel

    def __getattr__(self, name):
        if name in STACK_CALLS:
            return lambda *args, **kwargs: self._channel.call(name, *args, **kwargs)
        if name == "processes":
            raise AttributeError("the service processes are the grade-many process's: ask pids() instead")
        return getattr(self._stack, name)


def answer(stack, name: str, args, kwargs):
    """In the parent: run one of :data:`STACK_CALLS` for the child; the reply to send back."""
    if name not in STACK_CALLS:
        return "raise", AttributeError(f"the child may not call stack.{name}")
    try:
        return "ok", getattr(stack, name)(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - raised again in the child
        try:
            import pickle

            pickle.dumps(exc)
            return "raise", exc
        except Exception:  # noqa: BLE001
            return "raise", RuntimeError(f"{type(exc).__name__}: {exc}")


def child_main(job, conn) -> None:
    """The grade of ``job`` (a grade_many.SubmissionGrade) in this forked process; its last message is the outcome."""
    os.setpgid(0, 0)  # its own group: a signal to the parent's group (a terminal's Ctrl-C) is the parent's to handle
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if job.gate is not None:
        job.gate.forget_inherited()
    channel = Channel(conn)
    stopping = []

    def stop(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise SubmissionTimeout(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it (SIGTERM), after its own Ctrl-C
    outcome: dict = {"ended": "error", "error": "the grade ended without an outcome"}
    templates_before: set = set()
    try:
        from .grade import grade
        seen: set[Path] = set()

        def progress(text) -> None:
            channel.send(("say", str(text)))
            if threading.current_thread() is threading.main_thread():
                problem = start_problem(job.folder, seen)
                if problem:
                    raise DidNotStart(problem)

        extra = {"gate": job.gate} if job.gate is not None else {}
        templates_before = set(getattr(job.stack, "_templates", {}))
        results, grade_dir = grade(job.adapter, job.level, job.seed, only=job.only,
                                   stack=StackInChild(job.stack, channel), reports_dir=job.folder, progress=progress,
                                   **extra)
        outcome = {"ended": "done", "results": results, "grade_dir": str(grade_dir)}
    except DidNotStart as exc:
        outcome = {"ended": "did not start", "not_started": exc.reason, "error": exc.reason}
    except BaseException as exc:  # noqa: BLE001 - reported in the row, whatever it was
        if stopping or isinstance(exc, KeyboardInterrupt):  # a stop held over a cleanup comes back as Ctrl-C
            outcome = {"ended": "timeout"}
        else:
            outcome = {"ended": "error", "error_type": type(exc).__name__, "error": str(exc)}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the tidy-up below is not cut short
        _drop_own_templates(job.stack, templates_before)
        labels = {pid: f"role {key.split('/', 1)[1]}" for key, pid in roles_running(job.folder).items()}
        kill_descendants(labels, lambda text: channel.send(("say", text)))
        channel.send(("done", outcome))
    finally:
        os._exit(0)


def _drop_own_templates(stack, before: set) -> None:
    """The database templates this child made ([setup] template = true) are known to its copy of the stack only:
    dropped here, best effort, so none outlives the submission it was made for."""
    made = [t for key, t in (getattr(stack, "_templates", None) or {}).items() if key not in before and t.ok]
    for template in made:
        try:
            stack.postgres.drop_template(template.database)
        except Exception:  # noqa: BLE001 - the stack's data folder goes with the stack anyway
            pass


# --- what a child's grade folder shows (read by the child and by its parent) ---------------------------------------

def roles_running(folder: Path) -> dict[str, int]:
    """Role instances the histories under ``folder`` show started and not exited: instance -> pid."""
    running: dict[str, int] = {}
    for history in sorted(folder.glob("grade-*/*/history.jsonl")):
        try:
            lines = history.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for raw in lines:
            if '"role"' not in raw:
                continue
            try:
                e = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if e.get("type") != "role" or not isinstance(e.get("pid"), int):
                continue
            key = f"{history.parent.name}/{e.get('role')}"
            if e.get("action") == "start":
                running[key] = e["pid"]
            elif e.get("action") == "exit" and running.get(key) == e["pid"]:
                running.pop(key)
    return running


def start_problem(folder: Path, seen: set[Path]) -> str | None:
    """If a scenario just finished without getting the submission started (its setup or roles failed), why."""
    for run_json in sorted(folder.glob("grade-*/*/run.json")):
        if run_json in seen:
            continue
        try:
            run = json.loads(run_json.read_text())
        except (OSError, ValueError):
            continue  # being written: looked at again on the next progress line
        seen.add(run_json)
        timings = run.get("timings") or {}
        if run.get("error") and "faults_and_workload" not in timings:
            where = "setup" if "start_roles" not in timings else "starting the roles"
            logs = run_json.parent / "logs"
            log = logs / "setup.log" if where == "setup" else None
            if log is None:
                role = ((run.get("adapter") or {}).get("http") or {}).get("role") or "api"
                log = logs / f"{role}.log"
                if not log.is_file():
                    candidates = sorted(logs.glob("*.log"), key=lambda p: p.stat().st_mtime) if logs.is_dir() else []
                    log = candidates[-1] if candidates else log
            tail = _last_line(log)
            return (f"{where} failed in {run_json.parent.name}: {run['error']}"
                    + (f" — {log.name}: {tail}" if tail else ""))
    return None


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()
                 if line.strip() and not line.startswith("=== harness:")]
    except OSError:
        return ""
    return lines[-1][:240] if lines else ""
