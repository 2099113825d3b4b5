"""The workload's tail (``[workload.tail]``): uploads sent once the consumers are seen back after a hold or pause.

A scenario that holds or pauses every consumer while uploads arrive needs uploads made after the consumers are back
(expiry-after-backlog, clock-skew-expiry: "work after the release must still reach ready"). A fixed spacing cannot
promise that: on a loaded machine a held consumer took 19 s to start, after the last spaced upload, and every upload
expired (the check was left unknown). The tail waits for the event instead, judged from what the harness recorded
itself (the history file, re-read while it waits):

* the consumers are *back* once no consumer instance is held (``hold_start``/``hold_end`` phases) or paused
  (``sigstop``/``sigcont`` faults) and, after the last release, the broker's firehose showed a delivery or a job was
  seen ``processing`` (``consumers_back``);
* then the tail's uploads go one at a time, each once the previous one ended (a terminal state read from the API) or
  its wait ran out, until one ends ``ready`` that was sent after a claim was seen since the release (so the checkers
  count it as work after the consumers were back), or the tail's uploads are spent.

Pure functions over events (``consumers_back``, ``claim_seen_after``) plus the loop the runner calls in a thread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

TERMINAL = ("ready", "failed")


def role_kind(instance: Any) -> str:
    return str(instance or "").split("#")[0]


def last_release(events: Iterable[dict[str, Any]], consumer_roles: Iterable[str]) -> dict[str, Any] | None:
    """The line that ended the last hold or pause of consumers, or None while one is still in force (or none
    happened)."""
    consumers = set(consumer_roles)
    held: set[Any] = set()
    paused: set[str] = set()
    release = None
    for e in events:
        if e.get("type") == "phase" and e.get("name") in ("hold_start", "hold_end"):
            names = [role_kind(n) for n in (e.get("instances") or [])] + list(e.get("roles") or [])
            if not consumers & set(names):
                continue
            if e["name"] == "hold_start":
                held.add(e.get("fault"))
            else:
                held.discard(e.get("fault"))
                release = e
        elif e.get("type") == "fault" and role_kind(e.get("role")) in consumers:
            if e.get("action") == "sigstop" and e.get("phase") == "start":
                paused.add(str(e.get("role")))
            elif e.get("action") == "sigcont":
                paused.discard(str(e.get("role")))
                release = e
    return None if held or paused else release


def claim_seen_after(events: Iterable[dict[str, Any]], since_wall: float) -> dict[str, Any] | None:
    """The first line at or after ``since_wall`` showing a job ``processing`` (a claim), as the harness saw it."""
    return next((e for e in events if e.get("wall", 0.0) >= since_wall
                 and ((e.get("type") == "transition" and e.get("to") == "processing")
                      or (e.get("type") == "state" and e.get("state") == "processing"))), None)


def consumers_back(events: list[dict[str, Any]], consumer_roles: Iterable[str]) -> dict[str, Any] | None:
    """The first line proving a consumer works after the last release of every consumer (a delivery from the
    broker's firehose, or a claim seen), or None."""
    release = last_release(events, consumer_roles)
    if release is None:
        return None
    return next((e for e in events if e.get("wall", 0.0) >= release["wall"] and e.get("seq", 0) > release.get("seq", 0)
                 and (e.get("type") == "delivery"
                      or (e.get("type") == "transition" and e.get("to") == "processing")
                      or (e.get("type") == "state" and e.get("state") == "processing"))), None)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The history written so far (each line is flushed when written; a torn last line is skipped)."""
    import json

    out: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return out
    for raw in text.splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def run_tail(spec: dict[str, Any], ops: list[Any], *, send: Callable[[Any], dict[str, Any] | None],
             observer: Any, history: Any, consumer_roles: list[str], stopping: Any,
             log: Callable[[str], None] = lambda _m: None) -> None:
    """Wait until the consumers are back (at most ``timeout_seconds``), then send ``ops`` one after another as the
    module docstring says. Records a ``note`` per decision (trigger seen or not, why the tail stopped)."""
    timeout = float(spec.get("timeout_seconds", 60))
    each = float(spec.get("wait_seconds", 20))
    deadline = time.monotonic() + timeout
    back = None
    while back is None and not stopping.is_set():
        back = consumers_back(read_events(history.path), consumer_roles)
        if back is None:
            if time.monotonic() > deadline:
                break
            stopping.wait(0.1)
    if stopping.is_set():
        return
    release = last_release(read_events(history.path), consumer_roles)
    if back is None:
        history.append("note", message="workload tail: the consumers were not seen back; tail sent anyway",
                       seconds=timeout)
    else:
        history.append("note", message="workload tail: consumers seen back", evidence_line=back.get("seq"),
                       evidence_type=back.get("type"), release_seq=(release or {}).get("seq"))
    log(f"workload tail: {len(ops)} uploads at most, one at a time")
    for index, op in enumerate(ops):
        if stopping.is_set():
            return
        claimed = (release is not None
                   and claim_seen_after(read_events(history.path), float(release["wall"])) is not None)
        body = send(op)
        attachment_id = (body or {}).get("attachment_id")
        state = None
        ends = time.monotonic() + each
        while attachment_id and not stopping.is_set() and time.monotonic() < ends:
            try:
                observer.poll_one(attachment_id)
            except Exception:
                pass
            state = observer.states.get(attachment_id)
            if state in TERMINAL:
                break
            stopping.wait(0.1)
        if state == "ready" and claimed:
            history.append("note", message="workload tail: an upload sent after a claim since the release ended "
                                           "ready", attachment_id=attachment_id, sent=index + 1)
            return
    history.append("note", message="workload tail spent: no upload sent after a claim since the release ended ready",
                   sent=len(ops))
