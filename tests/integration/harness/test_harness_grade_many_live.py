"""`harness grade-many`: a class of submissions graded on one shared stack into one table.

- the reference, the Go example and a broken variant, each with the scenario that catches the variant: one table,
  three rows, verdicts valid / valid / invalid, exit 1 — through the console command, which starts its own stack;
- a submission whose adapter names a program that does not exist and one whose setup fails are rows with their
  reason, and the other submission is still graded;
- a submission past its time limit is stopped: its row says timeout and none of its processes is left.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import grade_many
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

SEED = 4242
CATCHES_NO_OUTBOX = "window-commit-publish-failpoint"


def test_grade_many_reference_go_example_and_a_broken_variant(tmp_path):
    gopipe = REPO_ROOT / "examples" / "go-pipeline" / "bin" / "gopipe"
    assert gopipe.is_file(), f"{gopipe} is missing: scripts/bootstrap.sh builds it with `go build`"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness", "grade-many", "reference", "examples/go-pipeline/adapter.toml",
         "tests/broken/no_outbox", "--level", "4", "--seed", str(SEED), "--only", CATCHES_NO_OUTBOX,
         "--timeout-per-submission", "240", "--reports", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    took = time.monotonic() - began
    print(f"\n[grade] grade-many of 3 submissions ({CATCHES_NO_OUTBOX} each) took {took:.1f}s")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr  # one submission invalid
    # in the order of their sorted names (the order --shard slices)
    assert f"base seed {SEED}" in out and "[3/3] reference" in out and "[2/3] no_outbox: INVALID" in out
    assert out.count("starting the shared stack") == 1  # one stack for the whole class
    (folder,) = tmp_path.glob(f"grade-many-*-L4-s{SEED}")
    for name in ("table.md", "table.csv", "index.html", "results.json"):
        assert (folder / name).is_file(), name
    rows = list(csv.DictReader((folder / "table.csv").open()))
    assert [(r["name"], r["verdict"]) for r in rows] == [("go-pipeline", "valid"), ("no_outbox", "invalid"),
                                                          ("reference", "valid")]
    assert rows[1]["BE-JOB-001"] == "fail" and "lost_accepted_work" in rows[1]["reason"]
    assert rows[0]["BE-JOB-001"] == rows[2]["BE-JOB-001"] == "pass"
    for row in rows:  # each links its own grade report, with the scenario it ran
        report = folder / row["report"]
        assert report.is_file(), row
        assert (report.parent / CATCHES_NO_OUTBOX / "timeline.html").is_file()
        assert json.loads((report.parent / "results.json").read_text())["seed"] == SEED
    markdown = (folder / "table.md").read_text()
    assert markdown.count("[report](") == 3 and "❌ invalid" in markdown
    page = (folder / "index.html").read_text()
    assert page.count('href="') >= 3 and "<script" not in page
    assert took < 300, f"grade-many of three one-scenario grades took {took:.0f}s"


def _variant(folder: Path, name: str, edit) -> None:
    text = (REPO_ROOT / "reference" / "adapter.toml").read_text()
    (folder / name).mkdir(parents=True)
    (folder / name / "adapter.toml").write_text(edit(text))


def test_invalid_and_not_starting_submissions_are_rows_and_the_others_are_graded(stack, tmp_path):
    klass = tmp_path / "class"
    _variant(klass, "alice", lambda t: t)
    _variant(klass, "bob", lambda t: t.replace('command = ["reference", "migrate"]', 'command = ["false"]'))
    _variant(klass, "carol", lambda t: t.replace('command = ["reference", "api"]',
                                                 'command = ["no-such-program-xyz", "api"]'))
    lines: list[str] = []
    rows, folder = grade_many.grade_many([str(klass)], 4, SEED, only=["poison-replay"], timeout=240,
                                         reports_dir=tmp_path / "out", stack=stack, progress=lines.append)
    print("\n".join(lines))
    by_name = {r.name: r for r in rows}
    assert [r.name for r in rows] == ["alice", "bob", "carol"]
    assert by_name["alice"].verdict == "valid", by_name["alice"].reason
    assert by_name["bob"].verdict == "did not start"
    assert "setup failed in poison-replay" in by_name["bob"].reason and "exited 1" in by_name["bob"].reason
    assert by_name["carol"].verdict == "invalid adapter"
    assert "no-such-program-xyz" in by_name["carol"].reason and "roles.api" in by_name["carol"].reason
    assert by_name["carol"].seconds < 5 and by_name["carol"].report is None  # nothing was started for it
    assert (folder / by_name["bob"].report).is_file()  # its partial grade report says why
    assert grade_many.exit_code(rows) == 2
    assert any(line.startswith("[2/3] bob: DID NOT START") for line in lines)


def test_a_submission_past_its_time_limit_is_stopped_and_leaves_no_process(stack, tmp_path):
    stack_pids = set(stack.pids().values())
    since = grade_many._ticks_now()
    lines: list[str] = []
    began = time.monotonic()
    rows, folder = grade_many.grade_many(["reference"], 4, SEED, only=["prefetch-under-backlog"], timeout=10,
                                         reports_dir=tmp_path, stack=stack, progress=lines.append)
    took = time.monotonic() - began
    print("\n".join(lines))
    print(f"[grade] a submission past a 10 s time limit was stopped; the run took {took:.1f}s")
    (row,) = rows
    assert row.verdict == "timeout", (row, lines)
    assert "time limit of 10s reached during prefetch-under-backlog" in row.reason
    assert took < 90, lines
    # Nothing the grade started outlives it, and the shared stack is whole for the next submission.
    assert grade_many.our_children(since, stack_pids) == {}
    assert grade_many.roles_running(folder / "reference") == {} or all(
        not Path(f"/proc/{pid}").exists() for pid in grade_many.roles_running(folder / "reference").values())
    assert all(stack.alive(name) for name in ("postgres", "rabbitmq", "s3", "toxiproxy"))
    assert (folder / row.report).is_file()
    assert grade_many.exit_code(rows) == 2


# A long run (make test-long): a class in two shards; CI keeps the one-process class above.
@pytest.mark.long
def test_a_class_sharded_in_two_processes_and_merged_into_one_table(tmp_path):
    """Two shards as a CI matrix would run them (separate processes, at once, each its own stack), then merge:
    one class table with every submission, its checklist rows, and a feedback page naming the failing scenario."""
    class_args = ["reference", "examples/go-pipeline/adapter.toml", "tests/broken/no_outbox"]
    common = ["--level", "4", "--seed", str(SEED), "--only", CATCHES_NO_OUTBOX, "--timeout-per-submission", "240"]
    began = time.monotonic()
    shards = [subprocess.Popen([sys.executable, "-m", "harness", "grade-many", *class_args, *common,
                                "--shard", f"{i}/2", "--reports", str(tmp_path / f"shard{i}")],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for i in (1, 2)]
    outputs = [p.communicate(timeout=540)[0] for p in shards]
    took = time.monotonic() - began
    print(f"\n[grade] two shards of a 3-submission class ({CATCHES_NO_OUTBOX} each) took {took:.1f}s")
    # sorted names: go-pipeline, no_outbox, reference; round robin: shard 1 = go-pipeline + reference
    assert shards[0].returncode == 0 and "shard 1/2 of 3" in outputs[0], outputs[0]
    assert shards[1].returncode == 1 and "no_outbox: INVALID" in outputs[1], outputs[1]
    folders = [next((tmp_path / f"shard{i}").glob("grade-many-*")) for i in (1, 2)]
    merged = subprocess.run([sys.executable, "-m", "harness", "grade-many", "merge", *map(str, folders),
                             "--reports", str(tmp_path / "merged")], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=60)
    assert merged.returncode == 1, merged.stdout + merged.stderr
    (folder,) = (tmp_path / "merged").glob("grade-many-*-merged")
    rows = list(csv.DictReader((folder / "class.csv").open()))
    assert [(r["name"], r["verdict"]) for r in rows] == [("go-pipeline", "valid"), ("no_outbox", "invalid"),
                                                          ("reference", "valid")]
    assert rows[1]["BE-JOB-001.1"] in ("fail", "unknown") or "fail" in {rows[1][k] for k in rows[1]
                                                                         if k.startswith("BE-JOB-001.")}
    for r in rows:
        assert (folder / r["report"]).is_file() and (folder / r["feedback"]).is_file(), r
        assert r["reproduce"].startswith("harness grade --sut ") and f"--seed {SEED}" in r["reproduce"]
    feedback = (folder / "no_outbox" / "feedback.md").read_text()
    assert f"harness run {CATCHES_NO_OUTBOX} --seed {SEED} --sut adapter.toml --level 4" in feedback
    assert "lost_accepted_work" in feedback
    assert "Every checklist row this grade required passed." in (folder / "reference" / "feedback.md").read_text()
