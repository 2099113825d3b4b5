"""Broken on purpose: one shared ack for the whole batch (ack with multiple=True).

The reference acks each delivery on its own, after that delivery's outcome is
committed. This variant, once any job's outcome is committed, acks with
``multiple=True`` at the newest delivery it holds on that channel — the usual
"ack the batch up to the last delivery tag" of a batch consumer — so the other
deliveries it holds, still unfinished, are settled with this job's outcome. A
crash then loses them at the broker: they were acknowledged before their own
outcome existed (only lease recovery or a stale-queue sweep could bring them
back).

Everything else is the reference. Settling a delivery the shared ack already
covered is skipped, as a batch consumer would (a second ack of the same tag
would close the channel).
"""

import logging
import sys

from reference import worker as worker_mod
from reference import worker_session as session_mod
from reference.cli import main

_original_on_message = worker_mod.Worker._on_message
_original_settle = session_mod.settle
log = logging.getLogger("reference.worker")
_newest: dict = {}  # channel -> the newest delivery received on it
_settled_upto: dict = {}  # channel -> the highest delivery tag a shared ack settled


async def _on_message_noting_the_newest(self, message, **kwargs):
    _newest[message.channel] = message
    await _original_on_message(self, message, **kwargs)


async def _settle_the_batch(message, how: str) -> None:
    try:
        channel = message.channel
    except Exception:  # channel gone: the reference's own handling
        await _original_settle(message, how)
        return
    if message.delivery_tag <= _settled_upto.get(channel, 0):
        return  # already settled by an earlier shared ack
    if how != "ack":
        await _original_settle(message, how)
        return
    newest = _newest.get(channel, message)
    target = newest if newest.delivery_tag > message.delivery_tag else message
    try:
        await target.ack(multiple=True)  # THE BUG: every delivery up to the newest shares this job's outcome
        _settled_upto[channel] = target.delivery_tag
        log.info("shared ack: delivery %d settled deliveries up to %d", message.delivery_tag, target.delivery_tag)
    except Exception as exc:
        log.info("shared ack failed (%s); acking delivery %d alone", type(exc).__name__, message.delivery_tag)
        await _original_settle(message, how)


worker_mod.Worker._on_message = _on_message_noting_the_newest
session_mod.settle = _settle_the_batch

if __name__ == "__main__":
    sys.exit(main())
