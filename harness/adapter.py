"""Adapter files: how to run one implementation under test (CONTRACT §9, schemas/adapter.schema.json)."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import vocabulary as vocab
from .schemas import REPO_ROOT, SchemaDocument, errors

WINDOWS = (
    "after_staging_before_record",
    "after_commit_before_publish",
    "after_publish_before_confirm",
    "after_s3_write_before_commit",
    "after_commit_before_ack",
)
from .defaults import DEFAULT_WINDOW_ROLES as DEFAULT_WINDOW_ROLES  # noqa: E402 - re-exported


class AdapterError(ValueError):
    pass


@dataclass(frozen=True)
class Role:
    name: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    instances: int = 1
    consumer: bool = False
    recovers_work: bool = False
    stop_timeout_seconds: float = 5.0
    metrics_path: str | None = None  # where this role's metrics page is, when not [metrics] path / [http] metrics_path


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
                recovers_work=bool(spec.get("recovers_work", name == "sweeper")),
                stop_timeout_seconds=float(spec.get("stop_timeout_seconds", 5)),
                metrics_path=spec.get("metrics_path"),
            )
        return out

    @property
    def setup(self) -> dict | None:
        return self.raw.get("setup")

    @property
    def setup_template(self) -> bool:
        """[setup] template = true: the setup command only prepares the database (no broker or bucket state), so a
        database it set up once may be cloned for each tenant (harness/run_setup.py ``database_template``)."""
        return bool(self.setup) and self.setup.get("template") is True

    @property
    def http(self) -> dict:
        return {"port": 0, "role": "api", "health_path": "/healthz", "startup_timeout_seconds": 30,
                **(self.raw.get("http") or {})}

    @property
    def broker(self) -> dict:
        return dict(self.raw["broker"])

    @property
    def capabilities(self) -> dict[str, bool]:
        declared = {"failpoints": False, "replay": False, "events": True, **(self.raw.get("capabilities") or {})}
        if self.events_sql:  # [events] sql: the harness reads the transitions from the database instead of GET /events
            declared["events"] = True
        return {**declared, "versions": bool(self.raw.get("versions"))}  # level 5: the optional [versions] table

    def has(self, capability: str) -> bool:
        return bool(self.capabilities.get(capability))

    @property
    def failpoint_roles(self) -> dict[str, str]:
        mapped = {w: self.window_role(w) for w in WINDOWS}
        return {**{w: r for w, r in mapped.items() if r}, **(self.raw.get("failpoints") or {})}

    @property
    def timings(self) -> dict:
        """The declared timings in seconds (a duration written "250ms", "30s", "5m" or "PT30S" is converted)."""
        out = {}
        for key, value in (self.raw.get("timings") or {}).items():
            try:
                out[key] = vocab.seconds(value) if isinstance(value, str) else value
            except vocab.VocabularyError as exc:
                raise AdapterError(f"timings.{key}: {exc}") from None
        return out

    @property
    def timings_env(self) -> dict[str, str]:
        """Timing name -> the environment variable that sets it, so a scenario can override it (e.g. a short TTL)."""
        return {k: (v["env"] if isinstance(v, dict) else v) for k, v in (self.raw.get("timings_env") or {}).items()}

    def timing_unit(self, name: str) -> str:
        """The unit the variable of ``[timings_env] name`` takes: ``s`` unless its entry says ``unit``."""
        entry = (self.raw.get("timings_env") or {}).get(name)
        return entry.get("unit", "s") if isinstance(entry, dict) else "s"

    def timing_value(self, name: str, value) -> str:
        """A timing (seconds, or a count) as its ``[timings_env]`` variable wants it."""
        if name == "max_attempts":  # a count, not a duration
            return str(value)
        return vocab.format_duration(value, self.timing_unit(name))

    def timing_overrides(self, overrides: dict) -> tuple[dict, dict[str, str]]:
        """(effective timings, env to add) for a scenario's ``[timings]``; AdapterError if one cannot be set."""
        lacking = sorted(k for k in overrides if k not in self.timings_env)
        if lacking:
            raise AdapterError(f"adapter {self.name} declares no [timings_env] variable for {', '.join(lacking)}")
        return ({**self.timings, **overrides},
                {self.timings_env[k]: self.timing_value(k, v) for k, v in overrides.items()})

    # --- the service's own vocabulary (harness/vocabulary.py) --------------------------------------------------

    @property
    def vocabulary(self) -> vocab.Vocabulary:
        """State names ([vocabulary] states) and API paths ([paths]) of this implementation."""
        return vocab.Vocabulary.from_raw(self.raw)

    @property
    def events_sql(self) -> str | None:
        """[events] sql: the read-only query that returns an attachment's transitions (instead of GET /events)."""
        return (self.raw.get("events") or {}).get("sql") or None

    def events_reader(self, env_direct: dict, env_roles: dict | None = None):
        """A reader of the transitions from the implementation's database (harness/events_sql.py), or None when the
        adapter has no [events] sql. It connects to the direct address (no fault cuts it) with the credentials the
        roles get (``env_roles``: the tenant's own database role), never the stack's administrator: the query is the
        submission's, and a superuser's read-only transaction could still read the server's files."""
        if not self.events_sql or not env_direct.get("DATABASE_URL"):
            return None
        from .events_sql import SqlEvents, with_credentials_of

        url = env_direct["DATABASE_URL"]
        if env_roles and env_roles.get("DATABASE_URL"):
            url = with_credentials_of(url, env_roles["DATABASE_URL"])
        return SqlEvents(url, self.events_sql)

    def metrics_path(self, role: str) -> str:
        """Where ``role`` serves its metrics: its own ``metrics_path``, else ``[http] metrics_path`` for the HTTP role
        and ``[metrics] path`` for the others, else /metrics."""
        spec = (self.raw.get("roles") or {}).get(role) or {}
        if spec.get("metrics_path"):
            return spec["metrics_path"]
        if role == self.http.get("role", "api"):
            return (self.raw.get("http") or {}).get("metrics_path") or "/metrics"
        return (self.raw.get("metrics") or {}).get("path") or "/metrics"

    def env_tables(self) -> list[tuple[str, dict]]:
        """Every environment table of the adapter, with its TOML name: where ``${VAR}`` may be used."""
        tables = [("env", self.raw.get("env") or {}), ("setup.env", (self.raw.get("setup") or {}).get("env") or {}),
                  ("metrics.env", (self.raw.get("metrics") or {}).get("env") or {}),
                  ("versions.consumer_env", (self.raw.get("versions") or {}).get("consumer_env") or {})]
        tables += [(f"roles.{name}.env", spec.get("env") or {}) for name, spec in (self.raw.get("roles") or {}).items()
                   if isinstance(spec, dict)]
        return [(where, table) for where, table in tables if isinstance(table, dict)]

    @property
    def interpolated_keys(self) -> frozenset[str]:
        """The variables the adapter declares with a ``$`` in their value (``${VAR}`` references, ``$$``)."""
        return frozenset(k for _, table in self.env_tables() for k, v in table.items()
                         if isinstance(v, str) and "$" in v)

    def interpolate_env(self, env: dict) -> dict:
        """A process's environment with the adapter's ``${VAR}`` references resolved from that environment itself (a
        role with a proxy of its own sees its own port in ``${DATABASE_PORT}``)."""
        keys = self.interpolated_keys
        if not keys:
            return env
        try:
            return vocab.interpolate_env(env, keys)
        except vocab.VocabularyError as exc:
            raise AdapterError(str(exc)) from None

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

    def version_env(self, version: int) -> dict[str, str]:
        """Level 5: the environment that makes a consumer instance run pipeline version ``version``."""
        env = (self.raw.get("versions") or {}).get("consumer_env") or {}
        return {k: str(v).replace("{version}", str(int(version))) for k, v in env.items()}

    @property
    def reprocess_path(self) -> str | None:
        return (self.raw.get("versions") or {}).get("reprocess_path")

    def roles_flagged(self, flag: str) -> list[str]:
        return sorted(name for name, role in self.roles.items() if getattr(role, flag))

    def window_role(self, window: str) -> str | None:
        """The role hosting a failure window: the adapter's ``[failpoints]`` map, else the usual layout when the
        adapter has a role of that name (a relay may live inside the API: then the adapter must say so)."""
        role = (self.raw.get("failpoints") or {}).get(window) or DEFAULT_WINDOW_ROLES.get(window)
        return role if role in self.raw["roles"] else None

    def expand_roles(self, names: list[str], windows: list[str] = ()) -> list[str]:
        """Role names with the groups a scenario may name instead, so scenarios never assume role names:
        ``@consumers`` (roles flagged ``consumer``), ``@recovers_work`` (roles flagged ``recovers_work``) and
        ``@window`` (the role hosting the scenario's window) and ``@producers`` (the HTTP role, which accepts uploads
        and creates their jobs, and the roles hosting the publish windows, which publish them)."""
        producers = [self.http["role"]] + [self.window_role(w) for w in ("after_commit_before_publish",
                                                                         "after_publish_before_confirm")]
        groups = {"@consumers": self.roles_flagged("consumer"), "@recovers_work": self.roles_flagged("recovers_work"),
                  "@window": [r for r in (self.window_role(w) for w in windows) if r],
                  "@producers": list(dict.fromkeys(r for r in producers if r and r in self.raw["roles"]))}
        out: list[str] = []
        for name in names:
            for role in groups.get(name, [name]):
                if role not in out:
                    out.append(role)
        return out

    def placeholders(self) -> dict[str, str | None]:
        """What ``{python}``, ``{adapter_dir}`` and ``{repo}`` stand for in commands (``{repo}``: None outside a
        checkout of this repository)."""
        return {"python": sys.executable, "adapter_dir": str(self.directory),
                "repo": str(REPO_ROOT) if REPO_ROOT is not None else None}

    def expand(self, part: str) -> str:
        """One command word with its placeholders expanded; AdapterError naming an unknown or unusable one."""
        subst = self.placeholders()

        class _Lookup(dict):
            def __missing__(self, key):
                if key in subst:  # {repo} outside a checkout
                    raise AdapterError(f"{{{key}}} in {part!r} names the harness's repository checkout, and this "
                                       "harness runs from an installed package: use {adapter_dir} (the adapter "
                                       "file's folder) instead")
                raise AdapterError(f"unknown placeholder {{{key}}} in {part!r} (known: "
                                   + ", ".join("{" + k + "}" for k in sorted(subst)) + ")")

        try:
            return part.format_map(_Lookup({k: v for k, v in subst.items() if v is not None}))
        except AdapterError:
            raise
        except (ValueError, IndexError) as exc:  # a stray brace, a positional field
            raise AdapterError(f"cannot expand {part!r}: {exc} (write {{{{ and }}}} for literal braces)") from None

    def resolve_command(self, command: tuple[str, ...] | list[str]) -> list[str]:
        """Expand {python} {adapter_dir} {repo}; find a bare program beside the running interpreter first."""
        out = [self.expand(part) for part in command]
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
            "consumers": self.roles_flagged("consumer"),
            "recovers_work": self.roles_flagged("recovers_work"),
            "failpoints": self.failpoint_roles,
            # The service's own vocabulary, when it maps any (what the history's states were translated from).
            **({"vocabulary": {"states": self.vocabulary.states}} if self.vocabulary.states else {}),
            **({"events_from": "sql"} if self.events_sql else {}),
        }


def resolve_path(path_or_name: str) -> Path:
    """A path to a TOML file or to a folder holding adapter.toml; from a checkout also a name such as ``reference``
    (a folder with adapter.toml at the top of the repository or under tests/broken/)."""
    candidate = Path(path_or_name)
    if candidate.is_file():
        return candidate.resolve()
    if candidate.is_dir() and (candidate / "adapter.toml").is_file():
        return (candidate / "adapter.toml").resolve()
    if REPO_ROOT is None:
        raise AdapterError(f"no adapter file {path_or_name!r}: give a path to an adapter.toml or to its folder (names "
                           "such as `reference` are only known when the harness runs from a checkout of its "
                           "repository; start one with `harness adapter init`)")
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
    missing_roles = sorted({r for r in (raw.get("failpoints") or {}).values() if r not in raw["roles"]})
    if missing_roles:
        raise AdapterError(f"{path}: failpoints mapped to unknown roles {missing_roles}")
    if unknown:
        # More failpoint names are allowed (CONTRACT §7); they are simply not graded windows.
        pass
    _ = adapter.timings  # a duration the schema's pattern let through but that does not parse raises here
    return adapter
