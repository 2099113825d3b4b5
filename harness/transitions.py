"""An attachment's transitions as the run saw them: the final ``/events`` read when there is one, else the
transitions the run observed. Shared by the checkers (harness/checkers/base.py re-exports it) and by the fault kinds
that prove from the history that their window was entered (chaos/kinds/_windows.py), below both."""

from __future__ import annotations

from typing import Any

from .formats import epoch
from .history import Event, History

# final.json as stored (the state read from the API and S3 after the drain): a JSON object whose fields are read
# with ``.get`` (a missing one is None, never an error).
FinalState = dict[str, Any]


def final_events(final: FinalState, attachment_id: str | None) -> list[dict[str, Any]]:
    record = final.get("attachments", {}).get(attachment_id) or {}
    return list(record.get("events") or [])


def observed_transitions(history: History, attachment_id: str | None) -> list[Event]:
    return _of_attachment(history, "transition", attachment_id)


def _of_attachment(history: History, type_: str, attachment_id: Any) -> list[Event]:
    """Indexed when the history can (harness.history.History.of_attachment), else a scan (a hand-made history)."""
    if hasattr(history, "of_attachment"):
        return history.of_attachment(type_, attachment_id)
    return [e for e in history.of_type(type_) if e.get("attachment_id") == attachment_id]


def served_version(final: FinalState, attachment_id: str | None) -> Any:
    """The pipeline_version GET served for the attachment at the final read (None when not read)."""
    record = ((final or {}).get("attachments") or {}).get(attachment_id) or {}
    return (record.get("body") or {}).get("pipeline_version")


def of_served_version(events: list[dict[str, Any]], final: FinalState,
                      attachment_id: str | None) -> list[dict[str, Any]]:
    """Level 5: the events of several pipeline versions' jobs share one stream (each names its
    ``pipeline_version``); a path is judged per version, so the per-attachment invariants read the version GET
    serves (else the oldest). ``version_isolation`` judges the versions against each other. One version (or
    events that name none): unchanged."""
    versions: set[Any] = {ev.get("pipeline_version") for ev in events} - {None}
    if len(versions) <= 1:
        return events
    keep = served_version(final, attachment_id)
    if keep not in versions:
        keep = min(versions)
    return [ev for ev in events if ev.get("pipeline_version") in (keep, None)]


def transitions_of(history: History, final: FinalState, attachment_id: str | None) -> list[dict[str, Any]]:
    """The attachment's transitions in commit order: final /events if read, else what the run observed.

    Each item: {"seq", "at" (epoch), "from", "to", "attempt", "actor", "reason", "line" (history line or None)}.
    """
    lines = {(e.get("event_seq")): e["line"] for e in observed_transitions(history, attachment_id)}
    events = final_events(final, attachment_id)
    if not events:
        events = [
            {"seq": e.get("event_seq"), "at": e.get("at_server"), "from": e.get("from"), "to": e.get("to"),
             "attempt": e.get("attempt"), "actor": e.get("actor"), "reason": e.get("reason"),
             "pipeline_version": e.get("pipeline_version")}
            for e in observed_transitions(history, attachment_id)
        ]
    events = of_served_version(events, final, attachment_id)
    out = []
    for ev in sorted(events, key=lambda e: (e.get("seq") is None, e.get("seq") or 0)):
        out.append(
            {
                "seq": ev.get("seq"),
                "at": epoch(ev.get("at")),
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
