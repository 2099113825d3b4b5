"""Each checker accepts a correct history and rejects one that exhibits the bug it names."""

from __future__ import annotations

import pytest

from harness.checkers import (CHECKERS, ack_after_commit, bounded_retries, duplicate_effects, lease_ownership, replay_audit,
                              lost_accepted_work, message_hygiene, run_checks, staging_safety, state_regression)
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import ATT, JOB, T0, Builder, happy, iso, job_message
from harness_histories import in_memory_dedup_history_for_recheck as in_memory_dedup_history

ATT2 = "9b2f4e1a-0c3d-4e5f-8a7b-6c5d4e3f2a1b"


message = job_message


def test_happy_history_is_valid_for_every_checker():
    b = happy()
    b.add(0.5, "message", body=message(), properties={"message_id": JOB})
    verdicts = run_checks(b.history(), b.final, b.run)
    assert {v.invariant: v.status for v in verdicts} == {name: VALID for name in CHECKERS}


# --- lost accepted work: the no-outbox bug leaves an accepted job queued forever -----------------------------

def test_lost_work_catches_job_stuck_in_queued_after_crash_between_commit_and_publish():
    b = Builder()
    b.add(0.0, "invoke", op="u1", f="upload", kind="good", sample="u1")
    b.add(0.1, "info", op="u1", f="upload", error="RemoteProtocolError")  # api died after commit, before publish
    b.add(0.2, "fault", action="crash", phase="hit", role="api", window="after_commit_before_publish")
    b.add(1.0, "invoke", op="u1.r1", f="upload", kind="good", sample="u1", retry_of="u1")
    b.add(1.1, "ok", op="u1.r1", f="upload", status=202, attachment_id=ATT, job_id=JOB)  # idempotent replay
    b.transitions(ATT, [(0.05, None, "queued", 1, "api")])
    verdict = lost_accepted_work.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert verdict.evidence[0]["attachment_id"] == ATT
    assert "queued" in verdict.evidence[0]["message"]
    assert verdict.seed == 42 and verdict.evidence[0]["lines"]


def test_lost_work_names_an_unroutable_publish_as_its_cause():
    # The job's message was published before its queue existed (a consumer that declares the topology when it
    # starts, every consumer held): the broker confirmed it and dropped it. Lost work, with its cause named.
    b = Builder()
    b.upload(0.0, ATT)
    b.add(0.2, "unroutable", exchange="jobs", routing_key="render", job_id=JOB, attachment_id=ATT, attempt=1)
    b.transitions(ATT, [(0.05, None, "queued", 1, "api")])
    verdict = lost_accepted_work.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    [item] = verdict.evidence
    assert "published unroutable 1 time(s) (exchange 'jobs', routing key 'render'" in item["message"]
    assert any(e.get("type") == "unroutable" for e in item["history"]), item
    # Without the tap's line, the same loss has no cause to name.
    plain = Builder()
    plain.upload(0.0, ATT)
    plain.transitions(ATT, [(0.05, None, "queued", 1, "api")])
    assert "unroutable" not in lost_accepted_work.check(plain.history(), plain.final, plain.run).evidence[0]["message"]


def test_lost_work_ignores_unknown_outcomes_and_accepts_failed_bad_input():
    b = Builder()
    b.add(0.0, "invoke", op="u1", f="upload", kind="good")
    b.add(0.1, "info", op="u1", f="upload", error="ReadTimeout")
    b.upload(1.0, ATT2, kind="poison")
    b.transitions(ATT2, [(1.1, None, "queued", 1, "api"), (1.2, "queued", "processing", 1, "worker"),
                         (1.3, "processing", "failed", 1, "worker")], error_code="decode_error")
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == VALID


def test_lost_work_rejects_good_input_failed_and_missing_variants_and_404():
    b = happy()
    b.final["attachments"][ATT]["body"]["variants"].pop()  # level 4 promises crop + optimized
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == INVALID
    b2 = Builder()
    b2.upload(0, ATT)
    b2.attachments[ATT] = {"status": 404, "body": None, "events": []}
    assert lost_accepted_work.check(b2.history(), b2.final, b2.run).status == INVALID


def test_lost_work_is_unknown_when_the_final_state_was_not_read():
    b = happy()
    b.final["read_ok"] = False
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == UNKNOWN


# --- duplicate effects / regression: in-memory dedup re-runs a ready job after restart -----------------------

def test_duplicate_effects_catches_second_ready_after_redelivery():
    b = in_memory_dedup_history()
    verdict = duplicate_effects.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert "ready reached 2 times" in verdict.evidence[0]["message"]
    assert verdict.evidence[0]["attachment_id"] == ATT


def test_state_regression_catches_ready_to_processing():
    b = in_memory_dedup_history()
    verdict = state_regression.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert any("ready→processing" in e["message"] for e in verdict.evidence)


def test_state_regression_catches_polled_ready_going_back_and_broken_chains():
    b = happy()
    b.add(3, "state", attachment_id=ATT, state="ready")
    b.add(4, "state", attachment_id=ATT, state="processing")
    assert state_regression.check(b.history(), b.final, b.run).status == INVALID
    b2 = Builder()
    b2.upload(0)
    b2.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "processing", "ready", 1, "worker")])
    assert state_regression.check(b2.history(), b2.final, b2.run).status == INVALID


def test_duplicate_effects_catches_checksum_mismatch_and_rewrite_after_ready():
    b = happy()
    key = b.final["attachments"][ATT]["body"]["variants"][0]["key"]
    b.final["attachments"][ATT]["objects"][key]["sha256"] = "ee" * 32
    assert duplicate_effects.check(b.history(), b.final, b.run).status == INVALID
    b2 = happy()
    b2.final["attachments"][ATT]["objects"][key]["last_modified"] = iso(T0 + 9)  # ready at T0+2
    verdict = duplicate_effects.check(b2.history(), b2.final, b2.run)
    assert verdict.status == INVALID and "rewritten" in verdict.evidence[0]["message"]


# --- ack after commit: the ack-before-commit bug leaves a crashed job stuck while the sweeper is held ---------

def crash_with_sweeper_held(builder, crash_at, hold_end, depth_after_crash=0):
    builder.add(crash_at - 1, "phase", name="hold_start", roles=["sweeper"])
    builder.add(crash_at, "fault", action="crash", phase="hit", role="worker", window="after_s3_write_before_commit")
    for offset in (1, 7, 10):  # the first sample is inside the management API's stats lag and is ignored
        builder.add(crash_at + offset, "queue", queue="attachments.jobs.process", ready=0, unacked=depth_after_crash)
    builder.add(hold_end, "phase", name="hold_end", roles=["sweeper"])


def test_ack_after_commit_catches_job_not_redelivered_while_sweeper_held():
    b = Builder()
    b.upload(0)
    crash_with_sweeper_held(b, crash_at=1.5, hold_end=16)
    # Only the sweeper (after the hold) brings it back: the broker had nothing to redeliver.
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (17, "processing", "queued", 1, "sweeper"), (18, "queued", "processing", 2, "worker"),
                        (19, "processing", "ready", 2, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    ev = verdict.evidence[0]
    assert ev["attachment_id"] == ATT and ev["queue_samples"][0]["ready"] == 0
    assert ev["lines"] and ev["deadline_seconds"] > 0


def test_ack_after_commit_valid_when_redelivery_finishes_the_job():
    b = Builder()
    b.upload(0)
    crash_with_sweeper_held(b, crash_at=1.5, hold_end=16)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (6, "processing", "ready", 1, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised


def test_ack_after_commit_valid_when_broker_keeps_the_delivery_until_lease_recovery():
    b = Builder()
    b.upload(0)
    crash_with_sweeper_held(b, crash_at=1.5, hold_end=16, depth_after_crash=1)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (17, "processing", "queued", 1, "sweeper"), (18, "queued", "processing", 2, "worker"),
                        (19, "processing", "ready", 2, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised
    assert "kept the unacked delivery" in verdict.evidence[0]["message"]


def test_ack_after_commit_depth_explained_by_other_jobs_does_not_count():
    b = Builder()
    b.upload(0)
    b.upload(0.2, ATT2, job_id="7c9e6679-7425-40de-944b-e07fc1f90ae7")
    crash_with_sweeper_held(b, crash_at=1.5, hold_end=16, depth_after_crash=1)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (17, "processing", "queued", 1, "sweeper"), (18, "queued", "processing", 2, "worker"),
                        (19, "processing", "ready", 2, "worker")])
    b.transitions(ATT2, [(0.3, None, "queued", 1, "api"), (15, "queued", "processing", 1, "worker"),
                         (15.5, "processing", "ready", 1, "worker")])  # its own message explains depth 1
    assert ack_after_commit.check(b.history(), b.final, b.run).status == INVALID


def test_ack_after_commit_unknown_without_queue_samples():
    b = Builder()
    b.upload(0)
    b.add(0.5, "phase", name="hold_start", roles=["sweeper"])
    b.add(1.5, "fault", action="crash", phase="hit", role="worker")
    b.add(16, "phase", name="hold_end", roles=["sweeper"])
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (17, "processing", "queued", 1, "sweeper"), (19, "queued", "processing", 2, "worker"),
                        (20, "processing", "ready", 2, "worker")])
    assert ack_after_commit.check(b.history(), b.final, b.run).status == UNKNOWN


def test_ack_after_commit_not_exercised_when_sweeper_was_running():
    b = Builder()
    b.upload(0)
    b.add(1.5, "fault", action="sigkill", phase="start", role="worker")
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (6, "processing", "queued", 1, "sweeper"), (7, "queued", "processing", 2, "worker"),
                        (8, "processing", "ready", 2, "worker")])
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised


# --- bounded retries --------------------------------------------------------------------------------------------

def test_bounded_retries_catches_attempts_beyond_max_and_undrained_queue():
    b = Builder(max_attempts=2)
    b.upload(0, kind="poison")
    steps = [(0.1, None, "queued", 1, "api")]
    for attempt in range(1, 4):
        steps += [(attempt, "queued", "processing", attempt, "worker"),
                  (attempt + 0.5, "processing", "queued", attempt, "worker")]
    b.transitions(ATT, steps)
    verdict = bounded_retries.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    messages = " ".join(e["message"] for e in verdict.evidence)
    assert "exceeds max_attempts" in messages and "poison input not terminal" in messages
    b2 = happy()
    b2.final["queues"]["work"] = {"ready": 3, "unacked": 0}
    assert bounded_retries.check(b2.history(), b2.final, b2.run).status == INVALID


def test_bounded_retries_catches_endless_redelivery_loop():
    b = happy()
    for i in range(40):
        b.add(3 + i * 0.1, "message", body=message())
    verdict = bounded_retries.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "endless" in verdict.evidence[0]["message"]


# --- message hygiene --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, fragment", [
    (message(download_url="s3://x/y"), "storage location"),  # a URL is judged by what it points at
    (message(download_url="http://cdn.example/y.png"), "a URL of a file"),
    (message(tracestate="a=s3://bucket/staging/x"), "storage location"),  # free text, judged by what it names
    (message(attempt=0), "validate"),
    (message(source="staging/" + ATT), "storage object key"),
    ("not json", "not a JSON object"),
])
def test_message_hygiene_rejects_bad_messages(body, fragment):
    b = happy()
    b.add(1, "message", body=body if isinstance(body, dict) else None, body_raw=body)
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert any(fragment in e["message"] for e in verdict.evidence), verdict.evidence


def test_message_hygiene_rejects_client_filename_and_job_id_reuse():
    b = happy()  # uploaded as holiday-0000abcd.png
    b.add(1, "message", body=message(tracestate="vendor=holiday-0000abcd"))
    assert "client filename" in message_hygiene.check(b.history(), b.final, b.run).evidence[0]["message"]
    b2 = happy()
    b2.add(1, "message", body=message())
    b2.add(2, "message", body=message(attachment_id=ATT2))
    assert any("reused" in e["message"] for e in message_hygiene.check(b2.history(), b2.final, b2.run).evidence)


def test_message_hygiene_checks_headers_and_properties_too():
    b = happy()
    b.add(1, "message", body=message(), properties={"headers": {"x-source": "http://cdn.example/holiday.png"}})
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "properties carries a storage location" in verdict.evidence[0]["message"]
    b2 = happy()  # the client filename in a header
    b2.add(1, "message", body=message(), properties={"headers": {"x-name": "holiday-0000abcd"}})
    assert message_hygiene.check(b2.history(), b2.final, b2.run).status == INVALID


def test_message_hygiene_job_id_must_be_the_one_the_api_returned():
    b = happy()
    b.add(1, "message", body=message(job_id="7c9e6679-7425-40de-944b-e07fc1f90ae7"))
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "differs from the job_id the API returned" in verdict.evidence[0]["message"]


@pytest.mark.parametrize("properties", [
    {"message_id": "a-fresh-id-per-publish"},  # message_id is free (CONTRACT §4)
    {"message_id": JOB, "headers": {"x-attempt": 1, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}},
    {},
], ids=["message-id-not-job-id", "headers", "no-properties"])
def test_message_hygiene_accepts_what_the_contract_leaves_free(properties):
    b = happy()
    b.add(1, "message", body=message(producer="go-relay", shard=3), properties=properties)  # extra fields: additive
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.evidence


def test_message_hygiene_is_unknown_when_the_tap_saw_nothing():
    b = Builder()
    b.upload(0)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "ready", 1, "worker")])
    b.add(0.01, "observe", source="tap", queue="harness.tap", firehose=False)
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "observation failed" in verdict.summary


def test_message_hygiene_names_unroutable_publishes_not_a_failed_observation():
    # Every publish went to no queue (a worker that declares its queue when it starts, held from the start): the tap
    # had nothing to see, and the reason says why — the implementation's topology, not the harness's observation.
    b = Builder()
    b.upload(0)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api")])
    b.add(0.01, "observe", source="tap", queue="harness.tap", firehose=True)
    b.add(0.2, "unroutable", exchange="jobs", routing_key="render", job_id=JOB, attachment_id=ATT, attempt=1)
    verdict = message_hygiene.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "observation failed" not in verdict.summary
    assert "routed 1 publish(es) to no queue" in verdict.summary
    assert verdict.evidence[0]["history"][0]["type"] == "unroutable", verdict.evidence


# --- lease ownership --------------------------------------------------------------------------------------------

def test_lease_ownership_catches_stale_owner_write_and_unrecovered_job():
    b = Builder(lease=4)
    b.upload(0)
    b.add(1.2, "fault", action="sigstop", phase="start", role="worker")
    b.add(11, "fault", action="sigcont", phase="end", role="worker")
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (6, "processing", "queued", 1, "sweeper"), (7, "queued", "processing", 2, "worker"),
                        (8, "processing", "ready", 2, "worker")])
    assert lease_ownership.check(b.history(), b.final, b.run).status == VALID
    # the stale owner (attempt 1) writes after attempt 2 claimed: fencing failed
    b.attachments[ATT]["events"].insert(4, {"seq": 4.5, "at": iso(T0 + 7.5), "from": "processing", "to": "queued",
                                           "attempt": 1, "actor": "worker", "reason": None})
    verdict = lease_ownership.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "stale owner" in verdict.evidence[0]["message"]
    b2 = Builder(lease=4)
    b2.upload(0)
    b2.add(1.2, "fault", action="sigstop", phase="start", role="worker")
    b2.add(11, "fault", action="sigcont", phase="end", role="worker")
    b2.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                         (12, "processing", "ready", 1, "worker")])
    verdict = lease_ownership.check(b2.history(), b2.final, b2.run)
    assert verdict.status == INVALID and "not recovered" in verdict.evidence[0]["message"]


# --- staging safety ---------------------------------------------------------------------------------------------

def test_staging_safety_catches_old_orphan_and_deleted_original():
    b = happy()
    b.final["bucket_objects"] = [{"key": "staging/orphan", "size": 5, "last_modified": iso(T0)}]
    verdict = staging_safety.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "orphan" in verdict.evidence[0]["message"]
    b.final["bucket_objects"] = [{"key": "staging/orphan", "size": 5, "last_modified": iso(T0 + 999)}]
    assert staging_safety.check(b.history(), b.final, b.run).status == VALID
    b.final["bucket_objects"].append({"key": "variants/never-committed/thumb", "size": 5, "last_modified": iso(T0)})
    assert staging_safety.check(b.history(), b.final, b.run).status == VALID  # not staging: not an orphan
    b.final["attachments"][ATT]["objects"][f"staging/{ATT}"]["exists"] = False
    assert staging_safety.check(b.history(), b.final, b.run).status == INVALID


def test_a_crashing_checker_yields_unknown(monkeypatch):
    b = happy()
    monkeypatch.setattr(duplicate_effects, "check", lambda *a: 1 / 0)
    verdicts = {v.invariant: v for v in run_checks(b.history(), b.final, b.run)}
    assert verdicts["duplicate_effects"].status == UNKNOWN


def crash_with_peeks(builder, seen: bool):
    builder.add(0.5, "phase", name="hold_start", roles=["sweeper"])
    builder.add(1.5, "fault", action="crash", phase="hit", role="worker", window="after_s3_write_before_commit")
    other = {"job_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "attachment_id": ATT2}
    mine = {"job_id": JOB, "attachment_id": ATT}
    for at in (2.0, 2.6, 3.2):
        builder.add(at, "queue", kind="peek", queue="attachments.jobs.process",
                    messages=[other] + ([mine] if seen else []), ready=2 if seen else 1)
    builder.add(6, "phase", name="hold_end", roles=["sweeper"])
    builder.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                              (6.5, "processing", "queued", 2, "sweeper"), (7, "queued", "processing", 2, "worker"),
                              (8, "processing", "ready", 2, "worker")])


def test_ack_after_commit_peeks_prove_the_delivery_came_back():
    b = Builder()
    b.upload(0)
    crash_with_peeks(b, seen=True)
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and "back in the work queue" in verdict.evidence[0]["message"]


def test_ack_after_commit_peeks_without_the_job_prove_an_early_ack():
    b = Builder()
    b.upload(0)
    crash_with_peeks(b, seen=False)
    verdict = ack_after_commit.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    ev = verdict.evidence[0]
    assert ev["attachment_id"] == ATT and "acked before" in ev["message"]
    assert len(ev["peeked"]) == 3 and ev["lines"][0] == 4  # the crash line comes first


# --- replay audit -----------------------------------------------------------------------------------------------

def replayed(builder, unauth=401, status=202, actor="operator:api", end="failed", requeue_attempt=2, claim_attempt=2):
    builder.upload(0, kind="poison")
    builder.add(3, "invoke", op="r1", f="replay", attachment_id=ATT)
    builder.add(3.1, "ok" if status == 202 else "fail", op="r1", f="replay", attachment_id=ATT, status=status,
                unauthenticated_status=unauth)
    steps = [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
             (2, "processing", "failed", 1, "worker"), (3.05, "failed", "queued", requeue_attempt, actor)]
    if end != "queued":
        steps += [(4, "queued", "processing", claim_attempt, "worker"),
                  (5, "processing", end, claim_attempt, "worker")]
    builder.transitions(ATT, steps, error_code="decode_failed")
    return builder


def test_replay_audit_valid_for_an_authenticated_audited_bounded_replay():
    b = replayed(Builder())
    verdict = replay_audit.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised
    assert state_regression.check(b.history(), b.final, b.run).status == VALID


@pytest.mark.parametrize("kwargs, fragment", [
    ({"unauth": 202}, "without a token"),
    ({"status": 409}, "not 202"),
    ({"end": "queued"}, "did not end terminal"),
    ({"requeue_attempt": 1, "claim_attempt": 1}, "did not start a new attempt"),
])
def test_replay_audit_rejects_contract_breaks(kwargs, fragment):
    b = replayed(Builder(), **kwargs)
    verdict = replay_audit.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and any(fragment in e["message"] for e in verdict.evidence)


# --- fault coverage ---------------------------------------------------------------------------------------------

def test_fault_coverage_is_unknown_when_a_scheduled_fault_never_happened():
    from harness.checkers import fault_coverage

    b = happy()
    b.run["schedule"] = [{"index": 0, "action": "failpoint", "window": "after_commit_before_ack"},
                         {"index": 1, "action": "toxic", "service": "s3"}]
    b.add(1, "fault", action="toxic", phase="start", service="s3")
    verdict = fault_coverage.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "after_commit_before_ack fired 0 times" in verdict.evidence[0]["message"]
    b.add(2, "fault", action="crash", phase="hit", role="worker", window="after_commit_before_ack")
    fired = fault_coverage.check(b.history(), b.final, b.run)  # a crash while armed: not yet its window
    assert fired.status == UNKNOWN and "its window was not shown" in fired.evidence[0]["message"]
    b.add(3, "delivery", queue="q", redelivered=True, job_id=JOB, attachment_id=ATT)  # ready before, delivered again
    assert fault_coverage.check(b.history(), b.final, b.run).status == VALID


@pytest.mark.parametrize("kwargs", [
    {"actor": "ops:7f3a"},  # any wording: the replay is known from the harness's own call
    {"actor": "janitor", "requeue_attempt": 1, "claim_attempt": 2},  # attempt counted at claim (River)
], ids=["own-wording", "attempt-at-claim"])
def test_replay_audit_and_regression_accept_other_readings_of_the_contract(kwargs):
    b = replayed(Builder(), **kwargs)
    assert replay_audit.check(b.history(), b.final, b.run).status == VALID
    assert state_regression.check(b.history(), b.final, b.run).status == VALID


def test_state_regression_rejects_failed_to_queued_the_harness_never_asked_for():
    b = Builder()
    b.upload(0, kind="poison")
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "failed", 1, "worker"), (3, "failed", "queued", 2, "operator:admin"),
                        (4, "queued", "processing", 2, "worker"), (5, "processing", "failed", 2, "worker")],
                  error_code="decode_failed")
    verdict = state_regression.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "asked for 0 operator replays" in verdict.evidence[0]["message"]


def test_state_regression_accepts_queued_to_failed_only_as_expiry():
    b = Builder()
    b.upload(0)
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (3, "queued", "failed", 1, "janitor")], error_code="expired")
    assert state_regression.check(b.history(), b.final, b.run).status == VALID
    b2 = Builder()
    b2.upload(0)
    b2.transitions(ATT, [(0.1, None, "queued", 1, "api"), (3, "queued", "failed", 1, "janitor")],
                   error_code="decode_failed")
    verdict = state_regression.check(b2.history(), b2.final, b2.run)
    assert verdict.status == INVALID and "only allowed as expiry" in verdict.evidence[0]["message"]


def test_consumer_and_recovering_roles_come_from_the_adapter_not_from_names():
    """A pipeline whose consumer is called `render` and whose lease recovery lives in `janitor`."""
    b = Builder(roles={"api": 1, "render": 1, "janitor": 1})
    b.run["adapter"]["consumers"], b.run["adapter"]["recovers_work"] = ["render"], ["janitor"]
    b.upload(0)
    b.add(0.5, "phase", name="hold_start", roles=["janitor"])
    b.add(1.5, "fault", action="crash", phase="hit", role="render", window="after_s3_write_before_commit")
    for offset in (1, 7, 10):
        b.add(1.5 + offset, "queue", queue="jobs", ready=0, unacked=0)
    b.add(16, "phase", name="hold_end", roles=["janitor"])
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "render"),
                        (17, "processing", "queued", 1, "janitor"), (18, "queued", "processing", 2, "render"),
                        (19, "processing", "ready", 2, "render")])
    assert ack_after_commit.check(b.history(), b.final, b.run).status == INVALID


@pytest.mark.parametrize("checker, timing_name, setup", [
    ("ack_after_commit", "lease_seconds", "crash"),
    ("lease_ownership", "lease_seconds", "pause"),
    ("bounded_retries", "max_attempts", None),
    ("staging_safety", "staging_retention_seconds", "orphan"),
])
def test_a_missing_timing_makes_the_dependent_check_unknown_never_valid(checker, timing_name, setup):
    b = happy()
    del b.run["adapter"]["timings"][timing_name]
    if setup == "crash":
        crash_with_sweeper_held(b, crash_at=1.5, hold_end=16)
    elif setup == "pause":
        b.add(1.2, "fault", action="sigstop", phase="start", role="worker")
        b.add(11, "fault", action="sigcont", phase="end", role="worker")
    elif setup == "orphan":
        b.final["bucket_objects"] = [{"key": "staging/" + ATT, "last_modified": iso(T0)},
                                     {"key": "staging/orphan", "last_modified": iso(T0)}]
    verdict = CHECKERS[checker].check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and timing_name in verdict.summary, verdict.summary


def test_without_the_events_capability_transition_checks_are_unknown_never_valid():
    b = replayed(Builder())
    b.run["adapter"]["capabilities"] = {"events": False, "replay": True}
    for attachment in b.attachments.values():  # nothing was read from /events
        attachment["events"] = []
    b.events = [e for e in b.events if e["type"] != "transition"]
    assert state_regression.check(b.history(), b.final, b.run).status == UNKNOWN
    assert replay_audit.check(b.history(), b.final, b.run).status == UNKNOWN


# --- role stability ---------------------------------------------------------------------------------------------

def test_role_stability_flags_a_role_that_dies_on_its_own_with_its_exit_code_and_log():
    from harness.checkers import role_stability

    b = happy()
    b.add(3, "role", action="exit", role="worker", returncode=1, expected=False, armed=None,
          log_tail="Traceback ...\nKeyError: 'job'")
    verdict = role_stability.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert verdict.evidence[0]["returncode"] == 1 and "KeyError" in verdict.evidence[0]["log_tail"]


def test_role_stability_tolerates_exits_the_harness_caused_or_during_a_fault():
    from harness.checkers import role_stability

    b = happy()
    b.add(2, "role", action="exit", role="worker", returncode=-9, expected=True, armed=None)  # SIGKILL by the nemesis
    b.add(2.5, "role", action="exit", role="relay", returncode=137, expected=False,
          armed={"after_commit_before_publish": "1*crash"})  # a failpoint firing
    b.add(4, "fault", action="restart_service", phase="start", service="rabbitmq")
    b.add(6, "fault", action="restart_service", phase="end", service="rabbitmq")
    b.add(9, "role", action="exit", role="api", returncode=1, expected=False, armed=None)  # gave up on the broker
    verdict = role_stability.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and "1 exits during faults" in verdict.summary
    b.add(60, "role", action="exit", role="api", returncode=1, expected=False, armed=None)  # long after
    assert role_stability.check(b.history(), b.final, b.run).status == INVALID


def test_an_unknown_counts_only_where_the_scenario_relies_on_it_or_observation_failed():
    from harness.checkers import counts

    unknown = lambda name: {"invariant": name, "status": UNKNOWN}
    assert counts(unknown("bounded_concurrency"), ["bounded_concurrency"])
    assert not counts(unknown("bounded_concurrency"), ["batch_independence"])  # incidental: proves nothing
    assert counts(unknown("bounded_concurrency"), None)  # a scenario that declares nothing relies on everything
    for always in ("message_hygiene", "fault_coverage", "lost_accepted_work"):  # observation itself failed
        assert counts(unknown(always), ["duplicate_effects"])
    assert counts({"invariant": "bounded_concurrency", "status": INVALID}, ["duplicate_effects"])
