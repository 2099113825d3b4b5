"""Adapter files: how to run one implementation under test (DESIGN §4, schemas/adapter.schema.json)."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .schemas import REPO_ROOT, SchemaDocument, errors

WINDOWS = (
    "after_staging_before_record",
    "after_commit_before_publish",
    "after_publish_before_confirm",
    "after_s3_write_before_commit",
    "after_commit_before_ack",
)
# Where each window sits when an adapter does not say (the reference's layout).
DEFAULT_WINDOW_ROLES = {
    "after_staging_before_record": "api",
    "after_commit_before_publish": "relay",
    "after_publish_before_confirm": "relay",
    "after_s3_write_before_commit": "worker",
    "after_commit_before_ack": "worker",
}


class AdapterError(ValueError):
    pass


@dataclass(frozen=True)
class Role:
    name: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    instances: int = 1
    consumer: bool = False
    stop_timeout_seconds: float = 5.0


@dataclass(frozen=True)
class Adapter(SchemaDocument):
    path: Path
    raw: dict


    @property
    def directory(self) -> Path:
        return self.path.parent

    @property
    def env(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.raw.get("env") or {}).items()}

    @property
    def roles(self) -> dict[str, Role]:
        out = {}
        for name, spec in self.raw["roles"].items():
            out[name] = Role(
                name=name,
                command=tuple(spec["command"]),
                env={k: str(v) for k, v in (spec.get("env") or {}).items()},
                instances=int(spec.get("instances", 1)),
                consumer=bool(spec.get("consumer", name == "worker")),
                stop_timeout_seconds=float(spec.get("stop_timeout_seconds", 5)),
            )
        return out

    @property
    def setup(self) -> dict | None:
        return self.raw.get("setup")

    @property
    def http(self) -> dict:
        return {"port": 0, "role": "api", "health_path": "/healthz", "startup_timeout_seconds": 30,
                **(self.raw.get("http") or {})}

    @property
    def broker(self) -> dict:
        return dict(self.raw["broker"])

    @property
    def capabilities(self) -> dict[str, bool]:
        return {"failpoints": False, "replay": False, "events": True, **(self.raw.get("capabilities") or {})}

    def has(self, capability: str) -> bool:
        return bool(self.capabilities.get(capability))

    @property
    def failpoint_roles(self) -> dict[str, str]:
        return {**DEFAULT_WINDOW_ROLES, **(self.raw.get("failpoints") or {})}

    @property
    def timings(self) -> dict:
        return dict(self.raw.get("timings") or {})

    @property
    def timings_env(self) -> dict[str, str]:
        """Timing name -> the environment variable that sets it, so a scenario can override it (e.g. a short TTL)."""
        return dict(self.raw.get("timings_env") or {})

    def timing_overrides(self, overrides: dict) -> tuple[dict, dict[str, str]]:
        """(effective timings, env to add) for a scenario's ``[timings]``; AdapterError if one cannot be set."""
        lacking = sorted(k for k in overrides if k not in self.timings_env)
        if lacking:
            raise AdapterError(f"adapter {self.name} declares no [timings_env] variable for {', '.join(lacking)}")
        return ({**self.timings, **overrides},
                {self.timings_env[k]: str(v) for k, v in overrides.items()})

    @property
    def limits(self) -> dict:
        return dict(self.raw.get("limits") or {})

    @property
    def expiry(self) -> dict:
        return {"error_code": "expired", **(self.raw.get("expiry") or {})}

    @property
    def operator_token(self) -> str:
        return (self.raw.get("admin") or {}).get("operator_token") or self.env.get("OPERATOR_TOKEN", "harness-operator")

    @property
    def replay_path(self) -> str:
        return (self.raw.get("admin") or {}).get("replay_path", "/v1/admin/attachments/{id}/replay")

    def resolve_command(self, command: tuple[str, ...] | list[str]) -> list[str]:
        """Expand {python} {adapter_dir} {repo}; find a bare program beside the running interpreter first."""
        subst = {"python": sys.executable, "adapter_dir": str(self.directory), "repo": str(REPO_ROOT)}
        out = [part.format(**subst) for part in command]
        if out and os.sep not in out[0]:
            beside = Path(sys.executable).parent / out[0]
            if beside.exists():
                out[0] = str(beside)
            else:
                found = shutil.which(out[0])
                if found:
                    out[0] = found
        return out

    def summary(self) -> dict:
        """What run.json keeps of the adapter (enough for the checkers)."""
        return {
            "name": self.name,
            "path": str(self.path),
            "level": self.level,
            "capabilities": self.capabilities,
            "timings": self.timings,
            "limits": self.limits,
            "expiry": self.expiry,
            "broker": self.broker,
            "roles": {name: role.instances for name, role in self.roles.items()},
            "consumers": sorted(name for name, role in self.roles.items() if role.consumer),
            "failpoints": self.failpoint_roles,
        }


def resolve_path(path_or_name: str) -> Path:
    """``reference`` (or any name of a folder with adapter.toml under the repo) or a path to a TOML file/folder."""
    candidate = Path(path_or_name)
    if candidate.is_file():
        return candidate.resolve()
    if candidate.is_dir() and (candidate / "adapter.toml").is_file():
        return (candidate / "adapter.toml").resolve()
    for folder in (REPO_ROOT / path_or_name, REPO_ROOT / "tests" / "broken" / path_or_name):
        if (folder / "adapter.toml").is_file():
            return (folder / "adapter.toml").resolve()
    raise AdapterError(f"no adapter file for {path_or_name!r} (give a path to adapter.toml or a known name)")


def load(path_or_name: str | Path) -> Adapter:
    path = resolve_path(str(path_or_name))
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise AdapterError(f"{path}: not valid TOML: {exc}") from exc
    problems = errors("adapter.schema.json", raw)
    if problems:
        raise AdapterError(f"{path}: invalid adapter file:\n  " + "\n  ".join(problems))
    unknown = [w for w in (raw.get("failpoints") or {}) if w not in WINDOWS]
    adapter = Adapter(path=path, raw=raw)
    missing_roles = sorted({r for r in adapter.failpoint_roles.values() if r not in raw["roles"]})
    if adapter.has("failpoints") and missing_roles:
        raise AdapterError(f"{path}: failpoints mapped to unknown roles {missing_roles}")
    if unknown:
        # More failpoint names are allowed (DESIGN §4); they are simply not graded windows.
        pass
    return adapter
