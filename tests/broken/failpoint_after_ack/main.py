"""Broken on purpose: the worker acks its delivery just BEFORE its commit, and its ``after_commit_before_ack``
failpoint sits after that ack.

Everything else is the reference. The failpoint still fires after the commit, so an armed run crashes "in" the
window by name; but the delivery is already settled, the window the name promises (the effect committed, the
message still unacked) is never entered, and a crash between the ack and the commit would lose the job. A grade
that trusts the failpoint's name vouches for a window this worker never has: fault_coverage must ask for the
window's own evidence (a redelivery of the job committed before the crash) and say ``unknown`` without it.
"""

import contextvars
import sys

from reference import worker as worker_mod
from reference.cli import main

_original_process = worker_mod.Worker._process
_original_commit = worker_mod.Worker._commit
_delivery = contextvars.ContextVar("delivery", default=None)


async def _process_remembering_delivery(self, message, job, *args, **kwargs):
    box = {"message": message, "acked": False}
    token = _delivery.set(box)
    try:
        await _original_process(self, _Settled(box), job, *args, **kwargs)
    finally:
        _delivery.reset(token)


class _Settled:
    """The delivery as the reference sees it: settled normally until the commit acked it; from then on settling
    again does nothing."""

    def __init__(self, box):
        self._message = box["message"]
        self._box = box

    def __getattr__(self, name):
        return getattr(self._message, name)

    async def ack(self, *args, **kwargs):
        if not self._box["acked"]:
            self._box["acked"] = True
            await self._message.ack(*args, **kwargs)

    async def nack(self, *args, **kwargs):
        if not self._box["acked"]:
            self._box["acked"] = True
            await self._message.nack(*args, **kwargs)

    async def reject(self, *args, **kwargs):
        if not self._box["acked"]:
            self._box["acked"] = True
            await self._message.reject(*args, **kwargs)


async def _commit_after_acking(self, claim, results, *args, **kwargs):
    box = _delivery.get()
    if box is not None and not box["acked"]:
        box["acked"] = True
        await box["message"].ack()  # THE BUG: acked before the commit; the failpoint after the commit comes later
    return await _original_commit(self, claim, results, *args, **kwargs)


worker_mod.Worker._process = _process_remembering_delivery
worker_mod.Worker._commit = _commit_after_acking

if __name__ == "__main__":
    sys.exit(main())
