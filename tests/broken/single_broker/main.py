"""Broken on purpose: one broker only.

The reference reads AMQP_URLS (every node of a RabbitMQ cluster) and, when its connection to one node is lost,
connects to the next (reference/brokers.py). This variant reads AMQP_URL alone, as an implementation written for
one broker would: on a cluster, when its node is killed or cut off, every role keeps retrying that node and waits
for it to come back, though the other nodes still serve the quorum queue.

Everything else is the reference (on a one-node stack it is the reference).
"""

import sys

from reference import brokers
from reference.cli import main

brokers.broker_urls = lambda settings: [settings.amqp_url]  # THE BUG: AMQP_URLS ignored, no failover

if __name__ == "__main__":
    sys.exit(main())
