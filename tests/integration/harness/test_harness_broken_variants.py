"""Each deliberately broken variant is graded invalid by the invariant that names its bug (tests/broken/)."""

from __future__ import annotations

import json

import pytest

from harness import adapter, scenarios
from harness.runner import ScenarioRun, check_run_dir
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

SEED = 4242
CASES = [
    # variant folder, the one scenario that catches it, the invariants that must call it invalid
    ("ack_before_commit", "window-s3-commit-failpoint", {"ack_after_commit"}),
    ("no_outbox", "window-commit-publish-failpoint", {"lost_accepted_work"}),
    ("in_memory_dedup", "window-commit-ack-failpoint", {"state_regression", "duplicate_effects"}),
    # One shared ack for the batch: the crashed consumer's unfinished delivery was already settled (BE-JOB-007).
    ("ack_multiple", "batch-crash-after-partial-commit", {"batch_independence", "ack_after_commit"}),
]


@pytest.mark.parametrize("variant, scenario_name, invariants", CASES, ids=[c[0] for c in CASES])
def test_broken_variant_is_graded_invalid_by_its_invariant(stack, tmp_path, variant, scenario_name, invariants):
    sut = adapter.load(REPO_ROOT / "tests" / "broken" / variant)
    run = ScenarioRun(scenarios.find(scenario_name), sut, stack, SEED, 4, run_dir=tmp_path / variant, progress=print)
    results = run.execute()
    statuses = {v["invariant"]: v for v in results["verdicts"]}
    # The variant works apart from its one bug: most accepted uploads still end ready.
    final = json.loads((tmp_path / variant / "final.json").read_text())
    states = [a["body"]["state"] for a in final["attachments"].values() if a.get("body")]
    assert states.count("ready") >= len(states) / 2, states
    assert results["verdict"] == "invalid", {k: v["summary"] for k, v in statuses.items()}
    for name in invariants:
        verdict = statuses[name]
        assert verdict["status"] == "invalid", (name, verdict["summary"])
        assert verdict["seed"] == SEED and verdict["evidence"]
        assert any(e.get("attachment_id") for e in verdict["evidence"])
    assert f"--seed {SEED}" in results["reproduce"] and scenario_name in results["reproduce"]
    # The stored run re-checks to the same verdict without any service.
    again = check_run_dir(tmp_path / variant, write=False)
    assert [(v["invariant"], v["status"]) for v in again["verdicts"]] == \
        [(v["invariant"], v["status"]) for v in results["verdicts"]]
