"""The five failure windows of CONTRACT §6, each armed with `crash` in the role
that hosts it: the process dies there, is restarted, and the attachment still
ends ready with exactly one result per effect key and no regression."""

from __future__ import annotations

import time

import httpx
import pytest

from reference_support import sample_jpeg, wait_for

pytestmark = pytest.mark.integration


def test_upload_reaches_ready_with_every_level_4_variant(pipeline):
    pipeline.start_all()
    response = pipeline.upload(sample_jpeg(1), filename="../../x.jpg")
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status_url"] == f"/v1/attachments/{body['attachment_id']}"
    pipeline.wait_state(body["attachment_id"])
    status = pipeline.assert_exactly_once(body["attachment_id"])
    assert status["job_id"] == body["job_id"] and status["attempt"] == 1 and status["error_code"] is None
    assert status["original"]["key"] == f"staging/{body['attachment_id']}"
    assert status["filename"] == "x.jpg"
    assert all("x.jpg" not in v["key"] for v in status["variants"])
    assert [e["to"] for e in pipeline.events(body["attachment_id"])] == ["queued", "processing", "ready"]
    assert pipeline.queue_depths() == {"attachments.jobs.process": 0, "attachments.jobs.dead": 0}


def test_level_3_promises_only_the_thumbnail(pipeline):
    pipeline.env.update(LEVEL="3", EXPECT_VARIANTS='["thumbnail"]')
    pipeline.start_all()
    response = pipeline.upload(sample_jpeg(2))
    assert response.status_code == 202
    pipeline.wait_state(response.json()["attachment_id"])
    pipeline.assert_exactly_once(response.json()["attachment_id"])


HOSTS = {
    "after_commit_before_publish": "relay",
    "after_publish_before_confirm": "relay",
    "after_s3_write_before_commit": "worker",
    "after_commit_before_ack": "worker",
}


@pytest.mark.parametrize("window", list(HOSTS))
def test_crash_in_window_then_restart_ends_ready_exactly_once(pipeline, window):
    host = HOSTS[window]
    pipeline.start_all(**{host: {"FAILPOINTS": f"{window}=1*crash"}})
    response = pipeline.upload(sample_jpeg(3))
    assert response.status_code == 202
    attachment_id = response.json()["attachment_id"]

    crashed = pipeline.roles[host]
    assert crashed.wait_exit(30) == 137, crashed.log()[-2000:]
    assert f"FAILPOINT {window} fired: crash" in crashed.log()
    pipeline.start(host, name=f"{host}-restarted")  # a new process: new identity, failpoints disarmed

    pipeline.wait_state(attachment_id)
    pipeline.assert_exactly_once(attachment_id)
    if window in ("after_publish_before_confirm", "after_commit_before_ack"):
        # the message was delivered twice or redelivered: the duplicate is a no-op and acked
        wait_for(lambda: pipeline.queue_depths()["attachments.jobs.process"] == 0, 20, what="queue drained")
    assert pipeline.queue_depths()["attachments.jobs.dead"] == 0


def test_crash_after_staging_before_record_is_not_accepted_and_the_orphan_is_swept(pipeline):
    pipeline.start_all(api={"FAILPOINTS": "after_staging_before_record=1*crash"})
    with pytest.raises(httpx.HTTPError):
        pipeline.upload(sample_jpeg(4))  # the API died mid-request: no 202
    api = pipeline.roles["api"]
    assert api.wait_exit(10) == 137
    staged = [obj.key for obj in pipeline.store.list_prefix("staging/")]
    assert len(staged) == 1, staged  # the original was staged ...
    assert pipeline.sql("SELECT count(*) AS n FROM attachments")[0]["n"] == 0  # ... but never recorded
    assert pipeline.sql("SELECT count(*) AS n FROM jobs")[0]["n"] == 0

    pipeline.start("api", name="api-restarted")
    wait_for(lambda: not list(pipeline.store.list_prefix("staging/")), 20, interval=0.5, what="orphan swept")

    retry = pipeline.upload(sample_jpeg(4))  # the client's retry is accepted and processed
    assert retry.status_code == 202
    pipeline.wait_state(retry.json()["attachment_id"])
    pipeline.assert_exactly_once(retry.json()["attachment_id"])
    time.sleep(4)  # past the staging retention: a recorded original is never swept
    assert pipeline.store.exists(f"staging/{retry.json()['attachment_id']}")
