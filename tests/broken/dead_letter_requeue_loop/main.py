"""Broken on purpose: unprocessable messages are requeued instead of dead-lettered.

The reference dead-letters a message it can never process (not JSON, failing jobs.schema.json, naming a job that
does not exist): it publishes it to the dead-letter exchange and acks it, once. This variant nacks it with
``requeue=True`` instead — the "put it back, someone will manage" of a consumer without isolation — so the same
message is handed out again at once, over and over, until the broker's own delivery limit (if the queue has one)
finally dead-letters it. Everything else is the reference.
"""

import logging
import sys

from reference import worker as worker_mod
from reference import worker_session as session_mod
from reference.cli import main

log = logging.getLogger("reference.worker")


async def _requeue_instead_of_dead_letter(self, message, reason: str) -> None:
    log.warning("cannot process message %s (%s): requeueing it", message.message_id, reason)
    await session_mod.settle(message, "nack")  # THE BUG: back to the work queue, not to the dead-letter queue


worker_mod.Worker._dead_letter = _requeue_instead_of_dead_letter

if __name__ == "__main__":
    sys.exit(main())
