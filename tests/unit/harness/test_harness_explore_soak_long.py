"""`harness explore` (pure parts: a drawn case → faults → a scenario TOML `harness run` loads; the shrink ordering;
the budget) and the long mode of `harness soak` (one run, every allowed kind, even pacing, seeded)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from chaos import kinds as fault_kinds
from harness import adapter as adapter_mod
from harness import cli, explore, soak, soak_long
from harness.scenarios import find, load_file
from harness.schemas import REPO_ROOT, errors

REFERENCE = adapter_mod.load("reference")
GO = adapter_mod.load(REPO_ROOT / "examples" / "go-pipeline" / "adapter.toml")
BLIND = adapter_mod.load(REPO_ROOT / "tests" / "broken" / "sweeper_blind_after_outage")


def case(*picks, uploads=4, seed=1):
    return explore.Case([explore.Pick(*p) for p in picks], uploads, seed)


# --- explore ------------------------------------------------------------------------------------------------------

def test_a_drawn_case_is_a_scenario_file_harness_run_accepts(tmp_path):
    for adapter in (REFERENCE, GO, BLIND):
        kinds = explore.kinds_for(adapter, 4)
        c = case(*[(k, 3 + n, n) for n, k in enumerate(kinds[:3])], uploads=7)
        raw = explore.scenario_raw(adapter, c, 4, "explore-007")
        assert errors("scenario.schema.json", raw) == []
        path = explore.write_scenario(raw, tmp_path / adapter.name)
        loaded = find(str(path))  # what `harness run FILE` does
        assert loaded.name == "explore-007" and loaded.raw == load_file(path).raw
        assert loaded.raw["faults"] == explore.faults_of(adapter, c.picks)
        assert [f["action"] for f in loaded.raw["faults"]] == [k for k in kinds[:3]]
        assert loaded.raw["workload"]["uploads"] == 7 and loaded.raw["workload"]["paced"] is True
        command = explore.replay_command(path, "tests/broken/x", 5, 4, 4)
        assert explore.replay_command(path, "x", 5, 3, 4).endswith("--seed 5 --level 3")
        assert command == f"harness run {path} --sut tests/broken/x --seed 5"
        args = cli.build_parser().parse_args(command.split()[1:])
        assert args.scenario == str(path) and args.seed == 5


def test_a_pick_is_deterministic_and_its_time_is_its_slot():
    picks = [explore.Pick("restart_service", 8, 1), explore.Pick("failpoint", 12, 0)]
    first = explore.faults_of(BLIND, picks)
    assert first == explore.faults_of(BLIND, picks)
    assert [f["at"] for f in first] == [2.0, 3.0]
    assert first[0]["service"] == "postgres" and first[1]["window"] == "after_s3_write_before_commit"


def test_a_role_armed_with_a_failpoint_is_not_armed_again():
    windows = {w: REFERENCE.window_role(w) for w in fault_kinds.get("failpoint").windows(REFERENCE)}
    for variant in range(30):
        faults = explore.faults_of(REFERENCE, [explore.Pick("failpoint", 2, variant), explore.Pick("failpoint", 4,
                                                                                                  variant + 1)])
        roles = [windows[f["window"]] for f in faults if f["action"] == "failpoint"]
        assert len(roles) == len(set(roles))


def test_the_smallest_failing_case_has_the_fewest_faults_then_uploads_then_earliest_simplest_picks():
    big = case(("sigkill", 5, 9), ("restart_service", 4, 1), ("failpoint", 10, 0), uploads=3)
    two_many_uploads = case(("restart_service", 4, 1), ("failpoint", 10, 0), uploads=9)
    two = case(("restart_service", 4, 1), ("failpoint", 10, 0), uploads=3)
    two_earlier = case(("restart_service", 2, 1), ("failpoint", 10, 0), uploads=3)
    two_lower_variant = case(("restart_service", 2, 1), ("failpoint", 10, 0), uploads=3)
    assert explore.smallest([big, two_many_uploads, two, two_earlier]) is two_earlier
    assert explore.size_key(two_lower_variant) == explore.size_key(two_earlier)
    assert explore.smallest([big]) is big and explore.smallest([]) is None
    ordered = sorted([big, two_many_uploads, two, two_earlier], key=explore.size_key)
    assert ordered == [two_earlier, two, two_many_uploads, big]


def test_budget_and_kinds_are_parsed_and_checked():
    assert explore.parse_budget("10m") == 600 and explore.parse_budget("90s") == 90 and explore.parse_budget("45") == 45
    assert explore.parse_budget("1h") == 3600
    with pytest.raises(explore.ExploreError):
        explore.parse_budget("ten minutes")
    assert explore.kinds_for(REFERENCE, 4, ["restart_service", "failpoint"]) == ["failpoint", "restart_service"]
    with pytest.raises(explore.ExploreError, match="unknown fault kind"):
        explore.kinds_for(REFERENCE, 4, ["meteor"])
    args = cli.build_parser().parse_args(["explore", "--sut", "reference", "--budget", "2m", "--seed", "3",
                                          "--kinds", "sigkill,toxic"])
    assert (args.budget, args.seed, args.kinds, args.max_faults) == ("2m", 3, "sigkill,toxic", 3)


def test_hypothesis_draws_the_same_cases_for_the_same_seed():
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    def draws(seed):
        seen = []
        strat = explore.strategy(explore.kinds_for(BLIND, 4), seed)

        @hseed(seed)
        @settings(database=None, max_examples=15, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(strat)
        def test(c):
            seen.append((c.uploads, [(p.kind, p.slot, p.variant) for p in c.picks]))
            assert 1 <= len(c.picks) <= explore.MAX_FAULTS and explore.UPLOADS[0] <= c.uploads <= explore.UPLOADS[1]

        test()
        return seen

    assert draws(11) == draws(11)


# --- the long soak ------------------------------------------------------------------------------------------------

def test_a_long_soak_draws_every_allowed_kind_spread_over_the_run_and_the_same_for_the_same_seed():
    for adapter in (REFERENCE, GO):
        raw = soak_long.scenario_raw(adapter, 7, 10_000, 4)
        assert errors("scenario.schema.json", raw) == []
        assert json.dumps(raw, sort_keys=True) == json.dumps(soak_long.scenario_raw(adapter, 7, 10_000, 4),
                                                             sort_keys=True)
        kinds, excluded = soak_long.kinds_for(adapter, 4)
        counts = Counter(f["action"] for f in raw["faults"])
        assert set(kinds) <= set(counts) and "permute" not in counts and "permute" in excluded
        assert all(counts[k] == 1 for k in soak.ONCE if k in counts)
        span = soak_long.span_of(10_000)
        assert len(raw["faults"]) >= span // soak_long.FAULT_EVERY
        times = [f["at"] for f in raw["faults"] if f.get("at") is not None]
        assert times == sorted(times) and times[0] < 0.1 * span and times[-1] > 0.7 * span
        w = raw["workload"]
        assert w["uploads"] + w["bad"] + w["poison"] == 10_000 and w["paced"] is True
        assert abs(w["spacing_seconds"] * 10_000 - span) < 1.0
        assert soak_long.scenario_raw(adapter, 8, 10_000, 4)["faults"] != raw["faults"]
    short = soak_long.scenario_raw(REFERENCE, 7, 300, 4)
    assert set(soak_long.kinds_for(REFERENCE, 4)[0]) <= {f["action"] for f in short["faults"]}


def test_soak_without_seeds_is_one_long_run_and_with_seeds_the_many_seed_soak():
    args = cli.build_parser().parse_args(["soak", "--sut", "reference", "--uploads", "10000", "--nemesis", "random",
                                          "--seed", "5"])
    assert args.seeds is None and args.uploads == 10_000
    assert cli.build_parser().parse_args(["soak", "--sut", "reference", "--seeds", "20"]).seeds == 20


# --- checkers over a long history: the quadratic spots (indexes instead of a scan per call) --------------------------

def test_history_indexes_answer_like_a_scan():
    from harness.history import History

    events = []
    for n in range(300):
        events.append({"type": "transition", "attachment_id": f"a{n % 40}", "to": "ready" if n % 3 else "queued"})
        events.append({"type": "object", "key": f"k{n % 25}", "size": n})
        events.append({"type": "ok", "f": "replay" if n % 7 == 0 else "upload", "attachment_id": f"a{n % 40}"})
    h = History.from_events(events)
    for t in ("transition", "object", "ok", "nothing"):
        assert h.of_type(t) == [e for e in h.events if e["type"] == t]
    assert h.of_type("ok", "object") == [e for e in h.events if e["type"] in ("ok", "object")]
    for a in ("a0", "a7", "a39", "zz"):
        assert h.of_attachment("transition", a) == [e for e in h.events if e["type"] == "transition"
                                                    and e.get("attachment_id") == a]
    assert h.where("object", "key", "k3") == [e for e in h.events if e["type"] == "object" and e.get("key") == "k3"]
    first = h.of_type("ok")
    first.clear()  # a caller's list is its own: the index is not changed through it
    assert len(h.of_type("ok")) == 300


def test_many_needles_are_found_like_one_substring_test_each():
    import random

    from harness.checkers.message_hygiene import _contained

    rng = random.Random(5)
    keys = {f"variants/{rng.getrandbits(64):016x}/thumb.webp" for _ in range(500)} | {"staging/abc-def"}
    texts = ["nothing here", "s3://bucket/staging/abc-def?x=1", " ".join(sorted(keys)[:3]),
             "variants/" + "0" * 16, sorted(keys)[10][:-1]]
    for text in texts:
        assert _contained(keys, text) == sorted(k for k in keys if k in text)
    few = {"report", "holiday"}
    assert _contained(few, "my holiday report") == ["holiday", "report"]


class _FakeRun:
    """Stands in for a scenario run: invalid exactly when a database restart and a crash in the worker's S3 window
    are both scheduled (the two-fault bug of tests/broken/sweeper_blind_after_outage, as a rule)."""

    calls = 0

    def __init__(self, scenario, *args, **kwargs):
        self.faults = scenario.raw["faults"]

    def execute(self):
        _FakeRun.calls += 1
        both = (any(f["action"] == "restart_service" and f["service"] == "postgres" for f in self.faults)
                and any(f.get("window") == "after_s3_write_before_commit" for f in self.faults))
        return {"verdict": "invalid" if both else "valid",
                "verdicts": [{"invariant": "lost_accepted_work", "status": "invalid" if both else "valid"}]}


def test_explore_shrinks_a_two_fault_failure_to_its_two_faults_and_stops_at_its_budget(tmp_path, monkeypatch):
    from harness import runner

    monkeypatch.setattr(runner, "ScenarioRun", _FakeRun)
    results, out = explore.explore(BLIND, "tests/broken/sweeper_blind_after_outage", budget=120, seed=8,
                                   kinds=["failpoint", "restart_service"], reports_dir=tmp_path, stack=object(),
                                   progress=lambda text: None)
    best = results["smallest"]
    assert best is not None and best["invalid"] == ["lost_accepted_work"]
    assert sorted(f["action"] for f in best["faults"]) == ["failpoint", "restart_service"]
    assert best["uploads"] == explore.UPLOADS[0] and results["replayed_invalid"] is True
    assert find(best["scenario"]).raw["faults"] == best["faults"]
    assert len({json.dumps([r["uploads"], r["faults"]], sort_keys=True) for r in results["runs"] if r["tag"] != "replay"}
               ) == len([r for r in results["runs"] if r["tag"] != "replay"])  # no scenario run twice
    _FakeRun.calls = 0
    spent, _ = explore.explore(BLIND, "x", budget=0, seed=8, reports_dir=tmp_path, stack=object(),
                               progress=lambda text: None)
    assert _FakeRun.calls == 0 and spent["smallest"] is None and spent["stopped"] == "budget spent, no failing case"


def test_when_hypothesis_stops_shrinking_explore_goes_on_greedily_within_the_budget(tmp_path, monkeypatch):
    import hypothesis
    from hypothesis import Phase

    from harness import runner

    class NoShrink(hypothesis.settings):  # Hypothesis' shrink cut short at once, as by its own shrink time limit
        def __init__(self, *args, **kwargs):
            kwargs["phases"] = [Phase.generate]
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(runner, "ScenarioRun", _FakeRun)
    monkeypatch.setattr(hypothesis, "settings", NoShrink)
    results, _ = explore.explore(BLIND, "x", budget=120, seed=8, kinds=["failpoint", "restart_service"],
                                 reports_dir=tmp_path, stack=object(), progress=lambda text: None)
    best = results["smallest"]
    assert sorted(f["action"] for f in best["faults"]) == ["failpoint", "restart_service"]
    assert best["uploads"] == explore.UPLOADS[0] and "greedy shrink" in results["stopped"]


def test_the_first_failure_is_shrunk_greedily_at_once_so_the_fault_that_does_not_matter_is_dropped(
        monkeypatch, tmp_path):
    """The CI test's shape on a fake clock: tests/broken/no_outbox, seed 13, two failpoints at most, 240 s; a valid
    run takes 15 s, a failing one 55 s (its drain waits for the lost job). Before: Hypothesis' shrink spent the budget
    on the uploads and the times, and the answer kept two faults (as a CI rehearsal saw); now the first failure is
    shrunk greedily at once and the answer is the one failpoint the bug needs."""
    import harness.runner as runner_mod

    clock = [0.0]
    monkeypatch.setattr(explore.time, "monotonic", lambda: clock[0])

    class FakeRun:
        def __init__(self, scenario, *args, **kwargs):
            self.faults = scenario.raw["faults"]

        def execute(self):
            bad = any(f.get("window") == "after_commit_before_publish" for f in self.faults)
            clock[0] += 55.0 if bad else 15.0
            return {"verdict": "invalid" if bad else "valid",
                    "verdicts": [{"invariant": "lost_accepted_work", "status": "invalid"}] if bad else []}

    monkeypatch.setattr(runner_mod, "ScenarioRun", FakeRun)
    no_outbox = adapter_mod.load(REPO_ROOT / "tests" / "broken" / "no_outbox")
    results, _ = explore.explore(no_outbox, "tests/broken/no_outbox", budget=240, seed=13, kinds=["failpoint"],
                                 max_faults=2, reports_dir=tmp_path, stack=object(), progress=lambda text: None,
                                 confirm=False)
    runs = [(r["tag"], r["verdict"], [f.get("window") for f in r["faults"]], r["uploads"]) for r in results["runs"]]
    best = results["smallest"]
    assert best is not None and [f.get("window") for f in best["faults"]] == ["after_commit_before_publish"], runs
    assert any(len(r[2]) == 2 and r[1] == "invalid" for r in runs), runs  # found with two faults, then shrunk
    # One fault and the least uploads: nothing smaller to find, so the search stops there, not at the budget.
    assert best["uploads"] == explore.UPLOADS[0] and "nothing smaller" in results["stopped"], results["stopped"]
    assert results["seconds"] <= 240 + 55, runs  # at most the run under way when the budget ran out
