"""Isolation of untrusted submissions (harness/isolation.py): a role cannot touch the grader.

Needs root, cgroups and nftables (what a CI runner must allow, docs/guides/grade-untrusted.md). The first two tests
need no services (a few seconds each); the last grades tests/cheats/all_at_once in one scenario on the session stack.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import adapter, isolation, scenarios
from harness.history import History, HistoryWriter
from harness.runner import ScenarioRun
from harness.schemas import REPO_ROOT
from harness.supervisor import Supervisor

pytestmark = pytest.mark.integration

# What a hostile role tries; prints one JSON line of what it managed.
ROLE = textwrap.dedent("""
    import json, os, signal, socket, sys, time
    found = {"uid": os.getuid(), "env": sorted(os.environ)}
    def connect(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return "connected"
        except OSError as exc:
            return type(exc).__name__
    found["allowed"] = connect(int(os.environ["PROXY_PORT"]))
    found["forbidden"] = connect(int(sys.argv[1]))
    try:
        os.kill(os.getppid(), 0)
        found["signal_parent"] = "allowed"
    except OSError as exc:
        found["signal_parent"] = type(exc).__name__
    try:
        open(sys.argv[2], "w").write("x")
        found["write_report"] = "written"
    except OSError as exc:
        found["write_report"] = type(exc).__name__
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "300"])
        os._exit(0)
    os.wait()
    def sleepers():
        pids = []
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{p}").st_uid == os.getuid() and open(f"/proc/{p}/cmdline", "rb").read().startswith(b"sleep"):
                    pids.append(int(p))
            except OSError:
                pass
        return pids
    # The grandchild may not have reached its exec yet when the middle child is reaped (a loaded machine).
    deadline = time.monotonic() + 10
    while not sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    found["daemon"] = sleepers()
    print(json.dumps(found), flush=True)
    time.sleep(300)
""")


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def test_an_isolated_role_reaches_only_its_own_ports_and_leaves_nothing_behind(tmp_path):
    problems = isolation.check()
    assert not problems, problems  # this machine is a grading machine: root, cgroups, nftables
    allowed, forbidden = _listener(), _listener()
    os.environ["HARNESS_TEST_SECRET"] = "grader-only"
    try:
        with HistoryWriter(tmp_path / "history.jsonl") as history:
            sup = Supervisor(tmp_path, history, isolate=True)
            slot = sup.sandbox.slot
            env = {**os.environ, "PROXY_PORT": str(allowed.getsockname()[1])}
            sup.add("worker", "worker", [sys.executable, "-c", ROLE, str(forbidden.getsockname()[1]),
                                         str(tmp_path / "planted")], env)
            sup.start("worker")
            log = tmp_path / "logs" / "worker.log"
            assert _wait(lambda: "\n{" in log.read_text()), log.read_text()
            found = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][0])
            assert found["uid"] == isolation.UID_BASE + slot
            assert "HARNESS_TEST_SECRET" not in found["env"] and "PROXY_PORT" in found["env"]
            assert found["allowed"] == "connected"
            assert found["forbidden"] == "ConnectionRefusedError"
            assert found["signal_parent"] == "PermissionError"
            assert found["write_report"] in ("PermissionError", "FileNotFoundError", "OSError")
            assert found["daemon"], "the role's daemon did not start"
            assert all(_alive(pid) for pid in found["daemon"])
            sup.stop_all()
        assert not (tmp_path / "planted").exists()
        assert not any(_alive(pid) for pid in found["daemon"]), "a daemonized process outlived the run"
        assert isolation.nft_table(slot) not in _nft_tables()
        assert not any(d.exists() for d in isolation.cgroup_dirs(slot))
        record = json.loads((tmp_path / "isolation.json").read_text())
        assert record["isolated"] and set(found["daemon"]) <= set(record["end"]["killed_at_end"])
        # The forbidden loopback port was tried: counted apart from other refused traffic, named, and recorded as
        # an attempt on the grader (a tamper line: the run is tampered whatever the attempt achieved).
        assert record["end"]["probed_packets"] >= 1
        assert forbidden.getsockname()[1] in record["end"]["probed_ports"]
        lines = History.load(tmp_path / "history.jsonl")
        notes = [e for e in lines if e.get("type") == "note"]
        assert any("killed what the submission left running" in e["message"] for e in notes)
        assert any(e.get("type") == "tamper" and e.get("found") == "attempted"
                   and forbidden.getsockname()[1] in e["ports"] for e in lines)
    finally:
        os.environ.pop("HARNESS_TEST_SECRET", None)
        allowed.close()
        forbidden.close()


HARNESS_THAT_DIES = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from harness.supervisor import Supervisor
    sup = Supervisor(Path(sys.argv[1]), isolate=True)
    script = "import os\\nif os.fork() == 0:\\n    os.setsid()\\n    os.execv('/bin/sleep', ['sleep', '300'])\\nimport time; time.sleep(300)"
    sup.add("worker", "worker", [sys.executable, "-c", script], dict(os.environ))
    sup.start("worker")
    print(sup.sandbox.slot, flush=True)
    time.sleep(300)
""")


def test_the_roles_die_with_a_killed_harness(tmp_path):
    """SIGKILL of the harness (no cleanup of its own): the watchdog kills the cgroup and removes the rules."""
    harness = subprocess.Popen([sys.executable, "-c", HARNESS_THAT_DIES, str(tmp_path)], stdout=subprocess.PIPE,
                               text=True, cwd=REPO_ROOT)
    try:
        slot = int(harness.stdout.readline())
        assert _wait(lambda: len(isolation.cgroup_pids(slot)) >= 2), isolation.cgroup_pids(slot)  # role, daemon
        members = isolation.cgroup_pids(slot)
        assert isolation.nft_table(slot) in _nft_tables()
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    assert _wait(lambda: not any(_alive(pid) for pid in members)), [p for p in members if _alive(p)]
    assert _wait(lambda: isolation.nft_table(slot) not in _nft_tables())
    assert _wait(lambda: not any(d.exists() for d in isolation.cgroup_dirs(slot)))


CHEAT_SCENARIO = "database-outage"
CHEAT_SEED = 21


def test_every_cheat_is_contained(stack, tmp_path, monkeypatch):
    """tests/cheats/all_at_once in one scenario with isolation on: each cheat blocked, its daemon gone after the
    run, the report folder untouched. Without isolation every one of them succeeds (tests/cheats/README.md)."""
    monkeypatch.setenv("HARNESS_ISOLATION_PIDS", "400")  # the fork bomb meets the limit sooner
    isolation.set_mode(True)
    try:
        sut = adapter.load(REPO_ROOT / "tests" / "cheats" / "all_at_once")
        run_dir = tmp_path / "run"
        results = ScenarioRun(scenarios.find(CHEAT_SCENARIO), sut, stack, CHEAT_SEED, 4, run_dir=run_dir,
                              progress=print).execute()
    finally:
        isolation.set_mode(None)
    lines = [line for line in (run_dir / "logs" / "worker.log").read_text().splitlines() if line.startswith("CHEAT ")]
    print("\n".join(lines))
    said = {line.split(":", 1)[0].split()[1]: line.split(":", 1)[1].strip() for line in lines if ":" in line}
    assert "done" in " ".join(lines), f"the cheats did not finish within the run: {lines}"
    for name in ("toxiproxy_api", "open_ports", "direct_database", "other_tenants", "signal_harness", "write_reports",
                 "fill_disk", "kill_others", "fork_bomb"):
        assert said.get(name, "").startswith("blocked"), (name, said.get(name))
    assert "connected to" in said["open_ports"] and ", 0 of them not named" in said["open_ports"]
    assert "File too large" in said["fill_disk"] or "No space left" in said["fill_disk"]
    daemon = int(said["daemonize"].split("daemon pid ")[1].split()[0])
    assert not _alive(daemon), "the daemonized cheat outlived the run"
    record = json.loads((run_dir / "isolation.json").read_text())
    assert daemon in record["end"]["killed_at_end"] and record["end"]["probed_packets"] >= 3
    assert not (run_dir / "CHEAT_WAS_HERE").exists()
    History.load(run_dir / "history.jsonl")  # still the harness's own, every line parses
    # One cheat is not contained but caught: a made-up message published straight into the harness's tap queue
    # (the broker lets the default exchange route to it by name) makes the run tampered.
    assert said.get("forge_tap", "").startswith("achieved"), said.get("forge_tap")
    assert results["verdict"] == "tampered", results["verdict"]
    tampered = [e for e in History.load(run_dir / "history.jsonl") if e.get("type") == "tamper"]
    assert any(e.get("link") == "harness.tap" for e in tampered), tampered


def test_a_setup_command_runs_contained_and_leaves_nothing(tmp_path):
    """The adapter's setup command (run before the roles' supervisor exists) gets the same sandbox: its user, and
    a daemon it started is killed when it returns."""
    script = ("import os\nprint(os.getuid(), flush=True)\nif os.fork() == 0:\n    os.setsid()\n"
              "    print(os.getpid(), flush=True)\n    os.execv('/bin/sleep', ['sleep', '300'])\n")
    with open(tmp_path / "setup.log", "wb") as log:
        returncode, record = isolation.run_contained([sys.executable, "-c", script], dict(os.environ), "setup",
                                                     timeout=60, stdout=log, stderr=subprocess.STDOUT)
    uid, daemon = (int(x) for x in (tmp_path / "setup.log").read_text().split()[:2])
    assert returncode == 0 and uid == record["uid"] >= isolation.UID_BASE
    assert daemon in record["end"]["killed_at_end"] and not _alive(daemon)
