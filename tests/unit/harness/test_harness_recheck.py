"""`harness check` on a stored run: same verdict, every report written and valid, exit codes by verdict."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from harness import cli
from harness.grade import aggregate, recheck_grade, requirement_checklist, scenario_entry
from harness.runner import check_run_dir
from harness_histories import ATT, happy, in_memory_dedup_history_for_recheck


def store(run_dir, builder, name="hand-made", checks=("duplicate_effects", "state_regression"),
          requirements=("BE-JOB-002",)):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "history.jsonl", "w") as f:
        for e in builder.events:
            f.write(json.dumps({k: v for k, v in e.items() if k != "line"}) + "\n")
    run = {**builder.run, "run_id": run_dir.name,
           "scenario": {"name": name, "description": "d", "windows": ["after_commit_before_ack"],
                        "requirements": list(requirements), "level": 3, "exactness": "exact",
                        "checks": list(checks)}}
    run["adapter"] = {**run["adapter"], "path": "/x/adapter.toml"}
    (run_dir / "run.json").write_text(json.dumps(run))
    (run_dir / "final.json").write_text(json.dumps(builder.final))
    return run_dir


def test_recheck_of_a_valid_run_is_valid_and_writes_all_reports(tmp_path, capsys):
    run_dir = store(tmp_path / "run1", happy())
    results = check_run_dir(run_dir)
    assert results["verdict"] == "valid"
    for name in ("results.json", "junit.xml", "summary.md", "timeline.html"):
        assert (run_dir / name).stat().st_size > 100, name
    ET.parse(run_dir / "junit.xml")
    html = (run_dir / "timeline.html").read_text()
    assert "<svg" in html and ATT[:8] in html and "<script" not in html
    assert cli.main(["check", str(run_dir)]) == 0
    assert "same" in capsys.readouterr().out


def test_recheck_of_an_invalid_run_gives_the_same_verdict_and_exit_1(tmp_path, capsys):
    run_dir = store(tmp_path / "run2", in_memory_dedup_history_for_recheck())
    first = check_run_dir(run_dir)
    assert first["verdict"] == "invalid"
    assert cli.main(["check", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "same" in out
    second = json.loads((run_dir / "results.json").read_text())
    assert [v["status"] for v in second["verdicts"]] == [v["status"] for v in first["verdicts"]]
    junit = ET.parse(run_dir / "junit.xml").getroot()
    assert junit.find(".//failure") is not None
    summary = (run_dir / "summary.md").read_text()
    assert "duplicate_effects" in summary and "--seed 42" in summary


def test_run_error_makes_the_verdict_unknown_exit_2(tmp_path):
    b = happy()
    run_dir = store(tmp_path / "run3", b)
    run = json.loads((run_dir / "run.json").read_text())
    run["error"] = "TimeoutError: api never healthy"
    (run_dir / "run.json").write_text(json.dumps(run))
    assert check_run_dir(run_dir)["verdict"] == "unknown"
    assert cli.main(["check", str(run_dir), "--no-write"]) == 2


def test_grade_checklist_and_recheck_of_a_grade_folder(tmp_path):
    grade_dir = tmp_path / "grade"
    ok = check_run_dir(store(grade_dir / "good", happy(), "good"))
    bad = check_run_dir(store(grade_dir / "bad", in_memory_dedup_history_for_recheck(), "bad"))
    entries = [scenario_entry(ok, grade_dir / "good", grade_dir, 1.0), scenario_entry(bad, grade_dir / "bad", grade_dir, 2.0)]
    skipped = [{"name": "paused", "reason": "proves level 4 > 3", "level": 4, "requirements": ["BE-JOB-006"]}]
    required = {"BE-JOB-002": ["good", "bad"]}  # at level 3 the catalogue here proves only BE-JOB-002
    checklist = requirement_checklist(entries, skipped, required)
    assert checklist["BE-JOB-002"]["status"] == "fail" and "bad (seed 42)" in checklist["BE-JOB-002"]["why"]
    assert checklist["BE-JOB-006"]["status"] == "not required" and "proves level 4" in checklist["BE-JOB-006"]["why"]
    assert checklist["BE-JOB-004"]["status"] == "not required"  # no scenario here names it, and it is not required
    results = aggregate(grade_dir, {"name": "fake", "level": 4, "path": None}, 3, 42, entries, skipped, {"total": 3},
                        required)
    from harness.report import write_grade_reports
    write_grade_reports(grade_dir, results)
    assert recheck_grade(grade_dir)["verdict"] == "invalid"
    assert "BE-JOB-002" in (grade_dir / "summary.md").read_text()


def test_a_requirement_passes_only_through_an_exercised_check(tmp_path):
    grade_dir = tmp_path / "grade"
    exercised = check_run_dir(store(grade_dir / "a", happy(), "a"))
    idle = check_run_dir(store(grade_dir / "b", happy(), "b", checks=("ack_after_commit",),
                               requirements=("BE-JOB-001",)))  # no crash happened
    assert exercised["verdict"] == idle["verdict"] == "valid"
    entry = lambda r, n: scenario_entry(r, grade_dir / n, grade_dir, 1.0)
    required = {"BE-JOB-002": ["a"], "BE-JOB-001": ["b"]}
    checklist = requirement_checklist([entry(exercised, "a"), entry(idle, "b")], [], required)
    assert checklist["BE-JOB-002"]["status"] == "pass" and "duplicate_effects" in checklist["BE-JOB-002"]["why"]
    # b named BE-JOB-001 and ran valid, but the check behind it had nothing to look at: not proven.
    assert checklist["BE-JOB-001"]["status"] == "unknown"
    assert "ack_after_commit" in checklist["BE-JOB-001"]["why"] and "not exercised" in checklist["BE-JOB-001"]["why"]


def test_a_required_requirement_nothing_exercised_makes_the_grade_unknown(tmp_path):
    grade_dir = tmp_path / "grade"
    ok = check_run_dir(store(grade_dir / "good", happy(), "good"))
    entries = [scenario_entry(ok, grade_dir / "good", grade_dir, 1.0)]
    skipped = [{"name": "expiry", "reason": "adapter cannot set job_ttl_seconds", "level": 4,
                "requirements": ["BE-JOB-005"]}]
    required = {"BE-JOB-002": ["good"], "BE-JOB-005": ["expiry"]}
    results = aggregate(grade_dir, {"name": "fake", "level": 4, "path": None}, 4, 42, entries, skipped, {}, required)
    assert results["requirements"]["BE-JOB-005"]["status"] == "unknown"
    assert "cannot set job_ttl_seconds" in results["requirements"]["BE-JOB-005"]["why"]
    assert results["verdict"] == "unknown"
    assert cli.EXIT[results["verdict"]] == 2
