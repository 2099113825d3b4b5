"""bounded_concurrency (BE-JOB-004) and expiry (BE-JOB-005) over hand-made histories: each rejects the bug it
names and accepts a correct run."""

from __future__ import annotations

from harness.checkers import bounded_concurrency, expiry, lost_accepted_work
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import T0, Builder, iso

SAMPLED = {"name": "prefetch-under-backlog", "checks": ["bounded_concurrency"]}
EXPIRY = {"name": "expiry-after-backlog", "checks": ["expiry"]}


def sampled(unacked_by_tick, prefetch=2, limit=2, consumers=("amq.ctag-1",), backlog=40, channels=None):
    """A held worker: ``backlog`` uploads accepted before its release at 5 s, then one consumer line per consumer
    per tick (every 0.15 s). ``channels``: each consumer's channel (default: one channel each)."""
    b = Builder(scenario=SAMPLED)
    b.run["adapter"]["limits"] = {"prefetch": limit} if limit else {}
    b.add(0.5, "phase", name="consumer_sampling_start", queue="work", fault=0)
    for n in range(backlog):
        b.upload(1.0 + 0.05 * n, f"00000000-0000-4000-8000-{n:012d}", job_id=f"j{n}", op=f"u{n}")
    b.add(5.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0)
    for tick, unacked in enumerate(unacked_by_tick, start=1):
        for n, tag in enumerate(consumers):
            channel = (channels or {}).get(tag, f"127.0.0.1:5{n} -> 127.0.0.1:5672 (1)")
            b.add(5.0 + 0.15 * tick, "consumer", queue="work", tick=tick, consumers=len(consumers), consumer_tag=tag,
                  channel=channel, prefetch=prefetch, unacked=unacked)
    return b


def test_bounded_concurrency_valid_when_unacked_stays_within_prefetch():
    b = sampled([0, 1, 2, 2, 2, 1, 2, 2, 1, 0])
    verdict = bounded_concurrency.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised
    assert verdict.evidence[0]["max_unacked"] == 2 and verdict.evidence[0]["consumers"] == ["amq.ctag-1"]


def test_bounded_concurrency_catches_unacked_above_prefetch():
    b = sampled([1, 2, 3, 2, 2, 2, 1])
    verdict = bounded_concurrency.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and verdict.seed == 42
    item = verdict.evidence[0]
    assert item["consumer_tag"] == "amq.ctag-1" and item["unacked"] == 3 and "unacked 3 > prefetch 2" in item["message"]
    assert item["lines"] and item["t"] == 5.45 and item["wall"] == T0 + 5.45


def test_bounded_concurrency_catches_unlimited_prefetch_and_the_declared_limit():
    unlimited = sampled([1, 2, 2, 2, 2, 2], prefetch=0)
    verdict = bounded_concurrency.check(unlimited.history(), unlimited.final, unlimited.run)
    assert verdict.status == INVALID and "unlimited" in verdict.evidence[0]["message"]
    # Within its own prefetch of 50, but the adapter claims 2: the claim is what the grade holds it to.
    above = sampled([10, 30, 40, 20, 10, 5], prefetch=50, limit=2)
    verdict = bounded_concurrency.check(above.history(), above.final, above.run)
    assert verdict.status == INVALID and "declared limit 2" in verdict.evidence[0]["message"]
    # Undeclared, a prefetch of 50 cannot be told from a bound (issue 20, item 9: valid before).
    assert bounded_concurrency.check(above.history(), above.final, {**above.run, "adapter": {}}).status == UNKNOWN


def test_bounded_concurrency_unknown_when_the_backlog_never_reached_the_bound():
    """Issue 20, item 9: a prefetch of 10 000, declared, against a 40-message backlog: every message may be held at
    once, the bound proves nothing (valid before: unacked 40 ≤ prefetch 10 000)."""
    huge = sampled([5, 40, 40, 38, 30, 20, 10, 5], prefetch=10000, limit=10000)
    verdict = bounded_concurrency.check(huge.history(), huge.final, huge.run)
    assert verdict.status == UNKNOWN and "never reached" in verdict.summary, verdict.summary
    assert "backlog of 40" in verdict.summary and "10000 × 1 consumers" in verdict.summary
    # Two consumers with prefetch 20 against the same backlog: 40 ≤ 2 × 20, not reached either.
    pair = sampled([5, 20, 20, 10], prefetch=20, limit=20, consumers=("amq.ctag-1", "amq.ctag-2"))
    assert bounded_concurrency.check(pair.history(), pair.final, pair.run).status == UNKNOWN


def test_bounded_concurrency_two_consumers_on_one_channel_are_bounded_by_their_prefetches_together():
    """A false alarm before issue 20: two consumers on one channel, each with prefetch 2 (basic.qos per consumer):
    the channel's unacked (up to 4) was read against each consumer's prefetch alone (invalid before)."""
    one_channel = {"amq.ctag-1": "127.0.0.1:50 -> 127.0.0.1:5672 (1)", "amq.ctag-2": "127.0.0.1:50 -> 127.0.0.1:5672 (1)"}
    b = sampled([2, 3, 4, 4, 4, 3, 4, 2], consumers=("amq.ctag-1", "amq.ctag-2"), channels=one_channel)
    verdict = bounded_concurrency.check(b.history(), b.final, b.run)
    assert verdict.status == VALID, verdict.summary
    over = sampled([2, 4, 5, 4], consumers=("amq.ctag-1", "amq.ctag-2"), channels=one_channel)
    verdict = bounded_concurrency.check(over.history(), over.final, over.run)
    assert verdict.status == INVALID and "unacked 5 > prefetch" in verdict.evidence[0]["message"], verdict.summary


def test_bounded_concurrency_unknown_with_too_few_samples_and_silent_elsewhere():
    few = sampled([0, 2, 1])
    assert bounded_concurrency.check(few.history(), few.final, few.run).status == UNKNOWN
    idle = sampled([0] * 20)  # a consumer was there, but never held a delivery while watched
    assert bounded_concurrency.check(idle.history(), idle.final, idle.run).status == UNKNOWN
    other = Builder()
    verdict = bounded_concurrency.check(other.history(), other.final, other.run)
    assert verdict.status == VALID and not verdict.exercised


# --- expiry -------------------------------------------------------------------------------------------------

EXPIRED = "11111111-1111-4111-8111-111111111111"
AMBIGUOUS = "22222222-2222-4222-8222-222222222222"
FRESH = "33333333-3333-4333-8333-333333333333"


def expiry_run(expired_end=None, fresh_end=None, ttl=2.0):
    """Worker held 0.5 s → 4 s with a 2 s TTL: EXPIRED accepted at 1 s (TTL out at 3 s, before the release),
    AMBIGUOUS at 2.5 s (either outcome allowed), FRESH at 5 s (after the first claim at 4.3 s)."""
    b = Builder(scenario=EXPIRY)
    b.run["adapter"]["timings"]["job_ttl_seconds"] = ttl
    b.run["adapter"].update(expiry={"error_code": "expired"}, consumers=["worker"])
    b.add(0.5, "phase", name="hold_start", roles=["worker"], instances=["worker"], fault=0)
    b.upload(1.0, EXPIRED, job_id="j1", op="u1")
    b.upload(2.5, AMBIGUOUS, job_id="j2", op="u2")
    b.add(4.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0)
    b.upload(5.0, FRESH, job_id="j3", op="u3")
    claim = lambda at: [(at, "queued", "processing", 1, "worker")]
    b.transitions(EXPIRED, [(1.1, None, "queued", 1, "api")] + claim(4.3) + [
        (4.35, "processing", expired_end or "failed", 1, "worker")],
        error_code=None if expired_end == "ready" else "expired")
    b.transitions(AMBIGUOUS, [(2.6, None, "queued", 1, "api")] + claim(4.4) + [(4.9, "processing", "ready", 1, "worker")])
    b.transitions(FRESH, [(5.1, None, "queued", 1, "api")] + claim(5.2) + [
        (5.6, "processing", fresh_end or "ready", 1, "worker")],
        error_code="expired" if fresh_end == "failed" else None)
    return b


def test_expiry_valid_when_the_held_job_expired_without_effect_and_fresh_work_is_ready():
    b = expiry_run()
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised
    assert verdict.evidence[0]["attachment_id"] == EXPIRED and verdict.evidence[-1]["attachment_ids"] == [FRESH]
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == VALID  # expired is not lost


def test_expiry_catches_a_job_processed_after_its_ttl():
    b = expiry_run(expired_end="ready")
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    item = verdict.evidence[0]
    assert item["attachment_id"] == EXPIRED and "TTL ran out" in item["message"] and item["lines"]
    assert verdict.seed == 42


def test_expiry_catches_objects_of_a_job_that_expired_while_held_and_results_of_any_expired_job():
    b = expiry_run()
    b.final["bucket_objects"] = [{"key": f"variants/{EXPIRED}/1/thumbnail", "size": 10, "last_modified": iso(T0 + 4)}]
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "yet has objects" in verdict.evidence[0]["message"]
    assert verdict.evidence[0]["effects"] == [f"object variants/{EXPIRED}/1/thumbnail"]
    b = expiry_run()
    b.final["attachments"][EXPIRED]["body"]["variants"] = [{"name": "thumbnail", "key": f"variants/{EXPIRED}/t"}]
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "business effect" in verdict.evidence[0]["message"]


def test_expiry_notes_objects_left_by_work_whose_commit_expired():
    b = expiry_run()
    body = b.final["attachments"][AMBIGUOUS]["body"]  # began before its TTL ran out, commit refused: expired
    body.update(state="failed", error_code="expired", variants=[], updated_at=iso(T0 + 4.9))
    b.final["bucket_objects"] = [{"key": f"variants/{AMBIGUOUS}/1/crop", "size": 10, "last_modified": iso(T0 + 4.8)}]
    b.final["attachments"][AMBIGUOUS]["events"][-1]["to"] = "failed"
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == VALID
    assert verdict.evidence[-1]["attachment_id"] == AMBIGUOUS and "unreferenced" in verdict.evidence[-1]["message"]


def test_expiry_catches_objects_written_after_the_deadline_of_a_job_that_expired_during_its_work():
    """Claimed before its TTL ran out, but fetch/render took long and the variants were written past the
    deadline (expiry not re-checked after the wait), then the commit was refused as expired: an effect started
    past the deadline (CONTRACT §5), not a mere leftover."""
    b = expiry_run()
    body = b.final["attachments"][AMBIGUOUS]["body"]  # accepted at 2.5 s with a 2 s TTL: deadline ≤ 4.55 s
    body.update(state="failed", error_code="expired", variants=[], updated_at=iso(T0 + 7.6))
    b.final["attachments"][AMBIGUOUS]["events"][-1]["to"] = "failed"
    b.final["bucket_objects"] = [{"key": f"variants/{AMBIGUOUS}/1/t3/crop.webp", "size": 10,
                                  "last_modified": iso(T0 + 7.5)}]
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    item = verdict.evidence[0]
    assert item["attachment_id"] == AMBIGUOUS and "after its deadline" in item["message"]
    assert item["effects"][0].startswith(f"object variants/{AMBIGUOUS}/1/t3/crop.webp")
    # Dated 1.45 s past it: a write issued just before the deadline and stored late on a loaded machine looks the
    # same (the check before the effect passed). A leftover of work that expired, noted, not an effect started late.
    b.final["bucket_objects"][0]["last_modified"] = iso(T0 + 6.0)
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and "unreferenced" in verdict.evidence[-1]["message"], verdict.summary


def test_expiry_catches_fresh_work_expired_and_expiry_before_the_ttl():
    b = expiry_run(fresh_end="failed")
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    messages = " | ".join(e["message"] for e in verdict.evidence)
    assert "before its TTL" in messages and "after the consumers were back" in messages


def test_expiry_unknown_when_the_scenario_could_not_prove_it_and_silent_elsewhere():
    b = expiry_run(ttl=None)
    b.run["adapter"]["timings"].pop("job_ttl_seconds")
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "job_ttl_seconds" in verdict.summary
    long_ttl = expiry_run(expired_end="ready", ttl=86400)  # nothing could expire during the hold
    assert expiry.check(long_ttl.history(), long_ttl.final, long_ttl.run).status == UNKNOWN
    other = Builder()
    verdict = expiry.check(other.history(), other.final, other.run)
    assert verdict.status == VALID and not verdict.exercised


def test_expiry_accepts_fresh_work_that_expired_after_its_ttl_behind_a_backlog():
    # A slow machine: FRESH (upload 5 s, TTL 2 s) is first seen expired at 7.4 s — a correct expiry, not a fault.
    b = expiry_run(fresh_end="failed")
    b.add(7.4, "state", attachment_id=FRESH, state="failed", error_code="expired")
    b.events.sort(key=lambda e: e["t"])
    messages = [e["message"] for e in expiry.check(b.history(), b.final, b.run).evidence]
    assert not any("after the consumers were back" in m for m in messages), messages


# --- a ready result or an effect past the deadline, in any scenario (issue 20, item 5) -----------------------

SLOW = {"name": "expiry-during-slow-fetch", "checks": ["expiry"]}
EARLY, LATE, CLAIMED_LATE = (f"4444444{n}-4444-4444-8444-444444444444" for n in range(3))


def slow_fetch_run(late_commit_at=6.5, late_objects_at=None, early_end="failed", with_messages=True,
                   scenario=SLOW):
    """No consumer held; a 3 s TTL. EARLY (202 at 0.05 s) is claimed at 0.3 s, seen claimed at 0.5 s, and (a slow
    fetch) ends as ``early_end`` at 3.5 s; LATE (202 at 0.35 s) is claimed at 0.6 s and committed ``ready`` at
    ``late_commit_at`` (its variants dated ``late_objects_at``); CLAIMED_LATE is claimed only after its deadline
    and expires at the claim."""
    b = Builder(scenario=scenario)
    b.run["adapter"]["timings"]["job_ttl_seconds"] = 3
    b.run["adapter"].update(expiry={"error_code": "expired"}, consumers=["worker"])
    for n, (att, job, at) in enumerate([(EARLY, "j-early", 0.0), (LATE, "j-late", 0.3), (CLAIMED_LATE, "j-cl", 0.6)]):
        b.upload(at, att, job_id=job, op=f"u{n}")
        if with_messages:
            b.add(at + 0.1, "message", body={"job_id": job, "attachment_id": att, "attempt": 1,
                                             "created_at": iso(T0 + at + 0.06), "expires_at": iso(T0 + at + 3.06)})
    b.transitions(EARLY, [(0.06, None, "queued", 1, "api"), (0.3, "queued", "processing", 1, "worker"),
                          (3.5, "processing", early_end, 1, "worker")],
                  error_code="expired" if early_end == "failed" else None)
    b.transitions(LATE, [(0.36, None, "queued", 1, "api"), (0.6, "queued", "processing", 1, "worker"),
                         (late_commit_at, "processing", "ready", 1, "worker")])
    if late_objects_at is not None:
        for obj in b.final["attachments"][LATE]["objects"].values():
            if obj["last_modified"] != iso(T0 + 0.36):
                obj["last_modified"] = iso(T0 + late_objects_at)
    b.transitions(CLAIMED_LATE, [(0.66, None, "queued", 1, "api"), (4.0, "queued", "processing", 1, "worker"),
                                 (4.05, "processing", "failed", 1, "worker")], error_code="expired")
    b.events.sort(key=lambda e: e["t"])
    return b


def test_expiry_catches_ready_committed_after_the_deadline_outside_a_hold():
    """Expiry checked at the claim only: LATE's slow fetch ends past its deadline, and it is committed ready with
    variants dated past it. Before issue 20 this graded valid (something else had expired)."""
    b = slow_fetch_run(late_commit_at=6.5, late_objects_at=6.2)
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID, verdict.summary
    item = verdict.evidence[0]
    assert item["attachment_id"] == LATE and "objects written after the job's deadline" in item["message"]
    assert item["deadline_no_later_than"] == T0 + 0.35 + 3


def test_expiry_catches_a_commit_past_the_deadline_its_own_record_shows():
    """Objects written in time, the commit 3 s past the expires_at its message carried, seen late by the
    harness: invalid; without messages the creation event + TTL is the deadline."""
    for with_messages in (True, False):
        b = slow_fetch_run(late_commit_at=6.5, late_objects_at=2.0, with_messages=with_messages)
        verdict = expiry.check(b.history(), b.final, b.run)
        assert verdict.status == INVALID, verdict.summary
        assert verdict.evidence[0]["attachment_id"] == LATE and "committed ready" in verdict.evidence[0]["message"]


def test_expiry_past_the_deadline_is_judged_in_every_scenario():
    b = slow_fetch_run(late_commit_at=6.5, late_objects_at=6.2, scenario={"name": "network-flaps", "checks": []})
    assert expiry.check(b.history(), b.final, b.run).status == INVALID


def test_expiry_trusts_the_harness_clock_over_a_late_stamp():
    """Seen ready before the latest possible deadline: never late, whatever a (skewed) role stamped."""
    b = slow_fetch_run(late_commit_at=2.5, late_objects_at=2.0)
    b.final["attachments"][LATE]["events"][-1]["at"] = iso(T0 + 9.0)  # a role's clock far ahead
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == VALID, verdict.summary


def test_expiry_during_a_slow_fetch_is_proven_only_by_a_job_claimed_in_time_that_expired():
    b = slow_fetch_run(late_commit_at=2.5, late_objects_at=2.0)
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert verdict.evidence[0]["attachment_id"] == EARLY and verdict.evidence[0]["seen_by"] == "harness clock"
    # Only a job already past its deadline at its claim expired: the re-check after a wait was never exercised.
    b = slow_fetch_run(late_commit_at=2.5, late_objects_at=2.0, early_end="ready")
    b.final["attachments"][EARLY]["objects"] = {}
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "re-check" in verdict.summary, verdict.summary


def test_expiry_while_every_consumer_was_paused_proves_expiry_without_a_hold():
    """clock-skew-expiry pauses the consumers (SIGSTOP) instead of holding them: a job whose TTL ran out in the
    pause and ended expired proves expiry there, as a hold does (no re-check after a claim needed)."""
    b = slow_fetch_run(late_commit_at=2.5, late_objects_at=2.0, early_end="ready",
                       scenario={"name": "clock-skew-expiry", "checks": ["expiry"]})
    b.final["attachments"][EARLY]["objects"] = {}
    b.add(0.0, "role", action="start", role="worker", pid=7)
    b.add(0.2, "fault", action="sigstop", phase="start", role="worker", pid=7)
    b.add(6.0, "fault", action="sigcont", phase="end", role="worker", pid=7)
    b.events.sort(key=lambda e: e["t"])
    verdict = expiry.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and "paused" in verdict.summary, verdict.summary
    assert verdict.evidence[0]["attachment_id"] == CLAIMED_LATE
