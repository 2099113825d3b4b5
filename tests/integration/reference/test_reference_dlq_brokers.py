"""Issue 23, defects 3 and 4: the dead-letter tools on a cluster and on today's RabbitMQ.

Defect 3: ``reference dlq list`` / ``dlq replay`` read the broker list (AMQP_URLS) and fail over between its nodes
like every other role, so they work during the node loss they exist for (here: the first node of the list is a
port nothing listens on).

Defect 4: RabbitMQ 4.0 gives a quorum queue without ``x-delivery-limit`` a limit of 20, and 4.0-4.2 count every
return of a message against it, so a dead-letter queue read (taken and returned) 20 times deleted its letters. Both
queues now declare their limit explicitly (checked on the broker's own record of the queues) and a letter read more
often than 4.0's default is still there. This broker (Debian's 3.10) counts every return too, so a DLQ limit set
below the number of reads shows the loss the explicit limit prevents."""

from __future__ import annotations

import asyncio
import json

import aio_pika
import httpx
import pytest

from reference_support import free_port

pytestmark = pytest.mark.integration

DEAD, WORK = "attachments.jobs.dead", "attachments.jobs.process"


def _publish_letter(pipeline, message_id: str) -> None:
    async def publish(channel):
        await channel.default_exchange.publish(
            aio_pika.Message(b"not json {", message_id=message_id, headers={"x-dead-letter-reason": "not JSON"},
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT), DEAD)

    pipeline.amqp(publish)


def _queue_arguments(pipeline, name: str) -> dict:
    tenant = pipeline.tenant
    url = f"{tenant.rabbitmq_management_url}/api/queues/{tenant.vhost}/{name}"
    response = httpx.get(url, auth=("harness", "harness"), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["arguments"]


def test_dlq_tools_fail_over_along_amqp_urls(pipeline):
    _publish_letter(pipeline, "letter-failover")
    dead_node = f"amqp://guest:guest@127.0.0.1:{free_port()}/"  # a node that is down: nothing listens there
    live = pipeline.env["AMQP_URL"]
    cluster = {"AMQP_URL": dead_node, "AMQP_URLS": f"{dead_node},{live}"}
    listed = pipeline.command("dlq", "list", extra_env=cluster)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [m["message_key"] for m in json.loads(listed.stdout)["messages"]] == ["letter-failover"]
    replayed = pipeline.command("dlq", "replay", "--message-id", "letter-failover", "--reason", "node loss drill",
                                "--operator", "alice", extra_env=cluster)
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert json.loads(replayed.stdout)["counts"] == {"unmappable": 1}  # garbage stays, audited


def _list_keys(pipeline) -> list[str]:
    from reference import dlq

    listed = asyncio.run(dlq.list_letters(pipeline.env["AMQP_URL"], 100))
    return [m["message_key"] for m in listed["messages"]]


def test_both_queues_declare_their_delivery_limit_and_reading_the_dlq_often_loses_nothing(pipeline):
    work, dead = _queue_arguments(pipeline, WORK), _queue_arguments(pipeline, DEAD)
    assert work.get("x-delivery-limit") == 20, work  # DELIVERY_LIMIT's default, declared explicitly
    assert (dead.get("x-delivery-limit") or 0) >= 1_000_000, dead  # never 4.0's default of 20
    _publish_letter(pipeline, "letter-read-often")
    for read in range(25):  # more reads than RabbitMQ 4.0's default limit of 20
        assert _list_keys(pipeline) == ["letter-read-often"], f"gone after {read} reads"
