"""`harness grade --sut reference --level 5` (the level the reference claims) is valid with every checklist row
passing — the seeds' 24 items and the level-5 rows of pipeline versions — prints where the time went, and a stored
grade re-checks the same."""

from __future__ import annotations

import json
import time

import pytest

from harness import adapter
from harness.defaults import DEFAULT_PARALLEL
from harness.checklist import ITEMS
from harness.grade import grade, recheck_grade
from harness.timing import table_lines

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1200)  # the hang guard below says more than the suite's 600 s would
def test_reference_grades_valid_at_level_5_with_every_checklist_row(stack, tmp_path):
    began = time.monotonic()
    results, grade_dir = grade(adapter.load("reference"), 5, seed=20261129, stack=stack, reports_dir=tmp_path,
                               parallel=DEFAULT_PARALLEL)
    took = time.monotonic() - began
    print(f"\n[grade] reference at level 5 took {took:.1f}s; where the time went: "
          + ", ".join(f"{key} {value:.1f}s" for key, value in results["timings"].items()))
    failing = {s["name"]: [v["summary"] for v in s["verdicts"] if v["status"] != "valid"] or s.get("error")
               for s in results["scenarios"] if s["verdict"] != "valid"}
    assert results["verdict"] == "valid", failing
    # Where the time went per phase and part (harness/timing.py): printed, and kept in results.json.
    print("[grade] " + "\n[grade] ".join(table_lines(results["time_went"])))
    parts = {row["key"] for row in results["time_went"]["rows"]}
    assert {"setup", "tenant", "setup_command", "start_roles", "role_healthy", "drain", "settle", "final_read",
            "stop", "role_stop", "check"} <= parts, parts
    # A hang guard, not a benchmark (speed is measured by the printed phases, on noisy machines): the goal of five
    # minutes on this machine kind is reported above, and a grade this far past it means something is stuck. It
    # took 352 s in one rehearsal and 481.5 s in another, alone on the machine with both cores 91 % busy.
    assert took < 900
    names = {s["name"] for s in results["scenarios"]}
    assert {"window-s3-commit-failpoint", "window-commit-publish-failpoint", "worker-paused-past-lease",
            "pipeline-rollout", "pipeline-late-duplicate", "pipeline-rollback"} <= names
    # Every requirement is proven by a check that was exercised (BE-JOB-007 included): none merely "not failed".
    assert {rid: r["status"] for rid, r in results["requirements"].items()} == \
        {f"BE-JOB-00{i}": "pass" for i in range(1, 8)}, results["requirements"]
    # The seeds' 24 verification items and the level-5 rows: every one provoked, and every one passes.
    assert {item: row["status"] for item, row in results["checklist"].items() if row["status"] != "pass"} == {}
    assert len(results["checklist"]) == 24 + sum(1 for item in ITEMS if item.level == 5) and \
        {item for item, row in results["checklist"].items() if row["level"] == 5} == \
        {item.id for item in ITEMS if item.level == 5} != set()
    # The probes actually probed: the window failpoints were hit, the ack and lease checks were exercised.
    by_name = {s["name"]: s for s in results["scenarios"]}
    for name in ("window-s3-commit-failpoint", "window-commit-ack-failpoint", "window-commit-publish-failpoint",
                 "window-publish-confirm-failpoint", "window-staging-record-failpoint"):
        run = json.loads((grade_dir / by_name[name]["run_dir"] / "run.json").read_text())
        assert run["window_hits"], f"{name}: failpoint never hit"
    exercised = {v["invariant"]: v["exercised"] for v in by_name["window-s3-commit-failpoint"]["verdicts"]}
    assert exercised["ack_after_commit"]
    exercised = {v["invariant"]: v["exercised"] for v in by_name["worker-paused-past-lease"]["verdicts"]}
    assert exercised["lease_ownership"]
    # The reference's own property (not a requirement on every implementation: lost_accepted_work lets a transient
    # fault spend attempts within the budget): an outage costs no attempt, so under a budget of one attempt and two
    # database cuts past the lease every upload still ends ready, at attempt 1.
    final = json.loads((grade_dir / by_name["database-outages-past-lease"]["run_dir"] / "final.json").read_text())
    outcomes = {a: ((r.get("body") or {}).get("state"), (r.get("body") or {}).get("attempt"))
                for a, r in final["attachments"].items()}
    assert outcomes and set(outcomes.values()) == {("ready", 1)}, outcomes
    for name in ("results.json", "junit.xml", "summary.md", "timeline.html", "index.html"):
        assert (grade_dir / name).exists()
    # A grade's folder is what a person or a CI job keeps: histories, logs, reports — no service data.
    size = sum(f.stat().st_size for f in grade_dir.rglob("*") if f.is_file())
    print(f"[grade] report folder {size / 1e6:.1f} MB")
    assert size < 20e6, f"{grade_dir} holds {size / 1e6:.1f} MB"
    # Re-checking the stored grade without services gives the same verdicts.
    again = recheck_grade(grade_dir)
    assert again["verdict"] == results["verdict"]
    assert [s["verdict"] for s in again["scenarios"]] == [s["verdict"] for s in results["scenarios"]]
    assert again["time_went"] == results["time_went"]
