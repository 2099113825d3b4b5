"""The stack's other backends: external URLs (validated, loopback only) and testcontainers (skipped with a reason)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from harness.stack.external import docker_status, external_urls
from harness.stack.ports import PortAllocator
from harness.stack.process import ServiceProcess, group_members


@pytest.fixture
def listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


def test_external_needs_every_url():
    with pytest.raises(ValueError, match="AMQP_URL"):
        external_urls({"DATABASE_URL": "postgresql://a@127.0.0.1:1/x", "S3_ENDPOINT_URL": "http://127.0.0.1:1"})


def test_external_refuses_non_loopback_targets(listening_port):
    env = {"DATABASE_URL": f"postgresql://u:p@127.0.0.1:{listening_port}/db",
           "AMQP_URL": "amqp://u:p@db.example.internal:5672/",
           "S3_ENDPOINT_URL": f"http://127.0.0.1:{listening_port}"}
    with pytest.raises(ValueError, match="loopback"):
        external_urls(env)


def test_external_reports_unreachable_service(listening_port):
    free = PortAllocator().take()
    env = {"DATABASE_URL": f"postgresql://u:p@127.0.0.1:{listening_port}/db",
           "AMQP_URL": f"amqp://u:p@127.0.0.1:{free}/", "S3_ENDPOINT_URL": f"http://127.0.0.1:{listening_port}"}
    with pytest.raises(ValueError, match="not reachable"):
        external_urls(env)


def test_external_accepts_reachable_loopback_urls(listening_port):
    env = {"DATABASE_URL": f"postgresql://u:p@127.0.0.1:{listening_port}/db",
           "AMQP_URL": f"amqp://u:p@localhost:{listening_port}/",
           "S3_ENDPOINT_URL": f"http://127.0.0.1:{listening_port}"}
    assert external_urls(env)["AMQP_URL"].startswith("amqp://")


def test_testcontainers_backend_states_why_it_is_skipped():
    status = docker_status()
    assert status.backend == "testcontainers"
    if not status.available:
        assert status.reason and ("Docker" in status.reason or "testcontainers" in status.reason)


def test_cli_reports_testcontainers_skip_with_reason():
    result = subprocess.run([sys.executable, "-m", "harness.cli", "stack", "up", "--testcontainers", "--json"],
                            capture_output=True, text=True, timeout=60)
    status = docker_status()
    if status.available:
        assert result.returncode == 2
    else:
        assert result.returncode == 0 and '"skipped": true' in result.stdout and status.reason.split(":")[0] in result.stdout


def test_port_allocator_never_repeats():
    ports = PortAllocator()
    taken = [ports.take() for _ in range(50)]
    assert len(set(taken)) == 50


def test_listener_ports_stay_below_the_ephemeral_range_and_are_never_given_twice():
    # A port the OS hands out for bind(0) (a Toxiproxy proxy made for a tenant ahead, an outgoing connection)
    # must never be one a role is about to bind: that collision once left an API unable to start.
    from harness.stack.ports import _ephemeral_low, listener_port
    low = _ephemeral_low()
    taken = [listener_port() for _ in range(30)] + [PortAllocator().take() for _ in range(30)]
    assert len(set(taken)) == 60 and all(p < low for p in taken)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] >= low  # what the OS picks is in the other range


def test_service_process_kills_its_whole_group(tmp_path):
    # A parent that starts a child which outlives it: killing the group must take both.
    script = "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"
    process = ServiceProcess(name="tree", argv=[sys.executable, "-c", script], log_path=tmp_path / "tree.log").start()
    import time
    deadline = time.monotonic() + 10
    while len(group_members(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(process.pid)) == 2
    process.kill()
    assert group_members(process.pid) == []


def test_a_forked_child_walks_listener_ports_of_its_own():
    """grade-many grades each submission in a forked child: with its parent's cursor, two children took the same
    ports at the same time, and one role's API port was already in use (class of 8, --jobs 2)."""
    import os

    from harness.stack import ports

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its cursor and exit without running anything of pytest's
        os.write(write, str(ports._LISTENERS._cursor).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child_cursor = int(os.read(read, 64))
    os.close(read)
    os.close(write)
    span = max(1, ports._LISTENERS._high - ports._LISTENERS.LOW)
    assert child_cursor == ports._LISTENERS.LOW + (pid * 7919) % span
    assert child_cursor != ports._LISTENERS._cursor
