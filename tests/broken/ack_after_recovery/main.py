"""Broken on purpose: a worker whose lease was lost acks its delivery instead of giving it back.

The reference stops a job whose lease is lost (a refused renewal: the job was recovered and claimed anew while its
owner was paused) before any new effect, and nacks the delivery: the broker hands the message out again, and the
delivery that gets it finds the job owned or done. This variant reasons "the job is someone else's now, this
message is done with" and acks it. Nothing is lost here (the recovery gave the job a message of its own), but the
seed is explicit: a lost or refused lease must not lead to the message being acknowledged — the old owner's stale
processing settled a message it no longer owned.

Everything else is the reference: renewals, fencing, the sweeper; only the settlement after a lost lease differs.
"""

import contextvars
import sys

from reference import lease as lease_mod
from reference import worker as worker_mod
from reference import worker_session as session_mod
from reference.cli import main

# One mutable box per delivery being processed: the lease is watched in tasks the delivery's own task starts.
DELIVERY = contextvars.ContextVar("delivery_lease_lost", default=None)
_process = worker_mod.Worker._process
_wait_live = lease_mod.Lease.wait_live
_settle = session_mod.settle


async def _process_in_a_box(self, message, job, received_at):
    token = DELIVERY.set({"lost": False})
    try:
        await _process(self, message, job, received_at)
    finally:
        DELIVERY.reset(token)


async def _wait_live_noting_a_loss(self, stop=None, timeout=None):
    try:
        return await _wait_live(self, stop, timeout)
    except lease_mod.LeaseLost:
        box = DELIVERY.get()
        if box is not None:
            box["lost"] = True
        raise


async def _settle_acking_once_lost(message, how):
    # THE BUG: a delivery whose lease was lost is settled as done instead of going back to the queue.
    box = DELIVERY.get()
    if how == "nack" and box is not None and box["lost"]:
        how = "ack"
    return await _settle(message, how)


worker_mod.Worker._process = _process_in_a_box
lease_mod.Lease.wait_live = _wait_live_noting_a_loss
session_mod.settle = _settle_acking_once_lost

if __name__ == "__main__":
    sys.exit(main())
