"""Isolation of submissions (harness/isolation.py): the pure parts and the switches, no root needed.

The kernel side (users, cgroups, nftables, mounts) is tested in tests/integration/harness/test_harness_isolation_live.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli, isolation
from harness.supervisor import Supervisor


def test_scrubbed_env_keeps_what_the_runner_set_and_drops_the_graders_own():
    base = {"PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "grader", "HOME": "/root", "LOG_LEVEL": "DEBUG",
            "VIRTUAL_ENV": "/venv", "LANG": "C.UTF-8"}
    env = {**base, "DATABASE_URL": "postgresql://u:p@127.0.0.1:5/db", "LOG_LEVEL": "INFO", "HTTP_PORT": "8080"}
    scrubbed = isolation.scrubbed_env(env, base)
    assert scrubbed == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "DATABASE_URL": "postgresql://u:p@127.0.0.1:5/db",
                        "LOG_LEVEL": "INFO", "HTTP_PORT": "8080"}
    assert isolation.base_environ().keys() <= set(isolation.KEEP_ENV)


def test_ports_in_env_are_the_loopback_urls_and_listener_variables():
    env = {"DATABASE_URL": "postgresql://harness:harness@127.0.0.1:18195/db",
           "AMQP_URLS": "amqp://g:g@127.0.0.1:18196/v,amqp://g:g@127.0.0.1:18199/v",
           "S3_ENDPOINT_URL": "http://127.0.0.1:18197", "HTTP_PORT": "33437", "METRICS_PORT": "42267",
           "ELSEWHERE": "http://example.org:9999/", "LEASE_SECONDS": "4", "NAME_PORT": "not a number"}
    assert isolation.ports_in_env(env) == {18195, 18196, 18199, 18197, 33437, 42267}


def test_mount_script_binds_back_what_a_blocked_home_or_tmp_would_hide(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "ROOT", tmp_path / "iso")
    home = tmp_path / "home"
    (home / "runner" / "work" / "sub").mkdir(parents=True)
    (home / "runner" / "secret").mkdir()
    reports = home / "runner" / "work" / "sub" / "reports"
    reports.mkdir()
    (home / "runner" / "work" / "sub" / "main.py").write_text("")
    monkeypatch.setattr(isolation, "_traversable", lambda p: Path(p) != home / "runner")
    # Only the submission's own folders: where this checkout and its venv live (under /tmp, say) is not the point.
    needed = isolation.needed_paths
    monkeypatch.setattr(isolation, "needed_paths",
                        lambda argv, env: [p for p in needed(argv, env) if p.is_relative_to(home)])
    argv = ["/usr/bin/python3", str(home / "runner" / "work" / "sub" / "main.py"), "worker"]
    script = isolation.mount_script(3, argv, {"TMPDIR": "/tmp"}, hide=[reports, tmp_path / "nowhere"])
    lines = script.splitlines()
    stage = f"{tmp_path}/iso/slot-3/stage/0"
    sub = str(home / "runner" / "work" / "sub")
    assert lines[0] == "set -e" and lines[-1] == 'exec "$@"'
    bind_aside = lines.index(f"mount --rbind {sub} {stage}")
    hide_home = lines.index(f"mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev harness-empty {home / 'runner'}")
    bind_back = lines.index(f"mount --rbind {stage} {sub}")
    assert bind_aside < hide_home < bind_back
    assert f"mount --bind {tmp_path}/iso/slot-3/tmp /tmp" in lines
    assert not any(" /tmp " in line and "rbind" in line for line in lines)  # /tmp itself is never bound back
    # The report folder is hidden after the submission's folder came back; a missing one is skipped.
    assert lines.index(f"mount -t tmpfs -o ro,size=4k,mode=0755 harness-hidden {reports}") > bind_back
    assert "nowhere" not in script
    assert "secret" not in script


def test_a_folder_inside_a_hidden_one_is_not_hidden_again(tmp_path, monkeypatch):
    """The reports folder and the run's grade folder inside it: one mount (the second has no mount point left)."""
    monkeypatch.setattr(isolation, "ROOT", tmp_path / "iso")
    # tmp_path may lie under /tmp, which the role sees replaced (and so out of view already): not what is tested here.
    monkeypatch.setattr(isolation, "HIDDEN_TMP", ())
    runs = tmp_path / "reports" / "runs"
    (runs / "grade-1").mkdir(parents=True)
    script = isolation.mount_script(0, [], {}, hide=[runs / "grade-1", runs])
    assert script.count("harness-hidden") == 1 and f"harness-hidden {runs}\n" in script


def test_a_hidden_folder_holding_the_submission_is_not_hidden(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "ROOT", tmp_path / "iso")
    sub = tmp_path / "reports" / "sub"
    sub.mkdir(parents=True)
    (sub / "main.py").write_text("")
    script = isolation.mount_script(0, [str(sub / "main.py")], {}, hide=[tmp_path / "reports"])
    assert "harness-hidden" not in script


def test_supervisor_without_isolation_records_it(tmp_path):
    sup = Supervisor(tmp_path, isolate=False)
    assert sup.sandbox is None
    assert json.loads((tmp_path / "isolation.json").read_text()) == {"isolated": False}
    sup.stop_all()


@pytest.mark.parametrize("argv, default_on", [
    (["run", "poison-message"], False),
    (["grade", "--sut", "reference"], False),
    (["grade-many", "reference", "--level", "4"], True),
])
def test_isolation_switches_and_defaults(argv, default_on, monkeypatch):
    monkeypatch.setattr(isolation, "check", lambda: [])
    parser = cli.build_parser()
    for extra, expected in (([], default_on), (["--isolate"], True), (["--no-isolation"], False)):
        args = parser.parse_args(argv + extra)
        try:
            assert cli._set_isolation(args) is None
            assert isolation.enabled() is expected, (argv, extra)
        finally:
            isolation.set_mode(None)
    assert isolation.enabled() is False


def test_isolation_asked_for_and_impossible_is_an_infrastructure_failure(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "check", lambda: ["the harness must run as root to isolate submissions"])
    ran = []
    monkeypatch.setattr(cli, "cmd_run", lambda args: ran.append(args) or 0)
    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), "run", cli.cmd_run))
    assert cli.main(["run", "poison-message", "--isolate"]) == 3
    err = capsys.readouterr().err
    assert "cannot be set up" in err and "must run as root" in err and "--no-isolation" in err
    assert not ran, "the run must not start unisolated"
    assert cli.main(["run", "poison-message", "--no-isolation"]) == 0 and ran
    assert isolation.enabled() is False  # main leaves the default behind


def _with_func(parser, command, func):
    parser._subparsers._group_actions[0].choices[command].set_defaults(func=func)
    return parser


def test_sandbox_refuses_when_the_machine_cannot_isolate(monkeypatch):
    monkeypatch.setattr(isolation, "check", lambda: ["no usable cgroups"])
    with pytest.raises(isolation.IsolationError, match="no usable cgroups.*--no-isolation"):
        isolation.Sandbox("run")


def test_a_preloaded_library_reaches_the_role_only(monkeypatch):
    """libfaketime (clock-skew roles) must not load into the root wrapper: set by the last step, before the role."""
    env = {"PATH": "/usr/bin", "LD_PRELOAD": "/usr/lib/faketime/libfaketime.so.1", "FAKETIME": "+5.000",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1", "DATABASE_URL": "postgresql://u:p@127.0.0.1:5/db"}
    assert isolation.outer_env(env) == {"PATH": "/usr/bin", "DATABASE_URL": "postgresql://u:p@127.0.0.1:5/db"}
    sandbox = object.__new__(isolation.Sandbox)
    sandbox.slot, sandbox.uid, sandbox.gid, sandbox.hide = 0, 64000, 64000, []
    sandbox.limits, sandbox.ports = isolation.Limits(), {5}
    monkeypatch.setattr(isolation, "mount_script", lambda *a: "exec \"$@\"")
    argv = sandbox.command(["/usr/bin/python3", "-c", "pass"], env)
    tail = argv[argv.index("--bounding-set=-all") + 2:]
    assert tail == ["/usr/bin/env", "FAKETIME=+5.000", "FAKETIME_DONT_FAKE_MONOTONIC=1",
                    "LD_PRELOAD=/usr/lib/faketime/libfaketime.so.1", "/usr/bin/python3", "-c", "pass"]


def test_an_isolated_run_starts_from_a_scrubbed_environment(monkeypatch):
    """Isolated, run_environment starts from PATH and the locale only, never the grader's own variables (the
    sandbox scrubs them again: defence in depth)."""
    from types import SimpleNamespace

    from harness.run_setup import run_environment

    monkeypatch.setenv("GRADER_SECRET", "s3cr3t")
    monkeypatch.setenv("LOG_LEVEL", "INFO")
    adapter = SimpleNamespace(timing_overrides=lambda timings: ({}, {}), env={"LOG_LEVEL": "INFO"},
                              operator_token="op")
    scenario = SimpleNamespace(raw={})
    tenant = SimpleNamespace(env=lambda proxied: {"DATABASE_URL": "postgresql://127.0.0.1:1/t"})
    isolation.set_mode(True)
    try:
        _, env = run_environment(adapter, scenario, 4, tenant, 8000, "/tmp/x")
    finally:
        isolation.set_mode(None)
    assert "GRADER_SECRET" not in env and env["LOG_LEVEL"] == "INFO" and env["DATABASE_URL"]
    _, open_env = run_environment(adapter, scenario, 4, tenant, 8000, "/tmp/x")
    assert open_env["GRADER_SECRET"] == "s3cr3t"  # unisolated (the trusted case): as before
