"""The shipped schemas accept exactly what the harness accepts, so a team validating against schemas/ is never
surprised by the grade:

- jobs.schema.json: message_hygiene validates every message with the shipped schema as it is (no hidden
  relaxation), and a message passes the shipped schema exactly when message_hygiene accepts it (for messages that
  carry nothing else it refuses: no storage location, no credential, the 202's job_id);
- adapter.schema.json: `harness adapter check` and adapter.load accept an adapter exactly when the shipped schema
  does (role names free both ways; an unknown key refused both ways).
"""

from __future__ import annotations

import copy
import json
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest

from harness import adapter as adapter_mod
from harness.adapter_check import check
from harness.checkers import message_hygiene
from harness.checkers.base import INVALID, VALID
from harness.history import History

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from harness_histories import ATT, JOB, Builder, job_message  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
JOBS = json.loads((REPO / "schemas" / "jobs.schema.json").read_text())
SHIPPED = jsonschema.Draft202012Validator(JOBS, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
ADAPTER_SCHEMA = json.loads((REPO / "schemas" / "adapter.schema.json").read_text())
REFERENCE_ADAPTER = (REPO / "reference" / "adapter.toml").read_text()

# (message body overrides, why). Each is judged by the shipped schema and by message_hygiene on a recorded history.
MESSAGES = [
    ({}, "the contract's fields"),
    ({"tenant": "acme", "route": {"shard": 3}, "priority": 5}, "extra fields (additive)"),
    ({"job_id": JOB.upper(), "attachment_id": ATT.upper()}, "upper-case UUIDs"),
    ({"created_at": "2026-11-29T12:00:00.1234567Z"}, "7 fractional digits (.NET)"),
    ({"created_at": "2026-11-29T12:00:00.123456789Z", "expires_at": "2026-11-30T12:00:00.000000000+00:00"},
     "9 fractional digits (Java)"),
    ({"expires_at": "2026-11-30t12:00:00z"}, "lower-case t and z"),
    ({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE"},
     "trace context"),
    ({"attempt": 0}, "attempt starts at 1"),
    ({"schema_version": 2}, "unknown schema version"),
    ({"variants": []}, "no variant"),
    ({"variants": ["sepia"]}, "an unknown variant"),
    ({"created_at": "2026-11-29T15:00:00+03:00"}, "a non-UTC timestamp"),
    ({"created_at": "yesterday"}, "not a timestamp"),
    ({"pipeline_version": "1"}, "a number as text"),
    ({"job_id": None}, "job_id missing"),
    ({"expires_at": None}, "expires_at missing"),
]


def body_of(overrides: dict) -> dict:
    body = job_message()
    for key, value in overrides.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def hygiene_verdict(body: dict):
    b = Builder()
    b.upload(0, ATT, job_id=JOB)
    b.add(0.15, "message", body=body, properties={})
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "ready", 1, "worker")])
    # As a run reads it: the history file's lines (History.load), where UUIDs are compared case-insensitively.
    history = History.from_lines(json.dumps(e, default=str) for e in b.history().events)
    return message_hygiene.check(history, b.final, b.run)


def test_the_checker_validates_with_the_shipped_schema_unchanged():
    assert message_hygiene.validator().schema == JOBS


@pytest.mark.parametrize("overrides, why", MESSAGES, ids=[why for _, why in MESSAGES])
def test_a_message_passes_the_schema_exactly_when_the_checker_accepts_it(overrides, why):
    body = body_of(overrides)
    schema_ok = not list(SHIPPED.iter_errors(copy.deepcopy(body)))
    verdict = hygiene_verdict(body)
    assert verdict.status in (VALID, INVALID), verdict
    assert (verdict.status == VALID) is schema_ok, (why, schema_ok, verdict.summary, verdict.evidence)
    if schema_ok:  # and it recognised the 202's job on the message, whatever the case of its UUIDs
        assert "no message seen" not in verdict.summary, verdict.summary


def test_the_corpus_has_both_sides():
    outcomes = {not list(SHIPPED.iter_errors(body_of(o))) for o, _ in MESSAGES}
    assert outcomes == {True, False}


# --- adapter.schema.json ------------------------------------------------------------------------------------------

def _adapter_variants():
    renamed = (REFERENCE_ADAPTER.replace('role = "api"', 'role = "web"').replace("[roles.api]", "[roles.web]")
               .replace('= "api"\n', '= "web"\n'))
    unknown_key = REFERENCE_ADAPTER.replace("[broker]\n", "[broker]\nqueue_typo = \"x\"\n")
    no_roles = REFERENCE_ADAPTER.replace("[roles.", "[notroles.")
    return [(REFERENCE_ADAPTER, "the reference"), (renamed, "free role names"), (unknown_key, "an unknown key"),
            (no_roles, "no [roles]")]


@pytest.mark.parametrize("text, why", _adapter_variants(), ids=[w for _, w in _adapter_variants()])
def test_an_adapter_passes_the_schema_exactly_when_the_harness_accepts_it(tmp_path, text, why):
    raw = tomllib.loads(text)
    schema_ok = not list(jsonschema.Draft202012Validator(ADAPTER_SCHEMA).iter_errors(raw))
    path = tmp_path / "adapter.toml"
    path.write_text(text)
    schema_fields = [p for p in check(path).problems if not p.reason.startswith("program not found")]
    assert (not schema_fields) is schema_ok, (why, schema_fields)
    try:
        adapter_mod.load(path)
        loaded = True
    except adapter_mod.AdapterError:
        loaded = False
    assert loaded is schema_ok, why
