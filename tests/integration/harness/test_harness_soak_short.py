"""A short soak on the reference (2 seeds, 10 uploads each, random faults): no false alarm, every seed's run folder
re-checks to the same verdicts, the soak folder re-checks with `harness check`. The 20-seed soak is run by hand
(`harness soak --sut reference --seeds 20`) and recorded in docs/TRACK-RECORD.md."""

from __future__ import annotations

import json

import pytest

from harness import adapter, cli, soak
from harness.runner import check_run_dir

pytestmark = pytest.mark.integration

SEEDS = [4253, 4255]  # a crash failpoint, SIGSTOP, SIGKILL, injected messages; a republish, a toxic, a hold


def test_a_short_soak_of_the_reference_has_no_false_alarm(stack, tmp_path, capsys):
    sut = adapter.load("reference")
    lines: list[str] = []
    results, soak_dir = soak.soak(sut, "reference", SEEDS, uploads=10, level=4, parallel=2, reports_dir=tmp_path,
                                  stack=stack, progress=lines.append)
    summary = results["summary"]
    assert summary["false_alarms"] == [], json.dumps(summary["false_alarms"], indent=1)
    assert summary["errors"] == []
    assert summary["figures"]["uploads"] == 20 and summary["figures"]["accepted"] == 20
    assert (summary["figures"]["lost"], summary["figures"]["duplicates"], summary["figures"]["regressions"]) == (0, 0, 0)
    assert summary["figures"]["faults_scheduled"] >= 4 and summary["figures"]["faults_happened"] >= 1
    assert any(line.startswith("seed 2/2") and "ETA" in line for line in lines)
    assert any("replay: harness soak --sut reference --seeds 1 --seed 4253 --uploads 10" in line for line in lines)
    assert (soak_dir / "summary.md").is_file() and (soak_dir / "results.json").is_file()
    for run in results["runs"]:
        rechecked = check_run_dir(soak_dir / run["run_dir"], write=False)
        assert {v["invariant"]: v["status"] for v in rechecked["verdicts"]} == {
            k: v.split(" ")[0] for k, v in run["checkers"].items()}
        # The schedule the run executed is the one drawn for the seed.
        stored = json.loads((soak_dir / run["run_dir"] / "run.json").read_text())
        assert [s["action"] for s in stored["schedule"]] == [f["action"] for f in run["faults"]]
        assert run["faults"] == soak.draw_schedule(sut, run["seed"], 10, 4)
    capsys.readouterr()
    assert cli.main(["check", str(soak_dir)]) == soak.exit_code(summary)
    assert "soak re-checked: 2 seeds, 0 false alarms" in capsys.readouterr().out
