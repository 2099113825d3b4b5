"""The cheat corpus (tests/cheats/): a submission that changes what the harness set up is graded ``tampered``.

One scenario run per cheat, on the session's stack. Run with the submission unisolated (the single-team default of
``harness run``): the cheat reaches the Toxiproxy API, as a trusted team's code could, and the tamper checks must
catch it. (Isolated, it could not reach the API at all: that is the isolation's own test.)
"""

from __future__ import annotations

import json

import pytest

from harness import adapter, isolation, scenarios
from harness.runner import ScenarioRun, check_run_dir
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

SEED = 4242
CASES = [
    # cheat folder, the scenario it is graded on, the checkers that must call it tampered
    # Heals its run's Toxiproxy proxies ten times a second: the two database cuts never hold.
    ("heal_toxiproxy", "database-outages-past-lease", {"tamper_evidence"}),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cheat, scenario_name, invariants", CASES, ids=[c[0] for c in CASES])
def test_a_submission_that_heals_the_harness_faults_is_graded_tampered(stack, tmp_path, cheat, scenario_name,
                                                                       invariants):
    sut = adapter.load(REPO_ROOT / "tests" / "cheats" / cheat)
    scenario = scenarios.find(scenario_name)
    run_dir = tmp_path / cheat
    isolation.set_mode(False)  # whatever HARNESS_ISOLATION says: this cheat must reach the API to be caught
    try:
        results = ScenarioRun(scenario, sut, stack, SEED, scenario.level, run_dir=run_dir, progress=print).execute()
    finally:
        isolation.set_mode(None)
    statuses = {v["invariant"]: v for v in results["verdicts"]}
    tamper = statuses["tamper_evidence"]
    assert results["verdict"] == "tampered", {k: v["summary"] for k, v in statuses.items()}
    assert all(statuses[name]["status"] == "tampered" for name in invariants)
    assert tamper["status"] == "tampered" and tamper["seed"] == SEED
    first = tamper["evidence"][0]
    # It names the scenario, the fault (its index in the schedule), what was expected and found, and when.
    assert first["scenario"] == scenario_name and first["fault"] in (0, 1)
    assert first["expected"] == {"enabled": False} and first["observed"] == {"enabled": True}
    assert isinstance(first["t"], float) and first["lines"]
    # The faults were asked for: without the tamper checks this run had passed as "all faults happened".
    assert statuses["fault_coverage"]["status"] == "valid"
    report = json.loads((run_dir / "results.json").read_text())
    assert report["verdict"] == "tampered" and "TAMPERED" in (run_dir / "summary.md").read_text()
    assert 'type="tampered"' in (run_dir / "junit.xml").read_text()
    again = check_run_dir(run_dir, write=False)  # the stored run re-checks to the same verdict, without services
    assert again["verdict"] == "tampered"
