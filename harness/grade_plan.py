"""A grade's planning: which scenarios it runs for an implementation at a level, which it skips and why, what it
requires — and, for the scheduler, which scenarios may not share the stack and how long each is expected to take."""

from __future__ import annotations

from . import scenarios as catalogue_mod
from .grade_checklist import items_required_at, required_at, skipped_entry

def runs_alone(scenario) -> str | None:
    """Why a scenario may not share the stack with another run (None when it may): it restarts a service every
    run depends on, or it says so (``exclusive = true``, e.g. for a measurement another run's load would skew)."""
    if scenario.raw.get("exclusive"):
        return "declared exclusive"
    for fault in scenario.raw.get("faults") or []:
        if fault.get("action") == "restart_service":
            return f"restarts {fault.get('service', 'a service')}"
    return None


def expected_seconds(scenario, timings: dict) -> float:
    """A rough length, to start the longest shared scenarios first so the last one to finish is a short one: the
    seconds its faults are scheduled to last (holds, pauses, outages, probes, scaled to the implementation's
    timings) plus a little per upload. Scenarios of one upload and a long pause are among the longest."""
    from .nemesis import resolve_schedule

    w = scenario.raw.get("workload") or {}
    uploads = int(w.get("uploads", 0)) + int(w.get("bad", 0)) + int(w.get("poison", 0))
    try:
        steps = resolve_schedule(list(scenario.raw.get("faults") or []), 0,
                                 {**timings, **(scenario.raw.get("timings") or {})})
    except Exception:  # a schedule this estimate cannot read: order it by its uploads alone
        steps = []
    faulted = 0.0
    for step in steps:
        for key in ("at", "duration", "probe_seconds"):
            value = step.get(key)
            if isinstance(value, (int, float)):
                faulted += float(value)
    return faulted + 0.3 * uploads


def plan(adapter, level: int, only: list[str] | None = None):
    """What a grade runs for this adapter: the chosen scenarios, the skipped ones (with reasons), the required
    requirements and the required checklist rows."""
    everything = catalogue_mod.catalogue()
    required = required_at(level, everything)
    required_items = items_required_at(level, everything)
    chosen, skipped_pairs = catalogue_mod.for_grade(everything, adapter, level)
    if only:  # a partial grade: it vouches only for what the chosen scenarios name and provoke
        chosen = [s for s in chosen if s.name in only]
        named = [s for s in everything if s.name in only]
        required = required_at(level, named)
        required_items = {k: v for k, v in items_required_at(level, named).items() if v}
    return chosen, [skipped_entry(s, why) for s, why in skipped_pairs], required, required_items
