"""The course profile (harness/course_profile.py, schemas/course-profile.schema.json): the grader's level, scenario
set, required capabilities and timing bounds; an adapter that claims otherwise is refused with the reason, before
any service starts (exit 2; a row `refused` in the class table)."""

from __future__ import annotations

import json

import pytest

from harness import adapter as adapter_mod
from harness import cli, course_profile
from harness.schemas import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "course-profile.toml"
STRICT = """profile_version = 1
name = "strict"
level = 3
scenarios = ["batch-poison-positions"]
[capabilities]
failpoints = true
[timings]
max_attempts = { max = 3 }
"""


def test_the_example_profile_is_valid_and_both_implementations_fit_it():
    profile = course_profile.load(EXAMPLE)
    assert profile.level == 3 and profile.scenarios and profile.timeout_per_submission == 900
    for sut in ("reference", REPO_ROOT / "examples" / "go-pipeline" / "adapter.toml"):
        assert course_profile.refusal(profile, adapter_mod.load(sut)) == []


def test_a_profile_is_checked_against_its_schema_and_the_catalogue(tmp_path):
    bad = tmp_path / "bad.toml"
    for text, words in [('profile_version = 1\nname = "x"\nlevel = 6\n', "level"),
                        ('profile_version = 1\nname = "x"\nlevel = 3\nscenarios = ["no-such"]\n', "no-such"),
                        ('profile_version = 1\nname = "x"\nlevel = 3\n[timings]\nnot_a_timing = {max = 1}\n',
                         "not_a_timing"),
                        ('profile_version = 1\nname = "x"\nlevel = 3\n[timings]\nlease_seconds = {min = 5, max = 1}\n',
                         "min 5 > max 1"),
                        ("this is [not toml", "not valid TOML")]:
        bad.write_text(text)
        with pytest.raises(course_profile.ProfileError, match=words):
            course_profile.load(bad)


def test_an_adapter_claiming_otherwise_is_refused_with_each_reason(tmp_path):
    raw = {"profile_version": 1, "name": "c", "level": 4, "capabilities": {"failpoints": True, "replay": True},
           "timings": {"lease_seconds": {"min": 10}, "max_attempts": {"max": 3}, "retry_poll_seconds": {"max": 1}}}
    profile = course_profile.parse(raw)
    adapter = adapter_mod.load("reference")
    reasons = course_profile.refusal(profile, adapter)
    joined = "\n".join(reasons)
    assert "lease_seconds = 4 is outside the course's bounds (≥ 10)" in joined
    assert "max_attempts = 5 is outside the course's bounds (≤ 3)" in joined
    assert "retry_poll_seconds" in joined and "declares none" in joined
    assert "failpoints" not in joined  # the reference declares both capabilities

    class Lower:
        level, capabilities, timings = 3, {"failpoints": False}, {}

    reasons = course_profile.refusal(course_profile.parse({**raw, "timings": {}}), Lower())
    assert any("claims level 3, the course grades level 4" in r for r in reasons)
    assert any("failpoints = true" in r for r in reasons) and any("replay = true" in r for r in reasons)


def test_grade_with_a_profile_refuses_before_any_service_starts(tmp_path, monkeypatch, capsys):
    from harness.stack import Stack

    monkeypatch.setattr(Stack, "start", lambda *a, **k: pytest.fail("no service may start for a refused adapter"))
    strict = tmp_path / "course.toml"
    strict.write_text(STRICT)
    code = cli.main(["grade", "--sut", "reference", "--profile", str(strict), "--seed", "1", "--no-isolation",
                     "--reports", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "refused by the course profile strict" in err and "max_attempts = 5" in err
    assert cli.main(["grade", "--sut", "reference", "--profile", str(strict), "--level", "4", "--no-isolation"]) == 2


def test_grade_many_with_a_profile_makes_a_refused_row_and_exits_2(tmp_path, monkeypatch, capsys):
    from harness.stack import Stack

    monkeypatch.setattr(Stack, "start", lambda *a, **k: pytest.fail("no service may start for a refused adapter"))
    strict = tmp_path / "course.toml"
    strict.write_text(STRICT)
    code = cli.main(["grade-many", "reference", "--profile", str(strict), "--seed", "3", "--no-isolation",
                     "--reports", str(tmp_path / "r")])
    assert code == 2
    (folder,) = (tmp_path / "r").glob("grade-many-*-L3-s3")
    (row,) = json.loads((folder / "class.json").read_text())["rows"]
    assert row["verdict"] == "refused" and "max_attempts = 5 is outside" in row["reason"]
    assert json.loads((folder / "class.json").read_text())["meta"]["profile"] == "strict"
    assert "refused" in (folder / "class.csv").read_text() and "course profile" in (folder / "class.html").read_text()
