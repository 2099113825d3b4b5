"""Roles of the implementation under test as supervised process groups (CONTRACT §2).

Each role instance is started in its own session (``start_new_session=True``)
so that SIGKILL / SIGSTOP / SIGCONT reach its whole process group, as a
container runtime would. Output goes to ``run_dir/logs/<instance>.log``. A
monitor thread notices exits and reports them to the history; instances can
be restarted with a different environment (failpoint arming).

With isolation on (``harness grade-many``, ``--isolate``; harness/isolation.py) every role of the run starts as the
run's own unprivileged user, in its cgroup, behind its network rules, with a scrubbed environment and private
temporary folders; ``stop_all`` kills whatever is left in the cgroup (a role that daemonized) and removes it all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import isolation
from .paths import reports_dir
from .stack import keeper
from .stack.process import signal_group


@dataclass
class Instance:
    name: str  # "worker", "worker#2"
    role: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | None = None
    paused: bool = False
    expected_exit: bool = False
    starts: int = 0
    exits: list[dict] = field(default_factory=list)
    armed: dict[str, str] = field(default_factory=dict)  # window -> spec while FAILPOINTS is set

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, T = stopped, Z, ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                members.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return members


def kill_group_members(pgid: int) -> list[int]:
    """SIGKILL every process still in group ``pgid``; returns their pids."""
    members = group_members(pgid)
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return members


def log_tail(path: Path, lines: int = 15, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class Supervisor:
    def __init__(self, run_dir: Path, history=None, on_exit=None, isolate: bool | None = None):
        self.logs = Path(run_dir) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.history = history
        self.on_exit = on_exit
        self.instances: dict[str, Instance] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        # Called with each process's environment as it starts (the adapter's ${VAR} references resolved from it,
        # harness/vocabulary.py); None: the environment as given.
        self.prepare_env = None
        # Isolation (harness/isolation.py): asked for by the caller, else the process's switch (the CLI's flags).
        # Asked for and impossible raises IsolationError: never run a stranger's code unisolated by accident.
        self.sandbox: isolation.Sandbox | None = None
        self.isolation: dict = {"isolated": False}
        if isolate if isolate is not None else isolation.enabled():
            self.sandbox = isolation.Sandbox(Path(run_dir).name, hide=[reports_dir(), Path(run_dir).resolve().parent])
            self.isolation = self.sandbox.describe()
            self._record("note", message="isolation: roles run as an unprivileged user of their own, in a cgroup, "
                         "behind network rules", isolation=self.isolation)
        (Path(run_dir) / "isolation.json").write_text(json.dumps(self.isolation, indent=2) + "\n")
        self._monitor = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._monitor.start()

    def _record(self, type_: str, **fields) -> None:
        if self.history is None:
            return
        # The watcher thread may reap a role after the run closed its history: drop that line, do not raise.
        append = getattr(self.history, "append_if_open", self.history.append)
        append(type_, **fields)

    # --- lifecycle ------------------------------------------------------------------------------
    def add(self, name: str, role: str, command: list[str], env: dict[str, str]) -> Instance:
        if self.sandbox is not None:
            env = self.sandbox.environment(env)
        instance = Instance(name=name, role=role, command=command, env=env, log_path=self.logs / f"{name.replace('#', '-')}.log")
        with self._lock:
            self.instances[name] = instance
        return instance

    def start(self, name: str, extra_env: dict[str, str] | None = None) -> Instance:
        with self._lock:
            instance = self.instances[name]
            if instance.alive():
                raise RuntimeError(f"{name} is already running")
            env = {**instance.env, **(extra_env or {})}
            instance.armed = {}
            if env.get("FAILPOINTS"):
                for item in env["FAILPOINTS"].split(";"):
                    if "=" in item:
                        window, spec = item.split("=", 1)
                        instance.armed[window.strip()] = spec.strip()
            log = instance.log_path.open("ab")
            log.write(f"\n=== harness: start {name} {' '.join(instance.command)} "
                      f"FAILPOINTS={env.get('FAILPOINTS', '')!r} at {time.time():.3f}\n".encode())
            log.flush()
            argv = instance.command
            if self.sandbox is not None:
                env = self.sandbox.environment(env)
            if self.prepare_env is not None:
                env = self.prepare_env(env)
            if self.sandbox is not None:
                argv = self.sandbox.command(instance.command, env)
                env = isolation.outer_env(env)  # LD_PRELOAD and FAKETIME* are set by the wrapper's last step
            instance.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, close_fds=True)
            keeper.register(instance.process.pid)  # the group dies with the harness, even a killed one
            log.close()
            instance.paused = False
            instance.expected_exit = False
            instance.starts += 1
        self._record("role", role=name, action="start", pid=instance.pid, armed=instance.armed or None)
        return instance

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to the instance's whole process group."""
        with self._lock:
            instance = self.instances[name]
            if instance.process is None:
                return
            signal_group(instance.process.pid, sig)
            if sig == signal.SIGSTOP:
                instance.paused = True
            elif sig == signal.SIGCONT:
                instance.paused = False
            elif sig == signal.SIGKILL:
                instance.expected_exit = True

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        self.wait_exit(name, 5)

    def pause(self, name: str) -> None:
        self.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)

    def stop(self, name: str, timeout: float | None = None) -> None:
        """SIGTERM the group, then SIGKILL after ``timeout``; a paused group is continued first."""
        with self._lock:
            instance = self.instances[name]
            if instance.process is None:
                return
            instance.expected_exit = True
        if instance.alive():
            if instance.paused:
                self.signal(name, signal.SIGCONT)
            self.signal(name, signal.SIGTERM)
            if not self.wait_exit(name, timeout if timeout is not None else 5):
                self.signal(name, signal.SIGKILL)
                self.wait_exit(name, 5)
        # Whatever the leader did, no member of its group may outlive it (CONTRACT §2).
        kill_group_members(instance.process.pid)
        keeper.release(instance.process.pid)

    def ensure_running(self, name: str, extra_env: dict[str, str] | None = None) -> bool:
        """Start ``name`` unless it runs; True if this call started it.

        Restart timers, heal and the nemesis all revive crashed roles; the check and the start
        happen under one lock so that two of them racing cannot both try."""
        with self._lock:
            if self.instances[name].alive():
                return False
            self.start(name, extra_env)
            return True

    def restart(self, name: str, extra_env: dict[str, str] | None = None) -> Instance:
        # Held across stop and start so a restart timer cannot slip a start in between.
        with self._lock:
            self.stop(name, timeout=2)
            return self.start(name, extra_env)

    def wait_exit(self, name: str, timeout: float) -> bool:
        instance = self.instances[name]
        if instance.process is None:
            return True
        try:
            instance.process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop_all(self) -> None:
        """Stop every instance at once (each SIGTERM, then SIGKILL after 3 s): a run's teardown takes as long as
        its slowest role, not the sum of them."""
        names = list(self.instances)
        if names:
            with ThreadPoolExecutor(len(names), thread_name_prefix="stop") as pool:
                for future in [pool.submit(self.stop, name, 3) for name in names]:
                    future.result()
        self._stop.set()
        self.close_sandbox()

    def close_sandbox(self) -> None:
        """Kill every process left in the run's cgroup (a role that daemonized or started its own session), then
        remove its rules, cgroups and mounts. The pids killed here and the connections refused are evidence."""
        if self.sandbox is None or self.sandbox.closed:
            return
        summary = self.sandbox.close()
        self.isolation = {**self.sandbox.describe(), "end": summary}  # the ports allowed are known only now
        if summary.get("killed_at_end"):
            self._record("note", message="isolation: killed what the submission left running in its cgroup after "
                         "its roles stopped", pids=summary["killed_at_end"])
        if summary.get("probed_packets"):
            # Loopback ports nobody gave the submission are the grader's (Toxiproxy, management, the database's own
            # port) or another tenant's: trying them is an attempt on the grader, refused or not.
            self._record("tamper", found="attempted", what="loopback TCP connections to ports the submission was "
                         "not given, refused by the network rules", packets=summary["probed_packets"],
                         ports=summary.get("probed_ports") or [])
        if summary.get("refused_packets"):
            self._record("note", message="isolation: the network rules refused connections of the submission's roles",
                         packets=summary["refused_packets"])
        if summary.get("wall_time_exceeded"):
            self._record("note", message="isolation: the submission's wall time ran out; its processes were killed")
        try:
            (self.logs.parent / "isolation.json").write_text(json.dumps(self.isolation, indent=2) + "\n")
        except OSError:
            pass

    # --- verification ---------------------------------------------------------------------------
    def problems(self, expected_running: set[str]) -> list[str]:
        """What is wrong now: an expected instance not running, any instance (or group member) stopped."""
        found = []
        for name, instance in self.instances.items():
            if name in expected_running and not instance.alive():
                found.append(f"{name} is not running")
            if instance.alive():
                for pid in group_members(instance.pid):
                    if process_state(pid) in ("T", "t"):  # t: stopped under a tracer (clockshift)
                        found.append(f"{name} pid {pid} is stopped")
        return found

    # --- monitor --------------------------------------------------------------------------------
    def _watch(self) -> None:
        seen: dict[str, int] = {}
        while not self._stop.wait(0.05):
            with self._lock:
                snapshot = list(self.instances.values())
            for instance in snapshot:
                process = instance.process
                if process is None or process.poll() is None or seen.get(instance.name) == process.pid:
                    continue
                seen[instance.name] = process.pid
                exit_info = {"role": instance.name, "pid": process.pid, "returncode": process.returncode,
                             "expected": instance.expected_exit, "armed": instance.armed or None}
                if not instance.expected_exit:  # the evidence a person needs: why did it die?
                    exit_info["log_tail"] = log_tail(instance.log_path)
                instance.exits.append(exit_info)
                self._record("role", action="exit", **exit_info)
                # A role that died on its own (a crash failpoint, a SIGKILL of its PID) leaves its children behind
                # (a process pool's forkserver and workers, re-parented to init): as when a container's main
                # process dies, nothing of its group outlives it.
                left = kill_group_members(process.pid)
                keeper.release(process.pid)
                if left:
                    self._record("note", message="killed what the exited role left running in its process group",
                                 role=instance.name, pids=sorted(left))
                if self.on_exit:
                    try:
                        self.on_exit(instance, exit_info)
                    except Exception as exc:  # never let a callback kill the monitor
                        self._record("note", message=f"on_exit callback failed: {exc!r}")
