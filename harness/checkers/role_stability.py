"""Roles do not crash on their own (BE-JOB-003; CONTRACT §2, §3: never a crash loop).

A role instance that exits without the harness stopping or killing it, and without an armed failpoint firing, is a
defect — unless it happened while a fault the harness caused was active (a dependency restarted or cut, a pause),
or shortly after it, when an implementation may legitimately give up and rely on its supervisor: that exit is kept
as a note. Evidence: the instance, its exit code, the time, and the tail of its log.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import INVALID, VALID, Verdict, evidence, seed_of, timing, FinalState, RunInfo

NAME = "role_stability"
REQUIREMENTS = ["BE-JOB-003"]


def fault_intervals(history: History) -> list[tuple[float, float]]:
    """(start wall, end wall) of every fault that affects dependencies or processes; open ones run to the end."""
    starts: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    out: list[tuple[float, float]] = []
    for e in history.of_type("fault"):
        key = (e.get("action") if e.get("action") != "sigcont" else "sigstop", e.get("service"), e.get("role"))
        if e.get("phase") == "start":
            starts[key] = e
        elif e.get("phase") == "end" and key in starts:
            out.append((starts.pop(key)["wall"], e["wall"]))
        elif e.get("phase") == "hit":
            out.append((e["wall"], e["wall"]))
    out += [(s["wall"], float("inf")) for s in starts.values()]
    return out


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    grace = max(10.0, 2 * (timing(run, "lease_seconds") or 5.0))
    intervals = fault_intervals(history)
    crashes: list[dict[str, Any]] = []
    tolerated: list[dict[str, Any]] = []
    for e in history.of_type("role"):
        if e.get("action") != "exit" or e.get("expected") or e.get("armed"):
            continue
        during = next(((a, b) for a, b in intervals if a - 1 <= e["wall"] <= b + grace), None)
        item = evidence(f"{e.get('role')} exited with code {e.get('returncode')}"
                        + (" during a fault" if during else " on its own, outside any fault"),
                        events=[e], role=e.get("role"), returncode=e.get("returncode"),
                        log_tail=(e.get("log_tail") or "")[-1500:] or None)
        (tolerated if during else crashes).append(item)
    if crashes:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(crashes)} role exits outside any fault",
                       evidence=crashes + tolerated, seed=seed_of(run))
    exits = sum(1 for e in history.of_type("role") if e.get("action") == "exit")
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"no role exited on its own ({len(tolerated)} exits during faults)" if tolerated
                   else "no role exited on its own", exercised=exits > 0 or bool(history.of_type("role")),
                   evidence=tolerated, seed=seed_of(run))
