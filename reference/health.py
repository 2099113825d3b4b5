"""Liveness and readiness of the roles that have no API of their own (relay, worker, sweeper).

Served on the role's ``METRICS_PORT`` next to ``/metrics`` (one small HTTP server per process, in a thread, so it
answers even when the role's event loop does not):

* ``GET /livez``: 200 while the process is worth keeping, 503 when a restart is the cure — the role's event loop
  has not ticked for ``HEALTH_STALL_SECONDS`` (blocked), or one of the role's own liveness checks fails (a worker
  holding an execution past its deadline and the abandonment: it is stuck as in issue 23 defect 1).
* ``GET /readyz``: 200 when the role does its work now, 503 otherwise (not connected, a dependency down, the relay's
  outbox lag over ``RELAY_READY_MAX_LAG_SECONDS``, the sweeper's last recovery sweep too old). A role that is not
  ready is not restarted for it: it reconnects by itself.

Both answer JSON: ``{"role", "live"|"ready", "checks": {name: {"ok", "detail"}}}``. A check that has not been able
to observe anything yet says so (``ok`` false, ``detail`` "not yet observed"): readiness is earned by an event
seen, never assumed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reference import metrics

log = logging.getLogger("reference.health")

Check = Callable[[], tuple[bool, str]]


class Health:
    """What one role process says about itself. Checks are plain callables read from the HTTP thread: they only
    read values the role's loop writes (floats, bools), never await."""

    def __init__(self, role: str, stall_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.role = role
        self.stall_seconds = stall_seconds
        self.clock = clock
        self.started = clock()
        self.loop_beat: float | None = None
        self.liveness: dict[str, Check] = {"event_loop": self._loop_check}
        self.readiness: dict[str, Check] = {}

    # --- fed by the role ---------------------------------------------------------------------------
    def beat(self) -> None:
        self.loop_beat = self.clock()

    async def run_beats(self, stop: asyncio.Event, every: float = 1.0) -> None:
        """Tick from the role's event loop: a loop that is blocked stops ticking, and /livez says so."""
        while not stop.is_set():
            self.beat()
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except asyncio.TimeoutError:
                pass

    def live_when(self, name: str, check: Check) -> None:
        self.liveness[name] = check

    def ready_when(self, name: str, check: Check) -> None:
        self.readiness[name] = check

    # --- read by the HTTP thread -------------------------------------------------------------------
    def _loop_check(self) -> tuple[bool, str]:
        now = self.clock()
        if self.loop_beat is None:
            since_start = now - self.started
            return since_start < self.stall_seconds, f"event loop not ticking yet ({since_start:.1f}s after start)"
        silent = now - self.loop_beat
        return silent < self.stall_seconds, f"event loop last ticked {silent:.1f}s ago (limit {self.stall_seconds}s)"

    @staticmethod
    def _run(checks: dict[str, Check]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, check in checks.items():
            try:
                ok, detail = check()
            except Exception as exc:  # noqa: BLE001 - a broken check is a failing one, never a crash of the probe
                ok, detail = False, f"check raised {type(exc).__name__}: {exc}"
            out[name] = {"ok": bool(ok), "detail": detail}
        return out

    def live(self) -> tuple[bool, dict[str, Any]]:
        checks = self._run(self.liveness)
        ok = all(c["ok"] for c in checks.values())
        return ok, {"role": self.role, "live": ok, "checks": checks}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        live_ok, live_body = self.live()
        checks = self._run(self.readiness)
        ok = live_ok and all(c["ok"] for c in checks.values())
        return ok, {"role": self.role, "ready": ok, "live": live_ok, "checks": {**live_body["checks"], **checks}}


def fresh(since: float | None, within: float, what: str, clock: Callable[[], float] = time.monotonic
          ) -> tuple[bool, str]:
    """A check that passes when ``what`` was last seen within ``within`` seconds (``since`` a monotonic time)."""
    if since is None:
        return False, f"{what}: not yet observed"
    age = clock() - since
    return age <= within, f"{what} {age:.1f}s ago (limit {within:.1f}s)"


class _Handler(BaseHTTPRequestHandler):
    health: Health | None = None

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path in ("/livez", "/readyz", "/healthz") and self.health is not None:
            ok, body = self.health.ready() if path == "/readyz" else self.health.live()
            payload, content_type, status = json.dumps(body).encode(), "application/json", 200 if ok else 503
        else:  # /metrics, and any other path as the Prometheus client answers it
            payload, content_type = metrics.render()
            status = 200
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:  # probes every few seconds: not a log line each
        pass


def serve(port: int | None, health: Health | None, host: str = "127.0.0.1") -> ThreadingHTTPServer | None:
    """``/metrics``, ``/livez``, ``/readyz`` (``/healthz`` = ``/livez``) on ``port`` in a daemon thread; None when
    no port is set."""
    if not port:
        return None
    handler = type("HealthHandler", (_Handler,), {"health": health})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health-http", daemon=True).start()
    log.info("metrics and health on http://%s:%d (/metrics, /livez, /readyz)", host, port)
    return server
