"""Verdicts and the shared read-only views that checkers build from a history.

A checker is a pure function ``check(history, final, run) -> Verdict``:
``history`` a :class:`harness.history.History`, ``final`` the dict stored in
final.json (state read from the API and S3 after draining), ``run`` the dict
stored in run.json (scenario, seed, adapter, level). No I/O, no clocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

VALID, INVALID, UNKNOWN = "valid", "invalid", "unknown"
TERMINAL_STATES = frozenset({"ready", "failed"})

# DESIGN §2: the only transitions an attachment may take (from, to).
ALLOWED_TRANSITIONS = frozenset(
    {
        (None, "queued"),
        ("queued", "processing"),
        ("processing", "queued"),
        ("processing", "ready"),
        ("processing", "failed"),
        ("failed", "queued"),  # explicit operator replay (level 4)
    }
)

LEVEL_VARIANTS = {3: ("thumbnail",), 4: ("thumbnail", "crop", "optimized"), 5: ("thumbnail", "crop", "optimized")}

# Roles whose death loses in-flight deliveries (consumers), used to find crashes that ack-after-commit must survive.
CONSUMER_ROLES = frozenset({"worker"})


@dataclass
class Verdict:
    invariant: str
    status: str
    requirements: list[str]
    summary: str
    exercised: bool = True
    evidence: list[dict[str, Any]] = field(default_factory=list)
    seed: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def combine(statuses: list[str]) -> str:
    """invalid beats unknown beats valid (an empty list is valid)."""
    if INVALID in statuses:
        return INVALID
    if UNKNOWN in statuses:
        return UNKNOWN
    return VALID


def parse_time(value: Any) -> float | None:
    """RFC 3339 / ISO 8601 string or epoch number -> epoch seconds (None if unparseable)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        text = str(value).replace("Z", "+00:00")
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def seed_of(run: dict) -> int | None:
    return run.get("seed")


def level_of(run: dict) -> int:
    return int(run.get("level") or run.get("adapter", {}).get("level") or 3)


def timings_of(run: dict) -> dict:
    return dict(run.get("adapter", {}).get("timings", {}))


def accepted_attachments(history) -> dict[str, dict]:
    """attachment_id -> {"invoke": ev, "ok": ev} for every upload answered 202 (first acceptance wins)."""
    out: dict[str, dict] = {}
    for invoke, ok in history.accepted():
        out.setdefault(ok["attachment_id"], {"invoke": invoke, "ok": ok})
    return out


def final_events(final: dict, attachment_id: str) -> list[dict]:
    record = final.get("attachments", {}).get(attachment_id) or {}
    return list(record.get("events") or [])


def observed_transitions(history, attachment_id: str) -> list[dict]:
    return [e for e in history.of_type("transition") if e.get("attachment_id") == attachment_id]


def transitions_of(history, final: dict, attachment_id: str) -> list[dict]:
    """The attachment's transitions in commit order: final /events if read, else what the run observed.

    Each item: {"seq", "at" (epoch), "from", "to", "attempt", "actor", "reason", "line" (history line or None)}.
    """
    lines = {(e.get("event_seq")): e["line"] for e in observed_transitions(history, attachment_id)}
    events = final_events(final, attachment_id)
    if not events:
        events = [
            {"seq": e.get("event_seq"), "at": e.get("at"), "from": e.get("from"), "to": e.get("to"),
             "attempt": e.get("attempt"), "actor": e.get("actor"), "reason": e.get("reason")}
            for e in observed_transitions(history, attachment_id)
        ]
    out = []
    for ev in sorted(events, key=lambda e: (e.get("seq") is None, e.get("seq") or 0)):
        out.append(
            {
                "seq": ev.get("seq"),
                "at": parse_time(ev.get("at")),
                "at_text": ev.get("at"),
                "from": ev.get("from"),
                "to": ev.get("to"),
                "attempt": ev.get("attempt"),
                "actor": ev.get("actor"),
                "reason": ev.get("reason"),
                "line": lines.get(ev.get("seq")),
            }
        )
    return out


def faults(history, phase: str | None = None) -> list[dict]:
    return [e for e in history.of_type("fault") if phase is None or e.get("phase") == phase]


def evidence(message: str, *, attachment_id=None, job_id=None, events=(), **extra) -> dict:
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


def final_read_ok(final: dict) -> bool:
    return bool(final) and final.get("read_ok", False)
