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


def test_kill_ours_signals_only_this_process_children(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        said = []
        # PID 1 and our own parent are not our children: never signalled, whatever the caller passes.
        done = grade_many.kill_ours({1: "init", os.getppid(): "parent", child.pid: "role api"}, said.append)
        assert done == [f"role api pid {child.pid}"]
        # Killed and collected by kill_ours itself (no zombie left for an abandoned Popen), so it is gone.
        assert not Path(f"/proc/{child.pid}").exists()
        assert said and "role api" in said[0]
    finally:
        if child.poll() is None:
            child.kill()


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
    def pids(self):
        return {}


def _stand_in(tmp_path, monkeypatch, body):
    """A SubmissionGrade whose grade() is ``body(reports_dir, progress)``, run in its thread."""
    import harness.grade

    monkeypatch.setattr(harness.grade, "grade", lambda adapter, level, seed, only=None, stack=None, reports_dir=None,
                        progress=print: body(Path(reports_dir), progress))
    sub = grade_many.Submission("stand-in", tmp_path / "adapter.toml", "stand-in")
    said: list[str] = []
    job = grade_many.SubmissionGrade(sub, adapter=None, level=4, seed=1, only=None, stack=StandInStack(),
                                     folder=tmp_path / "stand-in", timeout=1.5, say=said.append)
    return job, said


def test_a_submission_past_its_time_limit_is_stopped_and_its_roles_killed_by_pid(tmp_path, monkeypatch):
    state = {}

    def slow_grade(reports_dir, progress):
        scenario = reports_dir / "grade-1" / "slow-scenario"
        scenario.mkdir(parents=True)
        # A role the stand-in never stops itself (its "teardown" is skipped): only a kill by PID ends it.
        role = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        state["role"] = role
        (scenario / "history.jsonl").write_text(json.dumps({"type": "role", "action": "start", "role": "worker",
                                                            "pid": role.pid}) + "\n")
        try:
            while True:
                time.sleep(0.05)
        except grade_many.SubmissionTimeout:
            state["interrupted"] = True
            raise

    job, said = _stand_in(tmp_path, monkeypatch, slow_grade)
    began = time.monotonic()
    assert job.run() == "timeout"
    assert time.monotonic() - began < 15
    assert state["interrupted"] and not job.thread.is_alive()
    assert isinstance(job.error, grade_many.SubmissionTimeout)
    assert not Path(f"/proc/{state['role'].pid}").exists()  # killed and collected: not even a zombie is left
    assert any("time limit of 2s reached" in line for line in said)
    assert any(f"roles running: worker pid {state['role'].pid}" in line for line in said)
    assert any(f"killed by PID: role worker pid {state['role'].pid}" in line for line in said)


def test_a_submission_that_does_not_start_stops_after_its_first_scenario(tmp_path, monkeypatch):
    calls = []

    def failing_grade(reports_dir, progress):
        for name in ("first", "second"):
            calls.append(name)
            run_dir = reports_dir / "grade-1" / name
            (run_dir / "logs").mkdir(parents=True)
            (run_dir / "logs" / "setup.log").write_text("=== harness: start\nFATAL: role \"nobody\" does not exist\n")
            (run_dir / "run.json").write_text(json.dumps({"error": "RuntimeError: setup command exited 1; see "
                                                          "logs/setup.log", "timings": {"setup": 0.4, "stop": 0.1}}))
            progress(f"    {name}: UNKNOWN in 0.5s")
        return {}, reports_dir

    job, said = _stand_in(tmp_path, monkeypatch, failing_grade)
    assert job.run() == "did not start"
    assert calls == ["first"]  # the second scenario was never tried
    assert job.not_started == ('setup failed in first: RuntimeError: setup command exited 1; see logs/setup.log — '
                               'setup.log: FATAL: role "nobody" does not exist')
