"""`harness mutate` on real services: two mutants of the reference (harness/mutations/reference.toml), each on its
one short covering scenario, side by side on the session's stack. Both are killed, each by the checker that names
its bug, as in the full catalogue run recorded in docs/TRACK-RECORD.md (seed 7). About 25 s on the shared stack."""

from __future__ import annotations

import json
import time

import pytest

from harness import mutate

pytestmark = pytest.mark.integration

SEED = 7
EXPECTED = {  # mutant -> checkers of which one must say invalid (docs/TRACK-RECORD.md, "Mutation run")
    # window-commit-ack-failpoint: the redelivered ready job claimed again — seen as a regression, a second effect,
    # or (a CI rehearsal, its re-claim never finishing) lost work.
    "claim-any-state": {"state_regression", "duplicate_effects", "lost_accepted_work"},
    "ack-before-commit": {"ack_after_commit"},  # window-s3-commit-failpoint: acked, then crashed before the commit
}


def test_two_mutants_are_killed_by_the_checkers_that_name_them(stack, tmp_path):
    lines: list[str] = []
    began = time.monotonic()
    rows, out = mutate.run("reference", SEED, only=list(EXPECTED), jobs=2, reports_dir=tmp_path, stack=stack,
                           progress=lines.append)
    took = time.monotonic() - began
    print(f"\n[grade] harness mutate of {len(EXPECTED)} mutants took {took:.1f}s")
    log = "\n".join(lines)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == set(EXPECTED), log
    for name, checkers in EXPECTED.items():
        row = by_name[name]
        assert row["outcome"] == "killed", (name, row, log)
        assert checkers & set(row["checkers"]), (name, row["checkers"], log)
        assert list(row["scenarios"]) == row["covering"], row  # graded on its covering scenario only
    assert f"MUTATION SCORE reference seed {SEED}: 1.00 (killed 2, survived 0" in log, log
    stored = json.loads((out / "results.json").read_text())
    assert stored["seed"] == SEED and stored["score"] == 1.0 and len(stored["mutants"]) == 2
    assert "| `ack-before-commit` |" in (out / "table.md").read_text()
    assert stack.alive("postgres")  # the session's stack is the caller's: not stopped by the run
