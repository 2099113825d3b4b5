"""Issue 23, "health of every role": the relay, worker and sweeper answer /livez and /readyz on their METRICS_PORT,
next to /metrics, with what they saw themselves.

Before: the port was the Prometheus client's, which answers its metrics text with 200 on every path — a relay with
no database at all was "ready" (``curl /readyz`` → 200, ``# HELP python_gc_objects_collected_total``)."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest

from reference import health as health_module
from reference.health import Health, fresh
from reference.relay import Relay
from reference.settings import Settings
from reference.sweeper import Sweeper


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_port_answers_metrics_livez_and_readyz_each_with_its_own_verdict():
    role = Health("relay")
    role.beat()
    ready = {"ok": False}
    role.ready_when("connected", lambda: (ready["ok"], "sessions"))
    server = health_module.serve(free_port(), role)
    try:
        port = server.server_address[1]
        status, body = get(port, "/metrics")
        assert status == 200 and b"# HELP" in body
        status, body = get(port, "/livez")
        assert status == 200 and json.loads(body)["live"] is True
        status, body = get(port, "/readyz")
        answer = json.loads(body)
        assert status == 503 and answer["ready"] is False and answer["checks"]["connected"]["ok"] is False
        ready["ok"] = True
        status, body = get(port, "/readyz")
        assert status == 200 and json.loads(body)["ready"] is True
    finally:
        server.shutdown()


def test_an_event_loop_that_stops_ticking_is_not_live_and_not_ready():
    clock = Clock()
    role = Health("worker", stall_seconds=30, clock=clock)
    role.beat()
    clock.now += 29
    assert role.live()[0]
    clock.now += 2
    ok, body = role.live()
    assert not ok and "31.0s ago" in body["checks"]["event_loop"]["detail"]
    assert not role.ready()[0]


def test_a_failing_or_raising_check_fails_the_probe_and_says_why():
    role = Health("sweeper")
    role.beat()
    role.live_when("boom", lambda: 1 / 0)
    ok, body = role.live()
    assert not ok and "ZeroDivisionError" in body["checks"]["boom"]["detail"]
    assert fresh(None, 5, "x") == (False, "x: not yet observed")


def test_a_relay_is_ready_only_connected_and_while_its_outbox_lag_is_small():
    relay = Relay(Settings(relay_ready_max_lag_seconds=60))
    relay.health.beat()
    ok, body = relay.health.ready()
    assert not ok and body["checks"]["connected"]["ok"] is False
    assert body["checks"]["outbox_lag"]["detail"] == "outbox lag measured: not yet observed"
    relay.connected = True
    relay.lag_seconds, relay.lag_seen_at = 5.0, health_module.time.monotonic()
    assert relay.health.ready()[0]
    relay.lag_seconds = 61.0  # the outbox lag grows: not ready (a relay that keeps up elsewhere takes the work)
    ok, body = relay.health.ready()
    assert not ok and body["checks"]["outbox_lag"]["detail"].startswith("outbox lag 61.0s (limit 60s)")
    assert relay.health.live()[0]  # still live: restarting it would not make the broker faster


def test_a_relay_whose_lag_was_not_measured_lately_is_not_ready():
    relay = Relay(Settings(relay_poll_seconds=1, db_statement_timeout_seconds=1))
    relay.health.beat()
    relay.connected = True
    relay.lag_seconds, relay.lag_seen_at = 0.0, health_module.time.monotonic() - 60
    assert not relay.health.ready()[0]


def test_a_sweeper_is_ready_after_a_successful_recovery_sweep_and_not_live_when_a_loop_stops(monkeypatch):
    from reference import sweeper as sweeper_module

    monkeypatch.setattr(sweeper_module.ObjectStore, "from_settings", classmethod(lambda cls, *a, **k: None))
    sweeper = Sweeper(Settings(sweep_interval_seconds=1, db_statement_timeout_seconds=1,
                               db_connect_timeout_seconds=1))
    sweeper.health.beat()
    ok, body = sweeper.health.ready()
    assert not ok and body["checks"]["recovery_sweep"]["detail"] == \
        "last successful recovery sweep: not yet observed"
    assert sweeper.health.live()[0]  # not started yet is not stuck

    calls = {"n": 0}

    async def sweep_ok():
        calls["n"] += 1

    async def run_one(loop_name, sweep):
        stop = asyncio.Event()
        task = asyncio.create_task(sweeper._loop(stop, loop_name, sweep, 0.01))
        while calls["n"] == 0:
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(run_one("recovery", sweep_ok))
    assert sweeper.health.ready()[0]
    # a loop that began its last sweep long ago (a statement hanging past every timeout) is not live
    sweeper._swept["staging"] = health_module.time.monotonic() - 3600
    ok, body = sweeper.health.live()
    assert not ok and body["checks"]["staging_loop"]["ok"] is False


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/healthz"])
def test_without_a_health_object_the_port_serves_metrics_as_before(path):
    server = health_module.serve(free_port(), None)
    try:
        status, body = get(server.server_address[1], path)
        assert status == 200 and b"# HELP" in body
    finally:
        server.shutdown()


def test_json_logs_are_one_object_per_line_naming_the_job_and_the_attachment():
    import logging

    from reference.runtime import JsonFormatter

    record = logging.LogRecord("reference.worker", logging.INFO, __file__, 1, "job %s ready", ("j1",), None)
    record.job_id, record.attachment_id, record.attempt = "j1", "a1", 2
    line = json.loads(JsonFormatter("worker").format(record))
    assert line["message"] == "job j1 ready" and line["role"] == "worker" and line["level"] == "INFO"
    assert (line["job_id"], line["attachment_id"], line["attempt"]) == ("j1", "a1", 2)
    assert line["time"].endswith("+00:00") and "trace_id" not in line
