"""Adapter, scenario and report schemas: valid examples pass, invalid ones are rejected with a reason."""

from __future__ import annotations

import copy
import tomllib

import pytest

from harness import adapter as adapter_mod
from harness import scenarios
from harness.adapter import WINDOWS, AdapterError
from harness.schemas import REPO_ROOT, errors

REFERENCE = REPO_ROOT / "reference" / "adapter.toml"


def reference_raw() -> dict:
    return tomllib.loads(REFERENCE.read_text())


def test_reference_adapter_is_valid_and_resolves_by_name():
    a = adapter_mod.load("reference")
    assert a.path == REFERENCE.resolve()
    assert a.level == 5 and a.has("failpoints") and a.has("replay") and a.has("versions")
    assert a.version_env(2) == {"PIPELINE_VERSION": "2"} and a.reprocess_path.endswith("/reprocess")
    assert set(a.failpoint_roles) >= set(WINDOWS)
    assert a.timings["lease_seconds"] == float(a.env["LEASE_SECONDS"])
    assert a.timings["max_attempts"] == int(a.env["MAX_ATTEMPTS"])


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: r.pop("roles"), "'roles' is a required property"),
    (lambda r: r.__setitem__("roles", {}), "should be non-empty"),  # role names are free, but one is needed
    (lambda r: r.__setitem__("level", 2), "level"),
    (lambda r: r.__setitem__("adapter_version", 2), "adapter_version"),
    (lambda r: r["roles"]["api"].__setitem__("command", []), "roles/api/command"),
    (lambda r: r["broker"].pop("work_queue"), "'work_queue' is a required property"),
    (lambda r: r.__setitem__("colour", "blue"), "Additional properties"),
    (lambda r: r["timings"].__setitem__("lease_seconds", 0), "timings/lease_seconds"),
])
def test_invalid_adapters_are_rejected(mutate, fragment):
    raw = copy.deepcopy(reference_raw())
    mutate(raw)
    problems = errors("adapter.schema.json", raw)
    assert problems and any(fragment in p for p in problems), problems


def test_adapter_load_reports_the_file_and_failpoints_to_unknown_roles(tmp_path):
    raw = REFERENCE.read_text().replace('after_commit_before_ack = "worker"', 'after_commit_before_ack = "ghost"')
    path = tmp_path / "adapter.toml"
    path.write_text(raw)
    with pytest.raises(AdapterError, match="unknown roles"):
        adapter_mod.load(path)
    path.write_text("name = [")
    with pytest.raises(AdapterError, match="not valid TOML"):
        adapter_mod.load(path)
    with pytest.raises(AdapterError, match="no adapter file"):
        adapter_mod.load(tmp_path / "nothing-here")


def test_command_placeholders_are_expanded(tmp_path):
    raw = REFERENCE.read_text().replace('command = ["reference", "api"]', 'command = ["{python}", "{adapter_dir}/x.py"]')
    (tmp_path / "adapter.toml").write_text(raw)
    a = adapter_mod.load(tmp_path)
    import sys
    assert a.resolve_command(a.roles["api"].command) == [sys.executable, f"{tmp_path}/x.py"]


def test_every_catalogue_scenario_is_valid_and_the_windows_are_covered_twice():
    catalogue = scenarios.catalogue()
    assert len(catalogue) >= 15
    for window in WINDOWS:
        hits = [s for s in catalogue if window in s.raw["windows"]]
        assert any("failpoints" in s.requires for s in hits), window
        assert any(s.raw.get("exactness") == "approximate" and s.raw.get("fallback_for") for s in hits), window
    names = {s.name for s in catalogue}
    for s in catalogue:
        assert s.raw.get("fallback_for", s.name) in names
        for check in s.checks or []:
            from harness.checkers import CHECKERS
            assert check in CHECKERS, (s.name, check)
    for required in ("redelivery-of-ready-job", "concurrent-duplicate-delivery", "poison-message", "broker-restart",
                     "database-outage", "s3-outage", "worker-paused-past-lease"):
        assert required in names


def test_invalid_scenarios_are_rejected(tmp_path):
    bad = tmp_path / "bad-one.toml"
    bad.write_text('name = "bad-one"\ndescription = "x"\nwindows = ["nowhere"]\nrequirements = ["BE-JOB-009"]\n'
                   'level = 3\nfaults = []\n[workload]\nuploads = 1\n')
    with pytest.raises(scenarios.ScenarioError) as info:
        scenarios.load_file(bad)
    assert "windows/0" in str(info.value) and "requirements/0" in str(info.value)
    wrong_name = tmp_path / "other.toml"
    wrong_name.write_text(bad.read_text().replace('["nowhere"]', "[]").replace("BE-JOB-009", "BE-JOB-001")
                          .replace('name = "bad-one"', 'name = "bad-one"'))
    with pytest.raises(scenarios.ScenarioError, match="must equal the file name"):
        scenarios.load_file(wrong_name)


class FakeAdapter:
    def __init__(self, caps, timings_env=None):
        self.caps = caps
        self.timings_env = timings_env or {}
        self.timings = {"lease_seconds": 4}

    def has(self, c):
        return c in self.caps

    def window_role(self, window):
        return "api" if window == "after_staging_before_record" else "worker"


def test_grade_selection_runs_timed_kills_beside_failpoints_and_alone_without_them():
    # Issue 20 hole 1: a failpoint is the implementation's own placement; the harness's timed kill of the same
    # window runs beside it (it once ran only in its place, so a misplaced failpoint went unchallenged).
    catalogue = scenarios.catalogue()
    with_fp, skipped = scenarios.for_grade(catalogue, FakeAdapter({"failpoints", "replay"}), 4)
    names = {s.name for s in with_fp}
    assert "window-s3-commit-failpoint" in names and "window-s3-commit-sigkill" in names
    twins = [s for s in catalogue if s.raw.get("fallback_for") in names]
    assert len(twins) == 5 and all(s.name in names for s in twins), [s.name for s in twins]
    without, skipped = scenarios.for_grade(catalogue, FakeAdapter(set()), 4)
    names = {s.name for s in without}
    assert "window-s3-commit-sigkill" in names and "window-s3-commit-failpoint" not in names
    assert "poison-replay" not in names
    level3, skipped = scenarios.for_grade(catalogue, FakeAdapter({"failpoints"}), 3)
    assert all(s.level == 3 for s in level3)
    assert any(why.startswith("proves level 4") for _, why in skipped)


def valid_report() -> dict:
    return {"report_version": 1, "kind": "scenario", "run_id": "r1", "verdict": "invalid", "level": 4, "seed": 7,
            "sut": {"name": "x", "path": None, "level": 4},
            "scenario": {"name": "s", "windows": [], "requirements": ["BE-JOB-001"], "level": 3},
            "verdicts": [{"invariant": "lost_accepted_work", "status": "invalid", "requirements": ["BE-JOB-001"],
                          "summary": "1 lost", "exercised": True, "seed": 7,
                          "evidence": [{"message": "still queued", "attachment_id": "a"}]}]}


def test_report_schema_accepts_a_valid_report_and_rejects_broken_ones():
    assert errors("report.schema.json", valid_report()) == []
    broken = valid_report()
    broken["verdict"] = "maybe"
    assert errors("report.schema.json", broken)
    broken = valid_report()
    del broken["verdicts"]
    assert errors("report.schema.json", broken)
    broken = valid_report()
    broken["verdicts"][0]["evidence"] = [{"no": "message"}]
    assert errors("report.schema.json", broken)
    grade = {**valid_report(), "kind": "grade"}
    assert any("scenarios" in p for p in errors("report.schema.json", grade))


def test_scenario_timings_need_an_adapter_variable_and_reach_the_roles_env():
    catalogue = scenarios.catalogue()
    chosen, skipped = scenarios.for_grade(catalogue, FakeAdapter({"failpoints", "replay"}), 4)
    assert any(s.name == "expiry-after-backlog" and "cannot set job_ttl_seconds" in why for s, why in skipped)
    chosen, _ = scenarios.for_grade(catalogue, FakeAdapter({"failpoints", "replay"},
                                                           {"job_ttl_seconds": "JOB_TTL_SECONDS"}), 4)
    assert {"expiry-after-backlog", "prefetch-under-backlog"} <= {s.name for s in chosen}
    reference = adapter_mod.load("reference")
    timings, env = reference.timing_overrides({"job_ttl_seconds": 2})
    assert env == {"JOB_TTL_SECONDS": "2"} and timings["job_ttl_seconds"] == 2 and timings["lease_seconds"] == 4
    with pytest.raises(AdapterError, match="lease_seconds"):
        reference.timing_overrides({"lease_seconds": 1})
    assert reference.summary()["limits"] == {"prefetch": 2, "prefetch_env": "PREFETCH"}
    assert reference.summary()["consumers"] == ["worker"]


def relay_in_api_adapter(tmp_path, **role_flags):
    """An outside implementation's layout: no relay role, consumer and recovery under their own names."""
    import tomli_w

    raw = {"adapter_version": 1, "name": "outside", "level": 4,
           "roles": {"api": {"command": ["x"]}, "worker": {"command": ["x"], "consumer": False},
                     "render": {"command": ["x"], "consumer": True},
                     "janitor": {"command": ["x"], "recovers_work": True}},
           "broker": {"work_queue": "jobs"},
           "failpoints": {"after_commit_before_publish": "api", "after_publish_before_confirm": "api"}}
    path = tmp_path / "adapter.toml"
    path.write_text(tomli_w.dumps(raw))
    return adapter_mod.load(path)


def test_role_groups_and_window_roles_come_from_the_adapter(tmp_path):
    outside = relay_in_api_adapter(tmp_path)
    assert outside.expand_roles(["@consumers"]) == ["render"]
    assert outside.expand_roles(["@recovers_work", "api"]) == ["janitor", "api"]
    assert outside.expand_roles(["@window"], ["after_commit_before_publish"]) == ["api"]
    assert outside.window_role("after_s3_write_before_commit") == "worker"  # the usual layout where the role exists
    summary = outside.summary()
    assert summary["consumers"] == ["render"] and summary["recovers_work"] == ["janitor"]
    assert summary["failpoints"]["after_publish_before_confirm"] == "api" and "relay" not in summary["failpoints"].values()
    # The timed-kill fallback of a relay window targets the API; nothing in the catalogue asks for a relay role.
    chosen, skipped = scenarios.for_grade(scenarios.catalogue(), outside, 4)
    assert "window-commit-publish-sigkill" in {s.name for s in chosen}
    assert not [why for _, why in skipped if "maps no existing role" in why]


def test_a_window_whose_role_does_not_exist_is_skipped_with_the_reason(tmp_path):
    outside = relay_in_api_adapter(tmp_path)
    raw = dict(outside.raw, failpoints={})
    lacking = adapter_mod.Adapter(path=outside.path, raw=raw)  # no relay role and no mapping for the relay windows
    chosen, skipped = scenarios.for_grade(scenarios.catalogue(), lacking, 4)
    assert "window-commit-publish-sigkill" not in {s.name for s in chosen}
    assert any(s.name == "window-commit-publish-sigkill" and "maps no existing role" in why for s, why in skipped)
