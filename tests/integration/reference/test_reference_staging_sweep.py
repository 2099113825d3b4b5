"""Issue 10, defect 11: the staging sweep costs what is due, never a listing of every original, and lease recovery
stays on time while it runs.

Thousands of objects sit under staging/ (written straight to S3, as a large bucket would hold), every listing page
is slowed to what a page of a large remote bucket costs, and a processing job's lease expires while the sweeper
runs. The sweeper (in-process, the only way to count its S3 calls) must recover the lease within two sweep
intervals and must not list the bucket at all. On the code at the start of issue 10 the staging sweep listed all
of staging/ on the recovery loop, so the lease waited for the listing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from reference.settings import Settings
from reference.sweeper import Sweeper

pytestmark = pytest.mark.integration

STAGED_OBJECTS = 3000
PAGE_SECONDS = 1.0  # one list page of a large remote bucket; the real pages here take a few ms
SWEEP_INTERVAL = 1.0


def expired_lease_job(pipeline) -> str:
    """A processing job whose lease ran out a moment ago (its worker died), written directly."""
    attachment_id, job_id = uuid.uuid4(), uuid.uuid4()
    pipeline.sql("""INSERT INTO attachments (attachment_id, original_key, original_sha256, original_size,
                                             content_type, width, height)
                    VALUES (%(a)s, %(key)s, repeat('0', 64), 1, 'image/png', 1, 1)""",
                 {"a": attachment_id, "key": f"staging/{attachment_id}"})
    pipeline.sql("""INSERT INTO jobs (job_id, attachment_id, pipeline_version, variants, state, attempt,
                                      fencing_token, lease_owner, lease_expires_at, expires_at)
                    VALUES (%(j)s, %(a)s, 1, ARRAY['thumbnail'], 'processing', 1, 1, 'dead-worker',
                            now() - interval '10 milliseconds', now() + interval '1 hour')""",
                 {"j": job_id, "a": attachment_id})
    return str(job_id)


def test_staging_sweep_lists_nothing_and_lease_recovery_stays_on_time(pipeline):
    store = pipeline.store
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: store.put_bytes(f"staging/{uuid.UUID(int=n)}", b"x", "image/png"),
                      range(STAGED_OBJECTS)))
    settings = Settings(**{**{k.lower(): v for k, v in pipeline.env.items() if k.isupper()},
                           "sweep_interval_seconds": SWEEP_INTERVAL, "staging_retention_seconds": 3600,
                           "stale_queued_seconds": 3600})
    sweeper = Sweeper(settings)
    calls = {"list": 0, "keys": 0}
    listing = threading.Event()
    real_list = sweeper.store.client.list_objects_v2

    def slow_list(**kwargs):
        calls["list"] += 1
        listing.set()
        time.sleep(PAGE_SECONDS)
        page = real_list(**kwargs)
        calls["keys"] += len(page.get("Contents") or [])
        return page

    sweeper.store.client.list_objects_v2 = slow_list

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(sweeper.run(stop))
        try:
            # The lease runs out while a listing is under way (if the sweeper lists), else after the first sweeps.
            await asyncio.to_thread(listing.wait, 1.5 * SWEEP_INTERVAL)
            job_id = await asyncio.to_thread(expired_lease_job, pipeline)
            began = time.monotonic()
            while time.monotonic() - began < 20:
                rows = await asyncio.to_thread(pipeline.sql, "SELECT state FROM jobs WHERE job_id = %(j)s",
                                               {"j": job_id})
                if rows[0]["state"] != "processing":
                    return time.monotonic() - began
                await asyncio.sleep(0.05)
            return float("inf")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    recovered_after = asyncio.run(scenario())
    assert recovered_after <= 2 * SWEEP_INTERVAL + 0.5, (
        f"lease recovered {recovered_after:.2f}s after it expired (deadline {2 * SWEEP_INTERVAL + 0.5}s); "
        f"{calls['list']} list calls of the bucket meanwhile ({calls['keys']} keys)")
    assert calls["list"] == 0, f"the sweeper listed the bucket {calls['list']} times ({calls['keys']} keys)"
    # Objects nobody staged through the API have no staging record: not the sweeper's to judge (it never lists).
    assert store.exists(f"staging/{uuid.UUID(int=0)}")


def test_staging_cleanup_works_from_database_records_only(pipeline):
    """The API's staging record is gone once the upload is recorded; an unrecorded one past the retention (by the
    database's clock) and the original of a failed job past its retention are deleted; a young one is kept."""
    from reference_support import sample_jpeg

    pipeline.start("api")
    accepted = pipeline.upload(sample_jpeg(11))
    assert accepted.status_code == 202, accepted.text
    attachment_id = accepted.json()["attachment_id"]
    original = f"staging/{attachment_id}"
    assert pipeline.sql("SELECT count(*) AS n FROM staged_uploads")[0]["n"] == 0  # recorded: the row went with it
    store = pipeline.store
    for key, age in (("staging/old-orphan", "1 hour"), ("staging/young-orphan", "0 seconds")):
        store.put_bytes(key, b"x", "image/png")
        pipeline.sql("INSERT INTO staged_uploads (object_key, staged_at) VALUES (%(k)s, now() - %(age)s::interval)",
                     {"k": key, "age": age})
    pipeline.sql("""UPDATE jobs SET state = 'failed', error_code = 'decode_error', updated_at = now() - interval '1 hour'
                    WHERE attachment_id = %(a)s""", {"a": attachment_id})
    settings = Settings(**{**{k.lower(): v for k, v in pipeline.env.items() if k.isupper()},
                           "staging_retention_seconds": 600, "failed_retention_seconds": 60})
    sweeper = Sweeper(settings)

    async def sweep():
        from reference.db.pool import open_pool

        sweeper.db = await open_pool(settings, "test-sweeper", min_size=1, max_size=2)
        try:
            counts = await sweeper.sweep_once()
            return counts, await sweeper.sweep_staging()
        finally:
            await sweeper.db.close()

    counts, deleted = asyncio.run(sweep())
    assert counts["originals_released"] == 1 and deleted == 2
    assert not store.exists("staging/old-orphan") and not store.exists(original)
    assert store.exists("staging/young-orphan")
    assert [r["object_key"] for r in pipeline.sql("SELECT object_key FROM staged_uploads")] == ["staging/young-orphan"]


def test_a_key_whose_delete_is_refused_for_good_does_not_block_the_others(pipeline):
    """Issue 23 defect 13: the store refuses the delete of one doomed staging object for good (403 AccessDenied:
    a retention lock, a bucket policy). It sorts first; every other doomed object must still be deleted, sweep
    after sweep, while the refused one stays doomed (retried later, behind the others) and is counted."""
    from botocore.exceptions import ClientError
    from prometheus_client import REGISTRY

    store = pipeline.store
    keys = [f"staging/doomed-{n:02d}" for n in range(6)]
    for key in keys:
        store.put_bytes(key, b"x", "image/png")
        pipeline.sql("INSERT INTO staged_uploads (object_key, staged_at) VALUES (%(k)s, now() - interval '1 hour')",
                     {"k": key})
    settings = Settings(**{**{k.lower(): v for k, v in pipeline.env.items() if k.isupper()},
                           "staging_retention_seconds": 600})
    sweeper = Sweeper(settings)
    real_delete = sweeper.store.client.delete_object
    refused = keys[0]  # first in the sweep's order (doomed together, then by key)

    def delete_object(**kwargs):
        if kwargs["Key"] == refused:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "DeleteObject")
        return real_delete(**kwargs)

    sweeper.store.client.delete_object = delete_object
    failed_before = REGISTRY.get_sample_value("reference_sweeper_actions_total",
                                              {"action": "staging_delete_refused"}) or 0.0

    async def sweep_twice():
        from reference.db.pool import open_pool

        sweeper.db = await open_pool(settings, "test-sweeper", min_size=1, max_size=2)
        outcomes = []
        try:
            for _ in range(2):
                try:
                    outcomes.append(await sweeper.sweep_staging())
                except Exception as exc:  # noqa: BLE001 - recorded: what a sweep loop would log and retry
                    outcomes.append(type(exc).__name__)
            return outcomes
        finally:
            await sweeper.db.close()

    outcomes = asyncio.run(sweep_twice())
    left = [key for key in keys if store.exists(key)]
    assert left == [refused], (outcomes, left)
    rows = pipeline.sql("SELECT object_key, doomed_at IS NOT NULL AS doomed FROM staged_uploads")
    assert rows == [{"object_key": refused, "doomed": True}], rows  # kept doomed: retried, never recorded
    assert (REGISTRY.get_sample_value("reference_sweeper_actions_total", {"action": "staging_delete_refused"})
            or 0.0) >= failed_before + 1
