"""The history of one run: every client operation, observation and fault, as JSON lines.

Jepsen style: the workload, the observers and the nemesis only *append* facts here;
checkers later read the stored file and nothing else (plus final.json and run.json).
Each line has a sequence number, a monotonic time relative to the run start
(``t``, seconds) and a wall-clock time (``wall``, epoch seconds) so it can be
compared with the server's own timestamps on the same machine.

Line types (field ``type``); the fields of each are typed in events.py, and schemas/history.schema.json is generated
from it:
  invoke / ok / fail / info   a client operation (``op`` id); info = outcome unknown
  transition                  a state transition read from GET /events
  state                       a state observed by polling GET /v1/attachments/{id}
  message                     a message seen on the tap queue
  delivery                    a delivery from the work queue to a consumer, from the firehose (only when traced)
  queue                       a queue-depth sample (ready, unacked)
  consumer                    one consumer of the work queue: prefetch, its channel's unacked
  fault                       a nemesis action (``phase`` start / end / hit)
  role                        a role started / exited / restarted
  phase                       a scenario phase marker (workload, faults, heal, drain ...)
  observe                     what the observers could see: tap queue, firehose, each mirrored binding
  note                        anything else worth keeping
  object                      an object write seen by listing the bucket during the run (key, size, last_modified)
  snapshot                    a result's object read (HEAD) when its attachment was first seen ready
  versions / version_snapshot a change of an attachment's versions[] / a version's object read when it was seen ready
  metrics                     one read of a role instance's /metrics after the drain: the totals the adapter names
  tamper                      the harness's faults re-read while in force (chaos/network.py): a change it did not make
                              (found=changed) or a fault's verification summary (summary=true)
  unroutable                  a publish the broker routed to no queue (the firehose's empty ``routed_queues``): confirmed
                              by the broker and dropped — a message published before its topology existed
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypedDict

from .events import MODELS, unknown_fields
from .formats import canonical_ids, has_upper_uuid

# The fields of each type are typed in events.py (one model per type); schemas/history.schema.json is generated there.
EVENT_TYPES = frozenset(MODELS)

# One history line, as written and as read back: a JSON object with ``seq``, ``t``, ``wall``, ``type`` and the
# fields of its type (module docstring); a loaded one also has ``line``. Kept a plain dict: the file is the schema,
# and a checker reads an absent field as None (``e.get``).
Event = dict[str, Any]


class Operation(TypedDict):
    """A client operation: its ``invoke`` line and its completion (``ok`` / ``fail`` / ``info``), None while open."""

    invoke: Event
    complete: Event | None


class HistoryWriter:
    """Thread-safe append-only JSONL writer; flushes every line so a crash of the harness keeps them.

    ``strict`` (default: the environment variable ``HARNESS_HISTORY_STRICT`` is 1) refuses a field the type's model in
    events.py does not name; runs leave it off, so a field added without its model never stops a grade."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, strict: bool | None = None) -> None:
        self.strict = os.environ.get("HARNESS_HISTORY_STRICT") == "1" if strict is None else strict
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.RLock()  # append_if_open holds it around append
        self._clock = clock
        self._wall = wall
        self._t0 = clock()
        self._seq = 0
        self._faults_started: dict[int, threading.Event] = {}  # fault index -> set at its first start/hit line

    def _fault_started(self, index: int) -> threading.Event:
        with self._lock:
            return self._faults_started.setdefault(index, threading.Event())

    def wait_fault_started(self, index: int, timeout: float) -> bool:
        """Until a ``fault`` line of step ``index`` with phase start or hit is written (another step may wait for
        one: a hold released once the fault it covers is in force), at most ``timeout`` seconds."""
        return self._fault_started(index).wait(timeout)

    def now(self) -> float:
        return round(self._clock() - self._t0, 6)

    def append(self, type_: str, **fields: Any) -> Event:
        if type_ not in EVENT_TYPES:
            raise ValueError(f"unknown history event type {type_!r}")
        if self.strict:
            unknown = unknown_fields(type_, fields)
            if unknown:
                raise ValueError(f"history {type_!r} line: field(s) {unknown} not in its model (harness/events.py)")
        with self._lock:
            self._seq += 1
            line = {"seq": self._seq, "t": self.now(), "wall": round(self._wall(), 6), "type": type_, **fields}
            self._file.write(json.dumps(line, sort_keys=True, default=str) + "\n")
            self._file.flush()
            if type_ == "fault" and fields.get("phase") in ("start", "hit") and isinstance(fields.get("fault"), int):
                self._fault_started(fields["fault"]).set()
            return line

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def append_if_open(self, type_: str, **fields: Any) -> Event | None:
        """``append`` for a writer that may outlive the run (a watcher thread reaping a role at teardown): after
        ``close`` the line is dropped instead of raising in that thread."""
        with self._lock:
            if self._file.closed:
                return None
            return self.append(type_, **fields)

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class History:
    """A loaded history: a list of event dicts, each with ``line`` (1-based line number in the file)."""

    events: tuple[Event, ...]

    @classmethod
    def load(cls, path: Path) -> "History":
        return cls.from_lines(Path(path).read_text(encoding="utf-8").splitlines())

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> "History":
        """The lines as events; UUIDs compared case-insensitively, so each is read in lower case (formats.py): the
        file keeps what the implementation wrote."""
        events: list[Event] = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            event = json.loads(raw)
            if has_upper_uuid(raw):
                event = canonical_ids(event)
            event["line"] = number
            events.append(event)
        return cls(tuple(events))

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> "History":
        """Build a history from dicts (tests, hand-made histories); fills seq/t/wall/line if missing."""
        out: list[Event] = []
        for number, event in enumerate(events, start=1):
            e: Event = {"seq": number, "t": float(number), "wall": 1_700_000_000.0 + number, **canonical_ids(event)}
            e.setdefault("line", number)
            out.append(e)
        return cls(tuple(out))

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of_type(self, *types: str) -> list[Event]:
        """The events of these types, in history order (an index built once: checkers ask this thousands of times
        on a long run's history, which a scan each time made quadratic)."""
        index = self._index()
        if len(types) == 1:
            return list(index.get(types[0], ()))
        return [e for e in self.events if e["type"] in types]

    def of_attachment(self, type_: str, attachment_id: Any) -> list[Event]:
        """The events of ``type_`` naming ``attachment_id``, in history order (indexed once, like ``of_type``)."""
        return self.where(type_, "attachment_id", attachment_id)

    def where(self, type_: str, field: str, value: Any) -> list[Event]:
        """The events of ``type_`` whose ``field`` is ``value``, in history order (indexed once per type and field)."""
        key = ("where", type_, field)
        cache = self._memo()
        if key not in cache:
            by: dict[Any, list[Event]] = {}
            for e in self._index().get(type_, ()):
                value_of = e.get(field)
                if isinstance(value_of, (str, int, float, type(None))):
                    by.setdefault(value_of, []).append(e)
            cache[key] = by
        by_value: dict[Any, list[Event]] = cache[key]
        return list(by_value.get(value, ()))

    def _memo(self) -> dict[Any, Any]:
        """Indexes built once per loaded history (the dataclass is frozen: kept in the instance's ``__dict__``)."""
        cache: dict[Any, Any] = self.__dict__.setdefault("_cache", {})
        return cache

    def _index(self) -> dict[str, list[Event]]:
        cache = self._memo()
        if "type" not in cache:
            index: dict[str, list[Event]] = {}
            for e in self.events:
                index.setdefault(e["type"], []).append(e)
            cache["type"] = index
        by_type: dict[str, list[Event]] = cache["type"]
        return by_type

    def operations(self) -> dict[str, Operation]:
        """Pair every invoke with its completion: op id -> {"invoke": ev, "complete": ev|None}."""
        ops: dict[str, Operation] = {}
        for e in self.events:
            if e["type"] == "invoke":
                ops[e["op"]] = {"invoke": e, "complete": None}
            elif e["type"] in ("ok", "fail", "info") and e.get("op") in ops:
                ops[e["op"]]["complete"] = e
        return ops

    def accepted(self) -> list[tuple[Event, Event]]:
        """(invoke, ok) pairs of uploads that got a 202: the accepted work."""
        return [
            (o["invoke"], o["complete"])
            for o in self.operations().values()
            if o["complete"] is not None and o["complete"]["type"] == "ok" and o["complete"].get("attachment_id")
        ]


def excerpt(event: Event) -> Event:
    """A compact copy of a history line for evidence."""
    keep = {k: v for k, v in event.items() if k not in ("body_raw",)}
    return keep
