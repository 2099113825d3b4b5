"""Observers: what the harness sees of the implementation without touching its internals.

* :class:`ApiObserver` polls ``GET /v1/attachments/{id}`` and ``/events`` of every
  accepted attachment and records state changes and new transitions.
* :class:`ObjectWatcher` lists the bucket and records every object written.

What the harness sees of the broker (the tap, the consumer sampler, queue depths, the management API) is the
broker seam, :mod:`harness.broker`.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from . import http_clients
from .final_state import utc_text
from .polling import Poller
from .vocabulary import DEFAULT as DEFAULT_VOCABULARY


class ObjectWatcher(Poller):
    """Lists the run's bucket every ``interval`` seconds and records each object write it sees (a new key, or a new
    Last-Modified, size or ETag of a known one): objects overwritten or removed later are still in the history."""

    def __init__(self, s3_env: dict, history, interval: float = 0.25):
        super().__init__("object-watcher", interval)
        from .final_state import s3_client

        self.s3 = s3_client(s3_env)
        self.bucket = s3_env["S3_BUCKET"]
        self.history = history
        self.seen: dict[str, tuple] = {}
        self.lists = 0
        self.base_interval = interval

    def tick(self) -> None:
        token = None
        while True:
            page = self.s3.list_objects_v2(Bucket=self.bucket, **({"ContinuationToken": token} if token else {}))
            for item in page.get("Contents", []):
                modified = utc_text(item["LastModified"])
                mark = (modified, item["Size"], item.get("ETag"))
                if self.seen.get(item["Key"]) != mark:
                    self.seen[item["Key"]] = mark
                    self.history.append("object", key=item["Key"], size=item["Size"], last_modified=modified,
                                        etag=item.get("ETag"))
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
        self.lists += 1
        # A bucket of tens of thousands of objects (a long soak) is listed less often (40 000 objects: every 10 s),
        # so the listing does not take the machine; small runs keep the base interval.
        self.interval = max(self.base_interval, len(self.seen) / 4000.0)


class ApiObserver(Poller):
    """Polls each watched attachment's status (and events) every ``interval``, within a budget of reads a second
    (an unfinished attachment is re-read less often when many are). An attachment that is terminal and did not
    change on its last read is re-read only every ``QUIET_SECONDS`` or more: a regression or a late transition
    still shows (and the final read sees every event), while a grade's API is not kept busy answering for work
    that is done. The harness's own changes (an operator replay) re-read at once (``poll_one``).

    A long run (a soak of thousands of uploads) reads its due attachments on ``POLL_THREADS`` threads, unfinished
    ones first: one thread waiting on each answer in turn was the soak's bottleneck. Reads of one attachment never
    overlap (a lock per attachment), so its lines stay in the order they were seen."""

    QUIET_SECONDS = 1.0
    POLL_THREADS = 8
    SERIAL_UP_TO = 50  # a grade's scenario (tens of uploads) keeps the plain loop on the observer's own thread
    # A long run (a soak of thousands of uploads) re-reads its quiet terminal attachments at most this many per
    # second in all (their re-read period grows with their number): N × duration reads, not one each per second.
    QUIET_READS_PER_SECOND = 50.0
    # A small run (a grade's scenario) reads its unfinished attachments about this many times a second in all: one
    # or a few are read at every tick; a backlog of 40 held uploads every 0.8 s, not 10 times a second each (its
    # transitions are in /events either way). Quiet terminal ones: at most SMALL_QUIET_READS_PER_SECOND in all.
    SMALL_UNFINISHED_READS_PER_SECOND = 50.0
    SMALL_QUIET_READS_PER_SECOND = 20.0

    def __init__(self, base_url: str, history, interval: float = 0.1, events: bool = True, transport=None,
                 vocabulary=None, events_reader=None):
        super().__init__("api-observer", interval)
        self.client = http_clients.client(base_url=base_url, timeout=3, transport=transport)
        self.history = history
        self.events = events
        # The adapter's state names and paths (harness/vocabulary.py), and its [events] sql reader if any: states
        # are recorded in the contract's names, transitions read from the database instead of GET /events.
        self.vocabulary = vocabulary or DEFAULT_VOCABULARY
        self.events_reader = events_reader
        self.unknown_states: set[str] = set()
        self.events_errors = 0
        self._ids: list[str] = []
        self._known: set[str] = set()
        self._lock = threading.Lock()
        self._poll_locks: dict[str, threading.Lock] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._terminal: set[str] = set()
        self.states: dict[str, str] = {}
        self.attempts: dict[str, object] = {}  # attachment -> the attempt its last read reported (sigstop until_claimed)
        self.seen_seq: dict[str, set] = {}
        # attachment -> wall when its last events read began: an event that read did not show happened after it,
        # the harness's own lower bound for when a transition happened (its ``wall`` is only an upper one).
        self.events_read_began: dict[str, float] = {}
        self.first_seen: dict[str, dict[str, float]] = {}  # attachment -> state -> wall when first observed
        self.next_read: dict[str, float] = {}  # attachment -> monotonic time of its next read by tick()
        self.on_ready = None  # called (attachment_id, body) when an attachment is first seen ready (ReadySnapshot)
        # Level 5: called (attachment_id, pipeline_version, variants) when a version of ``versions[]`` is first
        # seen ready; ``versions`` lines record each change of that list.
        self.on_version_ready = None
        self.versions_seen: dict[str, str] = {}

    def watch(self, attachment_id: str) -> None:
        with self._lock:
            if attachment_id not in self._known:  # a set: a 10 000-upload run is not quadratic here
                self._known.add(attachment_id)
                self._ids.append(attachment_id)

    @property
    def ids(self) -> list[str]:
        with self._lock:
            return list(self._ids)

    def tick(self) -> None:
        now = time.monotonic()
        due = [a for a in self.ids if self.next_read.get(a, 0.0) <= now]
        if len(due) <= self.SERIAL_UP_TO or self.POLL_THREADS <= 1:
            for attachment_id in due:
                self.poll_one(attachment_id)
            return
        due.sort(key=lambda a: a in self._terminal)  # the drain waits on the unfinished ones
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.POLL_THREADS, thread_name_prefix="api-observer")
        failed = threading.Event()  # an API that does not answer ends the tick, not one timeout per attachment

        def read(attachment_id: str) -> None:
            if failed.is_set():
                return
            try:
                self.poll_one(attachment_id)
            except Exception:
                failed.set()
                raise

        errors = [f.exception() for f in [self._pool.submit(read, a) for a in due]]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def poll_one(self, attachment_id: str) -> None:
        # Also called by the nemesis while it waits for a trigger: one read of an attachment at a time keeps its
        # record in order (reads of different attachments may overlap).
        with self._poll_locks.setdefault(attachment_id, threading.Lock()):
            self._poll_one(attachment_id)

    def _poll_one(self, attachment_id: str) -> None:
        response = self.client.get(self.vocabulary.status_path(attachment_id))
        if response.status_code != 200:
            return
        reported = response.json()
        body = self.vocabulary.body(reported)
        state = body.get("state")
        self._note_unknown(attachment_id, reported.get("state") if isinstance(reported, dict) else None, "status")
        changed = state != self.states.get(attachment_id)
        self.attempts[attachment_id] = body.get("attempt")
        if changed and state == "ready" and self.on_ready is not None:
            try:  # before the state is recorded: a job picked as `ready` (republish, crash) was snapshotted first
                self.on_ready(attachment_id, body)
            except Exception as exc:
                self.history.append("note", message="snapshot of a ready result failed", error=repr(exc)[:200],
                                    attachment_id=attachment_id)
        if changed:
            self.states[attachment_id] = state
            if state in ("ready", "failed"):
                self._terminal.add(attachment_id)
            else:
                self._terminal.discard(attachment_id)
            self.first_seen.setdefault(attachment_id, {}).setdefault(state, time.time())
            self.history.append("state", attachment_id=attachment_id, state=state, attempt=body.get("attempt"),
                                error_code=body.get("error_code"))
        if isinstance(body.get("versions"), list):
            changed = self._record_versions(attachment_id, body) or changed
        if self.events:
            began = time.time()
            events = self._read_events(attachment_id)
            if events is None:
                return
            not_before = self.events_read_began.get(attachment_id)
            self.events_read_began[attachment_id] = began
            seen = self.seen_seq.setdefault(attachment_id, set())
            for event in events:
                for key in ("from", "to"):
                    self._note_unknown(attachment_id, event.get(key), "event")
                event = self.vocabulary.event(event)
                if event.get("seq") in seen:
                    continue
                seen.add(event.get("seq"))
                changed = True
                self.history.append("transition", attachment_id=attachment_id, event_seq=event.get("seq"),
                                    at_server=event.get("at"), attempt=event.get("attempt"),
                                    actor=event.get("actor"), reason=event.get("reason"),
                                    **{"from": event.get("from"), "to": event.get("to")},
                                    **({"not_before_wall": not_before} if not_before is not None else {}),
                                    **({"pipeline_version": event["pipeline_version"]}
                                       if event.get("pipeline_version") is not None else {}))
                self.first_seen.setdefault(attachment_id, {}).setdefault(event.get("to"), time.time())
        quiet = state in ("ready", "failed") and not changed
        unfinished = len(self._known) - len(self._terminal)
        if len(self._known) <= self.SERIAL_UP_TO:
            quiet_period = max(self.QUIET_SECONDS, len(self._terminal) / self.SMALL_QUIET_READS_PER_SECOND)
            waiting = 0.0 if changed else unfinished / self.SMALL_UNFINISHED_READS_PER_SECOND
        else:
            quiet_period = max(self.QUIET_SECONDS, len(self._known) / self.QUIET_READS_PER_SECOND)
            # Unchanged and not terminal, in a long run: at most once a second, and (a backlog of thousands) spread
            # so that all unfinished reads stay near 4 × QUIET_READS_PER_SECOND a second.
            waiting = 0.0 if changed else max(self.QUIET_SECONDS, unfinished / (4 * self.QUIET_READS_PER_SECOND))
        self.next_read[attachment_id] = time.monotonic() + (quiet_period if quiet else waiting)

    def _read_events(self, attachment_id: str) -> list | None:
        """The attachment's transitions as the service reports them: GET …/events (the adapter's path), or the
        adapter's [events] sql on its database. None when they could not be read this time."""
        if self.events_reader is None:
            response = self.client.get(self.vocabulary.events_path(attachment_id))
            if response.status_code != 200:
                return None
            return response.json().get("events", [])
        try:
            return self.events_reader.read(attachment_id)
        except Exception as exc:
            self.events_errors += 1
            if self.events_errors in (1, 10, 100):  # said, not repeated at every poll
                self.history.append("note", message="[events] sql could not be read", error=repr(exc)[:300],
                                    attachment_id=attachment_id, failures=self.events_errors)
            return None

    def _note_unknown(self, attachment_id: str, name, where: str) -> None:
        """A state name the service reported that is neither mapped by the adapter nor a contract state: said once
        per name, with the attachment it was first seen on (state_regression judges it)."""
        if name is None or not self.vocabulary.is_unknown(name) or name in self.unknown_states:
            return
        self.unknown_states.add(name)
        self.history.append("note", message=f"state {name!r} is neither a contract state nor mapped by the "
                            "adapter's [vocabulary] states", state=name, attachment_id=attachment_id, read=where)

    def _record_versions(self, attachment_id: str, body: dict) -> bool:
        """Level 5 (docs/CONTRACT.md): one ``versions`` line per change of the attachment's ``versions[]`` (each
        version's state and the keys and checksums it names), with the version GET serves at that moment."""
        versions = [{"pipeline_version": v.get("pipeline_version"), "state": v.get("state"),
                     "variants": [{"name": x.get("name"), "key": x.get("key"), "sha256": x.get("sha256")}
                                  for x in v.get("variants") or []]}
                    for v in body["versions"] if isinstance(v, dict)]
        if self.on_version_ready is not None:
            for v in versions:
                if v["state"] == "ready":
                    try:
                        self.on_version_ready(attachment_id, v["pipeline_version"], v["variants"])
                    except Exception as exc:
                        self.history.append("note", message="snapshot of a ready version failed",
                                            error=repr(exc)[:200], attachment_id=attachment_id)
        summary = json.dumps([versions, body.get("pipeline_version"), body.get("state")], sort_keys=True)
        if summary == self.versions_seen.get(attachment_id):
            return False
        self.versions_seen[attachment_id] = summary
        self.history.append("versions", attachment_id=attachment_id, served_version=body.get("pipeline_version"),
                            served_state=body.get("state"), versions=versions)
        return True

    def count_in(self, *states: str) -> int:
        return sum(1 for s in self.states.values() if s in states)

    def halt(self) -> None:
        super().halt()
        if self._pool is not None:  # its threads end with the run (a grade runs many)
            self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self.halt()
        self.client.close()
        if self.events_reader is not None:
            self.events_reader.close()
