"""A course profile: what the grader, not the student, sets for every submission — the level, the scenario set, the
capabilities an adapter must declare and bounds on its timings — in one TOML file checked into the course's
repository (schemas/course-profile.schema.json). Example::

    profile_version = 1
    name = "reliability-2026"
    level = 4
    scenarios = ["database-outages-past-lease", "worker-crash-after-commit"]
    [capabilities]
    failpoints = true
    replay = true
    [timings]
    lease_seconds = { min = 2, max = 30 }
    max_attempts = { min = 3, max = 10 }

``refusal(profile, adapter)`` says why an adapter does not fit (it claims a lower level, lacks a required
capability, declares a timing outside its bounds or not at all); `harness grade --profile` and `harness grade-many
--profile` refuse such a submission with that reason (exit 2, a row ``refused`` in the class table).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import schemas


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Profile:
    path: Path
    name: str
    level: int
    scenarios: list[str] | None = None
    capabilities: dict[str, bool] = field(default_factory=dict)
    timings: dict[str, dict] = field(default_factory=dict)
    timeout_per_submission: float | None = None


def parse(raw: dict, path: Path | str = "<profile>") -> Profile:
    problems = schemas.errors("course-profile.schema.json", raw)
    if problems:
        raise ProfileError(f"course profile {path} is not valid: " + "; ".join(problems[:5]))
    if raw.get("scenarios"):
        from . import scenarios as catalogue_mod

        known = {s.name for s in catalogue_mod.catalogue()}
        unknown = [n for n in raw["scenarios"] if n not in known]
        if unknown:
            raise ProfileError(f"course profile {path}: unknown scenario(s) {', '.join(unknown)} "
                               "(see `harness scenarios`)")
    for key, bounds in (raw.get("timings") or {}).items():
        if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
            raise ProfileError(f"course profile {path}: timings.{key}: min {bounds['min']} > max {bounds['max']}")
    return Profile(Path(path), raw["name"], int(raw["level"]), list(raw["scenarios"]) if raw.get("scenarios") else None,
                   dict(raw.get("capabilities") or {}), dict(raw.get("timings") or {}),
                   raw.get("timeout_per_submission"))


def load(path: Path | str) -> Profile:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"course profile {path}: cannot read it: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"course profile {path}: not valid TOML: {exc}") from exc
    return parse(raw, path)


def refusal(profile: Profile, adapter) -> list[str]:
    """Why ``adapter`` does not fit the course (empty: it does). Reads what the adapter claims, nothing it runs."""
    out = []
    if int(adapter.level) < profile.level:
        out.append(f"the adapter claims level {adapter.level}, the course grades level {profile.level}")
    have = adapter.capabilities
    for name, required in sorted(profile.capabilities.items()):
        if required and not have.get(name):
            out.append(f"the course requires [capabilities] {name} = true; the adapter declares "
                       f"{str(have.get(name, 'nothing')).lower()}")
    timings = adapter.timings
    for key, bounds in sorted(profile.timings.items()):
        value = timings.get(key)
        if not isinstance(value, (int, float)):
            out.append(f"the course bounds [timings] {key} ({_bounds(bounds)}); the adapter declares none")
        elif ("min" in bounds and value < bounds["min"]) or ("max" in bounds and value > bounds["max"]):
            out.append(f"[timings] {key} = {value} is outside the course's bounds ({_bounds(bounds)})")
    return out


def _bounds(bounds: dict) -> str:
    parts = [f"≥ {bounds['min']}" if "min" in bounds else "", f"≤ {bounds['max']}" if "max" in bounds else ""]
    return " and ".join(p for p in parts if p)
