"""An implementation without failpoints is graded at the five windows by timed SIGKILLs (approximate windows).

The reference, with its failpoint capability switched off in a copy of its adapter, must not be found wrong: the
black-box probes must not produce false alarms. A timed kill counts for its window only with evidence that it hit
it (fault_coverage), so a kill that landed outside leaves its scenario ``unknown`` — never ``valid`` on a window
that was not tested, never ``invalid`` for a correct implementation.
"""

from __future__ import annotations

import pytest

from harness import adapter
from harness.grade import grade
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

TIMED = ["window-staging-record-sigkill", "window-commit-publish-sigkill", "window-publish-confirm-sigkill",
         "window-s3-commit-sigkill", "window-commit-ack-sigkill"]


def test_reference_without_failpoints_is_graded_by_timed_kills(stack, tmp_path):
    text = (REPO_ROOT / "reference" / "adapter.toml").read_text()
    text = text.replace("failpoints = true", "failpoints = false").replace('name = "reference"', 'name = "blackbox"')
    (tmp_path / "adapter.toml").write_text(text)
    sut = adapter.load(tmp_path / "adapter.toml")
    results, _ = grade(sut, 4, seed=77, only=TIMED, stack=stack, reports_dir=tmp_path / "reports")
    ran = {s["name"]: s for s in results["scenarios"]}
    assert set(ran) == set(TIMED)
    assert all(s["exactness"] == "approximate" for s in ran.values())
    skipped = {s["name"]: s["reason"] for s in results["skipped"]}
    assert "adapter lacks failpoints" in skipped["window-s3-commit-failpoint"]
    bad = {n: [(v["invariant"], v["status"], v["summary"]) for v in s["verdicts"] if v["status"] != "valid"]
           or s.get("error") for n, s in ran.items() if s["verdict"] != "valid"}
    assert results["verdict"] in ("valid", "unknown"), bad
    for name, verdicts in bad.items():  # only an unproven hit may keep a window from counting
        assert verdicts and all(i == "fault_coverage" and st == "unknown" and "no evidence it was hit" in summary
                                for i, st, summary in verdicts), (name, verdicts)
    assert any(s["verdict"] == "valid" for s in ran.values()), "no timed kill was seen hitting its window"


def test_timed_kill_alone_catches_ack_before_commit(stack, tmp_path):
    """Without failpoints, the timed SIGKILL of a processing worker still convicts the ack-before-commit variant."""
    folder = REPO_ROOT / "tests" / "broken" / "ack_before_commit"
    text = (folder / "adapter.toml").read_text().replace("failpoints = true", "failpoints = false")
    (tmp_path / "adapter.toml").write_text(text.replace("{adapter_dir}", str(folder)))
    from harness import scenarios
    from harness.runner import ScenarioRun

    run = ScenarioRun(scenarios.find("window-s3-commit-sigkill"), adapter.load(tmp_path / "adapter.toml"), stack,
                      5, 4, run_dir=tmp_path / "run")
    results = run.execute()
    verdicts = {v["invariant"]: v for v in results["verdicts"]}
    assert verdicts["ack_after_commit"]["status"] == "invalid", verdicts["ack_after_commit"]["summary"]
