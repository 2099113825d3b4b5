"""batch_independence (BE-JOB-007) over hand-made histories: several deliveries in flight on one consumer, a
failure among them (a poison item, a consumer crash), and what must become of the others."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from harness import workload
from harness.checkers import CHECKERS, batch_independence
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import Builder

POISON = "aaaaaaaa-0000-4000-8000-000000000001"
GOOD1 = "aaaaaaaa-0000-4000-8000-000000000002"
GOOD2 = "aaaaaaaa-0000-4000-8000-000000000003"
GOOD3 = "aaaaaaaa-0000-4000-8000-000000000004"
BATCH = {"name": "batch-poison-positions", "checks": ["batch_independence"], "requirements": ["BE-JOB-007"]}
# The consumer role is deliberately not called "worker": the checker reads the adapter's consumer flags.
ROLES = {"api": 1, "jobs": 1, "janitor": 1}


def backlog(unacked=2, sample_from=5.1, sample_to=6.6, scenario=BATCH, consumers=1):
    """Consumers released at 5 s with a backlog; sampled every 0.15 s between ``sample_from`` and ``sample_to``."""
    b = Builder(scenario=scenario, roles=ROLES)
    b.run["adapter"]["consumers"] = ["jobs"]
    b.run["adapter"]["limits"] = {"prefetch": 2}
    b.upload(1.0, POISON, job_id="j-p", kind="poison", op="u0000")
    b.upload(1.1, GOOD1, job_id="j-1", op="u0001")
    b.upload(1.2, GOOD2, job_id="j-2", op="u0002")
    b.add(5.0, "phase", name="consumer_sampling_start", queue="work", fault=0)
    tick, at = 0, sample_from
    while at <= sample_to:
        tick += 1
        for n in range(1, consumers + 1):
            b.add(at, "consumer", queue="work", tick=tick, consumers=consumers, consumer_tag=f"amq.ctag-{n}",
                  channel=f"127.0.0.1:5{n} -> 127.0.0.1:5672 (1)", prefetch=2, unacked=unacked)
        at = round(at + 0.15, 3)
    return b


def poison_first(b, poison_end="failed", good1_end="ready", good1_error=None):
    """The poison leads the batch: claimed at 5.2 with GOOD1 (5.25); it fails at 5.6; GOOD2 is delivered next."""
    b.transitions(POISON, [(1.05, None, "queued", 1, "api"), (5.2, "queued", "processing", 1, "w"),
                           (5.6, "processing", poison_end, 1, "w")],
                  error_code="decode_failed" if poison_end == "failed" else None)
    b.transitions(GOOD1, [(1.15, None, "queued", 1, "api"), (5.25, "queued", "processing", 1, "w"),
                          (5.9, "processing", good1_end, 1, "w")], error_code=good1_error)
    b.transitions(GOOD2, [(1.25, None, "queued", 1, "api"), (5.7, "queued", "processing", 1, "w"),
                          (6.3, "processing", "ready", 1, "w")])
    return b


def check(b):
    return batch_independence.check(b.history(), b.final, b.run)


def test_registered_with_its_requirement():
    assert CHECKERS["batch_independence"] is batch_independence
    assert batch_independence.NAME == "batch_independence" and batch_independence.REQUIREMENTS == ("BE-JOB-007",)


def test_valid_when_a_poison_fails_inside_a_batch_and_its_neighbours_finish_once():
    verdict = check(poison_first(backlog()))
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert verdict.requirements == ["BE-JOB-007"] and verdict.seed == 42
    batch = verdict.evidence[0]
    assert batch["failure"] == "poison" and batch["attachment_id"] == POISON
    # GOOD2 was delivered after the poison had failed: not part of its batch.
    assert set(batch["batch"]) == {POISON, GOOD1} and batch["consumer_tag"] == "amq.ctag-1"
    assert batch["outcomes"] == {POISON: "failed", GOOD1: "ready"}
    assert batch["lines"] and batch["sample_line"]


def test_invalid_when_a_neighbour_shares_the_failing_items_outcome():
    verdict = check(poison_first(backlog(), good1_end="failed", good1_error="decode_failed"))
    assert verdict.status == INVALID and verdict.seed == 42
    lost = [e for e in verdict.evidence if "lost" in e["message"]]
    assert [e["attachment_id"] for e in lost] == [GOOD1]
    assert "poison u0000" in lost[0]["message"] and lost[0]["job_id"] == "j-1" and lost[0]["lines"]
    assert lost[0]["t"] is not None and lost[0]["wall"] is not None


def test_invalid_when_the_failing_item_is_reported_ready():
    verdict = check(poison_first(backlog(), poison_end="ready"))
    assert verdict.status == INVALID
    [item] = [e for e in verdict.evidence if "reported successful" in e["message"]]
    assert item["attachment_id"] == POISON and item["final_state"] == "ready" and item["lines"]


def crash_batch(b, peeked=(GOOD2, GOOD3), reexecute=False):
    """GOOD1 commits at 5.9 while GOOD2 (since 5.7) and GOOD3 (since 5.95) are in flight; the consumer is
    SIGKILLed at 6.0 with lease recovery held; the work queue is looked into at 6.5 and 7.1; restart at 8."""
    b.upload(1.3, GOOD3, job_id="j-3", op="u0003")
    b.transitions(POISON, [(1.05, None, "queued", 1, "api"), (5.2, "queued", "processing", 1, "w"),
                           (5.4, "processing", "failed", 1, "w")], error_code="decode_failed")
    first = [(1.15, None, "queued", 1, "api"), (5.25, "queued", "processing", 1, "w"),
             (5.9, "processing", "ready", 1, "w")]
    if reexecute:  # the redelivered batch runs the committed item again
        first += [(8.5, "ready", "processing", 1, "w"), (8.9, "processing", "ready", 1, "w")]
    b.transitions(GOOD1, first)
    b.transitions(GOOD2, [(1.25, None, "queued", 1, "api"), (5.7, "queued", "processing", 1, "w"),
                          (10.0, "processing", "queued", 2, "janitor"), (10.5, "queued", "processing", 2, "w"),
                          (11.0, "processing", "ready", 2, "w")])
    b.transitions(GOOD3, [(1.35, None, "queued", 1, "api"), (5.95, "queued", "processing", 1, "w"),
                          (10.0, "processing", "queued", 2, "janitor"), (10.6, "queued", "processing", 2, "w"),
                          (11.2, "processing", "ready", 2, "w")])
    b.add(5.95, "phase", name="hold_start", roles=["janitor"], instances=["janitor"], fault=1)
    b.add(6.0, "fault", action="sigkill", phase="start", role="jobs", pid=1234, trigger="batch", delay=0.0)
    for at in (6.5, 7.1):
        b.add(at, "queue", kind="peek", queue="work", ready=len(peeked),
              messages=[{"job_id": f"j-{a[-1]}", "attachment_id": a, "attempt": 1, "redelivered": True}
                        for a in peeked])
    b.add(8.0, "role", role="jobs", action="start", pid=1235)
    return b


def test_valid_when_a_crashed_consumers_unfinished_deliveries_come_back():
    verdict = check(crash_batch(backlog(sample_from=5.1, sample_to=6.0)))
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    crash = next(e for e in verdict.evidence if e.get("failure") == "crash")
    assert set(crash["batch"]) == {GOOD1, GOOD2, GOOD3} and "1 committed before it" in crash["message"]


def test_invalid_when_a_delivery_in_flight_was_settled_with_the_batch():
    verdict = check(crash_batch(backlog(sample_from=5.1, sample_to=6.0), peeked=(GOOD3,)))
    assert verdict.status == INVALID, verdict.summary
    [item] = [e for e in verdict.evidence if "settled with the batch" in e["message"]]
    assert item["attachment_id"] == GOOD2 and item["committed_meanwhile"] == [GOOD1]
    assert item["peeked"][0]["attachments"] == [GOOD3] and item["lines"]
    # Had the consumer been (re)started after GOOD2 was claimed, that claim's delivery went with its earlier life.
    restarted = crash_batch(backlog(sample_from=5.1, sample_to=6.0), peeked=(GOOD3,))
    restarted.add(5.8, "role", role="jobs", action="start", pid=1233)
    assert check(restarted).status == VALID


def test_invalid_when_a_committed_item_is_re_executed_after_the_crash():
    verdict = check(crash_batch(backlog(sample_from=5.1, sample_to=6.0), reexecute=True))
    assert verdict.status == INVALID
    items = [e for e in verdict.evidence if "re-executed" in e["message"]]
    assert items and {e["attachment_id"] for e in items} == {GOOD1}
    assert any("ready reached 2 times" in e["message"] for e in items)


def test_a_crash_of_a_role_that_is_no_consumer_is_no_batch_failure():
    b = crash_batch(backlog(sample_from=5.1, sample_to=6.0), peeked=(GOOD3,))
    b.run["adapter"]["consumers"] = ["api"]  # the adapter says the SIGKILLed role consumes nothing
    verdict = check(b)
    assert not any("settled with the batch" in e["message"] for e in verdict.evidence)


def test_unknown_when_no_sample_showed_two_deliveries_on_one_consumer():
    b = backlog(unacked=1)
    # Two consumer instances: items processing at once prove nothing about any one consumer.
    b.run["adapter"]["roles"] = {**b.run["adapter"]["roles"], "jobs": 2}
    verdict = check(poison_first(b))
    assert verdict.status == UNKNOWN and "no consumer sample ever showed 2" in verdict.summary
    assert verdict.evidence[0]["max_unacked"] == 1


def test_one_consumer_instance_processing_items_together_proves_the_batch_without_samples():
    """The broker lists a consumer seconds late; a fast consumer may drain the backlog before it is ever sampled."""
    verdict = check(poison_first(backlog(sample_from=99, sample_to=0)))  # never sampled
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert verdict.evidence[0]["proven_by"] == "overlap"
    # The same batch with the neighbour lost to the poison's outcome is caught the same way.
    broken = poison_first(backlog(sample_from=99, sample_to=0), good1_end="failed", good1_error="decode_failed")
    assert check(broken).status == INVALID


def test_unknown_when_no_failure_happened_while_deliveries_were_in_flight():
    b = backlog()
    for attachment_id, start in ((GOOD1, 5.2), (GOOD2, 5.25)):
        b.transitions(attachment_id, [(1.1, None, "queued", 1, "api"), (start, "queued", "processing", 1, "w"),
                                      (start + 0.5, "processing", "ready", 1, "w")])
    verdict = check(b)
    assert verdict.status == UNKNOWN and "no failure happened at all" in verdict.summary
    # Two consumers, and the samples holding two deliveries came long after the poison failed: which of its
    # neighbours shared its consumer cannot be told.
    late = poison_first(backlog(sample_from=12.0, sample_to=12.6, consumers=2))
    verdict = check(late)
    assert verdict.status == UNKNOWN and "several consumers were sampled" in verdict.summary


def test_one_consumer_proves_a_batch_whose_samples_came_late():
    # The broker's statistics lag by seconds: the first item of a backlog fails before the consumer is even
    # listed. With one consumer, the neighbours processed together with it were on it.
    verdict = check(poison_first(backlog(sample_from=9.0, sample_to=9.6)))
    assert verdict.status == VALID and verdict.exercised
    assert set(verdict.evidence[0]["batch"]) == {POISON, GOOD1}


def test_other_scenarios_are_not_exercised_rather_than_unknown():
    b = backlog(unacked=1, scenario={"name": "prefetch-under-backlog", "checks": ["bounded_concurrency"],
                                     "requirements": ["BE-JOB-004"]})
    b.run["adapter"]["roles"] = {**b.run["adapter"]["roles"], "jobs": 2}  # no single-consumer overlap proof
    verdict = check(poison_first(b))
    assert verdict.status == VALID and not verdict.exercised


def test_a_crash_proves_its_batch_by_what_the_broker_returned():
    # No consumer sample at all (the broker's statistics came too late): the first look into the work queue while
    # the consumer was down found two deliveries the broker had returned from it.
    b = crash_batch(Builder(scenario=BATCH, roles=ROLES))
    b.run["adapter"]["consumers"] = ["jobs"]
    b.upload(1.0, POISON, job_id="j-p", kind="poison", op="u0000")
    b.upload(1.1, GOOD1, job_id="j-1", op="u0001")
    b.upload(1.2, GOOD2, job_id="j-2", op="u0002")
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    crash = next(e for e in verdict.evidence if e.get("failure") == "crash")
    assert crash["proven_by"] == "returned" and set(crash["returned"]) == {GOOD2, GOOD3}
    assert "returned 2 of its deliveries" in crash["message"]
    # One returned delivery proves no batch, and the unproven crash is named in the reason.
    lone = crash_batch(Builder(scenario=BATCH, roles=ROLES), peeked=(GOOD3,))
    lone.run["adapter"]["consumers"] = ["jobs"]
    for attachment_id, job, op, kind in ((POISON, "j-p", "u0000", "poison"), (GOOD1, "j-1", "u0001", "good"),
                                         (GOOD2, "j-2", "u0002", "good")):
        lone.upload(1.0, attachment_id, job_id=job, kind=kind, op=op)
    verdict = check(lone)
    # (The poison before the crash, processed alongside GOOD1 on the only consumer, is still a proven batch.)
    assert not [e for e in verdict.evidence if e.get("failure") == "crash"]
    assert any("crash of jobs" in e["message"] and "nothing showed 2 or more deliveries" in e["message"]
               for e in verdict.evidence), verdict.evidence


def test_the_workload_pins_poison_items_to_the_first_middle_and_last_upload():
    ops = workload.plan(7, 17, 0, 3, 1000, poison_at=["first", "middle", "last"], min_side=500)
    assert [i for i, op in enumerate(ops) if op.kind == "poison"] == [0, 10, 19] and len(ops) == 20
    assert workload.fingerprint(ops) == workload.fingerprint(
        workload.plan(7, 17, 0, 3, 1000, poison_at=["first", "middle", "last"], min_side=500))
    for op in ops:
        if op.kind == "good":
            assert min(Image.open(io.BytesIO(op.data)).size) >= 500
    # Without the new knobs a plan is the one it always was (same seed, same bytes).
    assert workload.fingerprint(workload.plan(7, 17, 0, 3, 1000)) == \
        workload.fingerprint(workload.plan(7, 17, 0, 3, 1000, poison_at=(), min_side=16))
    with pytest.raises(ValueError):
        workload.plan(7, 5, 0, 1, poison_at=["first", "last"])


def test_a_traced_redelivery_of_the_committed_item_counts_toward_the_whole_batch_back():
    # The crash came between GOOD1's commit and its ack (after_commit_before_ack): the firehose traced GOOD1 and
    # GOOD2 redelivered after it. The committed item was in flight too — the whole batch came back — and a look
    # that only counted the queue leaves the trace to say so (it once counted unfinished jobs only: "at most 1").
    b = crash_batch(Builder(scenario=BATCH, roles=ROLES), peeked=())
    b.run["adapter"]["consumers"] = ["jobs"]
    for attachment_id, job, op, kind in ((POISON, "j-p", "u0000", "poison"), (GOOD1, "j-1", "u0001", "good"),
                                         (GOOD2, "j-2", "u0002", "good")):
        b.upload(1.0, attachment_id, job_id=job, kind=kind, op=op)
    for event in b.events:
        if event["type"] == "queue":
            event.pop("messages")  # an exact count, nothing listed
    b.add(0.5, "observe", source="firehose", deliveries=True)
    for at, attachment_id, job in ((8.2, GOOD1, "j-1"), (8.3, GOOD2, "j-2")):
        b.add(at, "delivery", job_id=job, attachment_id=attachment_id, attempt=1, redelivered=1, queue="work")
    b.events.sort(key=lambda e: e["t"])
    verdict = check(b)
    crash = next((e for e in verdict.evidence if e.get("failure") == "crash"), None)
    assert crash is not None, verdict.evidence
    assert crash["proven_by"] == "returned" and set(crash["returned"]) == {GOOD1, GOOD2}


def test_a_batch_that_committed_whole_before_the_crash_landed_is_proven_by_the_broker():
    # Two workers of one process claim GOOD1 and GOOD2 together and commit within a millisecond; the failpoint
    # crashes at the first commit, but the second lands before the process dies. At the crash no item is
    # ``processing`` any more, yet the broker hands both out again, redelivered: both were in flight on the
    # consumer, unacknowledged. (It once said "nothing else in flight with it (0 items)": unknown, on a Go
    # service graded in CI.)
    b = Builder(scenario=BATCH, roles=ROLES)
    b.run["adapter"]["consumers"] = ["jobs"]
    for attachment_id, job, op in ((GOOD1, "j-1", "u0001"), (GOOD2, "j-2", "u0002"), (GOOD3, "j-3", "u0003")):
        b.upload(1.0, attachment_id, job_id=job, op=op)
    b.add(0.5, "observe", source="firehose", deliveries=True)
    b.add(5.0, "role", role="jobs", action="start", pid=1234)
    b.transitions(GOOD1, [(1.05, None, "queued", 1, "api"), (5.2, "queued", "processing", 1, "w"),
                          (5.4, "processing", "ready", 1, "w")])
    b.transitions(GOOD2, [(1.1, None, "queued", 1, "api"), (5.21, "queued", "processing", 1, "w"),
                          (5.401, "processing", "ready", 1, "w")])
    b.transitions(GOOD3, [(1.15, None, "queued", 1, "api"), (8.6, "queued", "processing", 1, "w"),
                          (8.9, "processing", "ready", 1, "w")])
    b.add(5.45, "fault", action="crash", phase="hit", role="jobs", window="after_commit_before_ack")
    b.add(5.7, "queue", kind="peek", queue="work", ready=3)
    b.add(8.0, "role", role="jobs", action="start", pid=1235)
    for at, attachment_id, job in ((8.1, GOOD1, "j-1"), (8.11, GOOD2, "j-2")):
        b.add(at, "delivery", job_id=job, attachment_id=attachment_id, attempt=1, redelivered=1, queue="work")
    b.events.sort(key=lambda e: e["t"])
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    crash = next(e for e in verdict.evidence if e.get("failure") == "crash")
    assert set(crash["batch"]) == {GOOD1, GOOD2} and crash["proven_by"] == "returned"
    # One redelivery alone proves nothing: the crash is still named as unproven.
    b.events = [e for e in b.events if not (e["type"] == "delivery" and e.get("attachment_id") == GOOD2)]
    verdict = check(b)
    assert verdict.status == UNKNOWN and "returned 2 or more at once (at most 1)" in verdict.summary, verdict.summary


def _members_by_scan(failure, accepted, trans_of):
    """The members of a failure by a pass over every attachment (the definition the indexed query must match)."""
    from harness.checkers.batch_independence import _intervals

    in_flight, committed = [], []
    a, b = (failure["start"], failure["end"]) if failure["kind"] == "poison" else (failure["start"],) * 2
    if failure["kind"] == "poison":
        in_flight.append({"attachment_id": failure["attachment_id"], "stay": failure["stay"]})
    for attachment_id in accepted:
        if attachment_id == failure.get("attachment_id"):
            continue
        for stay in _intervals(trans_of(attachment_id)):
            end = stay["end"] if stay["end"] is not None else float("inf")
            if (stay["start"] < b and end > a) if failure["kind"] == "poison" else stay["start"] <= a < end:
                in_flight.append({"attachment_id": attachment_id, "stay": stay})
    if failure["kind"] == "crash" and in_flight:
        since = min(m["stay"]["start"] for m in in_flight)
        for attachment_id in accepted:
            for stay in _intervals(trans_of(attachment_id)):
                if stay["to"] == "ready" and stay["end"] is not None and since <= stay["end"] <= a:
                    committed.append({"attachment_id": attachment_id, "stay": stay})
    return in_flight, committed


def test_the_indexed_members_of_a_failure_are_those_of_a_scan():
    import random

    from harness.checkers.batch_independence import _members

    rng = random.Random(20261201)
    for _ in range(300):
        accepted = [f"a{i}" for i in range(rng.randint(0, 30))]
        trans = {}
        for attachment_id in accepted:
            t, out = rng.uniform(0, 50), []
            for _ in range(rng.randint(0, 4)):
                out.append({"to": rng.choice(["processing", "queued", "ready", "failed", "processing"]),
                            "at": t if rng.random() > 0.05 else None})
                t += rng.choice([0.0, rng.uniform(0, 5)])
            trans[attachment_id] = out
        for _ in range(5):
            start = rng.uniform(0, 55)
            failure = ({"kind": "poison", "start": start, "end": start + rng.uniform(0, 3), "stay": {},
                        "attachment_id": rng.choice(accepted) if accepted else None}
                       if rng.random() < 0.5 else {"kind": "crash", "start": start, "end": start})
            assert _members(failure, accepted, trans.get) == _members_by_scan(failure, accepted, trans.get)
