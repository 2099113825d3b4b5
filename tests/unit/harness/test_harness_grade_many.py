"""grade-many without services: which submissions, rows for the ones that cannot be graded, exit codes, and the
time limit / did-not-start paths with a stand-in grade (a child process playing a role)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import cli, grade_many
from harness.report import table
from harness.schemas import REPO_ROOT

BROKEN_ADAPTER = """adapter_version = 1
name = "broken"
level = 4
[roles.api]
command = ["definitely-not-a-program-xyz", "api"]
[roles.worker]
command = ["definitely-not-a-program-xyz", "worker"]
consumer = true
[broker]
work_queue = "q"
"""


def test_discover_files_folders_and_folders_of_submissions(tmp_path):
    klass = tmp_path / "class"
    for name in ("bob", "alice"):
        (klass / name).mkdir(parents=True)
        (klass / name / "adapter.toml").write_text("x")
    (klass / "notes").mkdir()  # no adapter.toml: not a submission
    single = tmp_path / "carol"
    single.mkdir()
    (single / "adapter.toml").write_text("x")
    loose = tmp_path / "dave.toml"
    loose.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    found = grade_many.discover([str(klass), str(single), str(loose), str(klass / "alice" / "adapter.toml"),
                                 str(empty), str(tmp_path / "missing")])
    assert [s.name for s in found] == ["alice", "bob", "carol", "dave", "alice-2", "empty", "missing"]
    assert found[0].adapter == klass / "alice" / "adapter.toml" and found[3].adapter == loose
    assert found[5].adapter is None and "no adapter.toml" in found[5].problem
    assert found[6].adapter is None and "no adapter file" in found[6].problem
    # From a checkout, names work as for `harness grade --sut`.
    (reference,) = grade_many.discover(["reference"])
    assert reference.adapter.resolve() == REPO_ROOT / "reference" / "adapter.toml" and reference.name == "reference"


def test_exit_code_all_valid_any_invalid_else_two():
    def rows(*verdicts):
        return [table.Row(f"s{i}", "a.toml", v) for i, v in enumerate(verdicts)]

    assert grade_many.exit_code(rows("valid", "valid")) == 0
    assert grade_many.exit_code(rows("valid", "invalid", "timeout")) == 1
    assert grade_many.exit_code(rows("valid", "unknown")) == 2
    assert grade_many.exit_code(rows("valid", "invalid adapter")) == 2
    assert grade_many.exit_code(rows("timeout")) == 2 and grade_many.exit_code([]) == 2


def test_invalid_adapters_are_rows_and_start_no_service(tmp_path, monkeypatch, capsys):
    from harness.stack import Stack

    def no_stack(*args, **kwargs):
        raise AssertionError("no service may start when no submission can be graded")

    monkeypatch.setattr(Stack, "start", no_stack)
    klass = tmp_path / "class"
    (klass / "broken").mkdir(parents=True)
    (klass / "broken" / "adapter.toml").write_text(BROKEN_ADAPTER)
    (klass / "garbage").mkdir()
    (klass / "garbage" / "adapter.toml").write_text("this is [not toml")
    code = cli.main(["grade-many", str(klass), str(tmp_path / "nowhere"), "--level", "4", "--seed", "5",
                     "--reports", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 2
    assert "base seed 5" in out and "[1/3] broken" in out and "[3/3] nowhere: INVALID ADAPTER" in out
    (folder,) = (tmp_path / "out").glob("grade-many-*-L4-s5")
    stored = json.loads((folder / "results.json").read_text())
    rows = {r["name"]: r for r in stored["rows"]}
    assert [r["verdict"] for r in stored["rows"]] == ["invalid adapter"] * 3
    assert "definitely-not-a-program-xyz" in rows["broken"]["reason"] and "roles.api" in rows["broken"]["reason"]
    assert "not valid TOML" in rows["garbage"]["reason"]
    assert "no adapter file" in rows["nowhere"]["reason"]
    for name in ("table.md", "table.csv", "index.html"):
        assert (folder / name).is_file()
    assert (folder / "table.csv").read_text().count("invalid adapter") == 3


def test_unknown_scenario_in_only_is_refused_before_anything(tmp_path, capsys):
    assert cli.main(["grade-many", "reference", "--level", "4", "--only", "no-such-scenario",
                     "--reports", str(tmp_path)]) == 2
    assert "no-such-scenario" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_descendants_follow_parent_links_and_kill_tree_leaves_nothing_running(tmp_path):
    """A process tree (a child leading its own group, its grandchild in another session): every member found by
    parent links, and killed with the root."""
    from harness.grade_child import descendants, kill_tree

    pid_file = tmp_path / "grandchild.pid"
    root = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        assert set(descendants(root.pid)) == {grandchild}
        assert os.getpid() not in descendants(root.pid) and root.pid in descendants(os.getpid())
        said = []
        done = kill_tree(root.pid, said.append, {grandchild: "role worker"})
        assert f"role worker pid {grandchild}" in done and root.wait(10) == -9
        assert said and "killed by PID: role worker" in said[0]
        deadline = time.monotonic() + 10  # the grandchild, orphaned, is collected by whoever adopted it
        while Path(f"/proc/{grandchild}").exists() and grade_many_state(grandchild) != "Z" \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert grade_many_state(grandchild) in (None, "Z")  # not running any more
    finally:
        if root.poll() is None:
            root.kill()


def grade_many_state(pid):
    from harness.grade_child import _stat

    fields = _stat(pid)
    return fields[0] if fields else None


def test_roles_running_follows_start_and_exit_lines(tmp_path):
    history = tmp_path / "grade-x" / "scn" / "history.jsonl"
    history.parent.mkdir(parents=True)
    lines = [{"type": "role", "action": "start", "role": "api", "pid": 11},
             {"type": "role", "action": "start", "role": "worker", "pid": 12},
             {"type": "role", "action": "exit", "role": "worker", "pid": 12},
             {"type": "role", "action": "start", "role": "worker", "pid": 13}]
    history.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"type": "role", "act')  # cut short
    assert grade_many.roles_running(tmp_path) == {"scn/api": 11, "scn/worker": 13}


class StandInStack:
    def __init__(self):
        self.calls = []

    def pids(self):
        return {}

    def alive(self, name):
        self.calls.append(name)
        return name == "postgres"


def _stand_in(tmp_path, monkeypatch, body, timeout=1.5):
    """A SubmissionGrade whose grade() is ``body(reports_dir, progress, stack)``, run in its child process."""
    import harness.grade

    monkeypatch.setattr(harness.grade, "grade", lambda adapter, level, seed, only=None, stack=None, reports_dir=None,
                        progress=print: body(Path(reports_dir), progress, stack))
    sub = grade_many.Submission("stand-in", tmp_path / "adapter.toml", "stand-in")
    said: list[str] = []
    job = grade_many.SubmissionGrade(sub, adapter=None, level=4, seed=1, only=None, stack=StandInStack(),
                                     folder=tmp_path / "stand-in", timeout=timeout, say=said.append)
    return job, said


def test_a_submission_past_its_time_limit_is_stopped_and_its_roles_killed_by_pid(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()

    def slow_grade(reports_dir, progress, stack):
        scenario = reports_dir / "grade-1" / "slow-scenario"
        scenario.mkdir(parents=True)
        # A role the stand-in never stops itself (its "teardown" is skipped): only a kill by PID ends it.
        role = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        (marks / "role").write_text(str(role.pid))
        (marks / "grade").write_text(str(os.getpid()))
        (scenario / "history.jsonl").write_text(json.dumps({"type": "role", "action": "start", "role": "worker",
                                                            "pid": role.pid}) + "\n")
        try:
            while True:
                time.sleep(0.05)
        except grade_many.SubmissionTimeout:
            (marks / "interrupted").write_text("yes")
            raise

    job, said = _stand_in(tmp_path, monkeypatch, slow_grade)
    began = time.monotonic()
    assert job.run() == "timeout"
    assert time.monotonic() - began < 15
    role, grade_pid = int((marks / "role").read_text()), int((marks / "grade").read_text())
    assert grade_pid != os.getpid() and grade_pid == job.process.pid  # the grade ran in a child process
    assert (marks / "interrupted").is_file() and not job.process.is_alive()
    assert isinstance(job.error, grade_many.SubmissionTimeout)
    assert not Path(f"/proc/{role}").exists()  # killed and collected by the child: not even a zombie is left
    assert not Path(f"/proc/{grade_pid}").exists()
    assert any("time limit of 2s reached" in line for line in said)
    assert any(f"roles running: worker pid {role}" in line for line in said)
    assert any(f"killed by PID: role worker pid {role}" in line for line in said)


def test_a_grade_that_ignores_the_stop_is_killed_with_its_whole_tree(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()

    def stubborn_grade(reports_dir, progress, stack):
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the stop: the parent must kill its tree
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        (marks / "helper").write_text(str(helper.pid))
        while True:
            time.sleep(0.05)

    monkeypatch.setattr(grade_many, "GRACEFUL_STOP_SECONDS", 1.0)
    job, said = _stand_in(tmp_path, monkeypatch, stubborn_grade, timeout=1.0)
    assert job.run() == "timeout"
    helper = int((marks / "helper").read_text())
    assert not job.process.is_alive() and job.process.exitcode == -9
    assert any("did not stop" in line for line in said)
    assert any(f"process pid {helper}" in line and "killed by PID" in line for line in said)
    deadline = time.monotonic() + 10
    while grade_many_state(helper) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert grade_many_state(helper) in (None, "Z")


def test_the_child_asks_the_parent_for_the_services_and_sends_its_results(tmp_path, monkeypatch):
    def quick_grade(reports_dir, progress, stack):
        progress("[1/1] one line of progress")
        progress("a line shown")
        grade_dir = reports_dir / "grade-1"
        grade_dir.mkdir(parents=True)
        return {"verdict": "valid", "alive": [stack.alive("postgres"), stack.alive("rabbitmq")],
                "pid": os.getpid()}, grade_dir

    job, said = _stand_in(tmp_path, monkeypatch, quick_grade, timeout=30)
    assert job.run() == "done"
    assert job.results["alive"] == [True, False] and job.results["pid"] != os.getpid()
    assert job.stack.calls == ["postgres", "rabbitmq"]  # answered by the parent's stack, not the child's copy
    assert job.grade_dir == tmp_path / "stand-in" / "grade-1"
    assert said == ["    a line shown"]  # a scenario's own [i/n] lines only with --verbose


def test_a_grade_started_from_a_worker_thread_is_stopped_the_same_way(tmp_path, monkeypatch):
    """--jobs N: each submission is driven from a pool thread; its child (forked from that thread) still takes the stop
    signal in its own main thread."""
    import threading

    marks = tmp_path / "marks"
    marks.mkdir()

    def slow_grade(reports_dir, progress, stack):
        try:
            while True:
                time.sleep(0.05)
        except grade_many.SubmissionTimeout:
            (marks / "interrupted").write_text("yes")
            raise

    job, said = _stand_in(tmp_path, monkeypatch, slow_grade, timeout=1.0)
    ended = []
    driver = threading.Thread(target=lambda: ended.append(job.run()))
    driver.start()
    driver.join(30)
    assert ended == ["timeout"] and (marks / "interrupted").is_file()
    assert not job.process.is_alive() and job.process.exitcode == 0  # it stopped itself, nothing killed it


def test_a_grade_stuck_in_one_long_call_is_stopped_at_once_and_does_not_go_on(tmp_path, monkeypatch):
    """A grade inside one long C call (a sleep, a blocking read): a thread stopped by an asynchronous exception
    could only be abandoned (it went on after its time limit, 15 s later); a process takes the signal at once."""
    def stuck(reports_dir, progress, stack):
        reports_dir.mkdir(parents=True, exist_ok=True)
        time.sleep(120)
        (reports_dir / "woke-up").write_text("went on after its time limit")
        return {}, reports_dir

    job, said = _stand_in(tmp_path, monkeypatch, stuck, timeout=1.0)
    began = time.monotonic()
    assert job.run() == "timeout"
    assert time.monotonic() - began < 8 and not job.process.is_alive()
    assert not (tmp_path / "stand-in" / "woke-up").exists()
    assert not any("did not stop" in line for line in said)


def test_an_error_in_the_grade_is_an_error_row_with_its_type(tmp_path, monkeypatch):
    def broken_grade(reports_dir, progress, stack):
        raise ValueError("no such level")

    job, said = _stand_in(tmp_path, monkeypatch, broken_grade, timeout=30)
    assert job.run() == "error"
    assert str(job.error) == "ValueError: no such level"


def test_a_submission_that_does_not_start_stops_after_its_first_scenario(tmp_path, monkeypatch):

    def failing_grade(reports_dir, progress, stack):
        for name in ("first", "second"):
            (reports_dir.parent / f"called-{name}").write_text("yes")
            run_dir = reports_dir / "grade-1" / name
            (run_dir / "logs").mkdir(parents=True)
            (run_dir / "logs" / "setup.log").write_text("=== harness: start\nFATAL: role \"nobody\" does not exist\n")
            (run_dir / "run.json").write_text(json.dumps({"error": "RuntimeError: setup command exited 1; see "
                                                          "logs/setup.log", "timings": {"setup": 0.4, "stop": 0.1}}))
            progress(f"    {name}: UNKNOWN in 0.5s")
        return {}, reports_dir

    job, said = _stand_in(tmp_path, monkeypatch, failing_grade)
    assert job.run() == "did not start"
    assert [p.name for p in sorted(tmp_path.glob("called-*"))] == ["called-first"]  # the second was never tried
    assert job.not_started == ('setup failed in first: RuntimeError: setup command exited 1; see logs/setup.log — '
                               'setup.log: FATAL: role "nobody" does not exist')
