"""`harness adapter check` and `harness adapter init`: an adapter file judged before any service starts.

``check`` reports every problem at once, one line each, naming the field (jsonschema's error path, dotted as in
TOML: ``roles.worker.instances``) and the reason: unknown keys, wrong types, missing required fields, timings the
catalogue needs, ``[timings_env]`` keys without a ``[timings]`` value, role commands whose program is not found,
``[failpoints]`` windows mapped to roles that do not exist, no consumer role, a ``CHANGE-ME`` left from the
skeleton. ``harness grade`` runs it first and refuses an adapter with problems.

What can run but cannot prove everything is a warning, never a refusal: an optional timing left out (an
implementation with no lease or no sweeper cannot declare one truthfully), a requirement no scenario can prove, a
topology no role may have declared while the consumers are held. And it prints the **proof plan**: per checklist row
of the graded level, whether this adapter can prove it and, if not, what is missing (a capability such as
failpoints, events or a dead-letter queue, a timing, a ``[timings_env]`` entry, an expiry metric).
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
from . import vocabulary as vocab
from . import checkers as _checkers
from .nemesis import timings_needed
from .schemas import validator

SKELETON = "adapter_skeleton.toml"
SCHEMA = "adapter.schema.json"

# Checkers that say `unknown` without a timing, and whether they do so in every scenario or only in the scenarios
# that name them in `checks` (where what they need happens: a consumer crash, a pause, orphans, a held consumer):
# computed from the checkers' own declarations (`TIMINGS`, `TIMINGS_IN_EVERY_SCENARIO` in each module of
# harness/checkers/). tests/unit/harness/test_harness_adapter_check.py keeps those in step with their sources.
TIMING_CHECKERS: dict[str, tuple[str, ...]] = _checkers.timing_checkers()
EVERY_SCENARIO = {name for name, flag in _checkers.declarations("TIMINGS_IN_EVERY_SCENARIO").items() if flag}
# Timings an adapter may leave out without a problem (added after adapters were written): without one, the scenarios
# that scale with it are skipped and its checks say unknown — a warning, never a refusal to grade. lease_seconds
# too: an implementation with no lease (a plain Celery worker) cannot declare one truthfully, and without it no
# grade can be valid anyway (BE-JOB-006 is left unprovable, a warning of its own), while a refusal would hide its
# other faults.
OPTIONAL_TIMINGS = {"stale_queued_seconds", "retry_base_seconds", "retry_cap_seconds", "lease_seconds",
                    # An implementation without a sweeper (no staging cleanup: a plain Celery deployment) is graded
                    # too: the rows staging_safety proves are named not provable, and the rest is judged.
                    "staging_retention_seconds", "sweep_interval_seconds"}
# Checkers that say `unknown` without a capability or an adapter field, and what is missing (their `NEEDS`).
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    name: tuple(tuple(need) for need in needs) for name, needs in _checkers.declarations("NEEDS").items()}
# Words the skeleton leaves for the author to replace: a grade with one of them left in never means anything.
PLACEHOLDERS = ("CHANGE-ME", "CHANGE_ME")

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
    plan: list["PlanRow"] = field(default_factory=list)  # per checklist row: provable by this adapter, or what lacks

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
        elif e.validator == "pattern" and isinstance(e.instance, str):
            report.add(field_name(path), _pattern_reason(e.validator_value, e.instance) or e.message)
        else:
            report.add(field_name(path), e.message)


def _pattern_reason(pattern: str, value: str) -> str | None:
    """What is wrong with a value its pattern refused, for the patterns of the adapter's own vocabulary."""
    if pattern == vocab.ENV_VALUE_PATTERN:
        unknown = vocab.unknown_references(value)
        what = (f"unknown variable {', '.join('${' + n + '}' for n in unknown)}" if unknown else
                "a $ that is neither ${NAME} nor $$ (a literal $)")
        return f"{what} in {_short(value)} (known: {', '.join(vocab.KNOWN_VARIABLES)})"
    if pattern == vocab.DURATION_PATTERN:
        return (f"not a duration: {_short(value)} (seconds as a number, or a string: \"250ms\", \"30s\", \"5m\", "
                "\"2h\", ISO 8601 \"PT30S\")")
    if pattern == vocab.EVENTS_SQL_PATTERN:
        return "the query must take the attachment's id as %(attachment_id)s"
    return None


# --- what the schema cannot say -----------------------------------------------------------------------------------

def _placeholder_problems(raw, report: Report, path: tuple = ()) -> None:
    """Every value still holding the skeleton's CHANGE-ME: refused (a work queue named CHANGE-ME is never observed,
    a description saying CHANGE-ME is a forgotten field)."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            _placeholder_problems(value, report, (*path, key))
    elif isinstance(raw, list):
        for index, value in enumerate(raw):
            _placeholder_problems(value, report, (*path, index))
    elif isinstance(raw, str) and any(p in raw for p in PLACEHOLDERS):
        report.add(field_name(path), f"still holds the skeleton's placeholder ({_short(raw)}): put your own value "
                                     "here, or delete the field if your implementation has no such thing")


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


def held_from_start(scenario) -> bool:
    """Whether the scenario holds every consumer from before the workload: they never start until released."""
    return any(f.get("action") in ("hold", "permute") and "@consumers" in (f.get("hold") or [])
               and f.get("at") is None and f.get("when") is None for f in scenario.raw.get("faults") or [])


def _topology_warnings(sut: adapter_mod.Adapter, catalogue, level: int, report: Report) -> None:
    """Without a setup command, the adapter cannot say who declares the work queue. If only a consumer declares it,
    it does not exist while a scenario holds every consumer from the start: every publish then is unroutable —
    confirmed by the broker, yet lost (CONTRACT §4)."""
    from .scenarios import for_grade

    if sut.setup and not sut.setup_template:
        return
    chosen, _ = for_grade(catalogue, sut, level)
    held = [s for s in chosen if held_from_start(s)]
    if not held:
        return
    queue = _table(sut.raw, "broker").get("work_queue")
    producers = sut.expand_roles(["@producers"])
    # [setup] template = true: the command runs once, in a template database; a tenant's broker never sees it.
    report.warnings.append(Problem("setup", (
        ("[setup] template = true (the setup command runs once, against a template database: it declares nothing "
         "in a tenant's broker)" if sut.setup else "no [setup] command")
        + f": the work queue {queue!r} and its bindings must exist before the first publish, "
        f"declared by a role that is never held (a producer: {', '.join(producers) or 'the HTTP role'}). If only a "
        f"consumer role ({', '.join(sut.roles_flagged('consumer'))}) declares it, it does not exist while "
        f"{_names(held)} hold every consumer from the start: those publishes are unroutable (confirmed, yet lost)")))


def _capability_warnings(sut: adapter_mod.Adapter, catalogue, level: int, report: Report) -> None:
    """A check a scenario declares that this adapter cannot feed (events, an expiry metric) leaves that scenario, and
    so each requirement it names, unknown: say which, before the grade runs. (Timings: _timing_problems.)"""
    from .scenarios import for_grade

    chosen, _ = for_grade(catalogue, sut, level)
    by_lack: dict[str, list] = {}
    for s in chosen:
        for check in s.checks or []:
            for need, label in NEEDS.get(check, ()):
                if not (sut.expiry.get("metric") if need == "expiry.metric" else sut.has(need)):
                    by_lack.setdefault(label, []).append((s, check))
    for label, pairs in by_lack.items():
        checks = sorted({c for _, c in pairs})
        scenarios = list({s.name: s for s, _ in pairs}.values())
        requirements = sorted({r for s in scenarios for r in s.raw["requirements"]})
        report.warnings.append(Problem(label.split(" ")[0], (
            f"not provided: {', '.join(checks)} would be unknown in {len(scenarios)} scenarios that run "
            f"({_names(scenarios)}), so {', '.join(requirements)} would be unknown ({label})")))


# --- the proof plan -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanRow:
    id: str
    provable: bool
    why: str  # by which scenarios, or what is missing

    def __str__(self) -> str:
        return f"  {self.id:13} {'provable' if self.provable else 'NOT PROVABLE':13} {self.why}"


def check_lacks(sut: adapter_mod.Adapter, scenario, check: str) -> list[str]:
    """What this adapter lacks for ``check`` to be judged in ``scenario`` (empty: nothing): a timing it does not
    declare (and the scenario does not set), a capability, an adapter field."""
    lacks = []
    overridden = scenario.raw.get("timings") or {}
    for name, checkers in TIMING_CHECKERS.items():
        if check in checkers and sut.timings.get(name) is None and name not in overridden:
            lacks.append(f"timings.{name}")
    for need, label in NEEDS.get(check, ()):
        present = sut.expiry.get("metric") if need == "expiry.metric" else sut.has(need)
        if not present:
            lacks.append(label)
    return lacks


def proof_plan(sut: adapter_mod.Adapter, catalogue, level: int) -> list[PlanRow]:
    """Per checklist row required at ``level``: can a grade with this adapter prove it? A row is proved by a
    scenario provoking it that runs, where one of the row's checks is exercised and valid and none is unknown
    (grade.checklist_rows): so a row is not provable when every scenario provoking it is skipped, or when one of its
    checks cannot be judged in a scenario that runs (it would be unknown)."""
    from .checklist import ITEMS
    from .scenarios import for_grade

    chosen, skipped = for_grade(catalogue, sut, level)
    ran = {s.name for s in chosen}
    reason = {s.name: why for s, why in skipped}
    rows = []
    for item in ITEMS:
        if item.level > level:
            continue
        provoking = [s for s in catalogue if s.in_grade and s.level <= level and item.id in (s.raw.get("verifies") or [])]
        if not provoking:
            rows.append(PlanRow(item.id, False, "no scenario of the catalogue provokes it"))
            continue
        running = [s for s in provoking if s.name in ran]
        if not running:
            rows.append(PlanRow(item.id, False, "every scenario provoking it is skipped: " + "; ".join(
                f"{s.name}: {reason.get(s.name, 'skipped')}" for s in provoking)))
            continue
        blocked = []
        for s in running:
            declared = s.checks
            for check in item.checks:
                if declared is not None and check not in declared:
                    continue
                lacks = check_lacks(sut, s, check)
                if lacks:
                    blocked.append(f"{s.name}: {check} needs {', '.join(lacks)}")
        if blocked:
            rows.append(PlanRow(item.id, False, "its check would be unknown: " + "; ".join(blocked)))
            continue
        approximate = [s.name for s in running if s.raw.get("exactness") == "approximate"]
        note = f" ({', '.join(approximate)}: approximate window)" if approximate else ""
        rows.append(PlanRow(item.id, True, "by " + ", ".join(s.name for s in running) + note))
    # A requirement also needs every scenario naming it to be judged: a check it declares that this adapter cannot
    # feed (a staging timing without a sweeper, events) leaves that scenario, and the requirement, unknown.
    blocked_req: dict[str, dict[str, list[str]]] = {}
    for s in chosen:
        for check in s.checks or []:
            lacks = check_lacks(sut, s, check)
            if lacks:
                for rid in s.raw["requirements"]:
                    blocked_req.setdefault(rid, {}).setdefault(f"{check} needs {', '.join(lacks)}", []).append(s.name)
    for rid in sorted({item.requirement for item in ITEMS if item.level <= level}):
        if rid in blocked_req:
            rows.append(PlanRow(rid, False, "the requirement would be unknown: " + "; ".join(
                f"{why} (in {', '.join(names)})" for why, names in blocked_req[rid].items())))
    return rows


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
        *_vocabulary_lines(sut),
        "windows -> roles" + (" (failpoints)" if sut.has("failpoints") else " (timed SIGKILL, no failpoints)") + ":",
        *[f"  {w:30} -> {r or '(no role: scenarios needing it are skipped)'}" for w, r in windows.items()],
        f"at level {level}: {len(chosen)} scenarios run, {len(skipped)} skipped",
        *[f"  run   {s.name}" for s in chosen],
        *[f"  skip  {s.name}: {why}" for s, why in skipped],
    ]
    return lines


def _vocabulary_lines(sut: adapter_mod.Adapter) -> list[str]:
    """How the harness will speak to this implementation: its state names, paths, where transitions and metrics are
    read, the variables it maps with ${NAME}."""
    words = sut.vocabulary
    lines = []
    if words.states:
        lines.append("states: " + ", ".join(f"{theirs} -> {ours}" for theirs, ours in words.states.items()))
    lines.append(f"paths: upload POST {words.upload_path()}, status GET {words.status_path('{id}')}")
    if sut.events_sql:
        lines.append("events: read by the harness from the database ([events] sql, read only)")
    elif sut.has("events"):
        lines.append(f"events: GET {words.events_path('{id}')}")
    metric_roles = [sut.http.get("role", "api"), *((sut.raw.get("metrics") or {}).get("roles") or [])]
    lines.append("metrics: " + ", ".join(f"{r} {sut.metrics_path(r)}" for r in dict.fromkeys(metric_roles)))
    mapped = sorted({f"{k}={v}" for _, table in sut.env_tables() for k, v in table.items()
                     if isinstance(v, str) and vocab.references(v)})
    if mapped:
        lines.append("environment mapped: " + ", ".join(mapped))
    return lines


def _vocabulary_warnings(sut: adapter_mod.Adapter, report: Report) -> None:
    """What the adapter says that the harness will not use."""
    entry = (sut.raw.get("timings_env") or {}).get("max_attempts")
    if isinstance(entry, dict) and entry.get("unit", "s") != "s":
        report.warnings.append(Problem("timings_env.max_attempts.unit", "max_attempts is a count, not a duration: "
                                       "the harness writes it as a plain integer whatever the unit"))
    if sut.events_sql and (sut.raw.get("paths") or {}).get("events"):
        report.warnings.append(Problem("paths.events", "not read: [events] sql is set, and the harness reads the "
                                       "transitions from the database"))
    if sut.events_sql and (sut.raw.get("capabilities") or {}).get("events") is False:
        report.warnings.append(Problem("capabilities.events", "false, but [events] sql is set: the harness reads "
                                       "the transitions with the query (events counts as provided)"))


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
    _placeholder_problems(raw, report)
    if not isinstance(raw.get("roles"), dict):
        return report
    sut = adapter_mod.Adapter(path=path, raw=raw)
    _program_problems(sut, raw, report)
    _vocabulary_warnings(sut, report)
    claimed = raw.get("level") if raw.get("level") in (3, 4, 5) else 5
    level = int(level or claimed)
    try:
        from .scenarios import catalogue

        scenarios = catalogue()
        _timing_problems(sut, scenarios, level, report)
        _coverage_problems(sut, scenarios, level, report)
        report.plan = proof_plan(sut, scenarios, level)
        _topology_warnings(sut, scenarios, level, report)
        _capability_warnings(sut, scenarios, level, report)
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
    plan, unprovable = [], [r for r in report.plan if not r.provable]
    if report.plan:
        plan = [f"proof plan (checklist rows of the graded level, then requirements): "
                f"{len(report.plan) - len(unprovable)} provable, {len(unprovable)} not provable with this adapter",
                *(str(r) for r in report.plan)]
    if report.ok:
        head = f"{where}: OK" + (f" ({len(warnings)} warnings)" if warnings else "")
        if unprovable:
            head += (f"; but not provable with this adapter, so a full grade cannot be valid: "
                     f"{', '.join(r.id for r in unprovable)} (see the proof plan)")
        return "\n".join([head, *warnings, *report.summary, *plan])
    count = len(report.problems)
    return "\n".join([*(str(p) for p in report.problems), *warnings, *plan,
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
