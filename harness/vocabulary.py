"""An implementation's own vocabulary, mapped to the contract's by its adapter file (docs/CONTRACT.md §9): state names
(``[vocabulary] states``), API paths (``[paths]``), ``${VAR}`` references to the harness's variables in
environment values, and durations written as the service writes them (``[timings]``, ``[timings_env]`` units).

Pure functions and one small value class: the observers, the final read, the workload and the supervisor apply them
where they read a state, call a path or start a process; ``harness adapter check`` and the schema refuse what they
cannot map.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

CONTRACT_STATES = ("queued", "processing", "ready", "failed")
TERMINAL_STATES = ("ready", "failed")
DEFAULT_PATHS = {"upload": "/v1/attachments", "status": "/v1/attachments/{id}",
                 "events": "/v1/attachments/{id}/events"}


class VocabularyError(ValueError):
    pass


# --- state names and paths ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Vocabulary:
    """The adapter's state names (theirs -> the contract's) and API paths; the default maps nothing."""

    states: dict = field(default_factory=dict)
    paths: dict = field(default_factory=lambda: dict(DEFAULT_PATHS))

    @classmethod
    def from_raw(cls, raw: dict) -> "Vocabulary":
        states = {str(k): str(v) for k, v in ((raw.get("vocabulary") or {}).get("states") or {}).items()}
        return cls(states=states, paths={**DEFAULT_PATHS, **(raw.get("paths") or {})})

    def state(self, name):
        """The contract's name for a state the service reports; a name it does not map is returned as it is (a
        contract name, or an unknown one that the checkers then judge as such)."""
        if not isinstance(name, str):
            return name
        return self.states.get(name, name)

    def is_unknown(self, name) -> bool:
        """A state the service reported that is neither mapped nor a contract state (``None`` is no state)."""
        return name is not None and self.state(name) not in CONTRACT_STATES

    def body(self, body):
        """A status body with its ``state`` (and each ``versions[].state``) in the contract's names."""
        if not isinstance(body, dict) or not self.states:
            return body
        out = dict(body)
        if "state" in out:
            out["state"] = self.state(out["state"])
        if isinstance(out.get("versions"), list):
            out["versions"] = [{**v, "state": self.state(v.get("state"))} if isinstance(v, dict) and "state" in v
                               else v for v in out["versions"]]
        return out

    def event(self, event):
        """One transition with ``from`` and ``to`` in the contract's names."""
        if not isinstance(event, dict) or not self.states:
            return event
        return {**event, **{k: self.state(event[k]) for k in ("from", "to") if k in event}}

    def path(self, which: str, attachment_id: str | None = None) -> str:
        template = self.paths.get(which) or DEFAULT_PATHS[which]
        return template.replace("{id}", str(attachment_id)) if attachment_id is not None else template

    def upload_path(self) -> str:
        return self.path("upload")

    def status_path(self, attachment_id: str) -> str:
        return self.path("status", attachment_id)

    def events_path(self, attachment_id: str) -> str:
        return self.path("events", attachment_id)


DEFAULT = Vocabulary()


# --- durations ----------------------------------------------------------------------------------------------------

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
# "250ms", "30s", "5m", "2h"; ISO 8601 "PT30S", "PT0.25S", "PT5M", "P1DT2H". Kept in step with the schema's
# $defs/duration pattern (tests/unit/harness/test_harness_vocabulary.py).
DURATION_PATTERN = (rf"^(?:{_NUMBER}(?:ms|s|m|h)|P(?!$)(?:[0-9]+D)?(?:T(?=[0-9])(?:{_NUMBER}H)?(?:{_NUMBER}M)?"
                    rf"(?:{_NUMBER}S)?)?)$")
_SUFFIX = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_ISO = re.compile(rf"^P(?:(?P<d>[0-9]+)D)?(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?$")
UNITS = ("s", "ms", "m", "h", "iso8601")


def seconds(value) -> float | int:
    """A duration of ``[timings]`` in seconds: a number is seconds already; a string is "250ms", "30s", "5m", "2h" or
    ISO 8601 ("PT30S"). VocabularyError for anything else."""
    if isinstance(value, bool):
        raise VocabularyError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        return value
    if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value):
        raise VocabularyError(f"not a duration: {value!r} (seconds as a number, or \"250ms\", \"30s\", \"5m\", "
                              "\"2h\", ISO 8601 \"PT30S\")")
    match = re.fullmatch(rf"({_NUMBER})(ms|s|m|h)", value)
    if match:
        total = float(match.group(1)) * _SUFFIX[match.group(2)]
    else:
        parts = _ISO.fullmatch(value).groupdict()
        total = (float(parts["d"] or 0) * 86400 + float(parts["h"] or 0) * 3600 + float(parts["m"] or 0) * 60
                 + float(parts["s"] or 0))
    total = round(total, 9)
    return int(total) if total == int(total) else total


def _plain(number: float) -> str:
    number = round(float(number), 9)
    return str(int(number)) if number == int(number) else repr(number)


def format_duration(value, unit: str = "s") -> str:
    """A duration in seconds as the environment variable of its ``[timings_env]`` entry wants it: ``s`` (the number
    as written: "0.2"), ``ms`` (whole milliseconds: "200"), ``m``, ``h``, or ``iso8601`` ("PT0.2S")."""
    if unit == "s":
        return str(value)
    total = float(seconds(value))
    if unit == "ms":
        return str(int(math.floor(total * 1000 + 0.5)))
    if unit == "m":
        return _plain(total / 60)
    if unit == "h":
        return _plain(total / 3600)
    if unit == "iso8601":
        return f"PT{_plain(total)}S"
    raise VocabularyError(f"unknown unit {unit!r} (known: {', '.join(UNITS)})")


# --- ${VAR} in environment values ---------------------------------------------------------------------------------

# What the harness gives every role (docs/CONTRACT.md §2), and the parts of its URLs an adapter may need on their
# own (a JDBC URL, AWS_* names): resolved per role instance, from the environment that instance starts with.
HARNESS_VARIABLES = ("DATABASE_URL", "AMQP_URL", "AMQP_URLS", "S3_ENDPOINT_URL", "S3_BUCKET", "S3_ACCESS_KEY",
                     "S3_SECRET_KEY", "HTTP_PORT", "LEVEL", "OPERATOR_TOKEN", "FAILPOINTS", "TMPDIR")
DERIVED_VARIABLES = {
    "DATABASE_HOST": ("DATABASE_URL", "host"), "DATABASE_PORT": ("DATABASE_URL", "port"),
    "DATABASE_NAME": ("DATABASE_URL", "path"), "DATABASE_USER": ("DATABASE_URL", "user"),
    "DATABASE_PASSWORD": ("DATABASE_URL", "password"),
    "AMQP_HOST": ("AMQP_URL", "host"), "AMQP_PORT": ("AMQP_URL", "port"), "AMQP_VHOST": ("AMQP_URL", "vhost"),
    "AMQP_USER": ("AMQP_URL", "user"), "AMQP_PASSWORD": ("AMQP_URL", "password"),
    "S3_HOST": ("S3_ENDPOINT_URL", "host"), "S3_PORT": ("S3_ENDPOINT_URL", "port"),
}
KNOWN_VARIABLES = HARNESS_VARIABLES + tuple(DERIVED_VARIABLES)
# A value of an environment table: "$$" is a literal "$", "${NAME}" one of KNOWN_VARIABLES, any other "$" stands for
# itself unless "{" or "$" follows. The schema's $defs/env_value pattern is this one (a test keeps them equal).
ENV_VALUE_PATTERN = r"^(?:[^$]|\$\$|\$\{(?:" + "|".join(KNOWN_VARIABLES) + r")\}|\$(?![{$]))*$"
_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}?")
# [events] sql takes the attachment's id as a named parameter (the schema's pattern for it).
EVENTS_SQL_PATTERN = r"%\(attachment_id\)s"


def references(value: str) -> list[str]:
    """The names a value refers to with ``${NAME}`` (known or not); ``$$`` is no reference."""
    return [m.group(1) for m in _REFERENCE.finditer(value) if m.group(0) != "$$"]


def unknown_references(value: str) -> list[str]:
    return [name for name in references(value) if name not in KNOWN_VARIABLES]


def _part(url: str, part: str) -> str:
    parts = urlsplit(url)
    if part == "host":
        return parts.hostname or ""
    if part == "port":
        try:
            return str(parts.port) if parts.port is not None else ""
        except ValueError:
            return ""
    if part == "user":
        return unquote(parts.username or "")
    if part == "password":
        return unquote(parts.password or "")
    if part == "path":
        return unquote(parts.path.lstrip("/"))
    if part == "vhost":  # amqp://host and amqp://host/ are the default vhost "/"
        return unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    raise KeyError(part)


def variable(name: str, env: dict) -> str:
    """The value of a known variable in ``env`` (a derived one from its URL); "" when the harness does not set it
    (AMQP_URLS on a one-node stack)."""
    if name in DERIVED_VARIABLES:
        source, part = DERIVED_VARIABLES[name]
        return _part(env[source], part) if env.get(source) else ""
    if name in HARNESS_VARIABLES:
        return str(env.get(name, ""))
    raise VocabularyError(f"unknown variable ${{{name}}} (known: {', '.join(KNOWN_VARIABLES)})")


def interpolate(value: str, env: dict) -> str:
    """``value`` with each ``${NAME}`` replaced by its value in ``env`` and ``$$`` by ``$``."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        if not match.group(0).endswith("}"):
            raise VocabularyError(f"unclosed ${{ in {value!r} (write $$ for a literal $)")
        return variable(match.group(1), env)

    return _REFERENCE.sub(one, value)


def interpolate_env(env: dict, keys) -> dict:
    """``env`` with the values of ``keys`` (the variables the adapter declares) interpolated from ``env`` itself."""
    out = dict(env)
    for key in keys:
        if key in out and isinstance(out[key], str) and "$" in out[key]:
            out[key] = interpolate(out[key], env)
    return out
