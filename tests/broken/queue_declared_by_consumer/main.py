"""Broken on purpose: the work queue exists only once a consumer has started.

What many services do: the worker declares its queue and binds it to the exchange when it starts consuming; the
set-up step and the relay declare the exchanges only, and the relay publishes without `mandatory` on a
publisher-confirm channel. While no worker has ever started (consumers held from before the first upload: a
deploy that brings producers up first, a backlog scenario), the exchange has no binding for the routing key: the
broker confirms each publish and drops it. The relay marks the outbox row published; the job stays `queued` with no
message anywhere. docs/CONTRACT.md §4 says the topology exists before the first publish.

The reference's lost-message safety net (the sweeper republishing a long-queued job whose queue is empty) would
hide the loss a few seconds later; like most services, this one has none, so the work is lost for good.

Everything else is the reference.
"""

import sys

import aio_pika
from pamqp.commands import Basic

from reference import relay as relay_mod
from reference import sweeper as sweeper_mod
from reference import topology
from reference.cli import main

ROLE = sys.argv[1] if len(sys.argv) > 1 else ""


async def declare_exchanges_only(channel, config) -> None:
    """The producers' view of the topology: the exchanges, no queue, no binding (THE BUG: the queue and its binding
    are declared by the worker alone, when it starts)."""
    await channel.declare_exchange(topology.EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    await channel.declare_exchange(topology.DEAD_LETTER_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)


async def publish_without_mandatory(self, exchange, message, routing_key=topology.ROUTING_KEY) -> bool:
    """Confirmed, but not mandatory: a publish that routes to no queue is acked by the broker and dropped."""
    result = await exchange.publish(message, routing_key, mandatory=False, timeout=relay_mod.PUBLISH_TIMEOUT_SECONDS)
    if not isinstance(result, Basic.Ack):
        raise aio_pika.exceptions.DeliveryError(None, result)
    return True


async def no_safety_net(self) -> int:
    return 0


if ROLE != "worker":
    topology.declare = declare_exchanges_only
relay_mod.Relay._publish = publish_without_mandatory
sweeper_mod.Sweeper._republish_lost = no_safety_net

if __name__ == "__main__":
    sys.exit(main())
