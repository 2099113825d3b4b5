"""Broken on purpose: a worker that finds its lease lapsed gives the job up and ACKS the delivery.

The reference keeps a lapsed lease in doubt: its renewal keeps trying, and a renewal that finds the job still
``processing`` under its fencing token revives the lease (nobody recovered it); a lease that is really lost (a
refused renewal) ends the job with a nack, so the broker keeps the message. This variant takes the careless view
of a worker woken from a long pause: "my lease ran out, someone else owns the job now, this delivery is not mine
to keep" — it stops the job and acks the delivery. When nobody recovered the job (the recovering roles were
stopped), the job is left ``processing`` with no message anywhere: only a later lease recovery can save it.

Everything else is the reference: renewals, fencing, the sweeper.
"""

import contextvars
import sys

from reference import lease as lease_mod
from reference import worker as worker_mod
from reference import worker_session as session_mod
from reference.cli import main

# One mutable box per delivery being processed: the lease is watched in tasks the delivery's own task starts, and
# a context variable's value set there would not reach back; the box they share does.
DELIVERY = contextvars.ContextVar("delivery_given_up", default=None)
_process = worker_mod.Worker._process
_wait_live = lease_mod.Lease.wait_live
_settle = session_mod.settle


async def _process_in_a_box(self, message, job, received_at):
    token = DELIVERY.set({"gave_up": False})
    try:
        await _process(self, message, job, received_at)
    finally:
        DELIVERY.reset(token)


async def _wait_live_giving_up(self, stop=None, timeout=None):
    # THE BUG (1/2): a lease found lapsed (its deadline passed, or the renewal saw it lapse) is taken as lost.
    if self.lost_reason is None and (self.lapses > 0 or self._clock() >= self.deadline - self.safety_margin):
        self.lost_reason = "lease lapsed: someone else owns the job now"
        box = DELIVERY.get()
        if box is not None:
            box["gave_up"] = True
        raise lease_mod.LeaseLost(self.lost_reason)
    return await _wait_live(self, stop, timeout)


async def _settle_acking_given_up(message, how):
    # THE BUG (2/2): a delivery given up that way is settled as done instead of going back to the queue.
    box = DELIVERY.get()
    if how == "nack" and box is not None and box["gave_up"]:
        how = "ack"
    return await _settle(message, how)


worker_mod.Worker._process = _process_in_a_box
lease_mod.Lease.wait_live = _wait_live_giving_up
session_mod.settle = _settle_acking_given_up

if __name__ == "__main__":
    sys.exit(main())
