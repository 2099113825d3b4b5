"""`harness adapter check` and `harness adapter init`: an adapter file judged before any service starts.

``check`` reports every problem at once, one line each, naming the field (jsonschema's error path, dotted as in
TOML: ``roles.worker.instances``) and the reason: unknown keys, wrong types, missing required fields, timings the
catalogue needs, ``[timings_env]`` keys without a ``[timings]`` value, role commands whose program is not found,
``[failpoints]`` windows mapped to roles that do not exist, no consumer role. ``harness grade`` runs it first and
refuses an adapter with problems.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from . import adapter as adapter_mod
from .nemesis import timings_needed
from .schemas import validator

SKELETON = "adapter_skeleton.toml"
SCHEMA = "adapter.schema.json"

# Checkers that say `unknown` without a timing (see each checker's `missing_timings` / `timing` use), and whether
# they do so in every scenario or only in the scenarios that name them in `checks` (where what they need happens:
# a consumer crash, a pause, orphans, a held consumer). tests/unit/harness/test_harness_adapter_check.py keeps this
# table in step with the checkers' sources.
TIMING_CHECKERS: dict[str, tuple[str, ...]] = {
    "lease_seconds": ("ack_after_commit", "lease_ownership", "lease_renewal", "owner_overlap", "stale_ack"),
    "max_attempts": ("bounded_retries", "dead_letter", "delivery_accounting"),
    "staging_retention_seconds": ("staging_safety",),
    "sweep_interval_seconds": ("staging_safety",),
    "job_ttl_seconds": ("expiry", "clock_agreement"),
    "stale_queued_seconds": ("redundant_publish",),
    "retry_base_seconds": ("retry_exhaustion",),
    "retry_cap_seconds": ("retry_exhaustion",),
}
EVERY_SCENARIO = {"bounded_retries"}  # runs, and needs its timing, in every scenario
# Timings an adapter may leave out without a problem (added after adapters were written): without one, the scenarios
# that scale with it are skipped and its checks say unknown — a warning, never a refusal to grade. lease_seconds
# too: an implementation with no lease (a plain Celery worker) cannot declare one truthfully, and without it no
# grade can be valid anyway (BE-JOB-006 is left unprovable, a warning of its own), while a refusal would hide its
# other faults.
OPTIONAL_TIMINGS = {"stale_queued_seconds", "retry_base_seconds", "retry_cap_seconds", "lease_seconds"}

TOML_TYPES = {"object": "table", "array": "array", "string": "string", "integer": "integer", "number": "number",
              "boolean": "boolean", "null": "nothing"}


@dataclass(frozen=True)
class Problem:
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass
class Report:
    path: Path | None
    problems: list[Problem] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)  # the grade can run, but cannot be valid

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, field_name: str, reason: str) -> None:
        problem = Problem(field_name, reason)
        if problem not in self.problems:
            self.problems.append(problem)


# --- field names --------------------------------------------------------------------------------------------------

def field_name(path, key: str | None = None) -> str:
    """A jsonschema error path as a TOML key path: ``roles.api.command[0]``; ``<file>`` for the top."""
    out = ""
    for part in [*path, *([key] if key is not None else [])]:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<file>"


def _toml_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _schema_problems(raw: dict, report: Report) -> None:
    errors = sorted(validator(SCHEMA).iter_errors(raw), key=lambda e: [str(p) for p in e.absolute_path])
    for e in errors:
        path = list(e.absolute_path)
        if "propertyNames" in e.schema_path:
            # The key itself is wrong (e.g. [timings_env] lease = ...): jsonschema points at the table.
            allowed = e.schema.get("enum")
            reason = (f"unknown key (expected one of: {', '.join(allowed)})" if allowed else
                      f"invalid key: {e.message}")
            report.add(field_name(path, e.instance), reason)
        elif e.validator == "additionalProperties" and isinstance(e.instance, dict):
            known = set(e.schema.get("properties") or {})
            for key in sorted(set(e.instance) - known):
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else (
                    f" (known: {', '.join(sorted(known))})" if known else "")
                report.add(field_name(path, key), "unknown key" + hint)
        elif e.validator == "required" and isinstance(e.instance, dict):
            for key in e.validator_value:
                if key not in e.instance:
                    report.add(field_name(path, key), "missing required field")
        elif e.validator == "type":
            expected = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
            report.add(field_name(path), f"wrong type: expected {' or '.join(TOML_TYPES.get(t, t) for t in expected)}, "
                                         f"got {_toml_type(e.instance)} {_short(e.instance)}")
        elif e.validator in ("enum", "const"):
            allowed = e.validator_value if e.validator == "enum" else [e.validator_value]
            report.add(field_name(path), f"must be {' or '.join(_short(v) for v in allowed)}, got {_short(e.instance)}")
        else:
            report.add(field_name(path), e.message)


# --- what the schema cannot say -----------------------------------------------------------------------------------

def _table(raw: dict, key: str) -> dict:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _roles(raw: dict) -> dict[str, dict]:
    return {name: spec for name, spec in _table(raw, "roles").items() if isinstance(spec, dict)}


def _program_problems(sut: adapter_mod.Adapter, raw: dict, report: Report) -> None:
    commands = [(f"roles.{name}.command", spec.get("command")) for name, spec in _roles(raw).items()]
    setup = _table(raw, "setup")
    if "command" in setup:
        commands.insert(0, ("setup.command", setup["command"]))
    for where, command in commands:
        if not isinstance(command, list) or not command or not all(isinstance(p, str) and p for p in command):
            continue  # the schema problems say what is wrong with it
        unexpandable = False
        for index, part in enumerate(command):
            try:
                sut.expand(part)
            except adapter_mod.AdapterError as exc:  # an unknown placeholder, {repo} outside a checkout
                report.add(f"{where}[{index}]", str(exc))
                unexpandable = True
                break
        if unexpandable:
            continue
        program = sut.resolve_command(command)[0]
        if os.sep in program:
            found = Path(program).is_file() and os.access(program, os.X_OK)
            if not found and Path(program).is_file():
                report.add(f"{where}[0]", f"program is not executable: {program}")
                continue
        else:
            found = shutil.which(program) is not None
        if not found:
            origin = f" (from {command[0]!r})" if command[0] != program else ""
            where_looked = "" if os.sep in program else " beside the harness's interpreter or on PATH"
            report.add(f"{where}[0]", f"program not found: {program}{origin}{where_looked}")


def _semantic_problems(raw: dict, report: Report) -> None:
    roles = _roles(raw)
    if roles:
        consumers = [name for name, spec in roles.items() if spec.get("consumer", name == "worker") is True]
        if not consumers:
            report.add("roles", "no role is flagged consumer = true: the harness cannot tell which role consumes the "
                                "work queue (crashes, holds and prefetch sampling target the consumers)")
        for window, role in _table(raw, "failpoints").items():
            if isinstance(role, str) and role not in roles:
                report.add(f"failpoints.{window}", f"mapped to role {role!r}, which [roles] does not define "
                                                   f"(roles: {', '.join(roles)})")
        http_role = _table(raw, "http").get("role", "api")
        if isinstance(http_role, str) and http_role not in roles:
            report.add("http.role", f"role {http_role!r} is not defined in [roles] (roles: {', '.join(roles)})")
    timings, names = _table(raw, "timings"), _timing_names()
    for key in _table(raw, "timings_env"):
        if key not in timings and key in names:
            report.add(f"timings_env.{key}", f"no [timings] value for {key}: declare timings.{key} (what the checkers "
                                             "assume when a scenario does not override it)")


def _timing_names() -> tuple[str, ...]:
    """The timings an adapter may declare (the schema's [timings] properties)."""
    return tuple(validator(SCHEMA).schema["properties"]["timings"]["properties"])


def _names(scenarios) -> str:
    return ", ".join(s.name for s in scenarios)


def _with_timing(sut: adapter_mod.Adapter, name: str) -> adapter_mod.Adapter:
    raw = {**sut.raw, "timings": {**sut.timings, name: 1}}
    return adapter_mod.Adapter(path=sut.path, raw=raw)


def _timing_problems(sut: adapter_mod.Adapter, catalogue, level: int, report: Report) -> None:
    from .scenarios import for_grade

    needed = set(TIMING_CHECKERS)
    for scenario in catalogue:
        needed |= timings_needed(scenario.raw["faults"] + list(scenario.raw.get("clock_skew") or []))
    now = {s.name for s in for_grade(catalogue, sut, level)[0]}
    for name in sorted(needed - {k for k, v in sut.timings.items() if v is not None}):
        would_run, _ = for_grade(catalogue, _with_timing(sut, name), level)
        skipped = [s for s in would_run if s.name not in now]
        checkers = TIMING_CHECKERS.get(name, ())
        unknown = [s for s in would_run if s.name in now and name not in (s.raw.get("timings") or {})
                   and any(c in EVERY_SCENARIO or c in (s.checks or []) for c in checkers)]
        if not skipped and not unknown:
            continue
        parts = []
        if skipped:
            parts.append(f"{_names(skipped)} would be skipped ({'its' if len(skipped) == 1 else 'their'} faults "
                         "scale with it)")
        if unknown:
            every = [c for c in checkers if c in EVERY_SCENARIO]
            who = f"{', '.join(checkers)} need{'s' if len(checkers) == 1 else ''} it"
            if every and len(unknown) == len(now):
                parts.append(f"all {len(unknown)} scenarios that run at level {level} would be unknown ({who})")
            else:
                parts.append(f"{_names(unknown)} would be unknown ({who})")
        if name in OPTIONAL_TIMINGS:
            report.warnings.append(Problem(f"timings.{name}", "not declared (optional); without it " + " and ".join(parts)))
            continue
        report.add(f"timings.{name}", "missing; without it " + " and ".join(parts))


def _coverage_problems(sut: adapter_mod.Adapter, catalogue, level: int, report: Report) -> None:
    """A requirement the catalogue proves at ``level`` but that no scenario can run for this adapter: the grade is
    certain to be unknown, so say so now, with why each of its scenarios is skipped."""
    from .grade import required_at
    from .scenarios import for_grade

    chosen, skipped = for_grade(catalogue, sut, level)
    ran = {rid for s in chosen for rid in s.raw["requirements"]}
    for rid, names in sorted(required_at(level, catalogue).items()):
        if rid not in ran:
            why = "; ".join(f"{s.name}: {reason}" for s, reason in skipped if s.name in names)
            report.warnings.append(Problem(rid, f"no scenario proving it can run, so a full level-{level} grade "
                                                f"will be unknown ({why})"))


# --- the summary of a clean adapter -------------------------------------------------------------------------------

def _summary(sut: adapter_mod.Adapter, catalogue, level: int) -> list[str]:
    from .scenarios import for_grade

    chosen, skipped = for_grade(catalogue, sut, level)
    windows = {w: sut.window_role(w) for w in adapter_mod.WINDOWS}
    lines = [
        f"roles: {', '.join(f'{n} x{r.instances}' if r.instances > 1 else n for n, r in sut.roles.items())}",
        f"consumer roles: {', '.join(sut.roles_flagged('consumer'))}",
        f"recovering roles: {', '.join(sut.roles_flagged('recovers_work')) or 'none'}",
        "capabilities: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in sut.capabilities.items()),
        "windows -> roles" + (" (failpoints)" if sut.has("failpoints") else " (timed SIGKILL, no failpoints)") + ":",
        *[f"  {w:30} -> {r or '(no role: scenarios needing it are skipped)'}" for w, r in windows.items()],
        f"at level {level}: {len(chosen)} scenarios run, {len(skipped)} skipped",
        *[f"  run   {s.name}" for s in chosen],
        *[f"  skip  {s.name}: {why}" for s, why in skipped],
    ]
    return lines


# --- entry points -------------------------------------------------------------------------------------------------

def check(path_or_name: str | Path, level: int | None = None) -> Report:
    """Every problem of an adapter file, or (when clean) a summary of what a grade at ``level`` would run."""
    try:
        path = adapter_mod.resolve_path(str(path_or_name))
    except adapter_mod.AdapterError as exc:
        return Report(None, [Problem(str(path_or_name), str(exc))])
    report = Report(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        report.add("<file>", f"cannot read {path}: {exc}")
        return report
    except tomllib.TOMLDecodeError as exc:
        report.add("<file>", f"not valid TOML: {exc}")
        return report
    _schema_problems(raw, report)
    _semantic_problems(raw, report)
    if not isinstance(raw.get("roles"), dict):
        return report
    sut = adapter_mod.Adapter(path=path, raw=raw)
    _program_problems(sut, raw, report)
    claimed = raw.get("level") if raw.get("level") in (3, 4, 5) else 5
    level = int(level or claimed)
    try:
        from .scenarios import catalogue

        scenarios = catalogue()
        _timing_problems(sut, scenarios, level, report)
        _coverage_problems(sut, scenarios, level, report)
    except Exception as exc:  # a table of the wrong type the schema problems already name
        if report.ok:
            report.add("<file>", f"cannot plan a grade with this adapter: {type(exc).__name__}: {exc}")
        return report
    if report.ok:
        report.summary = _summary(sut, scenarios, level)
    return report


def render(report: Report) -> str:
    """The report as printed: one line per problem, or the summary of a clean adapter."""
    where = report.path or "adapter"
    warnings = [f"warning: {w}" for w in report.warnings]
    if report.ok:
        return "\n".join([f"{where}: OK" + (f" ({len(warnings)} warnings)" if warnings else ""), *warnings,
                          *report.summary])
    count = len(report.problems)
    return "\n".join([*(str(p) for p in report.problems), *warnings,
                      f"{where}: {count} problem{'s' if count != 1 else ''}"])


def skeleton() -> str:
    """The commented adapter skeleton `harness adapter init` writes."""
    return resources.files("harness").joinpath(SKELETON).read_text(encoding="utf-8")


def init(path: Path, force: bool = False) -> Path:
    """Write the skeleton to ``path`` (a folder gets adapter.toml); FileExistsError unless ``force``."""
    path = Path(path)
    if path.is_dir():
        path = path / "adapter.toml"
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(skeleton(), encoding="utf-8")
    return path
