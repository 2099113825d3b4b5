"""Level 5 of the reference: pipeline versions (docs/CONTRACT.md "Level 5").

A worker of version N processes version-N jobs only (one queue per version; a misrouted message is forwarded, not
requeued); reprocessing is an audited, idempotent operator operation (HTTP behind the token, and the CLI); GET serves
the newest ready version and lists every version; a version's result is never touched by another version."""

from __future__ import annotations

import json

import httpx
import pytest

from reference_support import sample_jpeg, wait_for

pytestmark = pytest.mark.integration
TOKEN = "versions-test-token"


def reprocess(pipeline, attachment_id, version=2, token=TOKEN, reason="roll-out v2"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{pipeline.api_url}/v1/admin/attachments/{attachment_id}/reprocess",
                      json={"pipeline_version": version, "reason": reason}, headers=headers, timeout=10)


def version_of(status, version):
    return next((v for v in status["versions"] if v["pipeline_version"] == version), None)


def test_roll_out_reprocess_and_rollback(pipeline):
    pipeline.env["OPERATOR_TOKEN"] = TOKEN
    pipeline.start_all()
    attachment_id = pipeline.upload(sample_jpeg(50)).json()["attachment_id"]
    first = pipeline.wait_state(attachment_id)
    assert first["pipeline_version"] == 1 and [v["pipeline_version"] for v in first["versions"]] == [1]
    v1_objects = {o.key: o.last_modified for o in pipeline.store.list_prefix(f"variants/{attachment_id}/v1/")}

    # The operator call: refused without (or with a wrong) token, audited, idempotent.
    assert reprocess(pipeline, attachment_id, token=None).status_code == 401
    assert reprocess(pipeline, attachment_id, token="wrong").status_code == 403
    created = reprocess(pipeline, attachment_id)
    assert created.status_code == 202 and created.json()["created"] is True, created.text
    again = reprocess(pipeline, attachment_id)
    assert again.status_code == 200 and again.json()["job_id"] == created.json()["job_id"]
    audit = pipeline.sql("SELECT operator, reason, from_attempt FROM replay_audit WHERE job_id = %s",
                         (created.json()["job_id"],))
    assert len(audit) == 1 and audit[0]["from_attempt"] == 0 and "roll-out v2" in audit[0]["reason"]

    # No version-2 worker yet: version 1 stays served and ready; the version-1 worker never takes the v2 job.
    status = pipeline.status(attachment_id)
    assert status["state"] == "ready" and status["pipeline_version"] == 1
    assert version_of(status, 2)["state"] == "queued"

    v2 = pipeline.start("worker", name="worker-v2", PIPELINE_VERSION="2")
    wait_for(lambda: version_of(pipeline.status(attachment_id), 2)["state"] == "ready", 45, interval=0.2,
             what="version 2 ready")
    status = pipeline.status(attachment_id)
    assert status["pipeline_version"] == 2 and status["state"] == "ready"
    assert all(v["key"].startswith(f"variants/{attachment_id}/v2/") for v in status["variants"])
    assert version_of(status, 1)["variants"] == first["variants"]  # version 1 readable, untouched
    assert {o.key: o.last_modified for o in pipeline.store.list_prefix(f"variants/{attachment_id}/v1/")} == v1_objects
    events = pipeline.events(attachment_id)
    assert [(e["pipeline_version"], e["to"]) for e in events if e["to"] == "ready"] == [(1, "ready"), (2, "ready")]

    # Rollback: the version-2 worker stops; a new version-2 job waits, version 1 keeps processing uploads.
    v2.kill()
    second = pipeline.upload(sample_jpeg(51)).json()["attachment_id"]
    pipeline.wait_state(second)
    done = pipeline.command("reprocess", second, "--pipeline-version", "2", "--reason", "cli check",
                            "--operator", "tester")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["created"] is True
    status = pipeline.status(second)
    assert status["state"] == "ready" and status["pipeline_version"] == 1
    assert version_of(status, 2)["state"] == "queued"
    assert pipeline.status(attachment_id)["pipeline_version"] == 2  # the newest ready version stays served


def test_a_message_of_another_version_is_forwarded_not_processed(pipeline):
    pipeline.env["OPERATOR_TOKEN"] = TOKEN
    pipeline.start_all()
    attachment_id = pipeline.upload(sample_jpeg(52)).json()["attachment_id"]
    pipeline.wait_state(attachment_id)
    job_id = reprocess(pipeline, attachment_id).json()["job_id"]
    v2 = pipeline.start("worker", name="worker-v2", PIPELINE_VERSION="2")
    wait_for(lambda: version_of(pipeline.status(attachment_id), 2)["state"] == "ready", 45, interval=0.2,
             what="version 2 ready")
    # A copy of the version-2 message on the version-1 queue (an old relay, a manual republish).
    row = pipeline.sql("SELECT j.job_id, j.attempt, j.attachment_id, j.variants, j.created_at, j.expires_at "
                       "FROM jobs j WHERE j.job_id = %s", (job_id,))[0]
    body = {"schema_version": 1, "job_id": str(row["job_id"]), "attempt": row["attempt"],
            "attachment_id": str(row["attachment_id"]), "pipeline_version": 2, "variants": list(row["variants"]),
            "created_at": row["created_at"].isoformat().replace("+00:00", "Z"),
            "expires_at": row["expires_at"].isoformat().replace("+00:00", "Z")}
    pipeline.publish_raw(json.dumps(body).encode(), message_id=str(job_id), content_type="application/json")
    wait_for(lambda: "forwarded to attachments.jobs.process.v2" in pipeline.roles["worker"].log(), 20,
             what="forwarded by the version-1 worker")
    wait_for(lambda: "noop_ready" in v2.log(), 20, what="the version-2 worker's no-op")
    assert pipeline.queue_depths()["attachments.jobs.process"] == 0
    assert "claimed job " + str(job_id) not in pipeline.roles["worker"].log()
