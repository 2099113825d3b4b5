"""Broken on purpose: the API publishes the job itself right after its commit — no outbox row.

The upload's record commits without an outbox row; the API then publishes the
message directly (failpoint `after_commit_before_publish` sits between the two,
in the API). A crash there leaves an accepted job `queued` with nothing that
will ever publish it; an idempotent retry of the upload only replays the 202.
"""

import json
import re
import sys

import aio_pika
import psycopg

from reference import topology
from reference.api import app as app_mod
from reference.api.routes import attachments as attachments_mod
from reference.cli import main
from reference.db.queries import queries
from reference.messages import JobMessage

# The outbox insert of the upload statement, as a CTE (`message AS (INSERT INTO outbox ...)`) or as the final
# statement: replaced by a plain select of the job so the rest of the statement keeps its shape.
OUTBOX_CTE = re.compile(r"(\w+) AS \(\s*INSERT INTO outbox \(job_id, attempt\)\s*SELECT job_id, attempt FROM job"
                        r"\s*RETURNING id\s*\)", re.S)
OUTBOX_TAIL = re.compile(r"INSERT INTO outbox \(job_id, attempt\)\s*SELECT job_id, attempt FROM job\s*RETURNING id\s*$",
                         re.S)
statements = queries()._statements
sql = statements["record_upload"]
if OUTBOX_CTE.search(sql):
    sql = OUTBOX_CTE.sub(r"\1 AS (SELECT job_id AS id FROM job)", sql)
elif OUTBOX_TAIL.search(sql):
    sql = OUTBOX_TAIL.sub("SELECT job_id FROM job", sql)
if "outbox" in sql:
    raise SystemExit("no_outbox variant: the reference's record_upload changed shape; update tests/broken/no_outbox")
statements["record_upload"] = sql

REPLAYED: set = set()  # Idempotency-Keys answered from an earlier upload (nothing new committed)
_original_answer = attachments_mod._idempotent_answer


async def _tracking_answer(pool, key, request_sha256):
    answer = await _original_answer(pool, key, request_sha256)
    if answer is not None:
        REPLAYED.add(key)
    return answer


attachments_mod._idempotent_answer = _tracking_answer

JOB_ROW = """SELECT job_id, attempt, attachment_id, pipeline_version, variants, created_at, expires_at,
                    traceparent, tracestate FROM jobs WHERE job_id = %(job_id)s"""


class PublishAfterCommit:
    """ASGI wrapper: after a fresh 202 from POST /v1/attachments, publish the job directly."""

    def __init__(self, app, settings):
        self.app = app
        self.settings = settings
        self.channel = None

    def __getattr__(self, name):  # uvicorn and tests look at app.state etc.
        return getattr(self.app, name)

    async def publish(self, job_id: str) -> None:
        async with await psycopg.AsyncConnection.connect(self.settings.psycopg_conninfo) as conn:
            cursor = await conn.execute(JOB_ROW, {"job_id": job_id})
            columns = [c.name for c in cursor.description]
            row = dict(zip(columns, await cursor.fetchone()))
        if self.channel is None or self.channel.is_closed:
            connection = await aio_pika.connect(self.settings.amqp_url)
            self.channel = await connection.channel(publisher_confirms=True)
        job = JobMessage(job_id=row["job_id"], attempt=row["attempt"], attachment_id=row["attachment_id"],
                         pipeline_version=row["pipeline_version"], variants=tuple(row["variants"]),
                         created_at=row["created_at"], expires_at=row["expires_at"],
                         traceparent=row["traceparent"], tracestate=row["tracestate"])
        exchange = await self.channel.get_exchange(topology.EXCHANGE, ensure=False)
        await exchange.publish(aio_pika.Message(job.to_body(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                                **job.amqp_properties()), topology.ROUTING_KEY)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/v1/attachments":
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
        if start is not None and start["status"] == 202 and key not in REPLAYED:
            await self.app.state.failpoints.ahit("after_commit_before_publish")
            await self.publish(json.loads(body)["job_id"])  # THE BUG: nothing retries this if we die first
        await send(start)
        await send({"type": "http.response.body", "body": body})


_original_create_app = app_mod.create_app


def create_app(settings, **kwargs):
    return PublishAfterCommit(_original_create_app(settings, **kwargs), settings)


app_mod.create_app = create_app

if __name__ == "__main__":
    sys.exit(main())
