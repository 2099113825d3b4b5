"""Roles as process groups: a signal reaches every process a role started; stop leaves no member behind."""

from __future__ import annotations

import os
import signal
import sys
import time

from harness.history import History, HistoryWriter
from harness.supervisor import Supervisor, group_members, process_state

# A role that forks a child which would outlive a plain kill of the parent.
SCRIPT = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    print('up', flush=True); time.sleep(60)\n"


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_group_signals_reach_children_and_exits_are_recorded(tmp_path):
    with HistoryWriter(tmp_path / "h.jsonl") as history:
        sup = Supervisor(tmp_path, history)
        sup.add("worker", "worker", [sys.executable, "-c", SCRIPT], dict(os.environ))
        instance = sup.start("worker", {"FAILPOINTS": "after_commit_before_ack=1*crash"})
        assert instance.armed == {"after_commit_before_ack": "1*crash"}
        assert wait_for(lambda: len(group_members(instance.pid)) == 2)
        members = group_members(instance.pid)
        sup.pause("worker")
        assert wait_for(lambda: all(process_state(p) == "T" for p in members))
        assert sup.problems({"worker"}) and "stopped" in sup.problems({"worker"})[0]
        sup.resume("worker")
        assert wait_for(lambda: not sup.problems({"worker"}))
        sup.kill("worker")
        assert wait_for(lambda: not group_members(members[0]) and all(process_state(p) in (None, "Z") for p in members))
        assert wait_for(lambda: bool(instance.exits))
        assert instance.exits[0]["returncode"] == -signal.SIGKILL and instance.exits[0]["expected"]
        assert "worker is not running" in sup.problems({"worker"})
        sup.restart("worker")
        assert sup.instances["worker"].alive() and sup.instances["worker"].armed == {}
        sup.stop_all()
        assert not sup.instances["worker"].alive()
    events = History.load(tmp_path / "h.jsonl")
    actions = [e["action"] for e in events.of_type("role")]
    assert actions[:3] == ["start", "exit", "start"]
    assert (tmp_path / "logs" / "worker.log").read_text().count("=== harness: start worker") == 2


def test_unexpected_exit_is_reported_to_the_callback(tmp_path):
    seen = []
    sup = Supervisor(tmp_path, None, on_exit=lambda inst, info: seen.append(info))
    sup.add("api", "api", [sys.executable, "-c", "import os; os._exit(137)"], dict(os.environ))
    sup.start("api")
    assert wait_for(lambda: bool(seen))
    assert seen[0]["returncode"] == 137 and not seen[0]["expected"]
    sup.stop_all()


def test_revivers_racing_start_a_crashed_role_once(tmp_path):
    """A restart timer and heal both revive a crashed role at once (the CI flake of
    window-commit-ack-failpoint): exactly one start happens and neither raises."""
    import threading

    sup = Supervisor(tmp_path, None)
    sup.add("worker", "worker", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    sup.start("worker")
    sup.kill("worker")
    barrier = threading.Barrier(8)
    started, errors = [], []

    def revive():
        barrier.wait()
        try:
            started.append(sup.ensure_running("worker"))
        except Exception as exc:  # the bug: "worker is already running"
            errors.append(exc)

    threads = [threading.Thread(target=revive) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert not errors and started.count(True) == 1
        assert sup.instances["worker"].starts == 2
    finally:
        sup.stop_all()


def test_a_role_that_dies_on_its_own_leaves_nothing_of_its_group_running(tmp_path):
    # The leader kills itself (as a crash failpoint or a SIGKILL of its own PID would end it); the child it forked
    # (think of a process pool's forkserver) would be re-parented to init and live on.
    script = SCRIPT.replace("print('up', flush=True); time.sleep(60)",
                            "print('up', flush=True); time.sleep(0.5); os.kill(os.getpid(), 9)")
    with HistoryWriter(tmp_path / "h.jsonl") as history:
        sup = Supervisor(tmp_path, history)
        sup.add("worker", "worker", [sys.executable, "-c", script], dict(os.environ))
        instance = sup.start("worker")
        assert wait_for(lambda: len(group_members(instance.pid)) == 2)
        child = [p for p in group_members(instance.pid) if p != instance.pid][0]
        assert wait_for(lambda: process_state(child) in (None, "Z"), timeout=5), "the crashed role's child lives on"
        sup.stop_all()
    notes = [e for e in History.load(tmp_path / "h.jsonl").of_type("note") if "left running" in e.get("message", "")]
    assert notes and child in notes[0]["pids"]
