"""`harness explore` finds the bug of tests/broken/sweeper_blind_after_outage — it needs TWO faults: an outage the
sweeper sees and, after it, a worker dying with a job — and shrinks it to at most two faults, with a `harness run`
replay of a scenario file. The search space is narrowed to the kinds that matter (--kinds) and the budget is small, so
it fits CI; `harness explore --sut tests/broken/sweeper_blind_after_outage --budget 10m` is the unrestricted demo."""

from __future__ import annotations

import pytest

from harness import adapter, explore
from harness.scenarios import find
from harness.schemas import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.soak]

SEED = 13
KINDS = ["failpoint", "restart_service"]


def test_explore_finds_and_shrinks_the_two_fault_bug(stack, tmp_path):
    sut = adapter.load(REPO_ROOT / "tests" / "broken" / "sweeper_blind_after_outage")
    lines: list[str] = []
    results, out = explore.explore(sut, "tests/broken/sweeper_blind_after_outage", budget=480, seed=SEED,
                                   kinds=KINDS, reports_dir=tmp_path, stack=stack, progress=lines.append)
    best = results["smallest"]
    assert best is not None, "\n".join(lines)
    assert "lost_accepted_work" in best["invalid"]
    assert len(best["faults"]) <= 2, best["faults"]
    assert best["replay"].startswith(f"harness run {best['scenario']} --sut ")
    assert find(best["scenario"]).raw["faults"] == best["faults"]
    assert results["failing"] >= 1 and any(r["verdict"] == "valid" for r in results["runs"])
