"""The stack's life at its edges: a run directory at any depth, a service dying during start, Ctrl-C and SIGTERM
during `harness stack up`, and what is left on disk after a stop (logs in the run directory, nothing else)."""
from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import psycopg
import pytest

from harness.stack import Stack
from harness.stack import postgres as postgres_module
from harness.stack.data_dir import remove_data_dir
from harness.stack.ports import port_listening
from harness.stack.process import group_members
from harness.stack.seaweedfs import s3_client

pytestmark = pytest.mark.integration

# Logs, stack.json and nothing else: a grade's report folder must fit a CI artifact.
RUN_DIR_BOUND_BYTES = 1_000_000
SERVICE_LOGS = ("postgres.log", "rabbitmq.log", "epmd.log", "seaweedfs.log", "toxiproxy.log")


def deep_run_dir(base: Path, at_least: int = 160) -> Path:
    """Like /home/runner/work/<repo>/<repo>/reports/runs/<run id>/stack on a CI runner, only deeper."""
    folder = base
    while len(str(folder)) < at_least:
        folder = folder / "home-runner-work-attachments-reliability"
    return folder / "reports" / "runs" / "grade-20250101T000000-reference-L4-s7" / "stack"


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def started_for(data_dir: str) -> dict[int, str]:
    """Processes (pid -> command line) whose environment names the stack's data folder: whatever a service started,
    including a daemon that left its process group (an `epmd -daemon` run by an Erlang VM of the node)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if data_dir.encode() in environ:
            found[int(entry)] = command.strip()
    return found


def nothing_left_running(state: dict) -> None:
    assert {name: group_members(pid) for name, pid in state["pids"].items() if group_members(pid)} == {}
    assert started_for(state["data_dir"]) == {}, "a process the stack started outlived it"
    assert [port for port in state["ports"] if port_listening(port)] == []


def leftovers_in_tmp(state: dict, since: float, weed_pid: int | None = None) -> list[str]:
    """What a stack could leave in /tmp: its data folder, weed's sockets or glog files.

    Other stacks share /tmp (and reuse ports), so a socket counts only if it carries one of our ports and was made
    after `since` (a time.time()).
    """
    found = [p for p in glob.glob("/tmp/seaweedfs-*.sock")
             if any(p.endswith(f"-{port}.sock") for port in state["ports"]) and os.lstat(p).st_mtime >= since]
    if weed_pid:
        found += glob.glob(f"/tmp/weed.*.{weed_pid}")
    if Path(state["data_dir"]).exists():
        found.append(state["data_dir"])
    return found


def every_service_spawned(run_dir: Path, starter: subprocess.Popen, timeout: float = 60) -> dict:
    """stack.json once it names the five processes (while the starter still runs)."""
    deadline = time.monotonic() + timeout
    state: dict = {}
    while len(state.get("pids", {})) < 5 and starter.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            state = json.loads((run_dir / "stack.json").read_text())
        except (OSError, ValueError):
            pass
    assert len(state.get("pids", {})) == 5, "every service spawned"
    return state


def amqp_roundtrip(url: str) -> bytes:
    async def roundtrip() -> bytes:
        connection = await aio_pika.connect(url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("deep-probe", durable=True, arguments={"x-queue-type": "quorum"})
            await channel.default_exchange.publish(aio_pika.Message(b"deep"), routing_key="deep-probe")
            message = await queue.get(timeout=5)
            await message.ack()
            return message.body
    return asyncio.run(roundtrip())


def test_stack_runs_from_a_deep_run_dir_and_leaves_only_logs(tmp_path):
    run_dir = deep_run_dir(tmp_path)
    assert len(str(run_dir)) >= 150
    since = time.time() - 1
    began = time.monotonic()
    stack = Stack.start(run_dir)
    started = time.monotonic() - began
    weed_pid = stack.s3.process.pid
    try:
        tenant = stack.new_tenant("deep-path")  # a database, a vhost (management API) and a bucket
        with psycopg.connect(tenant.direct.database_url, connect_timeout=5) as conn:
            assert conn.execute("select current_database()").fetchone() == ("deep_path",)
        with psycopg.connect(tenant.proxied.database_url, connect_timeout=5) as conn:  # through Toxiproxy
            assert conn.execute("select 1").fetchone() == (1,)
        assert set(stack.toxiproxy.proxies()) >= {"postgres", "rabbitmq", "s3"}
        assert amqp_roundtrip(tenant.direct.amqp_url) == b"deep"
        client = s3_client(tenant.direct.s3_endpoint_url)
        client.put_object(Bucket=tenant.bucket, Key="probe", Body=b"deep")
        assert client.get_object(Bucket=tenant.bucket, Key="probe")["Body"].read() == b"deep"
        assert not stack.data_dir.is_relative_to(run_dir)
        assert (stack.data_dir / "postgres" / "data" / "PG_VERSION").exists()
    finally:
        stack.stop()
    state = json.loads((run_dir / "stack.json").read_text())
    nothing_left_running(state)
    assert leftovers_in_tmp(state, since, weed_pid) == []
    for log in SERVICE_LOGS:
        assert (run_dir / "logs" / log).is_file(), log
    assert any((run_dir / "logs" / "rabbitmq").glob("*.log")), "RabbitMQ's own log stays with the run"
    run_dir_bytes = size_of(run_dir)
    assert run_dir_bytes < RUN_DIR_BOUND_BYTES
    print(f"\n[stack] deep run dir ({len(str(run_dir))} chars): ready in {started:.1f}s "
          f"({', '.join(f'{k} {v:.1f}s' for k, v in stack.ready_seconds.items() if k != 'total')}); "
          f"run dir after stop {run_dir_bytes / 1024:.0f} KiB")


def test_keep_data_keeps_the_data_folder_for_a_post_mortem(tmp_path, capsys):
    stack = Stack.start(tmp_path / "kept", keep_data=True)
    try:
        with psycopg.connect(stack.direct.database_url, autocommit=True) as conn:
            conn.execute("create table evidence (v text)")
            conn.execute("insert into evidence values ('for the post-mortem')")
    finally:
        stack.stop()
    try:
        nothing_left_running(json.loads((tmp_path / "kept" / "stack.json").read_text()))
        assert (stack.data_dir / "postgres" / "data" / "PG_VERSION").exists()
        assert any((stack.data_dir / "rabbitmq" / "mnesia").iterdir())
        assert str(stack.data_dir) in capsys.readouterr().err, "where the data is must be printed"
    finally:
        assert remove_data_dir(stack.data_dir)


@pytest.mark.parametrize("how", ["impossible setting", "killed right after spawn"])
def test_postgres_dying_during_start_fails_fast_and_stops_everything(tmp_path, monkeypatch, how):
    if how == "impossible setting":
        monkeypatch.setitem(postgres_module.SERVER_SETTINGS, "max_connections", "-5")
    else:
        spawn = postgres_module.Postgres.start

        def spawn_then_kill(self):
            spawn(self)
            self.process.signal_group(signal.SIGKILL)
        monkeypatch.setattr(postgres_module.Postgres, "start", spawn_then_kill)

    run_dir = tmp_path / "dies"
    since = time.time() - 1
    began = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        Stack.start(run_dir)
    took = time.monotonic() - began
    message = str(raised.value)
    assert took < 5, f"took {took:.1f}s: {message}"
    assert message.startswith("PostgreSQL exited"), message
    if how == "impossible setting":
        assert "--- log tail ---" in message and '"max_connections"' in message, message
    state = json.loads((run_dir / "stack.json").read_text())
    assert set(state["pids"]) == {"postgres", "rabbitmq", "s3", "toxiproxy", "epmd"}, "every service was spawned"
    nothing_left_running(state)
    assert leftovers_in_tmp(state, since, state["pids"]["s3"]) == []
    print(f"\n[stack] PostgreSQL dying during start ({how}) reported in {took:.1f}s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_stack_up_stops_everything_it_started(tmp_path, sig):
    run_dir = tmp_path / "interrupted"
    since = time.time() - 1
    up = subprocess.Popen([sys.executable, "-m", "harness.cli", "stack", "up", "--run-dir", str(run_dir)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        state = every_service_spawned(run_dir, up)
        assert not state["ready_seconds"], "interrupted while still waiting for readiness"
        time.sleep(0.3)
        up.send_signal(sig)
        began = time.monotonic()
        up.communicate(timeout=30)
        took = time.monotonic() - began
    finally:
        if up.poll() is None:
            up.kill()
    assert took < 5, f"`harness stack up` took {took:.1f}s to stop"
    assert up.returncode == 2
    state = json.loads((run_dir / "stack.json").read_text())
    assert state["stopped"] is True
    nothing_left_running(state)
    assert leftovers_in_tmp(state, since, state["pids"]["s3"]) == []


@pytest.mark.parametrize("at", ["starting", "ready"])
def test_a_killed_stack_start_leaves_no_service_and_no_data(tmp_path, at):
    """SIGKILL runs no cleanup: the process's keeper (harness/stack/keeper.py) kills what it started and removes the
    data folder. While the services start, and once they are ready (a test session's stack, a grade's own stack);
    only `harness stack up`, whose services `harness stack down` stops by PID, hands them over."""
    run_dir = tmp_path / "killed"
    since = time.time() - 1
    script = ("import sys; from harness.stack import Stack; Stack.start(sys.argv[1]); print('ready', flush=True); "
              "import time; time.sleep(300)")
    starter = subprocess.Popen([sys.executable, "-c", script, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        if at == "ready":
            assert starter.stdout.readline().strip() == "ready"
        state = every_service_spawned(run_dir, starter)
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (any(group_members(pid) for pid in state["pids"].values())
                                           or Path(state["data_dir"]).exists()):
        time.sleep(0.1)
    nothing_left_running(state)
    assert not Path(state["data_dir"]).exists(), "the data folder outlived the killed starter"
    assert leftovers_in_tmp(state, since, state["pids"]["s3"]) == []  # weed's sockets in /tmp, removed by the keeper
