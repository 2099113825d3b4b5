"""redundant_publish (BE-JOB-004) over hand-made histories: a job published again while its first message still
waits behind held consumers is invalid; one message per job, a republish after a fault, and a missing timing are
judged as they should be."""

from __future__ import annotations

from harness.checkers import redundant_publish
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import Builder

SCENARIO = {"name": "backlog-no-republish", "checks": ["redundant_publish"]}
JOBS = [("a1111111-1111-4111-8111-111111111111", "b1111111-1111-4111-8111-111111111111"),
        ("a2222222-2222-4222-8222-222222222222", "b2222222-2222-4222-8222-222222222222")]


def backlog(copies: int, stale=2.0, hold_end=7.0, between=None):
    """Consumers held 0..hold_end s; two uploads at 0.5 s; each job's message seen ``copies`` times, 2 s apart."""
    b = Builder(scenario=SCENARIO)
    if stale is not None:
        b.run["adapter"]["timings"]["stale_queued_seconds"] = stale
    b.add(0.0, "phase", name="hold_start", roles=["worker"], instances=["worker"], fault=0)
    for attachment_id, job_id in JOBS:
        b.upload(0.5, attachment_id=attachment_id, job_id=job_id)
        b.add(0.6, "transition", attachment_id=attachment_id, event_seq=1, attempt=1, actor="api",
              **{"from": None, "to": "queued"})
    for n in range(copies):
        for attachment_id, job_id in JOBS:
            b.add(0.7 + 2.0 * n, "message", exchange="attachments.jobs", routing_key="jobs.process", source="binding",
                  properties={}, body={"job_id": job_id, "attachment_id": attachment_id, "attempt": 1})
        if between and n == 0:
            b.add(1.0, "fault", **between)
    b.add(hold_end, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0)
    b.add(hold_end + 0.5, "queue", queue="attachments.jobs.process", dead_letter=False, ready=2 * copies, unacked=0)
    return b


def test_invalid_when_a_waiting_job_is_published_again():
    b = backlog(copies=3)
    verdict = redundant_publish.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    found = [e for e in verdict.evidence if e.get("job_id")]
    assert len(found) == 4 and {e["job_id"] for e in found} == {job for _, job in JOBS}
    assert found[0]["earlier_seen_t"] < found[0]["later_seen_t"] and found[0]["lines"]
    assert verdict.evidence[0]["jobs_accepted_during_holds"] == 2


def test_valid_and_exercised_with_one_message_per_job():
    b = backlog(copies=1)
    verdict = redundant_publish.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_not_exercised_when_the_hold_is_shorter_than_the_threshold():
    b = backlog(copies=1, stale=30.0)
    verdict = redundant_publish.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised


def test_unknown_without_the_threshold_unless_a_repeat_is_seen():
    assert redundant_publish.check(backlog(copies=1, stale=None).history(), {}, backlog(1, stale=None).run).status \
        == UNKNOWN
    b = backlog(copies=2, stale=None)
    assert redundant_publish.check(b.history(), b.final, b.run).status == INVALID


def test_a_repeat_after_a_fault_is_not_judged():
    b = backlog(copies=2, between={"action": "restart_service", "phase": "start", "service": "rabbitmq"})
    verdict = redundant_publish.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "dead-letter" in verdict.summary


def test_no_hold_of_every_consumer_is_not_exercised():
    b = Builder(scenario=SCENARIO)
    b.upload(0.5, attachment_id=JOBS[0][0], job_id=JOBS[0][1])
    verdict = redundant_publish.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised


# --- an implementation without a republish safety net (issue 20: a correct shape misjudged) ----------------------

def without_net(copies: int):
    b = backlog(copies=copies, stale=None)
    b.run["adapter"]["capabilities"] = {"republish": False}  # the adapter says: no lost-message republish at all
    return b


def test_no_safety_net_declared_is_judged_never_republished_instead_of_unknown():
    b = without_net(copies=1)
    verdict = redundant_publish.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "no republish safety net" in verdict.summary and "none was published again" in verdict.summary


def test_no_safety_net_declared_still_fails_a_job_published_twice():
    b = without_net(copies=3)
    assert redundant_publish.check(b.history(), b.final, b.run).status == INVALID


def test_without_the_declaration_a_missing_threshold_stays_unknown():
    b = backlog(copies=1, stale=None)
    b.run["adapter"]["capabilities"] = {"replay": True}  # says nothing about republishing
    assert redundant_publish.check(b.history(), b.final, b.run).status == UNKNOWN
