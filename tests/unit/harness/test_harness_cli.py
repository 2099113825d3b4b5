"""The CLI's service-free commands and its wiring."""

from __future__ import annotations

import json

from harness import cli


def test_scenarios_lists_and_filters(capsys):
    assert cli.main(["scenarios"]) == 0
    out = capsys.readouterr().out
    assert "window-s3-commit-failpoint" in out and "worker-paused-past-lease" in out
    assert cli.main(["scenarios", "--level", "3", "--requirement", "BE-JOB-006"]) == 0
    assert "0 scenarios" in capsys.readouterr().out
    assert cli.main(["scenarios", "--window", "after_commit_before_ack", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed and all("after_commit_before_ack" in s["windows"] for s in listed)


def test_parser_knows_every_command_and_stack_commands_are_wired():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"scenarios", "run", "grade", "check"} <= set(commands)
    args = parser.parse_args(["run", "poison-message", "--seed", "5"])
    assert args.seed == 5 and args.sut == "reference"
    args = parser.parse_args(["grade", "--sut", "reference", "--level", "4"])
    assert args.level == 4


def test_errors_exit_2_with_a_reason(capsys, tmp_path):
    assert cli.main(["check", str(tmp_path / "missing")]) == 2
    assert "error" in capsys.readouterr().err
    assert cli.main(["grade", "--sut", str(tmp_path / "nope.toml"), "--level", "3"]) == 2
