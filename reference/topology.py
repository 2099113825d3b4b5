"""Broker topology of the reference (docs/ARCHITECTURE.md), declared idempotently.

Re-declaring with the same arguments is a no-op in RabbitMQ, so every role may
call :func:`declare` on start. Changing an argument of an existing queue fails
with PRECONDITION_FAILED, on purpose: topology changes need a migration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika

if TYPE_CHECKING:
    from reference.settings import Settings

EXCHANGE = "attachments.jobs"
ROUTING_KEY = "jobs.process"
QUEUE = "attachments.jobs.process"
DEAD_LETTER_EXCHANGE = "attachments.jobs.dlx"
DEAD_LETTER_QUEUE = "attachments.jobs.dead"


@dataclass(frozen=True)
class TopologyConfig:
    delivery_limit: int = 20
    queue_max_length: int = 1_000_000
    dead_letter_ttl_seconds: int = 7 * 24 * 3600
    # Explicit, never the broker's default (RabbitMQ 4.0 gives a quorum queue without one a limit of 20, and 4.0-4.2
    # count every return, a read of the dead-letter tools included): high enough that no read deletes a letter.
    dead_letter_delivery_limit: int = 1_000_000

    def queue_arguments(self) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",  # required by at-least-once dead-lettering
            "x-max-length": self.queue_max_length,
        }

    def dead_letter_queue_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "quorum", "x-message-ttl": self.dead_letter_ttl_seconds * 1000,
                "x-delivery-limit": self.dead_letter_delivery_limit}


def routing_key_for(pipeline_version: int) -> str:
    """Level 5: each pipeline version has its own routing key and queue; version 1 keeps the original names."""
    return ROUTING_KEY if int(pipeline_version) == 1 else f"{ROUTING_KEY}.v{int(pipeline_version)}"


def queue_for(pipeline_version: int) -> str:
    return QUEUE if int(pipeline_version) == 1 else f"{QUEUE}.v{int(pipeline_version)}"


async def declare_version(channel: aio_pika.abc.AbstractChannel, config: TopologyConfig,
                          pipeline_version: int) -> aio_pika.abc.AbstractQueue:
    """The queue of one pipeline version (>= 2), bound to the work exchange with its own routing key; the same
    arguments as the version-1 queue (quorum, delivery limit, dead-lettering). Returns the queue."""
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(queue_for(pipeline_version), durable=True, arguments=config.queue_arguments())
    await queue.bind(exchange, routing_key_for(pipeline_version))
    return queue


async def declare(channel: aio_pika.abc.AbstractChannel, config: TopologyConfig) -> None:
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    dlx = await channel.declare_exchange(DEAD_LETTER_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    queue = await channel.declare_queue(QUEUE, durable=True, arguments=config.queue_arguments())
    await queue.bind(exchange, ROUTING_KEY)
    dead = await channel.declare_queue(DEAD_LETTER_QUEUE, durable=True, arguments=config.dead_letter_queue_arguments())
    await dead.bind(dlx, "")


def config_from_settings(settings: Settings) -> TopologyConfig:
    return TopologyConfig(settings.delivery_limit, settings.queue_max_length, settings.dead_letter_ttl_seconds,
                          settings.dead_letter_delivery_limit)
