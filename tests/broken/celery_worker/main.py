"""Broken on purpose: the usual Python deployment — a Celery worker, the task enqueued right after the commit.

What many Python teams run, built from the reference's API, schema, render and S3 code:

* the API commits the attachment and its job (no outbox row), then calls the Celery task's ``apply_async`` right
  after the commit (failpoint ``after_commit_before_publish`` sits between the two, in the API). A crash there
  leaves an accepted job ``queued`` with nothing that will ever publish it — the commit→publish window loses work;
* the worker is a plain Celery worker on the RabbitMQ broker (AMQP_URL): ``acks_late=True``,
  ``task_reject_on_worker_lost=True``, ``worker_prefetch_multiplier=1``, the threads pool with
  WORKER_CONCURRENCY threads. Its task marks the job ``processing`` with a naive state update (no lease, no
  fencing token: ``lease_expires_at`` is just 'infinity'), renders the variants with the reference's renderer,
  writes them to S3 under fixed keys and marks the job ``ready``. Nobody reads the job's TTL: no ``expires`` is
  passed to ``apply_async`` and the task never looks at ``expires_at`` — a backlog that outlived its deadline is
  rendered ``ready`` anyway;
* transient errors (S3, database, a failpoint ``error``) are retried with Celery's ``self.retry`` (a new message,
  full-jitter backoff from RETRY_BASE_SECONDS to RETRY_CAP_SECONDS), at most MAX_ATTEMPTS attempts, then
  ``failed`` ``attempts_exhausted``; an image Pillow refuses ends ``failed`` with the reference's error_code;
* the operator replay endpoint is the reference's; the API enqueues the task after its commit too;
* a ``janitor`` (the reference's sweeper with its lease recovery and lost-message republish switched off — there
  is no lease and no outbox) cleans staging like a periodic cleanup task would. It recovers no work.

Messages are Celery's own (protocol 2: the body is ``[args, kwargs, embed]``, the task in the headers), as a real
Celery deployment sends them, not jobs.schema.json.

Roles: ``migrate`` (schema, bucket, the Celery queue), ``api``, ``worker``, ``janitor``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import socket
import sys
import uuid

import psycopg
from celery import Celery
from kombu import Exchange, Queue

from reference import imaging, topology
from reference.db.pool import connection_kwargs
from reference.db.queries import queries
from reference.failpoints import FailpointError, Failpoints
from reference.keys import variant_key
from reference.settings import Settings
from reference.storage import ObjectMissing, ObjectStore, StorageUnavailable, sha256_hex

log = logging.getLogger("celery_worker")

QUEUE_NAME = "attachments.render"  # the adapter's [broker] work_queue
TASK_NAME = "attachments.render_attachment"
WORK_QUEUE = Queue(QUEUE_NAME, Exchange(QUEUE_NAME, type="direct", durable=True), routing_key=QUEUE_NAME,
                   durable=True)

settings = Settings()

app = Celery("attachments", broker=settings.amqp_url)
app.conf.update(
    task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True,
    task_queues=[WORK_QUEUE], task_default_queue=QUEUE_NAME, task_default_exchange=QUEUE_NAME,
    task_default_routing_key=QUEUE_NAME, task_create_missing_queues=False,
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
    worker_concurrency=settings.worker_concurrency, worker_pool="threads",
    worker_enable_remote_control=False, worker_send_task_events=False, worker_hijack_root_logger=True,
    worker_redirect_stdouts=False,  # keep the real stderr: a failpoint announces itself on its file descriptor
    broker_connection_retry_on_startup=True, broker_connection_max_retries=None, broker_heartbeat=10,
)


# ------------------------------------------------------------------------------------------------- the API


def strip_outbox(sql: str, name: str) -> str:
    """The reference's statement without its outbox row: the API enqueues the task itself after the commit."""
    cte = re.compile(r",\s*(\w+) AS \(\s*INSERT INTO outbox \(job_id, attempt\)\s*SELECT job_id, attempt FROM (\w+)"
                     r"(\s*RETURNING id)?\s*\)", re.S)
    match = cte.search(sql)
    if match is None:
        raise SystemExit(f"celery_worker variant: the reference's {name} changed shape; update tests/broken/celery_worker")
    stub = f", {match.group(1)} AS (SELECT job_id AS id FROM {match.group(2)})"
    sql = sql[:match.start()] + stub + sql[match.end():]
    if "outbox" in sql:
        raise SystemExit(f"celery_worker variant: {name} still writes the outbox; update tests/broken/celery_worker")
    return sql


def enqueue(job_id: str, attachment_id: str) -> None:
    """What the view calls after ``session.commit()``: no ``expires``, no outbox — the broker is the only record."""
    render_attachment.apply_async(kwargs={"job_id": job_id, "attachment_id": attachment_id})


class EnqueueAfterCommit:
    """ASGI wrapper: after a fresh 202 of an upload or a replay (committed by then), enqueue the Celery task."""

    def __init__(self, app_, failpoints: Failpoints, replayed: set):
        self.app = app_
        self.failpoints = failpoints
        self.replayed = replayed

    def __getattr__(self, name):  # uvicorn and tests look at app.state etc.
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not (
                scope["path"] == "/v1/attachments" or scope["path"].endswith("/replay")):
            return await self.app(scope, receive, send)
        start, chunks = None, []

        async def capture(message):
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            else:
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, capture)
        body = b"".join(chunks)
        key = dict(scope.get("headers") or []).get(b"idempotency-key", b"").decode() or None
        if start is not None and start["status"] == 202 and (key is None or key not in self.replayed):
            answer = json.loads(body)
            await self.failpoints.ahit("after_commit_before_publish")
            # THE BUG: a crash (or a broker that refuses) right here, after the commit, loses the job for good.
            await asyncio.to_thread(enqueue, str(answer["job_id"]), str(answer["attachment_id"]))
        await send(start)
        await send({"type": "http.response.body", "body": body})


def cmd_api() -> int:
    from reference.api import app as app_mod
    from reference.api.routes import attachments as attachments_mod
    from reference.cli import main

    statements = queries()._statements
    statements["record_upload"] = strip_outbox(statements["record_upload"], "record_upload")
    statements["replay_job"] = strip_outbox(statements["replay_job"], "replay_job")
    replayed: set = set()  # Idempotency-Keys answered from an earlier upload (nothing new committed)
    original_answer = attachments_mod._idempotent_answer

    async def tracking_answer(pool, key, request_sha256):
        answer = await original_answer(pool, key, request_sha256)
        if answer is not None:
            replayed.add(key)
        return answer

    attachments_mod._idempotent_answer = tracking_answer
    original_create_app = app_mod.create_app

    def create_app(settings_, **kwargs):
        return EnqueueAfterCommit(original_create_app(settings_, **kwargs), Failpoints(settings_.failpoints), replayed)

    app_mod.create_app = create_app
    return main(["api"])


# ------------------------------------------------------------------------------------------------- the worker

store = None
failpoints = Failpoints(os.environ.get("FAILPOINTS", ""))
LIMITS = imaging.Limits(settings.max_pixels, settings.max_side, settings.max_frames)
TRANSIENT = (StorageUnavailable, ObjectMissing, FailpointError, psycopg.OperationalError, psycopg.InterfaceError,
             ConnectionError, TimeoutError)
OWNER = f"celery@{socket.gethostname()}:{os.getpid()}"


def db() -> psycopg.Connection:
    return psycopg.connect(settings.psycopg_conninfo, **connection_kwargs(settings, "celery-worker"))


def event(conn, job: dict, from_state: str, to_state: str, attempt: int, reason: str | None = None,
          next_attempt_at=None) -> None:
    conn.execute("""INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason,
                                                   actor, next_attempt_at)
                    VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
                 (job["attachment_id"], job["job_id"], from_state, to_state, attempt, reason, f"worker:{OWNER}",
                  next_attempt_at))


def start_job(job_id: str) -> dict | None:
    """The usual "if it is done, skip; else mark it processing" — no lease, no fencing token, no deadline."""
    with db() as conn, conn.transaction():
        job = conn.execute("""SELECT j.job_id, j.attachment_id, j.state, j.attempt, j.pipeline_version, j.variants,
                                     a.original_key, a.original_sha256
                              FROM jobs j JOIN attachments a USING (attachment_id)
                              WHERE j.job_id = %s FOR UPDATE OF j""", (job_id,)).fetchone()
        if job is None or job["state"] in ("ready", "failed"):
            return job and {**job, "skip": True}
        conn.execute("""UPDATE jobs SET state = 'processing', lease_owner = %s, lease_expires_at = 'infinity',
                               updated_at = now() WHERE job_id = %s""", (OWNER, job_id))
        if job["state"] == "queued":
            event(conn, job, "queued", "processing", job["attempt"])
        return {**job, "skip": False}


def finish_ready(job: dict, results: list[dict]) -> bool:
    with db() as conn, conn.transaction():
        row = conn.execute("""UPDATE jobs SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
                                     last_error = NULL, updated_at = now()
                              WHERE job_id = %s AND state = 'processing' RETURNING attempt""",
                           (job["job_id"],)).fetchone()
        if row is None:
            return False
        for r in results:
            conn.execute("""INSERT INTO results (attachment_id, pipeline_version, variant, object_key, sha256, size,
                                                 content_type, width, height, job_id, attempt, fencing_token)
                            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0)
                            ON CONFLICT (attachment_id, pipeline_version, variant) DO UPDATE
                            SET object_key = excluded.object_key, sha256 = excluded.sha256, size = excluded.size,
                                width = excluded.width, height = excluded.height, attempt = excluded.attempt""",
                         (job["attachment_id"], job["pipeline_version"], r["variant"], r["object_key"], r["sha256"],
                          r["size"], r["content_type"], r["width"], r["height"], job["job_id"], row["attempt"]))
        event(conn, job, "processing", "ready", row["attempt"])
        return True


def finish_failed(job: dict, error_code: str, reason: str) -> None:
    with db() as conn, conn.transaction():
        row = conn.execute("""UPDATE jobs SET state = 'failed', error_code = %s, last_error = %s,
                                     lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
                              WHERE job_id = %s AND state = 'processing' RETURNING attempt""",
                           (error_code, reason[:500], job["job_id"])).fetchone()
        if row is not None:
            event(conn, job, "processing", "failed", row["attempt"], f"{error_code}: {reason[:200]}")


def requeue(job: dict, delay: float, reason: str) -> None:
    with db() as conn, conn.transaction():
        row = conn.execute("""UPDATE jobs SET state = 'queued', attempt = attempt + 1,
                                     next_attempt_at = now() + make_interval(secs => %s), last_error = %s,
                                     lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
                              WHERE job_id = %s AND state = 'processing' RETURNING attempt, next_attempt_at""",
                           (delay, reason[:500], job["job_id"])).fetchone()
        if row is not None:
            event(conn, job, "processing", "queued", row["attempt"], reason[:200], row["next_attempt_at"])


def render_and_store(job: dict) -> list[dict]:
    original = store.get_bytes(job["original_key"])
    if sha256_hex(original) != job["original_sha256"].strip():
        raise imaging.ImageRejected("original_checksum_mismatch", "staging object differs from its record")
    results = []
    for variant in imaging.render_variants(original, tuple(job["variants"]), LIMITS):
        key = variant_key(job["attachment_id"], job["pipeline_version"], variant.name, variant.extension)
        digest = sha256_hex(variant.data)
        store.put_bytes(key, variant.data, variant.content_type, digest)
        results.append({"variant": variant.name, "object_key": key, "sha256": digest, "size": len(variant.data),
                        "content_type": variant.content_type, "width": variant.width, "height": variant.height})
    return results


@app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True,
          max_retries=max(0, settings.max_attempts - 1))
def render_attachment(self, job_id: str, attachment_id: str) -> str:
    job = start_job(job_id)
    if job is None:
        log.warning("job %s: no such job; dropping", job_id)
        return "unknown"
    if job["skip"]:
        return job["state"]
    try:
        results = render_and_store(job)
        failpoints.hit("after_s3_write_before_commit")
        done = finish_ready(job, results)
        failpoints.hit("after_commit_before_ack")
        return "ready" if done else "not processing"
    except imaging.ImageRejected as exc:
        finish_failed(job, exc.code, str(exc))
        return "failed"
    except TRANSIENT as exc:
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        if self.request.retries >= self.max_retries:
            finish_failed(job, "attempts_exhausted", reason)
            return "failed"
        delay = random.uniform(0, min(settings.retry_cap_seconds,
                                      settings.retry_base_seconds * 2 ** self.request.retries))
        requeue(job, delay, reason)
        raise self.retry(exc=exc, countdown=delay) from exc


def cmd_worker() -> int:
    global store
    imaging._init_pool_process(LIMITS.max_pixels)  # the renderer's Pillow limits, in this process (threads pool)
    store = ObjectStore.from_settings(settings, max_pool_connections=settings.worker_concurrency * 2 + 4)
    app.worker_main(["worker", "--loglevel", settings.log_level, "--pool", "threads",
                     "--concurrency", str(settings.worker_concurrency), "--prefetch-multiplier", "1",
                     "--queues", QUEUE_NAME, "--without-gossip", "--without-mingle", "--without-heartbeat",
                     "--hostname", f"render-{uuid.uuid4().hex[:8]}@%h"])
    return 0


# ------------------------------------------------------------------------------------------------- setup, janitor


def cmd_migrate() -> int:
    from reference.cli import main

    async def declare(channel, _config) -> None:  # the Celery work queue instead of the reference's topology
        import aio_pika

        exchange = await channel.declare_exchange(QUEUE_NAME, aio_pika.ExchangeType.DIRECT, durable=True)
        queue = await channel.declare_queue(QUEUE_NAME, durable=True)
        await queue.bind(exchange, QUEUE_NAME)

    topology.declare = declare
    return main(["migrate"])


def cmd_janitor() -> int:
    from reference import sweeper as sweeper_mod
    from reference.cli import main

    async def nothing(self) -> int:
        return 0

    sweeper_mod.Sweeper._expire_leases = nothing  # no lease to recover: a started job has no deadline
    sweeper_mod.Sweeper._republish_lost = nothing  # no outbox, no relay: nothing republishes a lost message
    sweeper_mod.Sweeper._expire_queued = nothing  # nobody reads the TTL (see above): no queued job expires
    return main(["sweeper"])


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    commands = {"api": cmd_api, "worker": cmd_worker, "migrate": cmd_migrate, "janitor": cmd_janitor}
    if role not in commands:
        raise SystemExit(f"usage: main.py {{{','.join(commands)}}}")
    sys.exit(commands[role]())
