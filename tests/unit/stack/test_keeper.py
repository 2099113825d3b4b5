"""The keeper: what a harness process started dies with it, even when it is killed (SIGKILL runs no cleanup)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.stack import keeper
from harness.stack.process import ServiceProcess, group_members, run_group

REPO = Path(__file__).resolve().parents[3]


def wait_for(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def starter(tmp_path: Path, body: str) -> tuple[subprocess.Popen, dict]:
    """A harness process that starts a service group (a shell with a child: two processes) and a data folder, prints
    what it made, then waits to be killed."""
    script = textwrap.dedent(f"""
        import json, sys, time
        from pathlib import Path
        from harness.stack import keeper
        from harness.stack.process import ServiceProcess, group_members
        folder = Path({str(tmp_path / "data")!r}); folder.mkdir(); (folder / "pg").write_text("x")
        keeper.register_path(folder)
        service = ServiceProcess(name="svc", argv=["sh", "-c", "sleep 300 & wait"],
                                 log_path=Path({str(tmp_path / "svc.log")!r})).start()
        {body}
        print(json.dumps({{"pgid": service.pid, "folder": str(folder)}}), flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    made = json.loads(proc.stdout.readline())
    assert wait_for(lambda: len(group_members(made["pgid"])) == 2), "the service and its child run"
    return proc, made


def test_a_killed_starters_groups_and_data_folders_go_with_it(tmp_path):
    proc, made = starter(tmp_path, "")
    proc.kill()
    proc.wait()
    assert wait_for(lambda: group_members(made["pgid"]) == []), "the service outlived its killed starter"
    assert wait_for(lambda: not Path(made["folder"]).exists()), "its data folder was left behind"


def test_a_released_group_and_folder_outlive_their_starter(tmp_path):
    """`harness stack up`: the services are handed over to `harness stack down`, which stops them by PID."""
    proc, made = starter(tmp_path, "keeper.release(service.pid); keeper.release_path(folder)")
    proc.kill()
    proc.wait()
    try:
        time.sleep(1.0)  # the keeper has read the end of its pipe by now, and would have acted
        assert len(group_members(made["pgid"])) == 2
        assert Path(made["folder"]).exists()
    finally:
        os.killpg(made["pgid"], signal.SIGKILL)


def test_the_lines_are_followed_to_the_end():
    lines = [json.dumps(m) for m in ({"group": 11, "start": "5"}, {"group": 12, "start": "6"}, {"released": 11},
                                      {"path": "/tmp/a"}, {"path": "/tmp/b"}, {"released_path": "/tmp/a"})]
    assert keeper.keep([*lines, "not json"]) == ({12: "6"}, ["/tmp/b"], [])


def test_a_groups_mark_is_kept_until_the_group_is_released():
    lines = [json.dumps(m) for m in ({"group": 11, "start": "5", "mark": "a"}, {"group": 12, "start": "6", "mark": "b"},
                                      {"group": 13, "start": "7"}, {"released": 11})]
    assert keeper.keep(lines) == ({12: "6", 13: "7"}, [], ["b"])


OUT_OF_GROUP = ["sh", "-c", "setsid sleep 300 & sleep 300 & wait"]  # an Erlang VM's port programs do this


def strays_of(service) -> list[int]:
    return [pid for pid in keeper.marked(service.mark) if pid not in group_members(service.pid)]


def test_what_a_service_started_in_a_session_of_its_own_is_stopped_with_it(tmp_path):
    """RabbitMQ's node runs its port programs (erl_child_setup, the epmd starter: a second Erlang VM) each in a
    session of its own: killing the node's group left them running. They carry the service's mark."""
    service = ServiceProcess(name="svc", argv=OUT_OF_GROUP, log_path=tmp_path / "svc.log").start()
    try:
        assert wait_for(lambda: len(strays_of(service)) == 1), "the out-of-group child runs"
        stray = strays_of(service)[0]
        service.stop(grace=1)
        assert group_members(service.pid) == []
        assert wait_for(lambda: keeper.start_time(stray) is None or zombie(stray)), "the stray outlived the stop"
    finally:
        for pid in keeper.marked(service.mark):
            os.kill(pid, signal.SIGKILL)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_starters_out_of_group_processes_go_with_it(tmp_path):
    proc, made = starter(tmp_path, f"""
        stray = ServiceProcess(name="stray", argv={OUT_OF_GROUP!r}, log_path=Path({str(tmp_path / "s.log")!r})).start()
        while not [p for p in keeper.marked(stray.mark) if p not in group_members(stray.pid)]: time.sleep(0.05)
        Path({str(tmp_path / "mark")!r}).write_text(stray.mark)""")
    mark = (tmp_path / "mark").read_text()
    assert len(keeper.marked(mark)) == 3  # the shell, its child in the group, the one in a session of its own
    proc.kill()
    proc.wait()
    assert wait_for(lambda: keeper.marked(mark) == []), "a process out of the service's group outlived the starter"


def test_a_group_id_now_naming_another_process_is_left_alone(tmp_path):
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert keeper.kill_left({sleeper.pid: "123"}) == []  # its start time is not the one registered
        assert keeper.kill_left({sleeper.pid: None}) == []  # gone before its start time could be read
        assert sleeper.poll() is None
        assert keeper.kill_left({sleeper.pid: keeper.start_time(sleeper.pid)}) == [sleeper.pid]
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_a_killed_graders_roles_go_with_it(tmp_path):
    """A role of the implementation (started by the supervisor, not isolated) dies with a harness killed mid-run."""
    script = textwrap.dedent(f"""
        import json, os, time
        from harness.supervisor import Supervisor
        supervisor = Supervisor({str(tmp_path / "run")!r}, isolate=False)
        supervisor.add("worker", "worker", ["sh", "-c", "sleep 300 & wait"], dict(os.environ))
        print(json.dumps(supervisor.start("worker").pid), flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pgid = json.loads(proc.stdout.readline())
    assert wait_for(lambda: len(group_members(pgid)) == 2)
    proc.kill()
    proc.wait()
    assert wait_for(lambda: group_members(pgid) == []), "the role outlived its killed grader"


def test_a_setup_command_dies_with_a_killed_grader(tmp_path):
    """The adapter's [setup] command (run_group): a grader killed while it runs leaves nothing of it running."""
    script = textwrap.dedent(f"""
        import sys
        from harness.stack.process import run_group
        with open({str(tmp_path / "setup.log")!r}, "wb") as log:
            run_group(["sh", "-c", "echo $$; sleep 300 & wait"], None, log, timeout=300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    log = tmp_path / "setup.log"
    assert wait_for(lambda: log.exists() and log.read_text().strip().isdigit())
    pgid = int(log.read_text())
    assert wait_for(lambda: len(group_members(pgid)) == 2)
    proc.kill()
    proc.wait()
    assert wait_for(lambda: group_members(pgid) == []), "the setup command outlived its killed grader"


def test_run_group_times_out_like_subprocess_run_and_leaves_nothing(tmp_path):
    with open(tmp_path / "log", "wb") as log, pytest.raises(subprocess.TimeoutExpired):
        run_group(["sh", "-c", "echo $$; sleep 300 & wait"], None, log, timeout=0.5)
    pgid = int((tmp_path / "log").read_text())
    assert group_members(pgid) == []
    with open(tmp_path / "log2", "wb") as log:
        assert run_group(["sh", "-c", "exit 3"], None, log, timeout=10) == 3
