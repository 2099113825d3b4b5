"""schemas/jobs.schema.json: the message contract accepts good jobs (extra fields too, UUIDs in either case,
timestamps at any fractional precision) and rejects broken fields, URLs and paths where an identifier belongs."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, strategies as st

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "schemas" / "jobs.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
VALID = SCHEMA["examples"][0]


def errors(message: dict) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(message)]


def with_(**changes) -> dict:
    message = copy.deepcopy(VALID)
    for key, value in changes.items():
        if value is None:
            message.pop(key, None)
        else:
            message[key] = value
    return message


def test_schema_is_valid_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"].endswith("2020-12/schema")
    # Extra fields are allowed (CONTRACT §4: additive); the harness judges their values, not the schema.
    assert SCHEMA.get("additionalProperties", True) is True


@pytest.mark.parametrize("example", SCHEMA["examples"])
def test_every_example_is_valid(example):
    assert errors(example) == []


@pytest.mark.parametrize("bad, why", [
    (with_(attachment_id="http://127.0.0.1/a.jpg"), "a URL where an id belongs"),
    (with_(attachment_id="../../x.jpg"), "a client path where an id belongs"),
    (with_(job_id="5F1D2C3B-8A9E-4B7C-9D0E-1F2A3B4C5D6"), "a uuid one digit short"),
    (with_(tracestate="Vendor=x"), "tracestate keys are lower case"),
    (with_(traceparent="00-xyz"), "malformed traceparent"),
    (with_(attempt=0), "attempt starts at 1"),
    (with_(pipeline_version=0), "pipeline_version starts at 1"),
    (with_(variants=[]), "no variant promised"),
    (with_(variants=["thumbnail", "thumbnail"]), "duplicate variant"),
    (with_(variants=["../../x"]), "unknown variant"),
    (with_(created_at="yesterday"), "timestamp not RFC 3339"),
    (with_(expires_at="2026-11-29T12:00:00+03:00"), "timestamps are UTC"),
    (with_(schema_version=2), "unknown schema version"),
    (with_(job_id=None), "job_id missing"),
    (with_(expires_at=None), "expires_at missing"),
])
def test_invalid_messages_are_rejected(bad, why):
    assert errors(bad), f"should reject: {why}"


@pytest.mark.parametrize("good, why", [
    (with_(tenant="acme", route={"shard": 3}), "extra fields: the contract grows additively"),
    (with_(job_id="0B7E7C52-3F0E-4A52-9A57-6D2B7C1F9E01"), "upper-case uuid (UUIDs are case-insensitive)"),
    (with_(created_at="2026-11-29T12:00:00.1234567Z"), ".NET: 7 fractional digits"),
    (with_(created_at="2026-11-29T12:00:00.123456789Z"), "Java: 9 fractional digits"),
    (with_(created_at="2026-11-29T12:00:00+00:00", expires_at="2026-11-30t12:00:00z"), "zero offset, lower-case t/z"),
    (with_(tracestate="congo=t61rcWkgMzE/x+y"), "a base64 tracestate value holding '/'"),
])
def test_valid_variants_are_accepted(good, why):
    assert errors(good) == [], why


_ALLOWED_STRING_FIELDS = ["job_id", "attachment_id", "created_at", "expires_at", "traceparent", "tracestate"]


@given(field=st.sampled_from(_ALLOWED_STRING_FIELDS),
       text=st.from_regex(r"(https?|s3|file)://[a-z0-9.]{1,20}(/[a-z0-9._-]{0,10}){0,3}|(\.\./)+[a-z]{1,8}(\.jpg)?",
                          fullmatch=True))
def test_no_string_field_can_carry_a_url_or_a_path(field, text):
    assert errors(with_(**{field: text}))
