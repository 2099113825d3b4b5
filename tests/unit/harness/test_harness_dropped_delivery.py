"""dropped_delivery (BE-JOB-001) over hand-made histories: a consumer handed a new delivery during a dependency fault
while the deliveries it held were of jobs with nothing recorded proves it acked unfinished work (the
ack_on_dependency_error variant's shape); a consumer that holds them, commits first, or gives them back is valid."""

from __future__ import annotations

from harness.checkers import dropped_delivery
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import Builder

A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"
C = "cccccccc-0000-4000-8000-000000000003"
JOBS = {A: "aaaaaaaa-1111-4000-8000-000000000001", B: "bbbbbbbb-1111-4000-8000-000000000002",
        C: "cccccccc-1111-4000-8000-000000000003"}
CONN = "127.0.0.1:40000 -> 127.0.0.1:5672"
QUEUE = "attachments.jobs.process"


def outage(toxic="cut", service="postgres", prefetch=2, consumers=1, traced=True, asked=True, ready=0):
    """Jobs A and B delivered to one channel at 1.0/1.1 and claimed; the database cut from 2.0 to 6.0; the queue
    sampled every second with ``ready`` messages waiting."""
    b = Builder(lease=4, scenario={"name": "hand-made", "checks": ["dropped_delivery"] if asked else []})
    b.run["adapter"]["limits"] = {"prefetch": prefetch} if prefetch is not None else {}
    b.run["adapter"]["broker"] = {"work_queue": QUEUE}
    if traced:
        b.add(0.05, "observe", source="firehose", deliveries=True, queue=QUEUE)
    for at in (0.5, 1.5, 2.5, 3.5):
        b.add(at, "queue", queue=QUEUE, dead_letter=False, ready=ready, unacked=2, consumers=consumers)
    b.add(2.0, "fault", action="toxic", service="postgres" if service == "postgres" else service, toxic=toxic,
          phase="start", params={})
    b.add(6.0, "fault", action="toxic", service=service, toxic=toxic, phase="end")
    return b


def deliver(b, at, attachment_id, attempt=1, redelivered=0, channel=1, connection=CONN):
    b.add(at, "delivery", queue=QUEUE, job_id=JOBS[attachment_id], attachment_id=attachment_id, attempt=attempt,
          redelivered=redelivered, channel=channel, connection=connection, message_id=JOBS[attachment_id])


def check(b):
    return dropped_delivery.check(b.history(), b.final, b.run)


def dropped(b, a_steps=None):
    """A and B claimed, then nothing recorded until a recovery at 9.0 (their deliveries acked during the cut); C
    handed to the same channel at 3.0, during the cut."""
    deliver(b, 1.0, A)
    deliver(b, 1.1, B)
    b.transitions(A, a_steps or [(0.5, None, "queued", 1, "api"), (1.2, "queued", "processing", 1, "worker"),
                                 (9.0, "processing", "queued", 1, "sweeper"),
                                 (9.5, "queued", "processing", 1, "worker"), (10.0, "processing", "ready", 1, "worker")])
    b.transitions(B, [(0.6, None, "queued", 1, "api"), (1.3, "queued", "processing", 1, "worker"),
                      (9.1, "processing", "queued", 1, "sweeper"), (9.6, "queued", "processing", 1, "worker"),
                      (10.1, "processing", "ready", 1, "worker")])
    b.transitions(C, [(0.7, None, "queued", 1, "api"), (7.0, "queued", "processing", 1, "worker"),
                      (8.0, "processing", "ready", 1, "worker")])
    deliver(b, 3.0, C)
    return b


def test_a_consumer_handed_a_delivery_while_its_held_jobs_had_nothing_recorded_is_invalid():
    verdict = check(dropped(outage()))
    assert verdict.status == INVALID, verdict.summary
    item = verdict.evidence[0]
    assert {h["attachment_id"] for h in item["held"]} == {A, B} and item["bound"] == 2
    assert item["during_fault"] and "during a dependency fault (toxic on postgres" in item["message"]
    assert item["attachment_id"] == C and verdict.seed == 42
    # Its own finding: both ended ready all the same, their deliveries never handed out again.
    assert "2 of the 2 jobs so held ended terminal" in verdict.summary and "safety net did the work" in verdict.summary


def test_a_consumer_that_committed_one_job_before_its_next_delivery_is_valid_and_exercised():
    b = outage()
    dropped(b, a_steps=[(0.5, None, "queued", 1, "api"), (1.2, "queued", "processing", 1, "worker"),
                        (2.9, "processing", "ready", 1, "worker")])
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_a_delivery_given_back_is_redelivered_and_never_counted_as_held():
    b = outage()
    dropped(b)
    deliver(b, 2.8, A, redelivered=1, channel=2)  # A nacked (or its channel closed): the broker handed it out again
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_the_bound_counts_every_consumer_the_queue_had():
    verdict = check(dropped(outage(consumers=2)))  # two consumers may share the channel: 4 free slots, 2 held
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_a_delivery_on_another_channel_proves_nothing_about_this_one():
    b = outage()
    deliver(b, 1.0, A)
    deliver(b, 1.1, B)
    b.transitions(A, [(0.5, None, "queued", 1, "api"), (1.2, "queued", "processing", 1, "worker"),
                      (7.0, "processing", "ready", 1, "worker")])
    b.transitions(B, [(0.6, None, "queued", 1, "api"), (1.3, "queued", "processing", 1, "worker"),
                      (7.1, "processing", "ready", 1, "worker")])
    b.transitions(C, [(0.7, None, "queued", 1, "api"), (7.0, "queued", "processing", 1, "worker"),
                      (8.0, "processing", "ready", 1, "worker")])
    deliver(b, 3.0, C, channel=2)
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_outside_any_dependency_fault_the_same_count_proves_the_same():
    """A shared multiple=true ack, or any ack of unfinished work, shows the same way with no fault at all: judged in
    every scenario, the evidence says whether a fault was in force."""
    for b in (dropped(outage(toxic="latency")), dropped(outage(service="rabbitmq"))):
        verdict = check(b)
        assert verdict.status == INVALID and "(0 during a dependency fault)" in verdict.summary, verdict.summary
        assert "outside any dependency fault" in verdict.evidence[0]["message"]
        assert verdict.evidence[0]["during_fault"] is False


def test_untraced_deliveries_or_no_prefetch_cannot_tell_where_relied_on():
    for b in (dropped(outage(traced=False)), dropped(outage(prefetch=None)), dropped(outage(consumers=0))):
        verdict = check(b)
        assert verdict.status == UNKNOWN and "cannot tell" in verdict.summary, verdict.summary
    verdict = check(dropped(outage(traced=False, asked=False)))
    assert verdict.status == VALID and not verdict.exercised, verdict.summary


def test_no_delivery_to_a_consumer_holding_unfinished_work_is_not_exercised():
    b = outage(asked=False)
    deliver(b, 1.0, A)
    b.transitions(A, [(0.5, None, "queued", 1, "api"), (1.2, "queued", "processing", 1, "worker"),
                      (7.0, "processing", "ready", 1, "worker")])
    verdict = check(b)
    assert verdict.status == VALID and not verdict.exercised, verdict.summary


def test_a_job_recovered_before_the_next_delivery_is_no_longer_held_by_its_old_owner():
    """An owner acking its delivery once the job was recovered is harmless (stale_ack's concern): not counted."""
    b = outage()
    dropped(b, a_steps=[(0.5, None, "queued", 1, "api"), (1.2, "queued", "processing", 1, "worker"),
                        (2.5, "processing", "queued", 1, "sweeper"), (7.0, "queued", "processing", 1, "worker"),
                        (8.0, "processing", "ready", 1, "worker")])
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary


def test_the_harness_own_look_into_the_queue_is_no_consumer():
    """The management API's gets (a look with requeue after the drain) are traced as deliveries on a direct
    connection: no prefetch bounds them, and they are never judged (a false alarm on a run of s3-write-denied)."""
    b = outage()
    for at, att in ((4.0, A), (4.0, B), (4.0, C)):
        deliver(b, at, att, connection="<harness-17166@localhost.1796183877.6200.0>")
    for att, start in ((A, 0.5), (B, 0.6), (C, 0.7)):
        b.transitions(att, [(start, None, "queued", 1, "api")])
    verdict = check(b)
    assert verdict.status == UNKNOWN and "no consumer was handed a delivery" in verdict.summary, verdict.summary


def test_an_earlier_pipeline_versions_delivery_is_not_judged_by_the_latest_versions_transitions():
    # Level 5: A and B were processed at version 1 and reprocessed at version 2, whose messages go to a queue of
    # their own (not traced). The final read's transitions are version 2's; against them the version-1 deliveries
    # looked held while C was handed out (a false alarm on the reference's pipeline-rollout, seed 20261129).
    b = outage()
    b.run["schedule"] = []
    deliver(b, 1.0, A)
    deliver(b, 1.1, B)
    for attachment_id in (A, B):
        b.transitions(attachment_id, [(2.6, None, "queued", 1, "api"), (2.7, "queued", "processing", 1, "worker"),
                                      (5.0, "processing", "ready", 1, "worker")])
        b.attachments[attachment_id]["body"]["versions"] = [{"pipeline_version": 1, "state": "ready"},
                                                            {"pipeline_version": 2, "state": "ready"}]
    b.transitions(C, [(0.7, None, "queued", 1, "api"), (3.1, "queued", "processing", 1, "worker"),
                      (4.0, "processing", "ready", 1, "worker")])
    deliver(b, 3.0, C)
    verdict = check(b)
    assert verdict.status != INVALID, verdict.summary
    for attachment_id in (A, B):  # one version each: the same history is the invalid shape it was
        b.attachments[attachment_id]["body"]["versions"] = [{"pipeline_version": 1, "state": "ready"}]
    assert check(b).status == INVALID


def held_through_the_cut(**kw):
    """A fast consumer: A delivered and done at once, B delivered after it and held through the cut (ready after it),
    nothing handed out during the cut — no delivery came while another of an unfinished job was held."""
    b = outage(**kw)
    deliver(b, 1.0, A)
    deliver(b, 1.1, B)
    b.transitions(A, [(0.5, None, "queued", 1, "api"), (1.05, "queued", "processing", 1, "worker"),
                      (1.3, "processing", "ready", 1, "worker")])
    b.transitions(B, [(0.6, None, "queued", 1, "api"), (1.3, "queued", "processing", 1, "worker"),
                      (6.4, "processing", "ready", 1, "worker")])
    return b


def test_messages_waiting_while_the_cut_held_every_slot_show_that_none_was_settled():
    # A fast consumer (the Go and TypeScript examples under load) finished each job within the tap's lag once the cut
    # healed: no delivery was ever judged contested, and the scenario ended unknown. The broker's own figures show the
    # same thing a contested delivery would: messages waited while the consumer held its whole prefetch through the
    # fault, and it was handed none.
    verdict = check(held_through_the_cut(ready=5))
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "5 messages waited ready" in verdict.summary and verdict.evidence[0]["history"][1]["ready"] == 5
    # Nothing waited (the consumer had taken all there was): it proves nothing, as before.
    verdict = check(held_through_the_cut(ready=0))
    assert verdict.status == UNKNOWN and "nor did messages wait" in verdict.summary, verdict.summary


def test_a_backlog_only_counts_with_one_consumer_holding_its_whole_prefetch_inside_the_fault():
    assert check(held_through_the_cut(ready=5, consumers=2)).status == UNKNOWN  # one channel cannot reach the bound
    assert check(held_through_the_cut(ready=5, prefetch=3)).status == UNKNOWN  # 2 unacked: a slot was free
    b = held_through_the_cut(ready=0)
    b.add(2.5, "queue", queue=QUEUE, dead_letter=False, ready=5, unacked=2, consumers=1)  # the fault 0.5 s old
    b.add(6.5, "queue", queue=QUEUE, dead_letter=False, ready=5, unacked=2, consumers=1)  # after it, in its grace
    assert check(b).status == UNKNOWN


def test_a_consumer_that_settles_during_the_cut_is_invalid_though_messages_waited():
    verdict = check(dropped(outage(ready=5)))
    assert verdict.status == INVALID, verdict.summary
