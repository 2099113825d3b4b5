"""The broker seam: everything the harness knows of the message broker lives in this package, and nothing else in
the harness imports a broker client. Today one broker, RabbitMQ (:mod:`harness.broker.rabbitmq`): the management
API reads (queues, bindings, consumers, connections), the exact queue depth by a passive declare, the tap that sees
every message reaching the work queue, and the consumer sampler. A second broker would be one more module here
with the same names."""

from .rabbitmq import (HARNESS_CONNECTION, ConsumerSampler, FailoverClient, Management, Tap, amqp_queue_depth,
                       decode_payload, management_auth, payload_bytes, permute_queue, vhost_of)

__all__ = ["HARNESS_CONNECTION", "ConsumerSampler", "FailoverClient", "Management", "Tap", "amqp_queue_depth",
           "decode_payload", "management_auth", "payload_bytes", "permute_queue", "vhost_of"]
