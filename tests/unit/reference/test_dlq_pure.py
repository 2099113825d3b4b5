"""reference/dlq.py, pure parts: how a dead letter is described, selected and decided."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

from reference.dlq import Selector, decide, describe, message_key

JOB, ATT = str(uuid.uuid4()), str(uuid.uuid4())
BODY = json.dumps({"job_id": JOB, "attachment_id": ATT, "attempt": 2}).encode()


def test_a_job_message_dead_lettered_by_the_broker_maps_to_its_job_with_the_x_death_reason_time_and_count():
    first = datetime(2026, 1, 1, tzinfo=timezone.utc)
    letter = describe(BODY, JOB, {"x-death": [{"reason": "delivery_limit", "count": 1, "time": first}],
                                  "x-first-death-reason": "delivery_limit"})
    assert (letter["job_id"], letter["attachment_id"], letter["attempt"]) == (JOB, ATT, 2)
    assert letter["mappable"] and letter["reason"] == "delivery_limit" and letter["count"] == 1
    assert letter["first_death_at"] == first.isoformat() and letter["message_key"] == JOB


def test_garbage_is_unmappable_with_why_and_named_by_its_body_hash():
    letter = describe(b"\xff not json", None, {"x-dead-letter-reason": "invalid message: not JSON",
                                               "x-dead-lettered-at": "2026-01-01T00:00:00+00:00"})
    assert not letter["mappable"] and "not JSON" in letter["unmappable_because"]
    assert letter["message_key"] == message_key(b"\xff not json", None) and letter["message_key"].startswith("sha256:")
    assert letter["reason"] == "invalid message: not JSON" and letter["first_death_at"].startswith("2026-01-01")
    assert not describe(json.dumps({"job_id": "nope"}).encode(), "m", {})["mappable"]


def test_a_selector_takes_by_key_job_reason_or_age_and_refuses_to_be_empty():
    now = datetime.now(timezone.utc)
    letter = {**describe(BODY, "m-1", {"x-dead-letter-reason": "unexpected_error: boom"}),
              "first_death_at": (now - timedelta(seconds=100)).isoformat()}
    assert Selector().empty()
    assert Selector(message_keys={"m-1"}).matches(letter, now)
    assert Selector(job_ids={JOB}).matches(letter, now)
    assert not Selector(job_ids={str(uuid.uuid4())}).matches(letter, now)
    assert Selector(dead_reason="UNEXPECTED").matches(letter, now)
    assert not Selector(dead_reason="delivery_limit").matches(letter, now)
    assert Selector(older_than_seconds=50).matches(letter, now)
    assert not Selector(older_than_seconds=500).matches(letter, now)
    assert Selector(everything=True).matches(letter, now)


def test_decide_replays_queued_and_failed_work_once_and_leaves_the_rest():
    job = {"state": "queued", "original_released": False, "lease_live": False}
    assert decide(None, None)[0] == "unmappable"
    assert decide(job, None)[0] == "replay"
    assert decide({**job, "state": "failed"}, None)[0] == "replay"
    at = datetime.now(timezone.utc)
    assert decide(job, {"at": at, "operator": "api:alice"})[0] == "already_replayed"
    assert decide({**job, "state": "ready"}, None)[0] == "already_terminal"
    assert decide({**job, "state": "failed", "original_released": True}, None)[0] == "already_terminal"
    assert decide({**job, "state": "processing", "lease_live": True}, None)[0] == "in_progress"


def test_both_quorum_queues_declare_their_delivery_limit_explicitly():
    """Issue 23 defect 4: RabbitMQ 4.0 gives a quorum queue declared without ``x-delivery-limit`` a limit of 20;
    neither queue of the reference relies on that default (the dead-letter queue's is high: reads never delete)."""
    from reference import topology
    from reference.settings import Settings

    config = topology.config_from_settings(Settings(delivery_limit=7, max_attempts=7,
                                                            dead_letter_delivery_limit=123_456))
    assert config.queue_arguments()["x-delivery-limit"] == 7
    assert config.dead_letter_queue_arguments()["x-delivery-limit"] == 123_456
    assert topology.TopologyConfig().dead_letter_queue_arguments()["x-delivery-limit"] >= 1_000_000
