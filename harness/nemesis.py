"""The fault schedule of a scenario, resolved from the seed, and its execution.

Resolution (``resolve_schedule``) is pure: the same scenario and seed give the
same list of steps with the same delays — recorded in run.json so a rerun can
be compared. Execution: the runner gives each step its own thread, where the step's
fault kind (``chaos/kinds/<action>.py``) drives the chaos package and records every
fault in the history.
"""

from __future__ import annotations

from .seeding import stream

DEFAULTS = {"restart_after": 0.5, "timeout": 30.0}


def is_scaled(value) -> bool:
    return isinstance(value, dict) and "of" in value


def timings_needed(faults: list[dict]) -> set[str]:
    """The implementation's timings a schedule scales with (``{of = "lease_seconds", times = 2.25}``)."""
    return {v["of"] for fault in faults for v in fault.values() if is_scaled(v)}


def scale(value, timings: dict):
    """A duration written relative to the implementation's own timings — ``{of, times, plus}`` — in seconds, so
    a pause "longer than the lease" is longer than *this* implementation's lease."""
    if not is_scaled(value):
        return value
    if timings.get(value["of"]) is None:
        raise KeyError(f"the adapter declares no {value['of']}")
    return round(float(timings[value["of"]]) * float(value.get("times", 1)) + float(value.get("plus", 0)), 3)


def resolve_schedule(faults: list[dict], seed: int, timings: dict | None = None) -> list[dict]:
    """Each fault with its random choices made (``at`` + jitter, a delay drawn from ``delay`` [lo, hi]) and its
    durations scaled to the implementation's timings."""
    rng = stream(seed, "faults")
    out = []
    for index, fault in enumerate(faults):
        fault = {k: scale(v, timings or {}) for k, v in fault.items()}
        step = {**DEFAULTS, **fault, "index": index}
        if "at" in fault:
            step["at"] = round(float(fault["at"]) + rng.uniform(0, float(fault.get("jitter", 0))), 3)
        if fault.get("action") == "failpoint" and fault.get("pause") is not None:
            # A pause whose length scales with a timing: the failpoint spec in milliseconds, at every hit.
            step["spec"] = f"pause({int(round(float(fault['pause']) * 1000))})"
        if "delay" in fault:
            lo, hi = fault["delay"]
            step["delay_drawn"] = [round(rng.uniform(lo, hi), 3) for _ in range(int(fault.get("count", 1)))]
        out.append(step)
    return out


def schedule_fingerprint(schedule: list[dict]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(schedule, sort_keys=True).encode()).hexdigest()
