"""The long mode of `harness soak` in CI: ONE run of 300 uploads at an even rate with every fault kind the reference
takes spread over it (the 10 000-upload run is by hand; its figures are in docs/TRACK-RECORD.md). No checker
invalid, nothing lost, duplicated or regressed; the soak folder re-checks with `harness check`; the scenario it ran
is a file `harness run` loads."""

from __future__ import annotations

import json

import pytest

from harness import adapter, cli, soak, soak_long
from harness.scenarios import find

pytestmark = [pytest.mark.integration, pytest.mark.soak]

SEED = 7


# A long run (make test-long): a soak; CI keeps test_harness_soak_short.py.
@pytest.mark.long
def test_a_300_upload_long_soak_of_the_reference(stack, tmp_path, capsys):
    sut = adapter.load("reference")  # claims level 5; the soak runs the level-4 kinds (versions: pipeline-* scenarios)
    lines: list[str] = []
    results, soak_dir = soak_long.soak_long(sut, "reference", SEED, uploads=300, level=4, reports_dir=tmp_path,
                                            stack=stack, progress=lines.append, every=10)
    s = results["summary"]
    fig = s["figures"]
    assert s["false_alarms"] == [], json.dumps(s["false_alarms"], indent=1)
    assert s["errors"] == []
    assert fig["uploads"] == 300 and fig["accepted"] >= 250  # the bad inputs are refused at the upload
    assert (fig["lost"], fig["duplicates"], fig["regressions"]) == (0, 0, 0)
    kinds, _ = soak_long.kinds_for(sut, 4)
    assert set(kinds) <= set(s["faults_by_kind"]) and fig["faults_happened"] >= len(kinds) - 2
    assert any(line.startswith("[") and "accepted" in line for line in lines)  # progress while it runs
    run = results["runs"][0]
    assert find(str(soak_dir / run["scenario_file"])).raw["faults"] == soak_long.draw_schedule(sut, SEED, 300, 4)
    capsys.readouterr()
    assert cli.main(["check", str(soak_dir)]) == soak.exit_code(s)
    assert "soak re-checked: 1 seeds, 0 false alarms" in capsys.readouterr().out
