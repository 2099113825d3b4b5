"""The fields of every history line, one typed model per event type, and the JSON schema generated from them.

A history (``history.py``) is JSON lines ``{seq, t, wall, type, ...}``; the models below name, for each ``type``,
the fields a line of that type may carry and their JSON types. ``Required[...]`` marks a field every line of the
type has; the others appear only where the writer had them (a fault line of a network fault has ``toxic``, one of
a kill has ``pid``). The models are the one place the format is written down:

* ``schemas/history.schema.json`` is generated from them (``python -m harness.events > schemas/history.schema.json``)
  and a unit test fails when the file and the models differ;
* ``HistoryWriter(strict=True)`` (or ``HARNESS_HISTORY_STRICT=1``) refuses a field its type's model does not name;
  runs write without it (a new field never stops a grade), unit tests turn it on (tests/unit/conftest.py), and a
  unit test reads every ``append`` call of harness/, chaos/ and load/ against the models;
* ``python -m harness.events reports/runs/*/history.jsonl`` checks stored histories against it;
* checkers keep reading lines as plain dicts (``history.Event``, ``e.get``): a field absent from a line reads None.

To add a field: add it to its type's model here, regenerate the schema, and write it.
"""

import json
import sys
import types
import typing
from typing import Any, Literal, Required, TypedDict, Union

JSON = dict[str, Any]


class Line(TypedDict, total=False):
    """What every line has, whatever its type: its position, the run's monotonic clock and the wall clock (each
    model below adds its ``type`` and fields)."""

    seq: Required[int]
    t: Required[float]
    wall: Required[float]


# --- client operations (workload.py, chaos kinds that call the API) ------------------------------------------------

class InvokeEvent(Line, total=False):
    """A client operation begins (``op`` id, ``f`` what it does: upload, replay, reprocess, dlq_replay, probe ...)."""

    type: Required[Literal["invoke"]]
    op: Required[str]
    f: Required[str]
    kind: str
    sample: str
    format: str
    filename: str
    size: int
    sha256: str
    idempotency_key: str
    retry_of: str | None
    same_bytes: bool
    probe: str
    of: str
    attachment_id: str
    job_id: str
    pipeline_version: int
    fault: int
    scope: str
    round: int
    state_before: str


class OkEvent(Line, total=False):
    """A client operation completed as asked (``status`` the HTTP status)."""

    type: Required[Literal["ok"]]
    op: Required[str]
    f: Required[str]
    status: Required[int]
    attachment_id: str
    job_id: str
    attempt: int | None
    pipeline_version: int
    fault: int
    repeat_job_id: str
    repeat_status: int
    unauthenticated_status: int | None
    answer: str
    scope: str
    round: int


class FailEvent(Line, total=False):
    """A client operation refused for certain (a 4xx answer: it did not take effect)."""

    type: Required[Literal["fail"]]
    op: Required[str]
    f: Required[str]
    status: Required[int]
    error_code: str
    attachment_id: str
    job_id: str | None
    attempt: int | None
    unauthenticated_status: int | None
    answer: str
    scope: str
    round: int


class InfoEvent(Line, total=False):
    """A client operation whose outcome is unknown (timeout, 5xx, connection error)."""

    type: Required[Literal["info"]]
    f: Required[str]
    op: str
    status: int
    error: str
    error_code: str
    detail: str
    done: bool
    pipeline_version: int
    states: JSON


# --- what the observers saw -----------------------------------------------------------------------------------------

TransitionEvent = TypedDict("TransitionEvent", {  # the functional form: ``from`` is a Python keyword
    "seq": Required[int],
    "t": Required[float],
    "wall": Required[float],
    "type": Required[Literal["transition"]],
    "attachment_id": Required[str],
    "attempt": Required[int],
    "event_seq": Required[int],
    "from": Required[str | None],
    "to": Required[str],
    "actor": Required[str],
    "reason": Required[str | None],
    "at_server": Required[str],
    "pipeline_version": int,
    # When the previous read of the attachment's events began (they did not show this one yet): the transition
    # happened after it. ``wall`` is when the harness first saw it, so the transition lies between the two. Absent on
    # the first read of an attachment.
    "not_before_wall": float,
}, total=False)
TransitionEvent.__doc__ = "A state transition read from the implementation's GET /events."


class StateEvent(Line, total=False):
    """A state observed by polling GET /v1/attachments/{id}."""

    type: Required[Literal["state"]]
    attachment_id: Required[str]
    state: Required[str]
    attempt: Required[int | None]
    error_code: Required[str | None]


class MessageEvent(Line, total=False):
    """A message seen on the harness's tap queue (or the firehose)."""

    type: Required[Literal["message"]]
    source: Required[str]
    exchange: Required[str]
    routing_key: Required[str]
    properties: Required[JSON]
    body: Required[JSON | None]
    body_raw: Required[str | None]


class DeliveryEvent(Line, total=False):
    """A delivery from the work queue to a consumer, read from the broker's firehose (only when traced)."""

    type: Required[Literal["delivery"]]
    queue: Required[str]
    connection: Required[str]
    channel: Required[int]
    redelivered: Required[int]
    sha256: Required[str]
    message_id: Required[str | None]
    job_id: Required[str | None]
    attachment_id: Required[str | None]
    attempt: Required[int | None]


class QueueEvent(Line, total=False):
    """A queue-depth sample (ready, unacked, consumers), or the queue read at a phase (``final``, ``kind``)."""

    type: Required[Literal["queue"]]
    queue: Required[str]
    ready: Required[int | None]
    consumers: Required[int | None]
    dead_letter: Required[bool]
    unacked: int | None
    stats_ready: int | None
    source: str
    kind: str
    final: bool
    running: list[Any]
    stopped: list[Any]
    fault: int
    states: JSON
    messages: list[Any]
    settle: JSON
    node: str
    target: str
    connections_elsewhere: int


class ConsumerEvent(Line, total=False):
    """One consumer of the work queue at a sampling tick: its prefetch and its channel's unacked."""

    type: Required[Literal["consumer"]]
    queue: Required[str]
    tick: Required[int]
    consumers: Required[int]
    consumer_tag: str
    channel: str
    prefetch: int
    unacked: int


class ObserveEvent(Line, total=False):
    """What the observers could see: the tap queue, the firehose, each mirrored binding, clocks, groups."""

    type: Required[Literal["observe"]]
    source: Required[str]
    queue: str
    exchange: str
    routing_key: str
    arguments: JSON
    firehose: bool
    deliveries: bool
    tracing_restored: bool
    clockshift_traced: bool
    consumers: int
    fault: int
    role: str
    pids: list[Any]
    go_binary: bool
    libfaketime_mapped: bool
    offset_seconds: float
    tz: str
    date_header_offset: float
    date_header_url: str
    groups: list[Any]
    reason: str
    status: str
    pending: int
    read: int
    ready: list[Any]


class ObjectEvent(Line, total=False):
    """An object write seen by listing the bucket during the run."""

    type: Required[Literal["object"]]
    key: Required[str]
    size: Required[int]
    etag: Required[str]
    last_modified: Required[str]


class SnapshotEvent(Line, total=False):
    """A variant object read at the moment its attachment was seen ready (ready_snapshot.py)."""

    type: Required[Literal["snapshot"]]
    attachment_id: Required[str]
    pipeline_version: Required[int | None]
    state: Required[str | None]
    variant: Required[str | None]
    key: Required[str]
    exists: Required[bool | None]  # False: no such object; None: the HEAD failed (``error``)
    size: int | None
    etag: str | None
    last_modified: str | None
    version_id: str | None
    error: str


class VersionSnapshotEvent(Line, total=False):
    """A variant object of one pipeline version read when that version was seen ready (level 5)."""

    type: Required[Literal["version_snapshot"]]
    attachment_id: Required[str]
    pipeline_version: Required[int | None]
    variant: Required[str | None]
    key: Required[str]
    exists: Required[bool | None]  # False: no such object; None: the HEAD failed (``error``)
    size: int | None
    etag: str | None
    last_modified: str | None
    version_id: str | None
    error: str


class VersionsEvent(Line, total=False):
    """A change of an attachment's ``versions[]``, with the version GET served at that moment (level 5)."""

    type: Required[Literal["versions"]]
    attachment_id: Required[str]
    versions: Required[list[Any]]
    served_version: Required[int | None]
    served_state: Required[str | None]


class MetricsEvent(Line, total=False):
    """One read of a role instance's /metrics after the drain: the totals the adapter names."""

    type: Required[Literal["metrics"]]
    role: Required[str]
    instance: Required[str]
    url: Required[str]
    alive: Required[bool]
    ok: Required[bool]
    values: Required[JSON]
    error: str


class UnroutableEvent(Line, total=False):
    """A publish the broker confirmed and routed to no queue (the firehose's empty ``routed_queues``)."""

    type: Required[Literal["unroutable"]]
    exchange: Required[str]
    routing_key: Required[str]
    message_id: Required[str | None]
    job_id: Required[str | None]
    attachment_id: Required[str | None]
    attempt: Required[int | None]


# --- what the harness did -------------------------------------------------------------------------------------------

class FaultEvent(Line, total=False):
    """A nemesis action (``phase`` start / end / hit / skipped / failed ...), ``fault`` the scenario step's index."""

    type: Required[Literal["fault"]]
    action: Required[str]
    phase: Required[str]
    fault: int
    params: JSON
    spec: str
    trigger: str | None
    window: str | None
    reason: str
    why: str
    error: str
    # processes and services
    role: str
    instance: str
    pid: int
    returncode: int
    killed: bool | list[Any]
    grace: float
    exit_seconds: float
    ready_seconds: float
    consumers_running: list[Any]
    with_roles: bool
    service: str
    node: str
    leader: str
    leader_after: str | None
    members: list[Any]
    target: str
    connections: JSON
    restored: bool
    how: str
    # network and clocks
    toxic: str
    delay: float
    exactness: str
    applied_wall: float
    # broker messages (duplicates, permutations, replays)
    queue: str
    jobs: list[Any]
    jobs_seen: int
    accepted: int
    published: int
    order: list[Any]
    original: list[Any]
    permuted: list[Any]
    changed: bool
    n: int
    copies: int
    routed: bool | int
    deliveries_traced: bool
    kind: str
    marker: str
    raw: str
    body: JSON | None
    message_id: str
    job_id: str | None
    attachment_id: str
    pipeline_version: int
    state: str
    sha256: str
    # object store
    bucket: str
    denied: str
    probe_code: str
    probe_status: int
    probes: list[Any]
    refused_until_wall: float
    lapsed_wall: float
    reapplied_wall: float


class RoleEvent(Line, total=False):
    """A role instance started / exited / restarted (supervisor.py)."""

    type: Required[Literal["role"]]
    action: Required[str]
    role: Required[str]
    pid: Required[int]
    armed: Required[JSON | None]
    returncode: int | None
    expected: bool
    log_tail: str


class PhaseEvent(Line, total=False):
    """A scenario phase marker (workload, faults, heal, drain ...), with what that phase found."""

    type: Required[Literal["phase"]]
    name: Required[str]
    seconds: float
    fault: int
    roles: list[Any]
    instances: list[Any]
    problems: list[Any]
    repaired: list[Any]
    queue: str
    bucket: str
    lists: int
    errors: int
    last_error: str | None
    ticks: int


class NoteEvent(Line, total=False):
    """Anything else worth keeping; the first note of a run names the scenario, seed, level and fingerprints."""

    type: Required[Literal["note"]]
    message: Required[str]
    scenario: str
    seed: int
    level: int
    sut: str
    schedule_fingerprint: str
    workload_fingerprint: str
    template: str
    setup_seconds: float
    tenant: str
    isolation: JSON
    role: str
    pids: list[Any]
    returncode: int
    seconds: float
    error: str
    fault: int
    attachment_id: str
    attempt: int
    held: JSON
    held_attempt: int | None
    extra_seconds: float
    failures: int
    packets: int
    queue: str
    read: str
    state: str
    window: str
    sent: int
    release_seq: int
    waited_seconds: float
    evidence_line: int
    evidence_type: str


class TamperEvent(Line, total=False):
    """The harness's faults re-read while in force (chaos/network.py): a change it did not make (``found`` changed)
    or one fault's verification summary (``summary`` true)."""

    type: Required[Literal["tamper"]]
    found: Required[str]
    fault: int | str
    kind: str
    link: str
    what: str
    when: str
    expected: JSON | str
    observed: JSON | str
    summary: bool
    checks: int
    unread: int
    ended: str
    in_force_seconds: float
    changes: list[Any]
    packets: int
    ports: list[Any]


MODELS: dict[str, type] = {
    "invoke": InvokeEvent, "ok": OkEvent, "fail": FailEvent, "info": InfoEvent,
    "transition": TransitionEvent, "state": StateEvent, "message": MessageEvent, "delivery": DeliveryEvent,
    "queue": QueueEvent, "consumer": ConsumerEvent, "observe": ObserveEvent, "object": ObjectEvent,
    "snapshot": SnapshotEvent, "version_snapshot": VersionSnapshotEvent, "versions": VersionsEvent,
    "metrics": MetricsEvent, "unroutable": UnroutableEvent,
    "fault": FaultEvent, "role": RoleEvent, "phase": PhaseEvent, "note": NoteEvent, "tamper": TamperEvent,
}

# One history line of any type, for code that builds lines as typed dicts (checkers read them as ``history.Event``).
AnyEvent = Union[InvokeEvent, OkEvent, FailEvent, InfoEvent, TransitionEvent, StateEvent, MessageEvent, DeliveryEvent,
                 QueueEvent, ConsumerEvent, ObserveEvent, ObjectEvent, SnapshotEvent, VersionSnapshotEvent,
                 VersionsEvent, MetricsEvent, UnroutableEvent, FaultEvent, RoleEvent, PhaseEvent, NoteEvent,
                 TamperEvent]

# Every line has these, written by HistoryWriter itself.
COMMON_FIELDS = ("seq", "t", "wall", "type")


def field_types(type_: str) -> dict[str, tuple[Any, bool]]:
    """Each field of ``type_``'s lines: (its Python type, whether every line has it)."""
    model = MODELS[type_]
    hints = typing.get_type_hints(model)
    required: frozenset[str] = vars(model)["__required_keys__"]
    return {name: (hint, name in required) for name, hint in hints.items()}


def fields_of(type_: str) -> frozenset[str]:
    """The field names a line of ``type_`` may carry (the common ones included)."""
    return frozenset(field_types(type_))


def _json_type(hint: Any) -> JSON:
    """The JSON-schema fragment of one annotation."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return {}
    if origin is Literal:
        (value,) = typing.get_args(hint)
        return {"const": value}
    if origin is Union or origin is types.UnionType:
        parts = [_json_type(a) for a in typing.get_args(hint)]
        if all(set(p) == {"type"} for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    base = origin or hint
    names = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null",
             dict: "object", list: "array"}
    if base in names:
        return {"type": names[base]}
    raise TypeError(f"no JSON type for the annotation {hint!r}")


def history_schema() -> JSON:
    """The JSON schema of one history line, generated from the models (schemas/history.schema.json is this)."""
    defs: JSON = {}
    for type_ in sorted(MODELS):
        fields = field_types(type_)
        doc = " ".join((MODELS[type_].__doc__ or "").split())
        defs[type_] = {
            "description": doc,
            "type": "object",
            "required": sorted(n for n, (_, req) in fields.items() if req),
            "properties": {n: _json_type(h) for n, (h, _) in sorted(fields.items())},
            "additionalProperties": False,
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:attachments-reliability:schemas:history:1",
        "title": "Harness history.jsonl line",
        "description": ("One line of a run's history.jsonl (harness/history.py): seq, t (seconds since the run "
                        "started, monotonic), wall (epoch seconds), type, and the fields of its type. GENERATED from "
                        "harness/events.py by `python -m harness.events`: edit the models, not this file."),
        "type": "object",
        "required": list(COMMON_FIELDS),
        "properties": {"type": {"enum": sorted(MODELS)}},
        "allOf": [{"if": {"properties": {"type": {"const": type_}}, "required": ["type"]},
                   "then": {"$ref": f"#/$defs/{type_}"}} for type_ in sorted(MODELS)],
        "$defs": defs,
    }


def schema_text() -> str:
    """The schema file's exact text."""
    return json.dumps(history_schema(), indent=2, sort_keys=False) + "\n"


def unknown_fields(type_: str, fields: typing.Iterable[str]) -> list[str]:
    """The names among ``fields`` that ``type_``'s model does not name (empty for an unknown type: refused apart)."""
    if type_ not in MODELS:
        return []
    known = fields_of(type_)
    return sorted(f for f in fields if f not in known)


def invalid_lines(path: str) -> list[str]:
    """Each line of a stored history.jsonl the schema refuses, with the reason (``python -m harness.events PATH...``)."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(history_schema())
    out = []
    with open(path, encoding="utf-8") as lines:
        for number, raw in enumerate(lines, start=1):
            if raw.strip():
                line = json.loads(raw)
                out += [f"{path}:{number} ({line.get('type')}): {e.message}" for e in validator.iter_errors(line)]
    return out


def main(argv: list[str]) -> int:
    """No argument: print the schema. Paths of history.jsonl files: check every line, exit 1 if one is refused."""
    if not argv:
        sys.stdout.write(schema_text())
        return 0
    problems = [p for path in argv for p in invalid_lines(path)]
    for problem in problems:
        print(problem)
    print(f"{len(argv)} histories, {len(problems)} lines refused")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
