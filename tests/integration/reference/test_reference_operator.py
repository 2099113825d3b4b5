"""Issue 23 defects 5 and 11: operator operations act on the job they name, under an identity the server knows.

Defect 5: at level 5 an attachment has one job per pipeline version; a dead-letter replay of version 2's letter
re-queued a failed version 1 as well (the replay matched the attachment, not the job) while its audit named one job.
Defect 11: the operator identity was whatever the client wrote in X-Operator under one shared token, a refused or
concurrent replay left no audit row, and wrong tokens could be tried without limit. Now: per-operator tokens
(hashed in the database, created and revoked by ``reference operator-token``), the identity taken from the token
(OPERATOR_TOKEN is the bootstrap token, named by OPERATOR_TOKEN_NAME), every outcome in ``operator_audit``, and
after OPERATOR_AUTH_MAX_FAILURES wrong tokens from one client a 429 with Retry-After."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import aio_pika
import httpx
import pytest

from reference_support import wait_for
from test_reference_failures import corrupt_png

pytestmark = pytest.mark.integration
DEAD = "attachments.jobs.dead"


def bearer(token: str, claimed: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    if claimed:
        headers["X-Operator"] = claimed
    return headers


def job_row(pipeline, job_id: str) -> dict:
    return pipeline.sql("SELECT state, attempt FROM jobs WHERE job_id = %s", (job_id,))[0]


def publish_dead_letter_of(pipeline, job_id: str) -> None:
    """The job's message as the broker dead-letters it (delivery limit), straight into the dead-letter queue."""
    row = pipeline.sql("SELECT job_id, attempt, attachment_id, pipeline_version, variants, created_at, expires_at "
                       "FROM jobs WHERE job_id = %s", (job_id,))[0]
    body = {"schema_version": 1, "job_id": str(row["job_id"]), "attempt": row["attempt"],
            "attachment_id": str(row["attachment_id"]), "pipeline_version": row["pipeline_version"],
            "variants": list(row["variants"]), "created_at": row["created_at"].isoformat().replace("+00:00", "Z"),
            "expires_at": row["expires_at"].isoformat().replace("+00:00", "Z")}

    async def publish(channel):
        await channel.default_exchange.publish(
            aio_pika.Message(json.dumps(body).encode(), message_id=str(job_id),
                             headers={"x-first-death-reason": "delivery_limit"},
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT), DEAD)

    pipeline.amqp(publish)


def test_a_replay_acts_on_the_job_it_names_not_on_every_failed_version(pipeline):
    """Defect 5 (red before the fix: version 1 was re-queued by the replay of version 2's letter)."""
    pipeline.env["LEVEL"] = "5"
    pipeline.start_all(("api", "relay", "worker"))
    attachment_id = pipeline.upload(corrupt_png(), filename="broken.png").json()["attachment_id"]
    v1 = pipeline.wait_state(attachment_id, ("failed",))["job_id"]
    made = httpx.post(f"{pipeline.api_url}/v1/admin/attachments/{attachment_id}/reprocess",
                      json={"pipeline_version": 2, "reason": "v2 decoder"}, headers=bearer("op-token"), timeout=10)
    assert made.status_code == 202, made.text
    v2 = made.json()["job_id"]
    pipeline.start("worker", name="worker-v2", PIPELINE_VERSION="2")
    wait_for(lambda: job_row(pipeline, v2)["state"] == "failed", 30, interval=0.2, what="version 2 failed")

    publish_dead_letter_of(pipeline, v2)
    done = httpx.post(f"{pipeline.api_url}/v1/admin/dlq/jobs/{v2}/replay", json={"reason": "v2 letter"},
                      headers=bearer("op-token"), timeout=30)
    assert done.status_code == 200 and done.json()["counts"] == {"replayed": 1}, done.text
    wait_for(lambda: job_row(pipeline, v2) == {"state": "failed", "attempt": 2}, 30, interval=0.2,
             what="version 2's replayed attempt failed again")
    assert job_row(pipeline, v1) == {"state": "failed", "attempt": 1}  # version 1 untouched
    replays = pipeline.sql("SELECT job_id::text AS job_id, from_attempt, to_attempt FROM replay_audit "
                           "WHERE from_attempt > 0")
    assert replays == [{"job_id": v2, "from_attempt": 1, "to_attempt": 2}]

    # The attachment's own replay takes the job its status shows (version 1 here), or the version it names.
    url = f"{pipeline.api_url}/v1/admin/attachments/{attachment_id}/replay"
    first = httpx.post(url, json={"reason": "status job"}, headers=bearer("op-token"), timeout=10)
    assert first.status_code == 202 and first.json()["job_id"] == v1, first.text
    assert job_row(pipeline, v2)["attempt"] == 2
    named = httpx.post(url, json={"reason": "version 2", "pipeline_version": 2}, headers=bearer("op-token"),
                       timeout=10)
    assert named.status_code == 202 and named.json() == {"attachment_id": attachment_id, "job_id": v2,
                                                         "attempt": 3}, named.text


def test_operator_identity_comes_from_the_token_and_every_outcome_is_audited(pipeline):
    """Defect 11 (red before the fix: no `reference operator-token`, X-Operator taken as the identity, refused and
    concurrent replays unaudited, wrong tokens tried without limit)."""
    pipeline.start_all(("api", "relay", "worker"), api={"OPERATOR_AUTH_MAX_FAILURES": "5"})
    created = pipeline.command("operator-token", "create", "alice")
    assert created.returncode == 0, created.stderr[-2000:]
    alice = json.loads(created.stdout.strip().splitlines()[-1])["token"]
    assert pipeline.sql("SELECT count(*) AS n FROM operator_tokens WHERE token_sha256 LIKE %s",
                        (f"%{alice}%",))[0]["n"] == 0  # only its hash is stored

    attachment_id = pipeline.upload(corrupt_png(), filename="broken.png").json()["attachment_id"]
    job_id = pipeline.wait_state(attachment_id, ("failed",))["job_id"]
    pipeline.roles["worker"].kill()  # the replayed job stays queued: the other three find it so, whatever the load
    url = f"{pipeline.api_url}/v1/admin/attachments/{attachment_id}/replay"

    def replay(headers):
        return httpx.post(url, json={"reason": "concurrent"}, headers=headers, timeout=15)

    with ThreadPoolExecutor(4) as pool:  # four at once: one replays, three are refused — all four audited
        answers = list(pool.map(replay, [bearer(alice, "mallory")] * 4))
    assert sorted(a.status_code for a in answers) == [202, 409, 409, 409], [a.text for a in answers]
    audit = pipeline.sql("SELECT operator, action, outcome, status, job_id::text AS job_id FROM operator_audit "
                         "WHERE action = 'replay' ORDER BY id")
    assert sorted((a["operator"], a["outcome"], a["status"]) for a in audit) == [
        ("api:alice", "accepted", 202)] + [("api:alice", "not_failed", 409)] * 3, audit
    assert {a["job_id"] for a in audit} == {job_id}
    events = pipeline.events(attachment_id)
    assert [e["actor"] for e in events if e["from"] == "failed"] == ["operator:api:alice"]

    # The bootstrap token (OPERATOR_TOKEN, what the harness uses) has its own name; X-Operator is ignored.
    pipeline.start("worker", name="worker-2")
    wait_for(lambda: (s := pipeline.status(attachment_id))["attempt"] == 2 and s["state"] == "failed", 30,
             what="the replayed attempt failed")
    boot = replay(bearer("op-token", "mallory"))
    assert boot.status_code == 202, boot.text
    assert pipeline.sql("SELECT operator FROM replay_audit ORDER BY id DESC LIMIT 1")[0]["operator"] == "api:bootstrap"

    revoked = pipeline.command("operator-token", "revoke", "alice")
    assert revoked.returncode == 0, revoked.stderr[-2000:]
    assert replay(bearer(alice)).status_code == 403  # revoked: a wrong token from now on (1 failure)

    # Wrong tokens: refused with 403 until the limit, then 429 with Retry-After — even for a good token.
    codes = [replay(bearer(f"guess-{n}")).status_code for n in range(4)]
    assert codes == [403, 403, 403, 403]
    locked = replay(bearer("op-token"))
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) >= 1, locked.text
    assert replay({}).status_code == 401  # no credentials: not a guess, never counted
    refused = pipeline.sql("SELECT outcome, status FROM operator_audit WHERE action = 'authenticate' ORDER BY id")
    assert [r["status"] for r in refused] == [403] * 5 + [429], refused
