"""Permute the work queue (BE-JOB-004: the handler must not depend on delivery order).

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

import asyncio
import json
import random


def _job_of(body: bytes) -> dict:
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


async def _permute(amqp_url: str, queue: str, rng: random.Random, limit: int, timeout: float) -> dict:
    import aiormq

    connection = await aiormq.connect(amqp_url)
    taken = []
    try:
        channel = await connection.channel(publisher_confirms=True)
        while len(taken) < limit:
            got = await channel.basic_get(queue, no_ack=False, timeout=timeout)
            if got.delivery_tag is None:  # Basic.GetEmpty: the queue has no ready message left
                break
            taken.append(got)
        order = permuted(taken, rng)
        published = 0
        try:
            for index in order:
                message = taken[index]
                await channel.basic_publish(message.body, exchange="", routing_key=queue,
                                            properties=message.header.properties, mandatory=True, timeout=timeout)
                published += 1
            for message in taken:
                await channel.basic_ack(message.delivery_tag)
        except BaseException:
            for message in taken:  # back where they were: never lose one (copies already confirmed may repeat)
                try:
                    await channel.basic_reject(message.delivery_tag, requeue=True)
                except Exception:
                    break  # the channel is gone: the broker returns every unacked delivery itself
            raise
        describe = [{"job_id": _job_of(m.body).get("job_id"), "attachment_id": _job_of(m.body).get("attachment_id"),
                     "attempt": _job_of(m.body).get("attempt"), "redelivered": bool(m.redelivered)} for m in taken]
        return {"original": describe, "permuted": [describe[i] for i in order], "order": order,
                "published": published}
    finally:
        await connection.close()


def permute_queue(amqp_url: str, queue: str, seed_rng: random.Random, limit: int = 500, timeout: float = 5.0) -> dict:
    """Permute up to ``limit`` ready messages of ``queue`` (see the module docstring); raises on failure, after
    putting the originals back."""
    return asyncio.run(asyncio.wait_for(_permute(amqp_url, queue, seed_rng, limit, timeout), timeout * 4 + limit * 0.2))
