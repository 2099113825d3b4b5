"""Issue 10, defect 9: an outbox row whose message can never pass the message schema gets a terminal
outcome (the row settles as dead, the job ends ``failed`` through legal transitions, a metric counts it)
instead of being deferred forever, and the relay keeps publishing the other rows.

Real services, the reference's own roles. The rows are corrupted in the database directly: a job replayed
past the schema's attempt maximum (1000), and a job with a variant the schema does not know. No harness
scenario can reach this: the harness never writes to an implementation's database.

RED on the unfixed reference: ``REFERENCE_UNDER_TEST=/work/base .venv/bin/pytest <this file>`` runs the roles
from that checkout (see ``reference_support.roles_from``).
"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from reference_support import assert_event_path, free_port, roles_from, sample_jpeg, wait_for

pytestmark = pytest.mark.integration
TERMINAL_WITHIN_SECONDS = 10.0



def assert_ready(pipeline, attachment_id: str, timeout: float) -> None:
    """Ready with every promised variant, by legal transitions (the object layout is not this test's concern)."""
    status = pipeline.wait_state(attachment_id, timeout=timeout)
    assert sorted(v["name"] for v in status["variants"]) == ["crop", "optimized", "thumbnail"], status
    assert_event_path(pipeline.events(attachment_id))

def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


@pytest.mark.timeout(120)
def test_unpublishable_rows_end_their_jobs_and_the_relay_goes_on(pipeline, monkeypatch):
    roles_from(pipeline, monkeypatch)
    pipeline.start_all(("api", "worker", "sweeper"))  # no relay yet: the rows wait in the outbox

    def accepted(seed: int) -> dict:
        response = pipeline.upload(sample_jpeg(seed), filename=f"p{seed}.jpg")
        assert response.status_code == 202, response.text
        return response.json()

    before = [accepted(1), accepted(2)]
    too_many_attempts, unknown_variant = accepted(3), accepted(4)
    # A job replayed past the schema's attempt maximum, its message row with it; and a variant no message may name.
    pipeline.sql("UPDATE jobs SET attempt = 1001 WHERE job_id = %s", (too_many_attempts["job_id"],))
    pipeline.sql("UPDATE outbox SET attempt = 1001 WHERE job_id = %s", (too_many_attempts["job_id"],))
    pipeline.sql("UPDATE jobs SET variants = '{thumbnail,sepia}' WHERE job_id = %s", (unknown_variant["job_id"],))
    poisoned = [too_many_attempts, unknown_variant]

    metrics_port = free_port()
    started = time.monotonic()
    pipeline.start("relay", METRICS_PORT=metrics_port)
    after = [accepted(5), accepted(6)]

    # Terminal within the bound: failed with an error_code, through legal transitions only.
    for upload in poisoned:
        status = pipeline.wait_state(upload["attachment_id"], ("failed", "ready"),
                                     timeout=TERMINAL_WITHIN_SECONDS - (time.monotonic() - started))
        assert status["state"] == "failed" and status["error_code"] == "unpublishable_message", status
        events = pipeline.events(upload["attachment_id"])
        assert_event_path(events)
        assert [(e["from"], e["to"]) for e in events][-2:] == [("queued", "processing"), ("processing", "failed")]
    # The rows are settled as dead, not pending (nor merely deferred).
    rows = pipeline.sql("SELECT job_id, published_at, last_error FROM outbox WHERE job_id = ANY(%s)",
                        ([u["job_id"] for u in poisoned],))
    assert len(rows) == 2 and all(r["published_at"] is not None and r["last_error"].startswith("dead:")
                                  for r in rows), rows
    # The relay kept publishing the rows around them (same batch and later ones).
    for upload in before + after:
        assert_ready(pipeline, upload["attachment_id"], timeout=45)
    assert re.search(r'reference_outbox_publish_failures_total\{kind="unpublishable"\} 2\.0', scrape(metrics_port))

    # An operator replay of such a job ends terminal again (a new attempt, the same broken message): no loop.
    replay = pipeline.http.post(f"{pipeline.api_url}/v1/admin/attachments/{unknown_variant['attachment_id']}/replay",
                                json={"reason": "retry after the fix"},
                                headers={"Authorization": f"Bearer {pipeline.env['OPERATOR_TOKEN']}"}, timeout=10)
    assert replay.status_code == 202, replay.text
    wait_for(lambda: len(pipeline.events(unknown_variant["attachment_id"])) >= 6, TERMINAL_WITHIN_SECONDS,
             what="the replayed job to end again")
    status = pipeline.status(unknown_variant["attachment_id"])
    assert status["state"] == "failed" and status["error_code"] == "unpublishable_message", status
    assert_event_path(pipeline.events(unknown_variant["attachment_id"]))
    assert pipeline.roles["relay"].alive()


@pytest.mark.timeout(150)
def test_unroutable_rows_get_a_terminal_outcome_and_the_relay_goes_on(pipeline, monkeypatch):
    """Issue 23 defect 6: a reprocess to a pipeline version no worker ever declared a queue for is returned by the
    broker (mandatory publish, no route) on every try. Deferred for OUTBOX_UNROUTABLE_GIVE_UP_SECONDS (a worker
    of that version may still start), then settled for good: the row is dead and the job ends failed with
    error_code ``unroutable`` through legal transitions, never deferred forever; the other rows keep flowing."""
    roles_from(pipeline, monkeypatch)
    metrics_port = free_port()
    pipeline.start_all(relay={"OUTBOX_UNROUTABLE_GIVE_UP_SECONDS": "4", "METRICS_PORT": metrics_port})
    first = pipeline.upload(sample_jpeg(60)).json()
    assert_ready(pipeline, first["attachment_id"], timeout=45)
    created = pipeline.http.post(f"{pipeline.api_url}/v1/admin/attachments/{first['attachment_id']}/reprocess",
                                 json={"pipeline_version": 7, "reason": "a version nobody runs"},
                                 headers={"Authorization": f"Bearer {pipeline.env['OPERATOR_TOKEN']}"}, timeout=10)
    assert created.status_code == 202, created.text
    job_id = created.json()["job_id"]

    def settled():
        rows = pipeline.sql("SELECT state, error_code FROM jobs WHERE job_id = %s", (job_id,))
        return rows[0] if rows[0]["state"] != "queued" else None

    try:
        job = wait_for(settled, 40, interval=0.5, what="the unroutable job to settle")
    finally:
        print("outbox:", pipeline.sql("SELECT publish_attempts, published_at IS NOT NULL AS settled, last_error "
                                      "FROM outbox WHERE job_id = %s", (job_id,)))
    assert (job["state"], job["error_code"]) == ("failed", "unroutable"), job
    rows = pipeline.sql("SELECT published_at, last_error FROM outbox WHERE job_id = %s", (job_id,))
    assert len(rows) == 1 and rows[0]["published_at"] is not None and rows[0]["last_error"].startswith("dead:")
    events = [e for e in pipeline.events(first["attachment_id"]) if e.get("pipeline_version") == 7]
    assert [(e["from"], e["to"]) for e in events] == [
        (None, "queued"), ("queued", "processing"), ("processing", "failed")], events
    assert "unroutable" in events[-1]["reason"], events
    assert re.search(r'reference_outbox_publish_failures_total\{kind="unroutable"\} 1\.0', scrape(metrics_port))
    later = pipeline.upload(sample_jpeg(61)).json()  # the relay goes on
    assert_ready(pipeline, later["attachment_id"], timeout=45)
