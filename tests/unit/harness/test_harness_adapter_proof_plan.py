"""`harness adapter check` tells the truth before a grade starts: per checklist row, whether this adapter can prove
it and what is missing; a leftover CHANGE-ME is refused; an implementation without a sweeper is gradable (warnings);
role names are free; a topology no role may have declared while the consumers are held is warned about. No service
starts."""

from __future__ import annotations

import re
import tomllib

from harness import cli
from harness.adapter_check import check, held_from_start, render, skeleton
from harness.scenarios import catalogue
from harness.schemas import REPO_ROOT

REFERENCE = (REPO_ROOT / "reference" / "adapter.toml").read_text()


def adapter(tmp_path, text: str):
    path = tmp_path / "adapter.toml"
    path.write_text(text)
    return path


def plan(report) -> dict:
    return {row.id: row for row in report.plan}


def test_the_reference_can_prove_every_row_it_claims():
    report = check(REPO_ROOT / "reference" / "adapter.toml")
    assert report.ok and report.plan, render(report)
    assert [r.id for r in report.plan if not r.provable] == [], render(report)
    assert "proof plan" in render(report) and "not provable with this adapter" in render(report)


def test_without_failpoints_retry_exhaustion_is_named_not_provable(tmp_path):
    path = adapter(tmp_path, REFERENCE.replace("failpoints = true", "failpoints = false"))
    report = check(path, 4)
    assert report.ok, render(report)  # it may run: the rest of the grade is worth having
    row = plan(report)["BE-JOB-003.2"]
    assert not row.provable and "retry-budget-exhausted: adapter lacks failpoints" in row.why
    head = render(report).splitlines()[0]
    assert "BE-JOB-003.2" in head and "cannot be valid" in head
    assert re.search(r"(?m)^  BE-JOB-003\.2 +NOT PROVABLE +every scenario provoking it is skipped", render(report))
    # Rows the timed SIGKILL fallbacks still prove stay provable, marked approximate.
    assert plan(report)["BE-JOB-002.2"].provable and "approximate" in plan(report)["BE-JOB-002.2"].why


def test_a_max_attempts_the_harness_cannot_set_leaves_the_retry_limit_unprovable(tmp_path):
    path = adapter(tmp_path, REFERENCE.replace('max_attempts = "MAX_ATTEMPTS"\n', ""))
    report = check(path, 4)
    row = plan(report)["BE-JOB-003.2"]
    assert not row.provable and "cannot set max_attempts" in row.why, row


def test_without_events_the_rows_and_requirements_that_need_them_are_named(tmp_path):
    path = adapter(tmp_path, REFERENCE.replace("events = true", "events = false"))
    report = check(path, 4)
    rows = plan(report)
    assert not rows["BE-JOB-003.3"].provable and "replay_audit needs capabilities.events" in rows["BE-JOB-003.3"].why
    assert not rows["BE-JOB-001"].provable and "state_regression needs capabilities.events" in rows["BE-JOB-001"].why
    assert any(w.field == "capabilities.events" for w in report.warnings)


def test_without_an_expiry_metric_its_row_is_not_provable(tmp_path):
    path = adapter(tmp_path, re.sub(r'(?m)^metric = .*\n', "", REFERENCE))
    row = plan(check(path, 4))["BE-JOB-005.3"]
    assert not row.provable and "expiry_metric needs [expiry] metric" in row.why


def test_a_leftover_change_me_is_refused(tmp_path, capsys):
    path = adapter(tmp_path, re.sub(r'(?m)^work_queue = .*$', 'work_queue = "CHANGE-ME"', REFERENCE))
    report = check(path)
    assert not report.ok
    assert [p.field for p in report.problems] == ["broker.work_queue"]
    assert "placeholder" in report.problems[0].reason
    assert cli.main(["adapter", "check", str(path)]) == 1
    assert cli.main(["grade", "--sut", str(path)]) == 2  # refused before any service starts
    assert "broker.work_queue" in capsys.readouterr().err


def test_an_implementation_without_a_sweeper_is_graded_with_warnings(tmp_path):
    text = re.sub(r"(?m)^(staging_retention_seconds|sweep_interval_seconds) = .*\n", "", REFERENCE)
    path = adapter(tmp_path, text)
    report = check(path, 4)
    assert report.ok, render(report)
    assert {"timings.staging_retention_seconds", "timings.sweep_interval_seconds"} <= {w.field for w in report.warnings}
    row = plan(report)["BE-JOB-001"]
    assert not row.provable and "staging_safety needs timings.staging_retention_seconds" in row.why


def test_role_names_are_free(tmp_path):
    text = (REFERENCE.replace('role = "api"', 'role = "web"').replace("[roles.api]", "[roles.web]")
            .replace("[roles.worker]", "[roles.consume]")
            .replace('= "api"\n', '= "web"\n').replace('= "worker"\n', '= "consume"\n')
            .replace('"relay", "worker", "sweeper"', '"relay", "consume", "sweeper"'))
    raw = tomllib.loads(text)
    assert "api" not in raw["roles"] and "worker" not in raw["roles"]
    report = check(adapter(tmp_path, text), 4)
    assert report.ok, render(report)
    assert "consumer roles: consume" in report.summary
    assert all(r.provable for r in report.plan), render(report)


def test_without_a_setup_command_the_topology_while_consumers_are_held_is_a_warning(tmp_path):
    text = re.sub(r"(?ms)^\[setup\]\n.*?\n\n", "", REFERENCE)
    assert "[setup]" not in text
    report = check(adapter(tmp_path, text), 4)
    assert report.ok, render(report)
    warning = next(w for w in report.warnings if w.field == "setup")
    assert "must exist before the first publish" in warning.reason and "unroutable" in warning.reason
    held = [s.name for s in catalogue() if held_from_start(s)]
    assert "expiry-without-consumers" in held and "expiry-without-consumers" in warning.reason
    assert "window-commit-ack-failpoint" not in held and "window-commit-ack-failpoint" not in warning.reason
    assert not any(w.field == "setup" for w in check(REPO_ROOT / "reference" / "adapter.toml").warnings)


def test_the_skeleton_claims_level_3_without_versions_and_lets_scenarios_set_max_attempts():
    raw = tomllib.loads(skeleton())
    assert raw["level"] == 3 and "versions" not in raw
    assert "max_attempts" in raw["timings_env"] and "max_attempts" in raw["timings"]


GO_ADAPTER = (REPO_ROOT / "examples" / "go-pipeline" / "adapter.toml").read_text()


def guide_text() -> str:
    return (REPO_ROOT / "docs" / "guides" / "write-an-adapter.md").read_text(encoding="utf-8")


def my_pipeline(tmp_path, text: str):
    """The adapter guide's folder: my-pipeline/adapter.toml beside bin/gopipe (a stand-in: no service starts)."""
    folder = tmp_path / "my-pipeline"
    (folder / "bin").mkdir(parents=True)
    binary = folder / "bin" / "gopipe"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return adapter(folder, text)


def said(path, text: str) -> str:
    return text.replace(str(path), "/tmp/my-team/my-pipeline/adapter.toml")


def test_the_adapter_guides_quoted_output_is_what_adapter_check_says(tmp_path):
    """What docs/guides/write-an-adapter.md shows `harness adapter check` printing — the proof plan without
    failpoints naming BE-JOB-003.2, the warning for a missing lease, one problem per mistake — is what it prints for
    the Go example's adapter (the file the guide ends with) changed the way the guide says."""
    shown = guide_text()
    cases = {
        "no failpoints": GO_ADAPTER.replace("failpoints = true", "failpoints = false"),
        "no lease": re.sub(r"(?m)^lease_seconds = .*\n", "", GO_ADAPTER),
        "relay window": GO_ADAPTER.replace('after_commit_before_publish = "api"', 'after_commit_before_publish = "relay"'),
        "no ttl": re.sub(r"(?m)^job_ttl_seconds = \d+.*\n", "", GO_ADAPTER),
        "no consumer": GO_ADAPTER.replace("consumer = true", "consumer = false"),
        "instances": GO_ADAPTER.replace("consumer = true", 'consumer = true\ninstances = "1"'),
    }
    quoted = {
        "no failpoints": ["/tmp/my-team/my-pipeline/adapter.toml: OK; but not provable with this adapter, so a full "
                          "grade cannot be valid: BE-JOB-003.2 (see the proof plan)",
                          "  BE-JOB-003.2  NOT PROVABLE  every scenario provoking it is skipped: "
                          "retry-budget-exhausted: adapter lacks failpoints"],
        "no lease": ["warning: timings.lease_seconds: not declared (optional); without it database-outages-past-lease, "
                     "…, worker-paused-past-lease would be skipped (their faults scale with it) and "
                     "batch-crash-after-partial-commit, …, window-s3-commit-sigkill would be unknown (ack_after_commit, "
                     "lease_ownership, … need it)"],
        "relay window": ["failpoints.after_commit_before_publish: mapped to role 'relay', which [roles] does not "
                         "define (roles: api, worker, sweeper)"],
        "no ttl": ["timings_env.job_ttl_seconds: no [timings] value for job_ttl_seconds: declare "
                   "timings.job_ttl_seconds (what the checkers assume when a scenario does not override it)"],
        "no consumer": ["roles: no role is flagged consumer = true: the harness cannot tell which role consumes the "
                        "work queue (crashes, holds and prefetch sampling target the consumers)"],
        "instances": ["roles.worker.instances: wrong type: expected integer, got string '1'"],
    }
    for name, text in cases.items():
        case_dir = tmp_path / name.replace(" ", "-")
        path = my_pipeline(case_dir, text)
        out = said(path, render(check(path, 4)))
        for line in quoted[name]:
            assert line in shown, f"the guide no longer quotes: {line}"
            # "…" in the guide stands for names left out of a long list
            pattern = ".*?".join(re.escape(part) for part in line.split("…"))
            assert re.search(pattern, out), f"{name}: adapter check does not say {line!r} but:\n{out}"
