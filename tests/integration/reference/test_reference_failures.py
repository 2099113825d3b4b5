"""Bounded retries, terminal states, replay (BE-JOB-003), input safety, and
503-never-202 when a backend is down."""

from __future__ import annotations

import io
import json
import signal
import struct
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import httpx
import pytest
from PIL import Image

from harness.stack.process import group_members
from reference_support import assert_event_path, sample_jpeg, wait_for

pytestmark = pytest.mark.integration


def corrupt_png() -> bytes:
    """Valid signature, header and trailer; the pixel data does not decompress."""
    buffer = io.BytesIO()
    Image.effect_noise((200, 200), 50).convert("RGB").save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    start = data.index(b"IDAT") + 4
    data[start:start + 64] = b"\x00" * 64
    return bytes(data)


def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_poison_messages_are_dead_lettered_with_a_reason_not_retried(pipeline):
    pipeline.start_all(roles=("relay", "worker"))
    unknown = {"schema_version": 1, "job_id": str(uuid.uuid4()), "attempt": 1, "attachment_id": str(uuid.uuid4()),
               "pipeline_version": 1, "variants": ["thumbnail"], "created_at": "2026-01-01T00:00:00Z",
               "expires_at": "2099-01-01T00:00:00Z"}
    pipeline.publish_raw(b"{not json", message_id="x")
    pipeline.publish_raw(json.dumps({**unknown, "url": "http://evil.invalid/a.jpg"}).encode(),
                         message_id=unknown["job_id"])
    pipeline.publish_raw(json.dumps(unknown).encode(), message_id=unknown["job_id"])
    wait_for(lambda: pipeline.queue_depths() == {"attachments.jobs.process": 0, "attachments.jobs.dead": 3}, 20,
             what="three dead letters")
    reasons = sorted(m["headers"].get("x-dead-letter-reason", "") for m in pipeline.dead_letters())
    assert reasons[0].startswith("an extra field carries a location")  # extra fields are fine, a URL is not
    assert reasons[1].startswith("body is not JSON")
    assert reasons[2].startswith("unknown_job")
    assert pipeline.roles["worker"].log().count("dead-lettering message") == 3


def test_file_pillow_rejects_fails_terminally_and_can_be_replayed_by_http(pipeline):
    pipeline.start_all()
    response = pipeline.upload(corrupt_png(), filename="broken.png")
    assert response.status_code == 202, response.text  # structurally fine: only decoding reveals it
    attachment_id = response.json()["attachment_id"]
    status = pipeline.wait_state(attachment_id, states=("failed",))
    assert (status["error_code"], status["attempt"], status["variants"]) == ("decode_failed", 1, [])
    assert [e["to"] for e in pipeline.events(attachment_id)] == ["queued", "processing", "failed"]

    url = f"{pipeline.api_url}/v1/admin/attachments/{attachment_id}/replay"
    assert httpx.post(url, json={"reason": "x"}).status_code == 401
    assert httpx.post(url, json={"reason": "x"}, headers={"Authorization": "Bearer nope"}).status_code == 403
    replayed = httpx.post(url, json={"reason": "new decoder"},
                          headers={"Authorization": "Bearer op-token", "X-Operator": "carol"})
    assert replayed.status_code == 202, replayed.text
    assert replayed.json() == {"attachment_id": attachment_id, "job_id": status["job_id"], "attempt": 2}
    status = wait_for(lambda: (s := pipeline.status(attachment_id))["attempt"] == 2 and s["state"] == "failed" and s,
                      30, what="replayed attempt failed again")
    assert status["error_code"] == "decode_failed"
    events = pipeline.events(attachment_id)
    assert_event_path(events)
    assert (events[3]["from"], events[3]["to"], events[3]["actor"]) == ("failed", "queued", "operator:api:bootstrap")
    audit = pipeline.sql("SELECT operator, reason, from_attempt, to_attempt FROM replay_audit")
    assert audit == [{"operator": "api:bootstrap", "reason": "new decoder", "from_attempt": 1, "to_attempt": 2}]


def test_transient_errors_retry_with_growing_jittered_delays_then_fail_then_cli_replay(pipeline):
    pipeline.env["MAX_ATTEMPTS"] = "4"
    pipeline.start_all(worker={"FAILPOINTS": "after_s3_write_before_commit=error"})
    attachment_id = pipeline.upload(sample_jpeg(20)).json()["attachment_id"]
    status = pipeline.wait_state(attachment_id, states=("failed",), timeout=40)
    assert (status["error_code"], status["attempt"]) == ("attempts_exhausted", 4)

    events = pipeline.events(attachment_id)
    assert_event_path(events)
    requeues = [e for e in events if e["from"] == "processing" and e["to"] == "queued"]
    assert [e["attempt"] for e in requeues] == [2, 3, 4]
    delays = [ts(e["next_attempt_at"]) - ts(e["at"]) for e in requeues]
    ceilings = [0.2, 0.4, 0.8]  # min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2**n)
    # next_attempt_at is the transaction's now() plus the delay, the event's at its clock_timestamp() a moment later
    # in the same transaction: a full-jitter delay near 0 reads a hair below 0 (-0.0004 s in a CI rehearsal).
    assert all(-0.05 <= d <= c + 0.01 for d, c in zip(delays, ceilings)), delays
    assert len({round(d, 4) for d in delays}) == 3  # jittered, not a fixed schedule
    claims = [e for e in events if e["to"] == "processing"][1:]
    for requeue, claim in zip(requeues, claims):  # no attempt started before its time
        assert ts(claim["at"]) >= ts(requeue["next_attempt_at"]) - 0.05
    assert all("FailpointError" in e["reason"] for e in requeues)

    pipeline.roles["worker"].kill()
    pipeline.start("worker", name="worker-fixed")
    done = pipeline.command("replay", attachment_id, "--reason", "failpoint removed", "--operator", "alice")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"attachment_id": attachment_id, "job_id": status["job_id"], "attempt": 5}
    status = pipeline.wait_state(attachment_id)
    pipeline.assert_exactly_once(attachment_id)
    assert status["job_id"] == pipeline.status(attachment_id)["job_id"] and status["attempt"] == 5
    refused = pipeline.command("replay", attachment_id, "--reason", "again")
    assert refused.returncode == 1 and json.loads(refused.stdout)["error"]["code"] == "not_failed"
    response = httpx.post(f"{pipeline.api_url}/v1/admin/attachments/{attachment_id}/replay",
                          json={"reason": "again"}, headers={"Authorization": "Bearer op-token"})
    assert response.status_code == 409


def test_bad_uploads_get_their_status_codes_and_leave_nothing_behind(pipeline):
    pipeline.start("api", MAX_UPLOAD_BYTES="150000")
    valid = sample_jpeg(30, size=(200, 150))
    noisy = io.BytesIO()
    Image.effect_noise((400, 300), 60).convert("RGB").save(noisy, format="JPEG", quality=95)
    cases = [
        (b"", 400, "empty_file"),
        (noisy.getvalue()[: len(noisy.getvalue()) // 2], 422, "truncated_image"),
        (png_header(20_000, 20_000), 422, "too_many_pixels"),
        (b"<?xml version='1.0'?><svg xmlns='http://www.w3.org/2000/svg'/>", 415, "unsupported_media_type"),
        (b"\xff\xd8\xff\xe0" + b"\x00" * 400_000, 413, "too_large"),
    ]
    for content, status, code in cases:
        response = pipeline.upload(content, filename="../../x.jpg")
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.text
    assert pipeline.sql("SELECT (SELECT count(*) FROM attachments) + (SELECT count(*) FROM jobs) + "
                        "(SELECT count(*) FROM outbox) AS n")[0]["n"] == 0
    assert list(pipeline.store.list_prefix("")) == []

    accepted = pipeline.upload(valid, filename="../../x.jpg")
    assert accepted.status_code == 202
    status = pipeline.status(accepted.json()["attachment_id"])
    assert status["filename"] == "x.jpg" and ".." not in status["original"]["key"]
    assert [o.key for o in pipeline.store.list_prefix("")] == [status["original"]["key"]]


def test_idempotency_key_returns_the_first_answer_and_409_for_another_body(pipeline):
    pipeline.start("api")
    first = pipeline.upload(sample_jpeg(40), headers={"Idempotency-Key": "client-retry-1"})
    assert first.status_code == 202
    again = pipeline.upload(sample_jpeg(40), headers={"Idempotency-Key": "client-retry-1"})
    assert (again.status_code, again.json()) == (202, first.json())
    other = pipeline.upload(sample_jpeg(41), headers={"Idempotency-Key": "client-retry-1"})
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_key_reused")

    with ThreadPoolExecutor(4) as pool:  # concurrent twins of a new key: one job
        answers = list(pool.map(lambda _: pipeline.upload(sample_jpeg(42), headers={"Idempotency-Key": "twins"}),
                                range(4)))
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["job_id"] for a in answers}) == 1
    assert pipeline.sql("SELECT count(*) AS n FROM jobs")[0]["n"] == 2


def test_database_or_storage_down_answers_503_never_202(pipeline, stack):
    pipeline.start_all(roles=("api", "relay", "worker"))
    for service, code in (("postgres", "database_unavailable"), ("s3", "storage_unavailable")):
        stack.toxiproxy.cut(service)
        try:
            response = pipeline.upload(sample_jpeg(50))
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == code and int(response.headers["retry-after"]) >= 1
        finally:
            stack.toxiproxy.restore(service)
    assert pipeline.sql("SELECT count(*) AS n FROM jobs")[0]["n"] == 0
    response = wait_for(lambda: (r := pipeline.upload(sample_jpeg(51))).status_code == 202 and r, 20,
                        interval=0.5, what="API recovered")
    pipeline.wait_state(response.json()["attachment_id"])
    pipeline.assert_exactly_once(response.json()["attachment_id"])


def test_the_first_request_after_the_database_ended_every_session_is_served(pipeline):
    """A restart or failover ends every session the API's pool holds. The pool met its dead connections one by
    one, 0, 1, then 2 s apart, so a request timed out (503 after 3 s) with the database up again: the first
    request that meets a dead connection now has every idle one checked and is served by a fresh one."""
    pipeline.start_all(roles=("api",))
    attachment_id = pipeline.upload(sample_jpeg(52)).json()["attachment_id"]
    url = f"{pipeline.api_url}/v1/attachments/{attachment_id}"
    with ThreadPoolExecutor(12) as pool:  # concurrent reads grow the API's pool beyond its minimum
        assert set(pool.map(lambda _: pipeline.http.get(url, timeout=10).status_code, range(60))) == {200}
    ended = pipeline.sql("SELECT count(*) FILTER (WHERE application_name = 'reference-api') AS api, "
                         "count(pg_terminate_backend(pid, 5000)) AS n FROM pg_stat_activity "  # waits for each to end
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")[0]
    assert ended["api"] >= 4, f"the API's pool held {ended['api']} sessions: too few to show the backoff"
    response = pipeline.http.get(url, timeout=10)
    assert response.status_code == 200, response.text


def test_broker_outage_is_survived_by_relay_and_worker(pipeline, stack):
    pipeline.start_all()
    stack.toxiproxy.cut("rabbitmq")
    try:
        response = pipeline.upload(sample_jpeg(60))
        assert response.status_code == 202  # durable handoff needs only the database and S3
        time.sleep(3)
        assert pipeline.status(response.json()["attachment_id"])["state"] == "queued"
    finally:
        stack.toxiproxy.restore("rabbitmq")
    pipeline.wait_state(response.json()["attachment_id"], timeout=45)
    pipeline.assert_exactly_once(response.json()["attachment_id"])


def test_every_role_exits_cleanly_on_sigterm(pipeline):
    pipeline.start_all()
    attachment_id = pipeline.upload(sample_jpeg(70)).json()["attachment_id"]
    pipeline.wait_state(attachment_id)
    for role in list(pipeline.roles.values()):
        started = time.monotonic()
        role.signal_group(signal.SIGTERM)
        assert role.wait_exit(float(pipeline.env["SHUTDOWN_GRACE_SECONDS"]) + 2) == 0, role.log()[-2000:]
        assert time.monotonic() - started <= float(pipeline.env["SHUTDOWN_GRACE_SECONDS"])
        # Its render or decode processes (and the forkserver's resource tracker) end with it: they once outlived
        # every gracefully stopped worker and API, orphaned, for good.
        assert wait_for(lambda pgid=role.process.pid: not group_members(pgid), 5, what=f"{role.name}'s processes gone")
