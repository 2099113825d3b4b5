"""Verdicts and the shared read-only views that checkers build from a history.

A checker is a pure function ``check(history, final, run) -> Verdict``:
``history`` a :class:`harness.history.History`, ``final`` the dict stored in
final.json (state read from the API and S3 after draining), ``run`` the dict
stored in run.json (scenario, seed, adapter, level). No I/O, no clocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..history import Event, History
# The checkers' view of an attachment's path (harness/transitions.py, below the fault kinds too), re-exported.
from ..transitions import (
    FinalState as FinalState,
    _of_attachment as _of_attachment,
    final_events as final_events,
    observed_transitions as observed_transitions,
    of_served_version as of_served_version,
    served_version as served_version,
    transitions_of as transitions_of,
)

# final.json (the state read from the API and S3 after the drain) and run.json (scenario, seed, adapter, level), as
# stored: JSON objects whose fields the checkers read with ``.get`` (a missing one is None, never an error).
RunInfo = dict[str, Any]

VALID, INVALID, UNKNOWN = "valid", "invalid", "unknown"
# The run was tampered with: something the harness set up (a fault in force) was changed by someone else while
# it ran (harness/checkers/tamper_evidence.py). Worst of all: nothing else the run shows can be trusted.
TAMPERED = "tampered"
STATUSES = (VALID, INVALID, UNKNOWN, TAMPERED)
TERMINAL_STATES = frozenset({"ready", "failed"})

# CONTRACT §5 reading: an attachment whose job expires before any claim may go queued → failed directly
# (with the expiry error_code: checked by state_regression against the final state).
EXPIRY_TRANSITION = ("queued", "failed")

# CONTRACT §5: the only transitions an attachment may take (from, to).
ALLOWED_TRANSITIONS = frozenset(
    {
        (None, "queued"),
        ("queued", "processing"),
        ("processing", "queued"),
        ("processing", "ready"),
        ("processing", "failed"),
        ("failed", "queued"),  # explicit operator replay (level 4)
        EXPIRY_TRANSITION,
    }
)

LEVEL_VARIANTS = {3: ("thumbnail",), 4: ("thumbnail", "crop", "optimized"), 5: ("thumbnail", "crop", "optimized")}



@dataclass
class Verdict:
    invariant: str
    status: str
    requirements: list[str]
    summary: str
    exercised: bool = True
    evidence: list[dict[str, Any]] = field(default_factory=list)
    seed: int | None = None
    # What this verdict observed that a checklist row names (harness/checklist.py: "check:tag"), e.g. an ack
    # compared with a commit ("ack_vs_commit"), copies of a job that raced ("raced"). Empty: nothing beyond
    # being exercised.
    proves: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def undecided(name: str, requirements: list[str], reason: str, asked: bool, seed: int | None,
              found: Iterable[dict[str, Any]] = (), *,
              unknown_prefix: str = "cannot tell", idle_prefix: str = "not exercised") -> Verdict:
    """Nothing to judge: ``unknown`` where the scenario relies on this check (``asked``), else ``valid`` and not
    exercised — a check that had nothing to look at proves nothing, and fails nothing."""
    if asked:
        return Verdict(name, UNKNOWN, requirements, f"{unknown_prefix}: {reason}", evidence=list(found), seed=seed)
    return Verdict(name, VALID, requirements, f"{idle_prefix}: {reason}", exercised=False, evidence=list(found),
                   seed=seed)


def not_proven(name: str, requirements: list[str], what: str, why: str, run: RunInfo,
               found: list[dict[str, Any]]) -> Verdict:
    """``undecided`` for a check the scenario names among its checks, worded "<what> not proven"."""
    return undecided(name, requirements, why, name in ((run.get("scenario") or {}).get("checks") or []),
                     seed_of(run), found, unknown_prefix=f"{what} not proven", idle_prefix="nothing to judge")


def combine(statuses: list[str]) -> str:
    """tampered beats invalid beats unknown beats valid (an empty list is valid)."""
    if TAMPERED in statuses:
        return TAMPERED
    if INVALID in statuses:
        return INVALID
    if UNKNOWN in statuses:
        return UNKNOWN
    return VALID


def parse_time(value: Any) -> float | None:
    """RFC 3339 string at any fractional precision (harness/formats.py) or epoch number -> epoch seconds (None if
    unparseable)."""
    from ..formats import epoch

    return epoch(value)


def seed_of(run: RunInfo) -> int | None:
    seed: int | None = run.get("seed")
    return seed


def level_of(run: RunInfo) -> int:
    return int(run.get("level") or run.get("adapter", {}).get("level") or 3)


def timings_of(run: RunInfo) -> dict[str, Any]:
    return dict(run.get("adapter", {}).get("timings", {}))


def timing(run: RunInfo, name: str) -> float | None:
    """A timing the adapter declared (or a scenario set), or None: a checker that needs a missing timing says
    unknown, it never falls back to a lenient default."""
    value = timings_of(run).get(name)
    return None if value is None else float(value)


def declared_timing(run: RunInfo, name: str) -> float:
    """A timing the caller knows is declared (it asked ``missing_timings`` first); a missing one is a checker bug."""
    value = timing(run, name)
    if value is None:
        raise ValueError(f"timing {name!r} is not declared")
    return value


def missing_timings(run: RunInfo, *names: str) -> list[str]:
    return [n for n in names if timing(run, n) is None]


def role_kind(role: str | None) -> str:
    """``worker#2`` -> ``worker``: the adapter role an instance belongs to."""
    return (role or "").split("#", 1)[0]


def consumer_roles(run: RunInfo) -> frozenset[str]:
    """Roles that consume the work queue, as the adapter's ``consumer`` flags say (never guessed from names)."""
    return frozenset(run.get("adapter", {}).get("consumers") or ())


def recovering_roles(run: RunInfo) -> frozenset[str]:
    """Roles that recover stuck work (lease expiry), as the adapter's ``recovers_work`` flags say."""
    return frozenset(run.get("adapter", {}).get("recovers_work") or ())


def has_capability(run: RunInfo, name: str) -> bool:
    return bool((run.get("adapter", {}).get("capabilities") or {}).get(name, name == "events"))


def expiry_code(run: RunInfo) -> str:
    code: str = (run.get("adapter", {}).get("expiry") or {}).get("error_code") or "expired"
    return code


def operator_replays(history: History, attachment_id: str | None) -> list[Event]:
    """Replays of this attachment that the harness itself asked for and the implementation accepted (202).
    An operator replay is known from this call, never from the wording of ``actor`` or ``reason``."""
    return [e for e in _of_attachment(history, "ok", attachment_id) if e.get("f") == "replay"]


def attempt_after(trans: list[dict[str, Any]], index: int) -> int | None:
    """The attempt number a (re)queue at ``trans[index]`` starts: the one on the transition itself, or — for an
    implementation that counts attempts at claim (CONTRACT §5) — the one on the next claim, whichever is higher."""
    numbers = [trans[index]["attempt"]]
    claim = next((t for t in trans[index + 1:] if t["to"] == "processing"), None)
    if claim is not None:
        numbers.append(claim["attempt"])
    numbers = [n for n in numbers if isinstance(n, int)]
    return max(numbers) if numbers else None


def accepted_attachments(history: History) -> dict[str, dict[str, Event]]:
    """attachment_id -> {"invoke": ev, "ok": ev} for every upload answered 202 (first acceptance wins)."""
    out: dict[str, dict[str, Event]] = {}
    for invoke, ok in history.accepted():
        out.setdefault(ok["attachment_id"], {"invoke": invoke, "ok": ok})
    return out


def faults(history: History, phase: str | None = None) -> list[Event]:
    return [e for e in history.of_type("fault") if phase is None or e.get("phase") == phase]


def evidence(message: str, *, attachment_id: Any = None, job_id: Any = None, events: Iterable[Event | None] = (),
             **extra: Any) -> dict[str, Any]:
    """One evidence item: what, which ids, which history lines (with times), plus any extra facts."""
    item: dict[str, Any] = {"message": message}
    if attachment_id:
        item["attachment_id"] = attachment_id
    if job_id:
        item["job_id"] = job_id
    evs = [e for e in events if e]
    if evs:
        item["lines"] = [e.get("line") for e in evs]
        item["history"] = [{k: v for k, v in e.items() if k not in ("body",)} for e in evs][:6]
        item["t"] = evs[0].get("t")
        item["wall"] = evs[0].get("wall")
    item.update({k: v for k, v in extra.items() if v is not None})
    return item


def final_read_ok(final: FinalState) -> bool:
    return bool(final) and bool(final.get("read_ok", False))


def state_at(trans: list[dict[str, Any]], wall: float) -> str | None:
    """The state a job was in at ``wall`` by its transitions (``transitions_of``), None before the first."""
    state = None
    for t in trans:
        if t["at"] is None or t["at"] > wall:
            break
        state = t["to"]
    return state
