"""Issue 12 (BE-JOB-003): the dead-letter channel — listed without loss, replayed by job or filter behind the
operator token, audited, idempotent; an unmappable letter stays. And (BE-JOB-005) the sweeper expires queued jobs
nobody claims, counted on ``attachments_expired_total`` of the sweeper's /metrics."""

from __future__ import annotations

import json

import aio_pika
import httpx
import pytest

from reference_support import free_port, sample_jpeg, wait_for

pytestmark = pytest.mark.integration

# The bootstrap token (OPERATOR_TOKEN) is the operator "bootstrap"; X-Operator is ignored (issue 23 defect 11).
TOKEN = {"Authorization": "Bearer op-token", "X-Operator": "alice"}
WORK, DEAD = "attachments.jobs.process", "attachments.jobs.dead"


def dead_letter_the_work_queue(pipeline) -> int:
    """Move every message of the work queue to the dead-letter queue, as a delivery limit would (no consumer runs)."""
    async def move(channel):
        queue = await channel.declare_queue(WORK, passive=True)
        dlx = await channel.get_exchange("attachments.jobs.dlx")
        moved = 0
        while (message := await queue.get(no_ack=False, fail=False)) is not None:
            headers = {**(message.headers or {}), "x-first-death-reason": "delivery_limit"}
            await dlx.publish(aio_pika.Message(message.body, headers=headers, message_id=message.message_id,
                                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "jobs.process")
            await message.ack()
            moved += 1
        return moved

    return pipeline.amqp(move)


def publish_dead(pipeline, body: bytes, message_id: str) -> None:
    async def publish(channel):
        await channel.default_exchange.publish(
            aio_pika.Message(body, message_id=message_id, headers={"x-dead-letter-reason": "not JSON"},
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT), DEAD)

    pipeline.amqp(publish)


def test_dlq_list_replay_by_job_is_audited_idempotent_and_leaves_the_unmappable(pipeline):
    pipeline.start_all(("api", "relay"))
    accepted = pipeline.upload(sample_jpeg(3))
    assert accepted.status_code == 202, accepted.text
    attachment_id, job_id = accepted.json()["attachment_id"], accepted.json()["job_id"]
    wait_for(lambda: pipeline.queue_depths()[WORK] == 1, 20, what="the job's message in the work queue")
    assert dead_letter_the_work_queue(pipeline) == 1
    publish_dead(pipeline, b"garbage {not json", "poison-1")
    wait_for(lambda: pipeline.queue_depths()[DEAD] == 2, 10, what="two dead letters")

    url = f"{pipeline.api_url}/v1/admin/dlq"
    assert httpx.get(url, timeout=10).status_code == 401
    first = httpx.get(url, headers=TOKEN, timeout=10).json()
    second = httpx.get(url, headers=TOKEN, timeout=10).json()
    assert first["depth"] == 2 and first["complete"]
    assert [m["message_key"] for m in first["messages"]] == [m["message_key"] for m in second["messages"]]
    letters = {m["message_key"]: m for m in first["messages"]}
    assert letters[job_id]["job_id"] == job_id and letters[job_id]["attachment_id"] == attachment_id
    assert letters[job_id]["reason"] == "delivery_limit"
    assert letters["poison-1"]["mappable"] is False and letters["poison-1"]["reason"] == "not JSON"
    assert pipeline.queue_depths()[DEAD] == 2  # reading consumed nothing
    listed = pipeline.command("dlq", "list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert json.loads(listed.stdout)["depth"] == 2

    replay_url = f"{pipeline.api_url}/v1/admin/dlq/jobs/{job_id}/replay"
    assert httpx.post(replay_url, json={"reason": "x"}, timeout=10).status_code == 401
    done = httpx.post(replay_url, json={"reason": "broker limit raised"}, headers=TOKEN, timeout=30)
    assert done.status_code == 200, done.text
    assert done.json()["counts"] == {"replayed": 1}, done.json()
    pipeline.start("worker")
    pipeline.wait_state(attachment_id, ("ready",), timeout=45)

    again = httpx.post(replay_url, json={"reason": "twice"}, headers=TOKEN, timeout=30).json()
    assert again["counts"] == {"already_replayed": 1}, again
    assert "nothing done" in again["results"][0]["detail"]
    by_cli = pipeline.command("dlq", "replay", "--all", "--reason", "sweep the rest", "--operator", "bob")
    assert by_cli.returncode == 0, by_cli.stderr[-2000:]
    assert json.loads(by_cli.stdout)["counts"] == {"unmappable": 1}
    assert pipeline.queue_depths()[DEAD] == 1  # the unmappable letter stays

    pipeline.assert_exactly_once(attachment_id)
    audit = pipeline.sql("SELECT outcome, operator, reason, job_id::text AS job_id, message_key FROM dlq_replays "
                         "ORDER BY id")
    assert [(a["outcome"], a["operator"]) for a in audit] == [
        ("replayed", "api:bootstrap"), ("already_replayed", "api:bootstrap"), ("unmappable", "bob")]
    assert audit[0]["job_id"] == job_id and audit[0]["reason"] == "broker limit raised"
    assert audit[2]["message_key"] == "poison-1" and audit[2]["job_id"] is None
    assert httpx.post(f"{pipeline.api_url}/v1/admin/dlq/replay", json={"reason": "no selector"}, headers=TOKEN,
                      timeout=10).status_code == 400


def metric_value(url: str, labels: str) -> float:
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith("attachments_expired_total{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sweeper_expires_unclaimed_queued_jobs_and_counts_them(pipeline):
    port = free_port()
    pipeline.start_all(("api", "relay", "sweeper"), api={"JOB_TTL_SECONDS": "2"},
                       sweeper={"METRICS_PORT": str(port)})
    ids = []
    for seed in (1, 2):
        answer = pipeline.upload(sample_jpeg(seed))
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["attachment_id"])
    for attachment_id in ids:  # no worker runs: only the sweeper can expire them
        status = pipeline.wait_state(attachment_id, ("failed",), timeout=20)
        assert status["error_code"] == "expired" and status["variants"] == []
        events = pipeline.events(attachment_id)
        assert [(e["from"], e["to"], e["actor"]) for e in events][-1] == ("queued", "failed", "sweeper")
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    assert metric_value(metrics_url, 'role="sweeper",where="sweeper"') == 2.0
    pipeline.start("worker")  # the messages still in the queue find the jobs terminal: no effect
    wait_for(lambda: pipeline.queue_depths()[WORK] == 0, 20, what="the work queue drained")
    for attachment_id in ids:
        assert pipeline.status(attachment_id)["state"] == "failed"
    assert pipeline.sql("SELECT count(*) AS n FROM results")[0]["n"] == 0
