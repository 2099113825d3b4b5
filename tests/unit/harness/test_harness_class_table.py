"""The class table (harness/class_table.py) and grade-many's sharding, side-by-side jobs and merge, without services:
every grade is a made-up results dict; the table of the merged shards must equal the table of one run."""

from __future__ import annotations

import threading
import time

import pytest

from harness import class_table, cli, grade_many
from harness.checklist import ITEMS
from harness.report import table

PASS_ALL = {item.id: "pass" for item in ITEMS}


def results(level: int, statuses: dict, scenarios=(), verdict="valid") -> dict:
    """A grade's results as results.json holds them, only the keys the class table reads."""
    rows = {}
    for item in ITEMS:
        status = statuses.get(item.id, "pass") if item.level <= level else "not required"
        rows[item.id] = {"status": status, "why": f"why {item.id}", "meaning": item.meaning,
                         "scenarios": [s["name"] for s in scenarios if item.id in s.get("verifies", [])]}
    return {"level": level, "verdict": verdict, "checklist": rows, "scenarios": list(scenarios),
            "requirements": {}}


LOST = {"name": "database-outages-past-lease", "seed": 77, "level": 3, "verdict": "invalid",
        "verifies": ["BE-JOB-001.2"],
        "verdicts": [{"invariant": "lost_accepted_work", "status": "invalid", "summary": "1 of 24 accepted lost",
                      "evidence": [{"message": "accepted, never ready", "attachment_id": "a-123"}]}]}


def test_level_achieved_is_the_highest_level_whose_rows_all_pass_in_one_grade():
    assert class_table.level_achieved(results(5, {})) == 5
    level4_row = next(i.id for i in ITEMS if i.level == 4)
    level3_row = next(i.id for i in ITEMS if i.level == 3)
    assert class_table.level_achieved(results(5, {level4_row: "not proven"})) == 3
    assert class_table.level_achieved(results(4, {level3_row: "fail"})) is None
    assert class_table.level_achieved(results(4, {})) == 4  # never above the grade's own level
    # a scenario of level 3 not valid: no level, even with every row passing
    assert class_table.level_achieved(results(4, {}, [{**LOST, "verifies": []}])) is None
    assert class_table.level_achieved(None) is None
    # a partial grade (a row not run: "not required" below the level) achieves nothing that row belongs to
    assert class_table.level_achieved(results(3, {level3_row: "not required"})) is None


def test_feedback_names_each_failed_row_with_evidence_scenario_and_the_laptop_command(tmp_path):
    grade = results(3, {"BE-JOB-001.2": "fail"}, [LOST], verdict="invalid")
    row = table.row_from_grade("alice", "class/alice/adapter.toml", grade, 12.0, "alice/g/index.html",
                               reproduce="harness grade --sut class/alice/adapter.toml --level 3 --seed 77")
    crow = class_table.class_row(1, row, grade, "alice")
    items = class_table.write_feedback(tmp_path / "alice", "alice", crow, grade)
    assert [i["row"] for i in items] == ["BE-JOB-001.2"]
    md = (tmp_path / "alice" / "feedback.md").read_text()
    assert "BE-JOB-001.2: fail" in md and "nothing accepted is lost" in md
    assert "1 of 24 accepted lost" in md and "a-123" in md
    assert "harness run database-outages-past-lease --seed 77 --sut adapter.toml --level 3" in md
    html = (tmp_path / "alice" / "feedback.html").read_text()
    assert "database-outages-past-lease" in html and "a-123" in html
    assert crow["checklist"]["BE-JOB-001.2"] == "fail" and crow["level_achieved"] is None
    # a submission that did not start: why comes first, above the rows it left unknown
    partial = table.row_from_grade("bob", "bob/adapter.toml", grade, 40.0, None, verdict="did not start",
                                   reason="starting the roles failed: api.log: Application startup failed")
    class_table.write_feedback(tmp_path / "bob", "bob", class_table.class_row(2, partial, grade, "bob"), grade)
    md = (tmp_path / "bob" / "feedback.md").read_text()
    assert md.index("Why: starting the roles failed") < md.index("## BE-JOB-001.2")


def test_csv_and_html_have_every_checklist_row_level_time_and_reproduce_and_sort_in_the_page():
    grade = results(4, {})
    row = table.row_from_grade("bob", "bob/adapter.toml", grade, 3.5, None, reproduce="harness grade --sut bob")
    crow = class_table.class_row(2, row, grade, "bob")
    text = class_table.csv_text([crow])
    header, line = text.splitlines()
    assert header.split(",")[:5] == ["index", "name", "adapter", "verdict", "level_achieved"]
    assert all(item.id in header for item in ITEMS)
    assert line.startswith("2,bob,bob/adapter.toml,valid,4,pass") and "3.5,harness grade --sut bob" in line
    page = class_table.html([crow], {"level": 4, "seed": 1, "submissions": 1})
    assert "table class=\"many sortable\"" in page and "addEventListener('click'" in page
    assert "<script src" not in page and "http" not in page.split("<script>")[1]


def test_shard_slices_are_deterministic_disjoint_and_cover_the_list():
    names = [f"s{k}" for k in range(7)]
    slices = [class_table.shard_of(names, i, 3) for i in (1, 2, 3)]
    assert sorted(sum(slices, [])) == sorted(names) and slices[0] == ["s0", "s3", "s6"]
    assert class_table.parse_shard("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "x", "1/0"):
        with pytest.raises(ValueError):
            class_table.parse_shard(bad)


def _fake_class(tmp_path, monkeypatch, overlap: list | None = None):
    """Five submissions whose grades are made up by name; ClassGrade.one stands in for the real grade."""
    klass = tmp_path / "class"
    for name in ("erin", "alice", "dave", "carol", "bob"):
        (klass / name).mkdir(parents=True)
        (klass / name / "adapter.toml").write_text("adapter_version = 1\n")
    made = {"alice": results(3, {"BE-JOB-001.2": "fail"}, [LOST], verdict="invalid"),
            "bob": results(5, {}), "carol": results(5, {next(i.id for i in ITEMS if i.level == 4): "not proven"},
                                                    verdict="unknown"),
            "dave": results(4, {}), "erin": None}
    running = {"now": 0, "most": 0}
    guard = threading.Lock()

    def one(self, sub):
        with guard:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.2)
        with guard:
            running["now"] -= 1
        grade = made[sub.name]
        reproduce = f"harness grade --sut {sub.shown_path} --level {self.level} --seed {self.seed}"
        if grade is None:
            return table.Row(sub.name, sub.shown_path, "did not start", {}, 1.0, None, "api never healthy",
                             reproduce)
        self.results[sub.name] = grade
        (self.out / sub.name / "grade-x").mkdir(parents=True, exist_ok=True)
        (self.out / sub.name / "grade-x" / "index.html").write_text(f"grade of {sub.name}")
        return table.row_from_grade(sub.name, sub.shown_path, grade, 1.0, f"{sub.name}/grade-x/index.html",
                                    reproduce=reproduce)

    monkeypatch.setattr(grade_many.ClassGrade, "one", one)
    monkeypatch.chdir(tmp_path)
    return klass, running


def _tables(folder):
    return (folder / "class.csv").read_text(), (folder / "class.html").read_text()


def test_merged_shards_make_the_same_table_as_one_run(tmp_path, monkeypatch, capsys):
    klass, running = _fake_class(tmp_path, monkeypatch)
    common = ["grade-many", "class", "--level", "5", "--seed", "9", "--no-isolation"]
    assert cli.main(common + ["--reports", "whole"]) == 1  # alice invalid
    (whole,) = (tmp_path / "whole").glob("grade-many-*")
    assert cli.main(common + ["--reports", "s1", "--shard", "1/2"]) == 1
    assert cli.main(common + ["--reports", "s2", "--shard", "2/2"]) == 0  # bob and dave: valid
    (s1,), (s2,) = (tmp_path / "s1").glob("grade-many-*"), (tmp_path / "s2").glob("grade-many-*")
    assert [line.split(",")[1] for line in (s1 / "class.csv").read_text().splitlines()[1:]] == [
        "alice", "carol", "erin"]  # round robin over the sorted names
    assert "alice" not in (s2 / "class.csv").read_text()
    assert cli.main(["grade-many", "merge", str(s2), str(s1), "--reports", "merged"]) == 1
    (merged,) = (tmp_path / "merged").glob("grade-many-*-merged")
    assert _tables(merged) == _tables(whole)
    csv_rows = (merged / "class.csv").read_text().splitlines()[1:]
    assert [r.split(",")[1] for r in csv_rows] == ["alice", "bob", "carol", "dave", "erin"]
    assert [r.split(",")[4] for r in csv_rows] == ["", "5", "3", "4", ""]
    assert (merged / "alice" / "feedback.md").is_file() and (merged / "alice" / "grade-x" / "index.html").is_file()
    assert "BE-JOB-001.2" in (merged / "alice" / "feedback.md").read_text()
    # a shard left out is refused, not a silently short table
    assert cli.main(["grade-many", "merge", str(s1), "--reports", "short"]) == 2
    assert "missing" in capsys.readouterr().out


def test_jobs_grade_submissions_side_by_side_with_the_same_table(tmp_path, monkeypatch):
    klass, running = _fake_class(tmp_path, monkeypatch)
    assert cli.main(["grade-many", "class", "--level", "5", "--seed", "9", "--no-isolation", "--reports", "one"]) == 1
    assert running["most"] == 1
    assert cli.main(["grade-many", "class", "--level", "5", "--seed", "9", "--no-isolation", "--reports", "two",
                     "--jobs", "2"]) == 1
    assert running["most"] == 2
    (one,), (two,) = (tmp_path / "one").glob("grade-many-*"), (tmp_path / "two").glob("grade-many-*")
    assert _tables(one) == _tables(two)


def test_the_run_gate_lets_shared_runs_overlap_and_an_exclusive_one_run_alone():
    gate = grade_many.RunGate()
    log, guard = [], threading.Lock()

    def shared(tag):
        with gate.shared():
            with guard:
                log.append(("in", tag))
            time.sleep(0.15)
            with guard:
                log.append(("out", tag))

    def exclusive():
        with gate.exclusive():
            with guard:
                log.append(("in", "X"))
            time.sleep(0.1)
            with guard:
                log.append(("out", "X"))

    threads = [threading.Thread(target=shared, args=("a",)), threading.Thread(target=shared, args=("b",))]
    for t in threads:
        t.start()
    time.sleep(0.05)
    threads.append(threading.Thread(target=exclusive))
    threads[-1].start()
    for t in threads:
        t.join(5)
    assert log[:2] == [("in", "a"), ("in", "b")] or log[:2] == [("in", "b"), ("in", "a")]
    x = log.index(("in", "X"))
    assert log[x + 1] == ("out", "X") and x == 4  # after both shared runs left, nothing during it


def test_a_grade_process_killed_while_waiting_or_holding_leaves_the_gate_usable(tmp_path):
    """Each submission's grade is a process of its own: one killed while it waits for the exclusive side, or while it
    holds the shared side, leaves nothing behind that blocks the others (the kernel drops a dead holder's lock)."""
    import multiprocessing
    import os
    import signal

    gate = grade_many.RunGate(tmp_path)
    context = multiprocessing.get_context("fork")

    def wants_exclusive():
        gate.forget_inherited()
        with gate.exclusive():
            pass

    def holds_shared():
        gate.forget_inherited()
        with gate.shared():
            time.sleep(60)

    with gate.shared():
        waiter = context.Process(target=wants_exclusive)
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # waiting behind the shared side held here
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.join(5)
    holder = context.Process(target=holds_shared)
    holder.start()
    time.sleep(0.3)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(5)
    got = []

    def shared_then_exclusive():
        with gate.shared():
            got.append("shared")
        with gate.exclusive():
            got.append("exclusive")

    t = threading.Thread(target=shared_then_exclusive)
    t.start()
    t.join(3)
    assert got == ["shared", "exclusive"]  # no request of the killed grades is left behind to block the others
    gate.close()


class _WholeStack:
    """A stack every service of which is up (what grade-many's tidy-up between submissions reads)."""

    class toxiproxy:
        @staticmethod
        def reset():
            pass

    def alive(self, name):
        return True

    def pids(self):
        return {}


def test_jobs_grade_each_submission_in_a_child_process_side_by_side_through_the_gate(tmp_path, monkeypatch):
    """--jobs 2 with the real machinery (a child process per submission, forked from the pool's threads, scenarios
    passing the file-lock gate): both ran at once in processes of their own, and each row has its grade's verdict."""
    import os
    import shutil
    from pathlib import Path

    import harness.grade
    from harness.schemas import REPO_ROOT

    klass = tmp_path / "class"
    for name in ("ann", "ben"):
        (klass / name).mkdir(parents=True)
        shutil.copy(REPO_ROOT / "reference" / "adapter.toml", klass / name / "adapter.toml")
    marks = tmp_path / "marks"
    marks.mkdir()

    def stand_in(adapter, level, seed, only=None, stack=None, reports_dir=None, progress=print, gate=None):
        assert gate is not None  # several submissions share the stack: every scenario goes through the gate
        name = Path(reports_dir).name
        other = marks / ("ben" if name == "ann" else "ann")
        with gate.shared():  # a rendezvous inside the shared side: each waits there until it sees the other
            (marks / name).write_text(str(os.getpid()))
            deadline = time.monotonic() + 30
            while not other.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            (marks / f"{name}-met").write_text("yes" if other.exists() else "no")
        grade_dir = Path(reports_dir) / "grade-x"
        grade_dir.mkdir(parents=True)
        (grade_dir / "index.html").write_text("grade")
        verdict = "invalid" if name == "ben" else "valid"
        return results(4, {"BE-JOB-001.2": "fail"} if name == "ben" else {}, verdict=verdict), grade_dir

    monkeypatch.setattr(harness.grade, "grade", stand_in)
    rows, folder = grade_many.grade_many([str(klass)], 4, 7, stack=_WholeStack(), jobs=2, reports_dir=tmp_path / "out",
                                         progress=lambda text: None)
    assert sorted((r.name, r.verdict) for r in rows) == [("ann", "valid"), ("ben", "invalid")]
    ann, ben = (int((marks / n).read_text()) for n in ("ann", "ben"))
    assert len({ann, ben, os.getpid()}) == 3  # each in a process of its own
    assert [(marks / f"{n}-met").read_text() for n in ("ann", "ben")] == ["yes", "yes"]  # inside the gate together
    assert grade_many.exit_code(rows) == 1
