"""Dead-letter channel of the reference (BE-JOB-003): what is in it, and its controlled replay.

What lands in ``attachments.jobs.dead``: messages the worker cannot process (not JSON, not a job, an unknown
job: ``x-dead-letter-reason`` in its headers, written by the worker) and messages the broker dead-lettered
(delivery limit reached: ``x-death`` / ``x-first-death-reason``). Shared by ``reference dlq …`` and
``/v1/admin/dlq``.

Reading never loses a message: dead letters are taken with ``basic.get`` WITHOUT auto-ack on a private channel and
held unacknowledged; closing the channel returns every one not acknowledged. Only a replay acknowledges, and only
after its database transaction committed (a lost ack leaves the letter in place; the next replay finds the job's
attempt already replayed and removes it as a duplicate). Order and counts on RabbitMQ quorum queues (see
docs/CONTRACT.md and reference/README.md "RabbitMQ versions"): a returned message keeps its place from RabbitMQ 4.0
on; from 4.0 to 4.2 every return also counts towards a delivery limit (default 20 from 4.0 when the queue sets
none), which a browse therefore spends. So the dead-letter queue declares its limit explicitly and high
(DEAD_LETTER_DELIVERY_LIMIT), letters are given back with one ``basic.nack(requeue=true)`` each (from 4.3 on not a
failed delivery, so not counted), and reads are bounded (``limit``). The broker list (AMQP_URLS) is followed as by
every other role (reference/brokers.py).

Replay (operator token, audited in ``dlq_replays``, one row per letter looked at, whatever the outcome):

* a letter naming a ``queued`` job: a new outbox row for the same attempt (the relay publishes it; any other copy
  is a no-op for the worker), once per job and attempt;
* a ``failed`` job: the operator replay of reference/replay.py (failed → queued, a new attempt, replay_audit);
* ``ready`` (or failed with its original released): nothing to do — ``already_terminal``; ``processing`` under a
  live lease: ``in_progress``; both remove the letter;
* the same job and attempt replayed before: ``already_replayed``, a no-op that says when and by whom;
* no job in the message, or no such job: ``unmappable`` — the letter stays, with its reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from reference import topology
from reference.db.queries import queries

if TYPE_CHECKING:
    from reference.brokers import BrokerNodes
    from reference.db.pool import Pool
    from reference.settings import Settings

_T = TypeVar("_T")

LIST_LIMIT = 100
SCAN_LIMIT = 1000
GET_TIMEOUT_SECONDS = 5.0


class DlqRefused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# ------------------------------------------------------------------------------------------------ pure parts

def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _uuid(value: Any) -> str | None:
    try:
        return str(uuid.UUID(str(_text(value))))
    except (TypeError, ValueError, AttributeError):
        return None


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), timezone.utc)
    if isinstance(value, (str, bytes)):
        try:
            parsed = datetime.fromisoformat(str(_text(value)).replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    return None


def message_key(body: bytes, message_id: str | None) -> str:
    """How an operator names a dead letter: its AMQP message_id, or the hash of its body when it has none."""
    return str(message_id) if message_id else "sha256:" + hashlib.sha256(body).hexdigest()


def describe(body: bytes, message_id: str | None, headers: dict[str, Any] | None,
             timestamp: Any = None) -> dict[str, Any]:
    """One dead letter as an operator sees it: its key, the job it maps to (or None), the reason it was
    dead-lettered, when it first died and how often. Pure: used by the list, the replay and the tests."""
    headers = dict(headers or {})
    job_id = attachment_id = attempt = None
    parse_error = None
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        parsed, parse_error = None, f"not JSON ({type(exc).__name__})"
    if isinstance(parsed, dict):
        job_id, attachment_id = _uuid(parsed.get("job_id")), _uuid(parsed.get("attachment_id"))
        attempt = parsed.get("attempt") if isinstance(parsed.get("attempt"), int) else None
        if job_id is None:
            parse_error = "no job_id in the message"
    elif parsed is not None:
        parse_error = "not a JSON object"
    deaths = [d for d in (headers.get("x-death") or []) if isinstance(d, dict)]
    reason = (_text(headers.get("x-dead-letter-reason")) or _text(headers.get("x-first-death-reason"))
              or (_text(deaths[-1].get("reason")) if deaths else None) or "unknown")
    times = [t for t in (_when(headers.get("x-dead-lettered-at")), *(_when(d.get("time")) for d in deaths),
                         _when(timestamp)) if t is not None]
    count = sum(int(d.get("count") or 1) for d in deaths) if deaths else 1
    return {
        "message_key": message_key(body, message_id),
        "message_id": _text(message_id),
        "job_id": job_id,
        "attachment_id": attachment_id,
        "attempt": attempt,
        "mappable": job_id is not None,
        "unmappable_because": None if job_id is not None else (parse_error or "no job_id in the message"),
        "reason": str(reason)[:500],
        "dead_lettered_by": _text(headers.get("x-dead-lettered-by")),
        "first_death_at": min(times).isoformat() if times else None,
        "count": count,
        "size": len(body),
    }


@dataclass
class Selector:
    """Which dead letters a replay takes: by key or job id, or by filter (reason substring, minimum age)."""

    message_keys: set[str] = field(default_factory=set)
    job_ids: set[str] = field(default_factory=set)
    dead_reason: str | None = None
    older_than_seconds: float | None = None
    everything: bool = False
    limit: int = SCAN_LIMIT

    def empty(self) -> bool:
        return not (self.message_keys or self.job_ids or self.dead_reason or self.older_than_seconds is not None
                    or self.everything)

    def matches(self, letter: dict[str, Any], now: datetime) -> bool:
        if self.message_keys or self.job_ids:
            if letter["message_key"] not in self.message_keys and letter.get("job_id") not in self.job_ids:
                return False
        if self.dead_reason and self.dead_reason.lower() not in (letter.get("reason") or "").lower():
            return False
        if self.older_than_seconds is not None:
            first = _when(letter.get("first_death_at"))
            if first is None or (now - first).total_seconds() < self.older_than_seconds:
                return False
        return True


def decide(job: dict[str, Any] | None, replayed_before: dict[str, Any] | None) -> tuple[str, str]:
    """(outcome, detail) for a mappable letter given its job row (locked) and an earlier replay of its attempt.
    ``replay`` means: do it (queued: publish again; failed: operator replay)."""
    if job is None:
        return "unmappable", "no such job in the database"
    if replayed_before is not None:
        return "already_replayed", (f"replayed at {replayed_before['at'].isoformat()} by "
                                    f"{replayed_before['operator']}: nothing done")
    if job["state"] == "ready":
        return "already_terminal", "the job is ready: nothing to replay"
    if job["state"] == "failed" and job["original_released"]:
        return "already_terminal", "the job failed and its original was released after the retention"
    if job["state"] == "processing" and job["lease_live"]:
        return "in_progress", "the job is being processed under a live lease: nothing to replay"
    return "replay", f"job {job['state']}"


# ------------------------------------------------------------------------------------------------ broker side

class _OneBroker:
    """A single URL given where the settings are expected (callers and tests that name one node)."""

    def __init__(self, amqp_url: str) -> None:
        self.amqp_url, self.amqp_urls = amqp_url, ""


async def _open(broker: BrokerNodes | str) -> tuple[AbstractConnection, AbstractChannel, AbstractQueue, int]:
    """``broker``: the settings (AMQP_URLS, else AMQP_URL: the node list every role fails over along, issue 23
    defect 3) or one URL."""
    from reference import brokers

    settings: BrokerNodes = _OneBroker(broker) if isinstance(broker, str) else broker
    connection = await brokers.connect(settings, timeout=GET_TIMEOUT_SECONDS,
                                       client_properties={"connection_name": "reference-dlq"})
    channel = await connection.channel()
    queue = await channel.declare_queue(topology.DEAD_LETTER_QUEUE, passive=True)
    return connection, channel, queue, int(queue.declaration_result.message_count or 0)


async def _take(queue: AbstractQueue, count: int) -> list[AbstractIncomingMessage]:
    """Up to ``count`` dead letters, held unacknowledged (closing the channel returns them)."""
    taken: list[AbstractIncomingMessage] = []
    for _ in range(count):
        message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT_SECONDS)
        if message is None:
            break
        taken.append(message)
    return taken


def _describe_message(message: AbstractIncomingMessage) -> dict[str, Any]:
    return describe(message.body, message.message_id, message.headers, message.timestamp)


async def _give_back(taken: list[AbstractIncomingMessage]) -> None:
    """Return every letter still held, each with its own ``basic.nack(requeue=true)`` before the channel closes:
    from RabbitMQ 4.3 on a nack returns a message without counting a failed delivery (a ``basic.reject`` or a
    channel close counts one), so a read does not spend the letter's delivery limit there; on 3.x and 4.0-4.2
    every return counts, and the dead-letter queue's explicit limit (DEAD_LETTER_DELIVERY_LIMIT) bounds that."""
    for message in taken:
        try:
            await message.nack(requeue=True)
        except Exception:  # already settled (a replay acked it) or the channel is gone: the close returns it
            pass


async def list_letters(broker: BrokerNodes | str, limit: int = LIST_LIMIT) -> dict[str, Any]:
    """What is in the dead-letter queue (the first ``limit`` letters, in queue order). Nothing is acknowledged:
    every letter goes back when the private channel closes."""
    limit = max(1, min(int(limit), SCAN_LIMIT))
    connection, channel, queue, depth = await _open(broker)
    taken: list[AbstractIncomingMessage] = []
    try:
        taken = await _take(queue, min(depth, limit))
        letters = [_describe_message(m) for m in taken]
    finally:
        await _give_back(taken)
        await channel.close()  # returns every letter still held (never acknowledged)
        await connection.close()
    return {"queue": topology.DEAD_LETTER_QUEUE, "depth": depth, "listed": len(letters),
            "complete": len(letters) >= depth, "messages": letters}


async def replay_letters(broker: BrokerNodes | str, pool: Pool, selector: Selector, *, operator: str, reason: str,
                         ttl_seconds: float, max_attempts: int, max_replays: int) -> dict[str, Any]:
    """Replay the dead letters ``selector`` takes; every letter looked at gets an audit row of the request."""
    reason, operator = (reason or "").strip(), (operator or "").strip()
    if not reason:
        raise DlqRefused(400, "reason_required", "a replay needs a reason")
    if not operator:
        raise DlqRefused(400, "operator_required", "a replay needs an operator name")
    if selector.empty():
        raise DlqRefused(400, "selector_required", "name messages or jobs, or give a filter (reason, age, or all)")
    request_id = uuid.uuid4()
    audit: dict[str, Any] = {"request_id": request_id, "operator": operator[:200], "reason": reason[:1000]}
    results: list[dict[str, Any]] = []
    now = datetime.now(timezone.utc)
    connection, channel, queue, depth = await _open(broker)
    seen_keys: set[str] = set()
    seen_jobs: set[str] = set()
    held: list[AbstractIncomingMessage] = []
    try:
        taken = await _take(queue, min(depth, max(1, selector.limit)))
        held = list(taken)
        for message in taken:
            letter = _describe_message(message)
            if not selector.matches(letter, now):
                continue
            seen_keys.add(letter["message_key"])
            if letter["job_id"]:
                seen_jobs.add(letter["job_id"])
            outcome = await _replay_one(pool, letter, audit, ttl_seconds, max_attempts, max_replays)
            results.append(outcome)
            if outcome["outcome"] != "unmappable":
                await message.ack()  # after the commit: a lost ack leaves a duplicate, never a loss
                held.remove(message)
    finally:
        await _give_back(held)
        await channel.close()  # every letter not acknowledged goes back, the unmappable ones among them
        await connection.close()
    # Named but no longer in the queue: replayed before (a no-op that says so), or unknown.
    missing = [("message", k) for k in sorted(selector.message_keys - seen_keys)]
    missing += [("job", j) for j in sorted(selector.job_ids - seen_jobs)]
    for kind, name in missing:
        results.append(await _not_in_queue(pool, kind, name, audit))
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return {"request_id": str(request_id), "operator": audit["operator"], "reason": audit["reason"],
            "dead_letters_seen": depth, "counts": counts, "results": results}


async def _replay_one(pool: Pool, letter: dict[str, Any], audit: dict[str, Any], ttl_seconds: float,
                      max_attempts: int, max_replays: int) -> dict[str, Any]:
    base = {"message_key": letter["message_key"], "job_id": letter["job_id"],
            "attachment_id": letter["attachment_id"], "dead_reason": letter["reason"]}
    row = {**audit, **base, "job_attempt": letter["attempt"]}
    if not letter["mappable"]:
        async with pool.connection() as conn:
            await conn.execute(queries().dlq_audit, {**row, "job_id": None, "attachment_id": None,
                                                     "outcome": "unmappable",
                                                     "detail": letter["unmappable_because"]})
        return {**base, "outcome": "unmappable", "detail": f"{letter['unmappable_because']}: the message stays"}
    from reference.replay import ReplayRefused, replay

    async with pool.connection() as conn:
        async with conn.transaction():
            job = await (await conn.execute(queries().dlq_lock_job, {"job_id": letter["job_id"]})).fetchone()
            attempt = letter["attempt"] if letter["attempt"] is not None else (job or {}).get("attempt")
            row["job_attempt"] = attempt
            before = None
            if job is not None:
                before = await (await conn.execute(queries().dlq_replayed_before,
                                                   {"job_id": job["job_id"], "job_attempt": attempt})).fetchone()
            outcome, detail = decide(job, before)
            if job is not None:
                row["attachment_id"] = job["attachment_id"]
            if outcome == "replay" and job is not None and job["state"] == "queued":  # decide: replay has a job
                republished = await (await conn.execute(queries().dlq_republish_queued, row)).fetchone()
                if republished is not None and republished["replayed"]:  # its audit row was written by the same statement
                    return {**base, "attachment_id": str(job["attachment_id"]), "outcome": "replayed",
                            "detail": f"queued: published again (attempt {job['attempt']})"}
                # Lost to a concurrent replay of the same job and attempt: audited as such (issue 23 defect 11).
                outcome, detail = "already_replayed", "replayed concurrently: nothing done"
            if outcome == "replay" and job is not None:  # failed (original kept) or processing, lease lapsed
                if job["state"] == "failed":
                    try:  # the letter's own job, never the attachment's other versions (issue 23 defect 5)
                        done = await replay(conn, job["attachment_id"], job_id=job["job_id"],
                                            reason=f"dead letter: {audit['reason']}", operator=audit["operator"],
                                            ttl_seconds=ttl_seconds, max_attempts=max_attempts,
                                            max_replays=max_replays, action="dlq_replay")
                        outcome, detail = "replayed", f"failed → queued, attempt {done.attempt}"
                    except ReplayRefused as exc:
                        outcome, detail = "already_terminal", exc.message
                else:
                    outcome, detail = "in_progress", "the job's lease lapsed: the sweeper recovers it"
            await conn.execute(queries().dlq_audit, {**row, "job_id": letter["job_id"] if job else None,
                                                     "attachment_id": row["attachment_id"] if job else None,
                                                     "outcome": outcome, "detail": detail})
    shown = {**base, "outcome": outcome, "detail": detail if outcome != "unmappable" else
             f"{detail}: the message stays"}
    return shown


async def _not_in_queue(pool: Pool, kind: str, name: str, audit: dict[str, Any]) -> dict[str, Any]:
    job_id = _uuid(name) if kind == "job" else None
    async with pool.connection() as conn:
        earlier = await (await conn.execute(queries().dlq_replayed_lookup, {
            "message_key": name if kind == "message" else None, "job_id": job_id})).fetchone()
        if earlier is None:
            return {"message_key": name if kind == "message" else None, "job_id": job_id, "attachment_id": None,
                    "dead_reason": None, "outcome": "not_found",
                    "detail": f"no such {kind} in the dead-letter queue, and none replayed before"}
        detail = (f"not in the dead-letter queue: taken at {earlier['at'].isoformat()} by {earlier['operator']} "
                  f"({earlier['outcome']}); nothing done")
        await conn.execute(queries().dlq_audit, {
            **audit, "message_key": earlier["message_key"], "job_id": earlier["job_id"],
            "attachment_id": earlier["attachment_id"], "job_attempt": earlier["job_attempt"], "dead_reason": None,
            "outcome": "already_replayed", "detail": detail})
    return {"message_key": earlier["message_key"], "job_id": str(earlier["job_id"]),
            "attachment_id": str(earlier["attachment_id"]), "dead_reason": None, "outcome": "already_replayed",
            "detail": detail}


async def run_with_pool(settings: Settings, work: Callable[[Pool], Awaitable[_T]]) -> _T:
    """For the CLI: a small pool of its own around ``work(pool)``."""
    from reference.db.pool import open_pool

    pool = await open_pool(settings, "reference-dlq", min_size=1, max_size=2, wait=True)
    try:
        return await asyncio.wait_for(work(pool), timeout=120)
    finally:
        await pool.close(timeout=2)
