"""The same seed reproduces the same workload and fault schedule on a real run."""

from __future__ import annotations

import json

import pytest

from harness import adapter, scenarios
from harness.history import History
from harness.runner import ScenarioRun

pytestmark = pytest.mark.integration


def uploads(run_dir):
    return [(e["sample"], e["sha256"], e["idempotency_key"]) for e in History.load(run_dir / "history.jsonl")
            if e["type"] == "invoke" and e.get("f") == "upload" and not e.get("retry_of")]


def test_same_seed_same_workload_and_schedule(stack, tmp_path):
    sut = adapter.load("reference")
    scenario = scenarios.find("window-commit-ack-sigkill")
    runs = []
    for name, seed in (("a", 99), ("b", 99), ("c", 100)):
        ScenarioRun(scenario, sut, stack, seed, 3, run_dir=tmp_path / name).execute()
        runs.append(json.loads((tmp_path / name / "run.json").read_text()))
    a, b, c = runs
    assert a["workload_fingerprint"] == b["workload_fingerprint"] != c["workload_fingerprint"]
    assert a["schedule"] == b["schedule"] and a["schedule"] != c["schedule"]
    assert sorted(uploads(tmp_path / "a")) == sorted(uploads(tmp_path / "b"))
