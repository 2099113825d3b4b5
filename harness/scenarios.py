"""The declarative scenario catalogue (scenarios/*.toml, schemas/scenario.schema.json)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from .nemesis import timings_needed
from .paths import data_dir
from .schemas import SchemaDocument, errors

# The catalogue: the repository's scenarios/ folder, shipped in the wheel as package data (paths.py).
CATALOGUE_DIR = data_dir("scenarios")


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class Scenario(SchemaDocument):
    path: Path
    raw: dict

    def __getattr__(self, item):
        try:
            return self.raw[item]
        except KeyError:
            raise AttributeError(item) from None


    @property
    def requires(self) -> list[str]:
        return list(self.raw.get("requires") or [])

    @property
    def rabbitmq_nodes(self) -> int:
        """RabbitMQ nodes the scenario needs: more than one is a cluster, which `harness run` starts for it."""
        return int(self.raw.get("rabbitmq_nodes") or 1)

    @property
    def in_grade(self) -> bool:
        return bool(self.raw.get("grade", True))

    @property
    def checks(self) -> list[str] | None:
        return self.raw.get("checks")

    def to_dict(self) -> dict:
        return {**self.raw, "path": str(self.path)}


def load_file(path: Path) -> Scenario:
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from exc
    problems = errors("scenario.schema.json", raw)
    if problems:
        raise ScenarioError(f"{path}: invalid scenario:\n  " + "\n  ".join(problems))
    if raw["name"] != Path(path).stem:
        raise ScenarioError(f"{path}: name {raw['name']!r} must equal the file name")
    return Scenario(Path(path), raw)


def catalogue(directory: Path = CATALOGUE_DIR) -> list[Scenario]:
    return [load_file(p) for p in sorted(Path(directory).glob("*.toml"))]


def find(name: str, directory: Path = CATALOGUE_DIR) -> Scenario:
    if Path(name).is_file():
        return load_file(Path(name))
    for scenario in catalogue(directory):
        if scenario.name == name:
            return scenario
    raise ScenarioError(f"unknown scenario {name!r}; see `harness scenarios`")


def select(scenarios, *, level: int | None = None, requirement: str | None = None, window: str | None = None):
    """Filter: scenarios that prove at most ``level``, name ``requirement``, or hit ``window``."""
    out = []
    for s in scenarios:
        if level is not None and s.level > level:
            continue
        if requirement and requirement not in s.raw["requirements"]:
            continue
        if window and window not in s.raw["windows"]:
            continue
        out.append(s)
    return out


def for_grade(scenarios, adapter, level: int,
              rabbitmq_nodes: int = 1) -> tuple[list[Scenario], list[tuple[Scenario, str]]]:
    """The scenarios a grade at ``level`` runs for ``adapter``, and the ones skipped with the reason.

    A scenario needing a capability the adapter lacks is skipped. A window's timed-SIGKILL twin (``fallback_for``)
    runs beside its failpoint scenario, not only in its place: a failpoint is placed by the implementation, which
    may place it wrong (after the ack it should precede), while the harness's own kill, timed on what it observes,
    is evidence the implementation cannot shape.
    """
    chosen, skipped = [], []
    for s in scenarios:
        if not s.in_grade:
            skipped.append((s, "not part of a grade (run it with `harness run`)"))
            continue
        if s.level > level:
            skipped.append((s, f"proves level {s.level} > {level}"))
            continue
        if s.rabbitmq_nodes > rabbitmq_nodes:
            skipped.append((s, f"needs a {s.rabbitmq_nodes}-node RabbitMQ cluster; the grade's stack has "
                               f"{rabbitmq_nodes} (run it with `harness run {s.name}`, which starts one)"))
            continue
        lacking = [c for c in s.requires if not adapter.has(c)]
        if lacking:
            skipped.append((s, f"adapter lacks {', '.join(lacking)}"))
            continue
        unscalable = sorted(k for k in timings_needed(s.raw["faults"] + list(s.raw.get("clock_skew") or []))
                            if adapter.timings.get(k) is None)
        if unscalable:
            skipped.append((s, f"its faults scale with {', '.join(unscalable)}, which the adapter does not declare"))
            continue
        unsettable = sorted(k for k in (s.raw.get("timings") or {}) if k not in adapter.timings_env)
        if unsettable:
            skipped.append((s, f"adapter cannot set {', '.join(unsettable)} (no [timings_env] entry)"))
            continue
        unmapped = [w for w in s.raw.get("windows") or [] if adapter.window_role(w) is None
                    and any(f.get("role") == "@window" or f.get("action") == "failpoint" for f in s.raw["faults"])]
        if unmapped:
            skipped.append((s, f"adapter maps no existing role to {', '.join(unmapped)} ([failpoints])"))
            continue
        if s.raw.get("clock_skew"):
            from .clock import cannot_skew

            why = cannot_skew(adapter, s.raw)
            if why:
                skipped.append((s, why))
                continue
        chosen.append(s)
    return chosen, skipped
