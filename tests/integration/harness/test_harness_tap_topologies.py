"""The tap sees every message that reaches the work queue, whatever the topology (CONTRACT §10), on a real broker.

Each case declares the topology the way an implementation might (exchange type, routing, who declares it when),
publishes a job message the way its relay would, and checks the tap recorded exactly the messages that reached
the work queue, with every property and header — and that a republished copy reaches the work queue again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import aio_pika
import pytest

from harness.history import History, HistoryWriter
from harness.broker import Management, Tap, amqp_queue_depth

pytestmark = pytest.mark.integration

WORK_QUEUE = "work"

# name -> (exchange type or None for the default exchange, binding key, binding arguments, publish routing key,
#          publish headers, a routing key / headers that must NOT reach the work queue)
TOPOLOGIES = {
    "direct": ("direct", "render", {}, "render", {}, ("other", {})),
    "topic": ("topic", "jobs.*", {}, "jobs.process", {}, ("audit.process", {})),
    "fanout": ("fanout", "", {}, "ignored", {}, None),
    "headers": ("headers", "", {"x-match": "all", "kind": "job"}, "", {"kind": "job"}, ("", {"kind": "audit"})),
    "default": (None, None, {}, WORK_QUEUE, {}, ("elsewhere", {})),
}


def job_body() -> bytes:
    return json.dumps({"schema_version": 1, "job_id": str(uuid.uuid4()), "attempt": 1,
                       "attachment_id": str(uuid.uuid4()), "pipeline_version": 1, "variants": ["thumbnail"],
                       "created_at": "2026-11-30T10:00:00Z", "expires_at": "2026-12-01T10:00:00Z",
                       "extra_field": "additive"}).encode()


async def declare_and_publish(amqp_url: str, kind: str | None, key, arguments, routing_key, headers, stray) -> dict:
    """Declare the topology as an implementation's role would at start, then publish one job and one stray."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(WORK_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        await channel.declare_queue("elsewhere", durable=True)
        if kind is None:
            exchange = channel.default_exchange
        else:
            exchange = await channel.declare_exchange("jobs-" + kind, aio_pika.ExchangeType(kind), durable=True)
            await queue.bind(exchange, routing_key=key, arguments=arguments or None)
        message_id = str(uuid.uuid4())  # deliberately not the job_id
        await exchange.publish(aio_pika.Message(job_body(), message_id=message_id, content_type="application/json",
                                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                                headers={**headers, "x-trace": "abc"}, app_id="some-relay"),
                               routing_key=routing_key)
        if stray is not None:
            await exchange.publish(aio_pika.Message(b'{"not": "a job"}', headers=stray[1]), routing_key=stray[0],
                                   mandatory=False)
        return {"message_id": message_id, "exchange": exchange.name}
    finally:
        await connection.close()


def drain(tap: Tap, want: int, timeout: float = 10) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tap.tick()
        if len(tap.tapped()) >= want:
            time.sleep(0.5)  # anything extra (a stray that should not be there) shows up too
            tap.drain_once()
            break
        time.sleep(0.2)
    return tap.tapped()


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_tap_sees_work_queue_messages_for_any_topology(stack, tenant, tmp_path, name):
    kind, key, arguments, routing_key, headers, stray = TOPOLOGIES[name]
    writer = HistoryWriter(tmp_path / "history.jsonl")
    management = Management(tenant.rabbitmq_management_url, tenant.direct.amqp_url)
    tap = Tap(management, writer, WORK_QUEUE, None, sync_every=0.2)
    tap.prepare()  # before the topology exists: roles declare it at start
    assert not tap.wait_for_topology(0.5)
    published = asyncio.run(declare_and_publish(tenant.direct.amqp_url, kind, key, arguments, routing_key,
                                                headers, stray))
    # Published before the first sync (a role that declares and publishes at once): a copied binding only routes
    # later messages, so the firehose must show this one. The next one comes after the copy: seen once, not twice.
    assert tap.wait_for_topology(5)
    first = published
    if kind is not None:
        published = asyncio.run(declare_and_publish(tenant.direct.amqp_url, kind, key, arguments, routing_key,
                                                    headers, stray))
    want = 1 if kind is None else 2
    seen = drain(tap, want)
    writer.close()
    ours = [m for m in seen if m["properties"].get("message_id") == published["message_id"]]
    assert len(ours) == 1, seen
    assert len(seen) == want, seen  # every publish that reached the work queue, each exactly once
    assert any(m["properties"].get("message_id") == first["message_id"] for m in seen)
    message = ours[0]
    assert message["body"]["extra_field"] == "additive"
    assert message["exchange"] == published["exchange"]
    assert message["properties"]["headers"]["x-trace"] == "abc"
    assert message["properties"]["app_id"] == "some-relay"
    assert all(m["body"] and "job_id" in m["body"] for m in seen), "a message that never reached the work queue"
    history = History.load(tmp_path / "history.jsonl")
    observed = history.of_type("observe")
    assert any(e.get("firehose") for e in observed)
    if kind is not None:
        assert any(e.get("source") == "binding" and e.get("exchange") == published["exchange"] for e in observed)
    # The stray went to no queue (the default exchange's goes to a queue of its own): the broker confirmed and
    # dropped it, and the tap says so — how work published before its topology existed is reported.
    dropped = history.of_type("unroutable")
    if name == "default":
        assert dropped == [], dropped
    elif stray is not None:
        assert {(e["exchange"], e["routing_key"]) for e in dropped} == {(published["exchange"], stray[0])}, dropped

    # A republished copy keeps every property and header, so it routes to the work queue like the original.
    before = amqp_queue_depth(tenant.direct.amqp_url, WORK_QUEUE)["ready"]
    assert management.publish(message["exchange"], message["routing_key"], message["raw"], message["properties"])
    deadline = time.monotonic() + 5
    while amqp_queue_depth(tenant.direct.amqp_url, WORK_QUEUE)["ready"] <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert amqp_queue_depth(tenant.direct.amqp_url, WORK_QUEUE)["ready"] == before + 1
    management.close()
