"""`harness explore` on real services: Hypothesis draws fault schedules and workloads for a broken variant, finds a
failing one, shrinks it and prints a `harness run` of a scenario file that replays it.

CI uses tests/broken/no_outbox, whose bug one fault shows every time (a relay crash between the commit and the
publish loses the message for good): the search and the shrink are then quick and the same on every run. The
two-fault demo — tests/broken/sweeper_blind_after_outage, whose bug needs an outage the sweeper sees AND a worker
dying with a job after it — is a longer, timing-dependent search (minutes, and its failure does not replay every
time), so it is a command, not a CI test: `harness explore --sut tests/broken/sweeper_blind_after_outage --kinds
failpoint,restart_service --budget 10m` (its result is in docs/TRACK-RECORD.md)."""

from __future__ import annotations

import pytest

from harness import adapter, explore
from harness.scenarios import find
from harness.schemas import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.soak]

SEED = 13


# A long run (make test-long): explore's budget is minutes by design.
@pytest.mark.long
def test_explore_finds_shrinks_and_replays_a_failure(stack, tmp_path):
    sut = adapter.load(REPO_ROOT / "tests" / "broken" / "no_outbox")
    lines: list[str] = []
    # Two faults at most: the shrink from two to the one the bug needs is a step or two, where three took the whole
    # budget on a loaded runner (291 s in a CI rehearsal). The budget stays: at load 16 two took 220 s and more.
    results, _ = explore.explore(sut, "tests/broken/no_outbox", budget=240, seed=SEED, kinds=["failpoint"],
                                 max_faults=2, reports_dir=tmp_path, stack=stack, progress=lines.append)
    best = results["smallest"]
    assert best is not None, "\n".join(lines)
    assert "lost_accepted_work" in best["invalid"]
    # Shrunk to what the bug needs: the crash between the relay's commit and its publish.
    assert [(f["action"], f.get("window")) for f in best["faults"]] == \
        [("failpoint", "after_commit_before_publish")], best["faults"]
    first = next(r for r in results["runs"] if r["verdict"] == "invalid")
    assert len(best["faults"]) <= len(first["faults"]) and best["uploads"] <= first["uploads"]
    assert best["replay"].startswith(f"harness run {best['scenario']} --sut ")
    assert find(best["scenario"]).raw["faults"] == best["faults"]
    assert results["replayed_invalid"] is True, "\n".join(lines)
