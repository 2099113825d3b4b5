"""One stack serves a whole test session or grade, and every run or test gets a bucket of its own: SeaweedFS gives
each bucket its own volumes, so the store must not run out of volumes after a few dozen buckets (it did at 77)."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration

BUCKETS = 120  # more than the automatic volume limit a CI disk gave


def test_objects_can_be_written_to_many_more_buckets_than_the_automatic_volume_limit(stack):
    client = stack.s3.client()
    run = uuid.uuid4().hex[:6]
    for index in range(BUCKETS):
        bucket = f"many-{run}-{index:03d}"
        stack.s3.create_bucket(bucket)
        client.put_object(Bucket=bucket, Key="probe", Body=b"x")
    last = f"many-{run}-{BUCKETS - 1:03d}"
    assert client.get_object(Bucket=last, Key="probe")["Body"].read() == b"x"
