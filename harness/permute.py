"""Permute the work queue (BE-JOB-004: the handler must not depend on delivery order): the seeded order, here;
the broker's side (taking the messages out and publishing them again) is the broker seam's
(:func:`harness.broker.permute_queue`), described below.

With every consumer held, the ready messages of the work queue are taken out over AMQP (``basic.get`` without
auto-ack: the broker keeps each one as an unacknowledged delivery of the harness's own channel, so nothing is lost
if anything goes wrong), published again in a seeded random order — body, properties and headers as they were — to
the default exchange with the work queue's name as routing key (every queue is bound there, whatever the
implementation's exchange type), each publish waited for its broker confirm (mandatory: an unroutable one fails),
and only then are the originals acknowledged. If anything fails before that, the originals are rejected with
requeue (or returned by the broker when the channel closes): the queue holds at least what it held. The original
and the permuted order are returned for the history.

One property may differ: an original without an AMQP ``message_id`` gets a random one (the AMQP client sets it for
its confirm bookkeeping); the contract leaves ``message_id`` free.
"""

from __future__ import annotations

import json
import random


def job_of(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def permuted(order: list, rng: random.Random, tries: int = 20) -> list[int]:
    """Indices of ``order`` in a seeded random order that differs from the original whenever it can (2+ items)."""
    indices = list(range(len(order)))
    out = list(indices)
    for _ in range(tries):
        rng.shuffle(out)
        if len(out) < 2 or out != indices:
            break
    return out
