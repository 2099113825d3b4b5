"""message_hygiene judges storage locations and credentials by their values (issue 20, item 6 and a false alarm).

A location is any key or bucket the harness saw written (the object watcher's history, the final read and bucket
listing, flat keys too) or the S3 endpoint's host:port; a credential is a secret the harness knows (by its hash),
URL userinfo or a bearer value. Names are free: ``fencing_token`` or ``x-dedup-token`` is service data, and a URI
that names no storage (a CloudEvents ``source``) is an identifier.
"""

from __future__ import annotations

import pytest

from harness.checkers import message_hygiene
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, JOB, happy, job_message

BUCKET = "h42-3fa9c1-window-commit-publi"
ENDPOINT = "http://127.0.0.1:45123"
OPERATOR = "harness-operator-token"
S3_SECRET = "harness-secret-key"


def built(headers=None, body_extra=None, objects=(), bucket_objects=()):
    b = happy()
    b.run["storage"] = message_hygiene.storage_record(
        {"S3_BUCKET": BUCKET, "S3_ENDPOINT_URL": ENDPOINT, "S3_ACCESS_KEY": "harness-access",
         "S3_SECRET_KEY": S3_SECRET, "DATABASE_URL": "postgresql://harness:dbpass-42@127.0.0.1:45001/h42",
         "AMQP_URL": "amqp://harness:mqpass-42@127.0.0.1:45002/h42"}, OPERATOR)
    b.add(0.01, "phase", name="object_watch_start", bucket=BUCKET)
    for key in objects:
        b.add(0.3, "object", key=key, size=10, last_modified="2026-01-01T00:00:00Z", etag='"x"')
    b.final["bucket_objects"] = [{"key": k, "size": 1} for k in bucket_objects]
    b.add(0.5, "message", body=job_message(**(body_extra or {})), properties={"headers": headers or {}})
    return b


def judge(b):
    return message_hygiene.check(b.history(), b.final, b.run)


@pytest.mark.parametrize("headers, objects, what", [
    ({"x-bucket": BUCKET}, (), "storage bucket"),
    ({"x-object": "orig-" + ATT + ".png"}, ("orig-" + ATT + ".png",), "storage object key"),  # a flat key
    ({"x-staged": "incoming/" + ATT}, ("incoming/" + ATT,), "storage object key"),  # written, later moved
    ({"x-store": "127.0.0.1:45123"}, (), "storage endpoint"),
    ({"x-trace": S3_SECRET}, (), "credential"),  # a known secret under an innocent name
    ({"x-trace": "Bearer " + OPERATOR}, (), "credential"),
    ({"x-callback": "amqp://guest:guest@broker:5672/"}, (), "credential"),  # URL userinfo
], ids=["bucket", "flat-key", "moved-staging-key", "endpoint", "known-secret", "operator-token", "userinfo"])
def test_a_location_or_secret_by_value_is_invalid(headers, objects, what):
    verdict = judge(built(headers, objects=objects))
    assert verdict.status == INVALID, verdict.summary
    assert any(what in e["message"] for e in verdict.evidence), verdict.evidence


@pytest.mark.parametrize("headers, body_extra", [
    ({"fencing_token": "17", "x-dedup-token": "9f2c4e1a77b0"}, {"fencing_token": 17}),
    ({"ce-source": "https://pipeline.example.com/relay", "ce-specversion": "1.0"},
     {"dataschema": "https://example.com/schemas/jobs.json"}),
    ({"x-variant-set": "thumbnail"}, {}),
], ids=["credential-named-service-data", "cloudevents-source", "variant-name"])
def test_service_data_and_identifiers_are_free(headers, body_extra):
    verdict = judge(built(headers, body_extra, objects=(f"variants/{ATT}/1/thumbnail", "thumbnail-cache"),
                          bucket_objects=(f"staging/{ATT}",)))
    assert verdict.status == VALID, verdict.evidence


def test_a_flat_key_equal_to_an_identifier_is_not_a_finding():
    """An implementation that stores the original under its attachment_id: the message must still carry the id."""
    verdict = judge(built(objects=(ATT, JOB)))
    assert verdict.status == VALID, verdict.evidence


def test_the_stored_record_keeps_no_secret_in_clear():
    record = message_hygiene.storage_record({"S3_BUCKET": BUCKET, "S3_ENDPOINT_URL": ENDPOINT,
                                             "S3_SECRET_KEY": S3_SECRET}, OPERATOR)
    text = repr(record)
    assert S3_SECRET not in text and OPERATOR not in text
    assert record["bucket"] == BUCKET and record["endpoints"] == ["127.0.0.1:45123"]
