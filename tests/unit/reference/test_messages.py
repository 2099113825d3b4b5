import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from reference.messages import InvalidMessage, JobMessage, parse, rfc3339, schema, validate


def job(**overrides) -> JobMessage:
    created = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=timezone.utc)
    fields = dict(job_id=uuid.uuid4(), attempt=2, attachment_id=uuid.uuid4(), pipeline_version=1,
                  variants=("thumbnail", "crop", "optimized"), created_at=created,
                  expires_at=created + timedelta(days=1),
                  traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    fields.update(overrides)
    return JobMessage(**fields)


def test_round_trip_and_schema_valid():
    message = job()
    body = message.to_body()
    validate(json.loads(body))
    assert parse(body, str(message.job_id)) == message


def test_schema_examples_validate():
    for example in schema()["examples"]:
        validate(example)


def test_amqp_properties_map_the_contract():
    message = job(tracestate="vendor=abc")
    props = message.amqp_properties()
    assert props["message_id"] == str(message.job_id)
    assert props["content_type"] == "application/json"
    assert props["timestamp"] == message.created_at
    assert props["headers"]["traceparent"] == message.traceparent
    assert props["headers"]["tracestate"] == "vendor=abc"
    assert props["headers"]["x-attempt"] == 2


def test_timestamps_are_rfc3339_utc():
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)) == "2026-01-02T03:04:05Z"
    plus_two = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=plus_two)) == "2026-01-02T01:04:05.000007Z"


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(attempt=0),
    lambda d: d.update(job_id="not-a-uuid"),
    lambda d: d.update(variants=[]),
    lambda d: d.update(variants=["thumbnail", "thumbnail"]),
    lambda d: d.update(variants=["watermark"]),
    lambda d: d.update(url="http://example.invalid/x.jpg"),
    # (tracestate "k=http://evil" is no longer poison: jobs.schema.json judges a URL by what it points at, and this
    # one names no storage — see message_hygiene in docs/CONTRACT.md.)
    lambda d: d.pop("expires_at"),
    lambda d: d.update(created_at="2026-11-29 12:00:00"),
    lambda d: d.update(schema_version=2),
])
def test_invalid_messages_are_poison(mutate):
    data = json.loads(job().to_body())
    mutate(data)
    with pytest.raises(InvalidMessage):
        parse(json.dumps(data).encode())


def test_non_json_is_poison():
    with pytest.raises(InvalidMessage):
        parse(b"\xff\xfe not json")


def test_the_reader_tolerates_what_the_contract_allows():
    # CONTRACT §4: extra fields are additive and the AMQP message_id is free (fresh per publish is fine).
    message = job()
    data = json.loads(message.to_body())
    data.update(priority=3, tenant={"region": "eu-1"})
    assert parse(json.dumps(data).encode(), message_id=str(uuid.uuid4())) == message
    data.update(callback={"href": "https://example.invalid/hook"})  # but no location, not even in an extra field
    with pytest.raises(InvalidMessage):
        parse(json.dumps(data).encode())


def test_builder_refuses_to_emit_an_invalid_message():
    with pytest.raises(InvalidMessage):
        job(attempt=5000).to_body()
