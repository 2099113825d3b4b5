"""`harness soak`: the seeded random fault schedule (reproducible, within the adapter's capabilities and roles) and
the report (every invalid a false alarm with its evidence, unknowns apart, the figures)."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from harness import adapter as adapter_mod
from harness import cli, soak
from harness.scenarios import load_file
from harness.schemas import REPO_ROOT

REFERENCE = adapter_mod.load("reference")
GO = adapter_mod.load(REPO_ROOT / "examples" / "go-pipeline" / "adapter.toml")
RUNNER_ACTIONS = {"failpoint", "sigkill", "sigstop", "toxic", "restart_service", "republish", "replay",
                  "start_instance", "hold", "inject", "permute", "s3_deny", "sigterm",
                  "sigkill_children"}


def _variant(base, **changes):
    raw = copy.deepcopy(base.raw)
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return adapter_mod.Adapter(path=base.path, raw=raw)


def test_the_same_seed_draws_the_same_schedule_and_workload():
    for adapter in (REFERENCE, GO):
        for seed in (1, 4242, 9000):
            first = soak.scenario_raw(adapter, seed, 30, 4)
            again = soak.scenario_raw(adapter, seed, 30, 4)
            assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    schedules = {json.dumps(soak.draw_schedule(REFERENCE, seed, 30, 4), sort_keys=True) for seed in range(20)}
    assert len(schedules) >= 18  # different seeds, different schedules


def test_every_drawn_scenario_is_valid_and_uses_only_runner_actions(tmp_path):
    for adapter in (REFERENCE, GO):
        for seed in range(150):
            scenario = soak.build_scenario(adapter, seed, 30, 4)  # raises on a schema violation
            assert 2 <= len(scenario.raw["faults"]) <= 4
            assert {f["action"] for f in scenario.raw["faults"]} <= RUNNER_ACTIONS
            w = scenario.raw["workload"]
            assert w["uploads"] + w["bad"] + w["poison"] == 30
    # The file written into a seed's folder is the same scenario, and `harness run` can load it.
    written = soak.build_scenario(REFERENCE, 7, 12, 4, folder=tmp_path)
    assert load_file(tmp_path / "soak-s7.toml").raw == written.raw


def test_the_schedule_targets_only_what_the_adapter_defines():
    for adapter in (REFERENCE, GO):
        roles = set(adapter.roles)
        consumers = set(adapter.roles_flagged("consumer"))
        drawn = Counter()
        for seed in range(300):
            faults = soak.draw_schedule(adapter, seed, 30, 4)
            drawn.update(f["action"] for f in faults)
            actions = [f["action"] for f in faults]
            assert actions.count("permute") <= 1 and actions.count("replay") <= 1
            armed = [adapter.window_role(f["window"]) for f in faults if f["action"] == "failpoint"]
            assert len(armed) == len(set(armed)), "two failpoints on one role: the second arm disarms the first"
            struck = {f.get("role") for f in faults if f["action"] in ("sigkill", "sigstop")} | {
                r for f in faults if f["action"] == "hold" for r in f["hold"]}
            assert not set(armed) & struck, "a kill, pause or hold of an armed role disarms its failpoint"
            for f in faults:
                if f["action"] == "failpoint":
                    assert adapter.window_role(f["window"]) in roles
                if f["action"] in ("sigkill", "sigstop", "sigterm", "toxic") and f.get("role"):
                    assert f["role"] in roles
                if f["action"] == "start_instance":
                    assert f["role"] in consumers
                if f["action"] == "hold":
                    assert f["hold"][0] in roles and f["hold"][0] != adapter.http["role"]
                if f["action"] == "sigstop":
                    assert f["duration"]["of"] == "lease_seconds"  # scaled to this implementation's lease
            if "permute" in actions:  # every consumer is held through the workload: nothing else targets them
                for f in faults:
                    assert f.get("role") not in consumers and (f.get("hold") or [None])[0] not in consumers
                    if f["action"] == "failpoint":
                        assert adapter.window_role(f["window"]) not in consumers
        assert set(drawn) == RUNNER_ACTIONS, RUNNER_ACTIONS - set(drawn)  # every kind comes up


def test_capabilities_and_level_restrict_the_kinds():
    bare = _variant(REFERENCE, capabilities={"failpoints": False, "replay": False, "events": True}, failpoints=None)
    kinds, why = soak.allowed_kinds(bare, 4)
    assert "failpoint" not in kinds and "replay" not in kinds
    assert "failpoints capability" in why["failpoint"] and "replay capability" in why["replay"]
    kinds3, why3 = soak.allowed_kinds(REFERENCE, 3)
    assert "inject" not in kinds3 and "replay" not in kinds3 and "level 4" in why3["inject"]
    for seed in range(200):
        assert not {f["action"] for f in soak.draw_schedule(bare, seed, 30, 4)} & {"failpoint", "replay"}
        assert not {f["action"] for f in soak.draw_schedule(REFERENCE, seed, 30, 3)} & {"inject", "replay"}
    # No lease declared: pauses and holds in seconds, not scaled to a timing the adapter lacks.
    raw_timings = {k: v for k, v in REFERENCE.raw["timings"].items() if k != "lease_seconds"}
    unleased = _variant(REFERENCE, timings=raw_timings)
    for seed in range(100):
        for f in soak.draw_schedule(unleased, seed, 30, 4):
            assert not isinstance(f.get("duration"), dict) and not isinstance(f.get("hold_seconds"), dict)


def test_a_replay_always_has_something_to_replay_and_no_nemesis_means_no_faults():
    for seed in range(300):
        raw = soak.scenario_raw(REFERENCE, seed, 10, 4)
        if any(f["action"] == "replay" for f in raw["faults"]):
            assert raw["workload"]["poison"] >= 1
    assert soak.draw_schedule(REFERENCE, 5, 30, 4, nemesis="none") == []
    with pytest.raises(soak.SoakError):
        soak.draw_schedule(REFERENCE, 5, 30, 4, nemesis="chaos-monkey")


def test_seeds_and_the_replay_line():
    assert soak.seeds_from(40, 3) == [40, 41, 42]
    assert soak.replay_command("reference", 41, 30, 4, "random", 4) == "harness soak --sut reference --seeds 1 --seed 41"
    assert soak.replay_command("x.toml", 41, 10, 3, "none", 4) == (
        "harness soak --sut x.toml --seeds 1 --seed 41 --uploads 10 --nemesis none --level 3")
    restart = {"faults": [{"action": "restart_service", "service": "rabbitmq"}]}
    assert soak.runs_alone(restart) == "restarts rabbitmq"
    assert soak.runs_alone({"faults": [{"action": "toxic", "service": "s3"}]}) is None


# --- the report -----------------------------------------------------------------------------------------------------

def _verdict(name, status, evidence=(), exercised=True):
    return {"invariant": name, "status": status, "summary": f"{name} {status}", "exercised": exercised,
            "evidence": [{"message": m} for m in evidence], "requirements": []}


def _entry(tmp_path: Path, seed: int, verdicts: list[dict], states: list[str]) -> dict:
    run_dir = tmp_path / f"seed-{seed}"
    run_dir.mkdir()
    final = {"attachments": {f"a{i}": {"body": {"state": s}} for i, s in enumerate(states)}}
    (run_dir / "final.json").write_text(json.dumps(final))
    raw = soak.scenario_raw(REFERENCE, seed, len(states), 4)
    status = "invalid" if any(v["status"] == "invalid" for v in verdicts) else (
        "unknown" if any(v["status"] == "unknown" for v in verdicts) else "valid")
    result = {"verdict": status, "verdicts": verdicts, "error": None}
    return soak.seed_entry(seed, result, run_dir, tmp_path, raw, 12.3, f"harness soak --seed {seed}")


def test_every_invalid_is_a_false_alarm_with_its_evidence_and_unknowns_count_apart(tmp_path):
    clean = _entry(tmp_path, 1, [_verdict("lost_accepted_work", "valid"), _verdict("duplicate_effects", "valid"),
                                 _verdict("state_regression", "valid"), _verdict("expiry", "valid", exercised=False),
                                 _verdict("fault_coverage", "valid")], ["ready"] * 9 + ["failed"])
    alarm = _entry(tmp_path, 2, [_verdict("lost_accepted_work", "valid"),
                                 _verdict("duplicate_effects", "invalid", ["a1 second ready", "a1 rewritten"]),
                                 _verdict("state_regression", "unknown"),
                                 _verdict("fault_coverage", "unknown", ["fault 1 (sigkill): sent 0 times"])],
                   ["ready"] * 10)
    assert clean["checkers"]["expiry"] == "valid (idle)"
    assert clean["figures"]["ready"] == 9 and clean["figures"]["failed"] == 1 and clean["figures"]["lost"] == 0
    assert alarm["figures"]["duplicates"] == 2 and alarm["figures"]["regressions"] is None
    assert alarm["figures"]["faults_happened"] == alarm["figures"]["faults_scheduled"] - 1
    summary = soak.summarize([clean, alarm])
    assert [a["seed"] for a in summary["false_alarms"]] == [2]
    assert summary["false_alarms"][0]["invariant"] == "duplicate_effects"
    assert summary["false_alarms"][0]["evidence"][0]["message"] == "a1 second ready"
    assert summary["false_alarms"][0]["replay"] == "harness soak --seed 2"
    assert {u["invariant"] for u in summary["unknowns"]} == {"state_regression", "fault_coverage"}
    assert summary["figures"]["uploads"] == 20 and summary["figures"]["duplicates"] == 2
    assert summary["figures_undecided"] == {"regressions": 1}
    assert summary["checkers"]["expiry"] == {"valid": 0, "idle": 1, "invalid": 0, "unknown": 0}
    assert soak.exit_code(summary) == 1
    assert soak.exit_code(soak.summarize([clean])) == 0
    results = {"sut": {"name": "reference"}, "level": 4, "nemesis": "random", "uploads": 10, "parallel": 2,
               "seconds": 30.0, "runs": [clean, alarm], "summary": summary}
    soak.write_reports(tmp_path, results)
    text = (tmp_path / "summary.md").read_text()
    assert "**false alarms: 1**" in text and "a1 second ready" in text and "harness soak --seed 2" in text
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["false_alarms"][0]["seed"] == 2


def test_a_run_error_or_no_seed_exits_2():
    assert soak.exit_code({"false_alarms": [], "errors": [{"seed": 1, "error": "x"}], "seeds": 1}) == 2
    assert soak.exit_code({"false_alarms": [], "errors": [], "seeds": 0}) == 2


def test_bad_input_is_refused_with_a_reason(capsys):
    for argv in (["soak", "--sut", "reference", "--seeds", "0"], ["soak", "--sut", "reference", "--uploads", "-3"],
                 ["soak", "--sut", "reference", "--nemesis", "bogus"], ["soak", "--seeds", "2"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
    assert cli.main(["soak", "--sut", "no-such-implementation", "--seeds", "1"]) == 2
    assert "no-such-implementation" in capsys.readouterr().err
