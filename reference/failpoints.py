"""Failpoints: deterministic faults at the named failure windows (CONTRACT §6, §7).

Syntax: ``FAILPOINTS="name=action;name2=N*action"`` where action is

* ``crash``      - die at once, ``os._exit(137)``: no cleanup, no nack, no flush;
* ``pause(ms)``  - sleep that many milliseconds, then continue;
* ``error``      - raise :class:`FailpointError` (a transient error);

and the optional ``N*`` prefix arms the failpoint for its first N hits only.
Unknown action syntax is rejected at start-up so a typo never silently disarms a test.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field

# The five windows of CONTRACT §6, in pipeline order, and the role that hosts each.
WINDOWS: dict[str, str] = {
    "after_staging_before_record": "api",
    "after_commit_before_publish": "relay",
    "after_publish_before_confirm": "relay",
    "after_s3_write_before_commit": "worker",
    "after_commit_before_ack": "worker",
}

CRASH_EXIT_CODE = 137
_SPEC = re.compile(
    r"^(?:(?P<count>\d+)\*)?(?:(?P<crash>crash)|(?P<error>error)|pause\((?P<ms>\d+(?:\.\d+)?)\))$"
)
_NAME = re.compile(r"^[a-z][a-z0-9_.\-]*$")


class FailpointError(RuntimeError):
    """Raised by the ``error`` action; callers treat it as a transient failure."""


@dataclass
class Failpoint:
    name: str
    action: str  # "crash" | "pause" | "error"
    pause_ms: float = 0.0
    remaining: int | None = None  # None: every hit
    hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def take(self) -> bool:
        """Count a hit; True when this hit must run the action."""
        with self._lock:
            self.hits += 1
            if self.remaining is None:
                return True
            if self.remaining <= 0:
                return False
            self.remaining -= 1
            return True


def parse_failpoints(spec: str | None) -> dict[str, Failpoint]:
    points: dict[str, Failpoint] = {}
    for raw in (spec or "").split(";"):
        item = raw.strip()
        if not item:
            continue
        name, sep, action = item.partition("=")
        name, action = name.strip(), action.strip().replace(" ", "")
        if not sep or not _NAME.match(name):
            raise ValueError(f"bad failpoint {item!r}: expected name=action")
        match = _SPEC.match(action)
        if not match:
            raise ValueError(f"bad failpoint action {action!r} for {name}: "
                             "crash | pause(ms) | error, optional N* prefix")
        count = int(match["count"]) if match["count"] is not None else None
        if match["crash"]:
            kind = "crash"
        elif match["error"]:
            kind = "error"
        else:
            kind = "pause"
        points[name] = Failpoint(name, kind, float(match["ms"] or 0.0), count)
    return points


class Failpoints:
    """The armed failpoints of one process."""

    def __init__(self, spec: str | None = None):
        self.points = parse_failpoints(spec)

    def __bool__(self) -> bool:
        return bool(self.points)

    def _announce(self, point: Failpoint) -> None:
        # Raw write: a crash must not depend on logging handlers or buffers.
        line = f"FAILPOINT {point.name} fired: {point.action} (hit {point.hits}) pid={os.getpid()}\n"
        try:
            os.write(sys.stderr.fileno(), line.encode())
        except (OSError, ValueError):
            pass

    def _fire_now(self, name: str) -> Failpoint | None:
        point = self.points.get(name)
        if point is None or not point.take():
            return None
        self._announce(point)
        if point.action == "crash":
            os._exit(CRASH_EXIT_CODE)
        if point.action == "error":
            raise FailpointError(f"failpoint {name}")
        return point

    def hit(self, name: str) -> None:
        """Blocking variant for synchronous code."""
        point = self._fire_now(name)
        if point is not None:
            time.sleep(point.pause_ms / 1000.0)

    async def ahit(self, name: str) -> None:
        """Async variant: a pause yields to the event loop instead of blocking it."""
        point = self._fire_now(name)
        if point is not None:
            await asyncio.sleep(point.pause_ms / 1000.0)
