"""Level-4 automatic recovery beyond the five windows: a message lost at the
broker, and expiry before the effect (CONTRACT §5, expiry)."""

from __future__ import annotations

import time

import pytest

from reference_support import assert_event_path, sample_jpeg, wait_for

pytestmark = pytest.mark.integration


def test_a_queued_job_whose_message_was_lost_is_republished_by_the_sweeper(pipeline):
    pipeline.start_all(roles=("api", "relay"))
    attachment_id = pipeline.upload(sample_jpeg(80)).json()["attachment_id"]
    wait_for(lambda: pipeline.queue_depths()["attachments.jobs.process"] == 1, 15, what="message queued")

    async def purge(channel):
        queue = await channel.declare_queue("attachments.jobs.process", passive=True)
        await queue.purge()

    pipeline.amqp(purge)  # the only message of an accepted job is gone
    pipeline.start_all(roles=("worker", "sweeper"), sweeper={"STALE_QUEUED_SECONDS": "2"})
    status = pipeline.wait_state(attachment_id, timeout=30)
    assert status["attempt"] == 1  # a republish is a redelivery, not a new attempt
    assert "queued_republished 1" in pipeline.roles["sweeper"].log()
    pipeline.assert_exactly_once(attachment_id)


def test_a_job_that_expires_before_its_effect_fails_as_expired_without_effect(pipeline):
    pipeline.start_all(roles=("api", "relay"), api={"JOB_TTL_SECONDS": "1"})
    attachment_id = pipeline.upload(sample_jpeg(81)).json()["attachment_id"]
    time.sleep(1.5)
    pipeline.start("worker")
    status = pipeline.wait_state(attachment_id, states=("failed",))
    assert (status["error_code"], status["variants"]) == ("expired", [])
    assert list(pipeline.store.list_prefix(f"variants/{attachment_id}/")) == []
    assert_event_path(pipeline.events(attachment_id))
