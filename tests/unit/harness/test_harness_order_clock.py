"""order_independence (BE-JOB-004.1) and clock_agreement (BE-JOB-005.4) over hand-made histories: each is valid on
a correct run, invalid on the bug it exists for, and unknown when it could not observe what the row needs."""

from __future__ import annotations

from harness_histories import Builder, happy, iso, job_message

from harness.checkers import INVALID, UNKNOWN, VALID, clock_agreement, order_independence
from harness.checkers.order_independence import connection_of

PERMUTE = {"name": "permuted-parallel-delivery", "checks": ["order_independence"]}
CLOCK = {"name": "clock-skew-expiry", "checks": ["clock_agreement"]}
A, B, C = ("aaaaaaaa-0000-4000-8000-00000000000a", "bbbbbbbb-0000-4000-8000-00000000000b",
           "cccccccc-0000-4000-8000-00000000000c")


# --- order_independence ---------------------------------------------------------------------------------------

def permuted_run(changed=True, connections=2, fail=None, scenario=PERMUTE):
    b = Builder(scenario=scenario)
    for n, attachment_id in enumerate((A, B, C)):
        happy(at=0.1 * n, attachment_id=attachment_id, builder=b)
    original = [{"job_id": f"j{n}", "attachment_id": a} for n, a in enumerate((A, B, C))]
    permuted = [original[2], original[0], original[1]] if changed else original
    b.add(0.6, "fault", action="permute", phase="start", queue="work")
    b.add(0.7, "fault", action="permute", phase="end", queue="work", changed=changed, original=original,
          permuted=permuted, order=[2, 0, 1] if changed else [0, 1, 2], published=3)
    for n in range(connections):
        b.add(1.2, "consumer", queue="work", tick=1, consumers=connections, consumer_tag=f"c{n}",
              channel=f"127.0.0.1:{4000 + n} -> 127.0.0.1:5672 (1)", prefetch=2, unacked=1)
    if fail:
        b.transitions(fail, [(0.3, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker"),
                             (1.1, "processing", "failed", 1, "worker")], error_code="out_of_order")
    return b


def test_order_independence_valid_when_permuted_jobs_end_ready_once_on_two_consumers():
    b = permuted_run()
    verdict = order_independence.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    facts = verdict.evidence[-1]
    assert facts["permuted"] == ["j2", "j0", "j1"] and len(facts["consumer_connections_with_deliveries"]) == 2


def test_order_independence_catches_a_job_refused_as_out_of_order():
    b = permuted_run(fail=B)
    verdict = order_independence.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert any(e.get("attachment_id") == B and "did not end ready" in e["message"] for e in verdict.evidence)


def test_order_independence_unknown_when_the_order_did_not_change_or_one_consumer_consumed():
    same = permuted_run(changed=False)
    assert order_independence.check(same.history(), same.final, same.run).status == UNKNOWN
    lone = permuted_run(connections=1)
    # happy() processes each job 1 s → 2 s, 0.1 s apart: they overlap, but a single attached consumer is not parallel
    # delivery to several consumers.
    verdict = order_independence.check(lone.history(), lone.final, lone.run)
    assert verdict.status == UNKNOWN and "no parallel consumption" in verdict.summary


def test_order_independence_falls_back_to_attached_consumers_and_overlapping_work_when_statistics_lag():
    b = permuted_run(connections=2)
    for e in b.events:
        if e["type"] == "consumer":
            e["unacked"] = 0  # the management statistics lag: no delivery shown on any channel
    verdict = order_independence.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised
    assert verdict.evidence[-1]["most_permuted_jobs_processing_at_once"] == 3


def test_order_independence_not_exercised_without_a_permutation():
    b = happy(builder=Builder(scenario={"name": "other", "checks": ["lost_accepted_work"]}))
    verdict = order_independence.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised
    assert connection_of("127.0.0.1:1 -> 127.0.0.1:2 (3)") == "127.0.0.1:1 -> 127.0.0.1:2"


# --- clock_agreement ------------------------------------------------------------------------------------------

STALE, MIDDLE, FRESH = ("11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222",
                        "33333333-3333-4333-8333-333333333333")


def clock_run(stale_end=None, fresh_end=None, producer_status="verified", consumer_status="verified",
              producer_tz="Pacific/Kiritimati", consumer_tz="America/Adak", ttl=2.0):
    """Producers 2.5 s behind, consumers 2.5 s ahead; worker held 0.5 s → 4 s with a 2 s TTL: STALE accepted at 1 s
    (TTL out at 3 s, before the release), MIDDLE at 2.5 s (either outcome allowed), FRESH at 5 s (after the first
    claim the harness saw at 4.5 s)."""
    b = Builder(scenario=CLOCK)
    b.run["adapter"]["timings"]["job_ttl_seconds"] = ttl
    b.run["adapter"].update(expiry={"error_code": "expired"}, consumers=["worker"])
    for role, offset, status, tz, groups in (("api", -2.5, producer_status, producer_tz, ["@producers"]),
                                             ("relay", -2.5, producer_status, producer_tz, ["@producers"]),
                                             ("worker", 2.5, consumer_status, consumer_tz,
                                              ["@consumers", "@recovers_work"])):
        b.add(0.1, "observe", source="clock_skew", role=role, offset_seconds=offset, groups=groups, status=status,
              reason=f"{status} (test)")
        if tz:
            b.add(0.1, "observe", source="clock_tz", role=role, tz=tz, groups=groups, status="set", reason="test")
    b.add(0.5, "phase", name="hold_start", roles=["worker"], instances=["worker"], fault=0)
    b.upload(1.0, STALE, job_id="j1", op="u1")
    b.upload(2.5, MIDDLE, job_id="j2", op="u2")
    b.add(4.0, "phase", name="hold_end", roles=["worker"], instances=["worker"], fault=0)
    b.upload(5.0, FRESH, job_id="j3", op="u3")
    claim = lambda at: [(at, "queued", "processing", 1, "worker")]
    b.transitions(STALE, [(1.1, None, "queued", 1, "api")] + claim(4.3) + [
        (4.35, "processing", stale_end or "failed", 1, "worker")],
        error_code=None if stale_end == "ready" else "expired")
    b.add(4.5, "state", attachment_id=STALE, state=stale_end or "failed",
          error_code=None if stale_end == "ready" else "expired")
    b.transitions(MIDDLE, [(2.6, None, "queued", 1, "api")] + claim(4.4) + [(4.9, "processing", "ready", 1, "worker")])
    b.transitions(FRESH, [(5.1, None, "queued", 1, "api")] + claim(5.2) + [
        (5.3, "processing", fresh_end or "ready", 1, "worker")],
        error_code="expired" if fresh_end == "failed" else None)
    b.add(5.5, "state", attachment_id=FRESH, state=fresh_end or "ready",
          error_code="expired" if fresh_end == "failed" else None)
    b.events.sort(key=lambda e: e["t"])
    return b


def test_clock_agreement_valid_when_stale_work_expires_and_fresh_work_is_ready_with_clocks_apart():
    b = clock_run()
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "5s apart" in verdict.summary and "time zones" in verdict.summary
    facts = verdict.evidence[-1]
    assert {c["role"]: c["side"] for c in facts["clocks"]} == {"api": "producer", "relay": "producer",
                                                                "worker": "consumer"}


def test_clock_agreement_catches_fresh_work_expired_by_a_clock_ahead():
    b = clock_run(fresh_end="failed")
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    messages = [e["message"] for e in verdict.evidence if e.get("attachment_id") == FRESH]
    assert any("before its TTL" in m for m in messages) and any("after the consumers were back" in m for m in messages)


def test_clock_agreement_catches_stale_work_processed_by_a_clock_behind():
    b = clock_run(stale_end="ready")
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert any(e.get("attachment_id") == STALE and "TTL ran out" in e["message"] for e in verdict.evidence)


def test_clock_agreement_is_unknown_on_time_zones_alone():
    """Hole 10 (issue 20): libfaketime does not move a Go program's clock, and time zones change how a time is
    written, not what a clock reads. Before: VALID ("offset part not exercised, time zones 24h apart"); now unknown,
    naming each role whose offset was not shown and why."""
    b = clock_run(producer_status="cannot_apply", consumer_status="cannot_apply")  # Go programs
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN, verdict.summary
    assert "alone prove no clock difference" in verdict.summary
    assert all(f"{role}: cannot_apply" in verdict.summary for role in ("api", "relay", "worker"))
    # An offset the role's clock shows on one side only is not enough either when another asked offset is not shown.
    b = clock_run(producer_status="ineffective")
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "api: ineffective" in verdict.summary and "worker" not in verdict.summary


def stamped(b, ahead: float):
    """The claim events' `at` as a worker whose clock runs `ahead` seconds ahead would stamp them."""
    for e in b.events:
        if e["type"] == "transition" and e.get("to") == "processing":
            e["at_server"] = iso(e["wall"] - 0.2 + ahead)
    return b


def test_clock_agreement_takes_an_offset_from_the_claim_times_the_consumer_stamped():
    # libfaketime mapped (preloaded) proves nothing by itself; claim times 2.5 s ahead of when the harness saw them do.
    b = stamped(clock_run(consumer_status="preloaded"), 2.5)
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "worker stamped" in verdict.summary and "4.8s apart" in verdict.summary  # 2.3 s shown (+2.5 asked, seen 0.2 s late)
    worker = next(c for c in verdict.evidence[-1]["clocks"] if c["role"] == "worker")
    assert worker["offset_stamp"]["attachment_id"] and worker["offset_seconds"] == 2.3
    for unshown in (stamped(clock_run(consumer_status="preloaded"), 0.0),  # stamped by the database's clock, say
                    stamped(clock_run(consumer_status="preloaded"), 0.9)):  # within the slack
        verdict = clock_agreement.check(unshown.history(), unshown.final, unshown.run)
        assert verdict.status == UNKNOWN and "worker: preloaded" in verdict.summary, verdict.summary
    # Two consumer roles: a claim cannot be put on one of them.
    two = stamped(clock_run(consumer_status="preloaded"), 2.5)
    two.run["adapter"]["consumers"] = ["worker", "worker_b"]
    assert clock_agreement.check(two.history(), two.final, two.run).status == UNKNOWN


def test_clock_agreement_unknown_without_a_clock_difference_or_without_a_clock_at_all():
    same = clock_run(producer_status="cannot_apply", consumer_status="cannot_apply", producer_tz="UTC",
                     consumer_tz="Etc/UTC")
    verdict = clock_agreement.check(same.history(), same.final, same.run)
    assert verdict.status == UNKNOWN and "not shown on the role's own clock" in verdict.summary
    close = clock_run()  # every offset shown, but 0.8 s apart is less than half the 2 s TTL
    for e in close.events:
        if e.get("source") == "clock_skew":
            e["offset_seconds"] = 0.4 if e["offset_seconds"] > 0 else -0.4
    verdict = clock_agreement.check(close.history(), close.final, close.run)
    assert verdict.status == UNKNOWN and "no clock offset reached both" in verdict.summary
    bare = Builder(scenario=CLOCK)
    happy(builder=bare)
    assert clock_agreement.check(bare.history(), bare.final, bare.run).status == UNKNOWN
    other = happy(builder=Builder(scenario={"name": "other", "checks": []}))
    verdict = clock_agreement.check(other.history(), other.final, other.run)
    assert verdict.status == VALID and not verdict.exercised


def test_clock_agreement_counts_a_pause_of_every_consumer_instance_as_a_hold():
    b = clock_run()
    for e in b.events:  # the same run, with the consumer paused (SIGSTOP) instead of held
        if e["type"] == "phase" and e.get("name") == "hold_start":
            e.update(type="fault", action="sigstop", phase="start", role="worker")
        elif e["type"] == "phase" and e.get("name") == "hold_end":
            e.update(type="fault", action="sigcont", phase="end", role="worker")
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    b.run["adapter"]["roles"]["worker"] = 2  # one of two consumer instances paused: the other consumed meanwhile
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "no consumer was held" in verdict.summary


# --- the machinery: role groups, time zones, the permutation ---------------------------------------------------

def test_producers_group_time_zones_and_a_go_implementation_still_graded_on_its_time_zones():
    import random
    from pathlib import Path

    from harness import adapter as adapter_mod
    from harness import clock
    from harness.permute import permuted
    from harness.scenarios import find, for_grade

    repo = Path(__file__).resolve().parents[3]
    ref = adapter_mod.load(repo / "reference" / "adapter.toml")
    go = adapter_mod.load(repo / "examples" / "go-pipeline" / "adapter.toml")
    assert ref.expand_roles(["@producers"]) == ["api", "relay"]
    assert go.expand_roles(["@producers"]) == ["api"]  # the relay lives in the API process
    scenario = find("clock-skew-expiry")
    entries = scenario.raw["clock_skew"]
    timings = {**ref.timings, **scenario.raw["timings"]}
    assert clock.resolve(entries, ref, [], timings) == {"worker": 5.0, "sweeper": 5.0}  # producers: time zone only
    assert clock.resolve_tz(entries, ref, []) == {"api": "Pacific/Kiritimati", "relay": "Pacific/Kiritimati",
                                                  "worker": "America/Adak", "sweeper": "America/Adak"}
    assert clock.groups_of(entries, ref, [])["worker"] == ["@consumers"]
    # A time zone reaches Go programs: the scenario is not skipped for them (clock-skew-staging, offsets only, is);
    # their offsets come from clockshift, and clock_agreement judges them from the roles' own clocks.
    assert clock.cannot_skew(go, scenario.raw) is None
    assert scenario in for_grade([scenario], ref, 4)[0]
    order = permuted(list("abcdef"), random.Random(4242))
    assert sorted(order) == list(range(6)) and order != list(range(6))
    assert permuted(list("abcdef"), random.Random(4242)) == order  # seeded
    assert permuted(["only"], random.Random(1)) == [0]


def test_clock_agreement_accepts_fresh_work_that_expired_after_its_ttl_behind_a_backlog():
    # A slow machine: FRESH waits in the queue past its TTL and expires correctly (seen at 7.5 s, upload 5 s + 2 s).
    b = clock_run()
    b.events = [e for e in b.events if e.get("attachment_id") != FRESH or e["type"] in ("invoke", "ok")]
    b.transitions(FRESH, [(5.1, None, "queued", 1, "api"), (7.2, "queued", "processing", 1, "worker"),
                          (7.3, "processing", "failed", 1, "worker")], error_code="expired")
    b.add(7.5, "state", attachment_id=FRESH, state="failed", error_code="expired")
    b.events.sort(key=lambda e: e["t"])
    verdict = clock_agreement.check(b.history(), b.final, b.run)
    assert verdict.status != INVALID, [e.get("message") for e in verdict.evidence]


def _permuted_with_a_failure(kind: str, error_code: str):
    """A, B, C permuted and consumed by two consumers; A uploaded as ``kind`` ends failed with ``error_code``."""
    b = Builder(scenario=PERMUTE)
    job_a = "j-a"
    b.upload(0.0, A, job_id=job_a, kind=kind)
    b.add(0.15, "message", body=job_message(job_a, A), properties={})
    b.transitions(A, [(0.1, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker"),
                      (1.1, "processing", "failed", 1, "worker")], error_code=error_code)
    for n, attachment_id in enumerate((B, C), start=1):
        happy(at=0.1 * n, attachment_id=attachment_id, builder=b)
    original = [{"job_id": f"j{n}", "attachment_id": a} for n, a in enumerate((A, B, C))]
    b.add(0.6, "fault", action="permute", phase="start", queue="work")
    b.add(0.7, "fault", action="permute", phase="end", queue="work", changed=True, original=original,
          permuted=[original[2], original[0], original[1]], order=[2, 0, 1], published=3)
    for n in range(2):
        b.add(1.2, "consumer", queue="work", tick=1, consumers=2, consumer_tag=f"c{n}",
              channel=f"127.0.0.1:{4000 + n} -> 127.0.0.1:5672 (1)", prefetch=2, unacked=1)
    return b


def test_order_independence_lets_a_planted_poison_upload_fail_but_not_a_good_one():
    """Soak seed 9000 (reference): a poison upload (the harness planted it: it cannot be decoded) among the permuted
    jobs ends `failed (decode_failed)`, as it must; it is no sign of order dependence. A good one failing still is."""
    poison = _permuted_with_a_failure("poison", "decode_failed")
    verdict = order_independence.check(poison.history(), poison.final, poison.run)
    assert verdict.status == VALID, verdict.evidence
    good = _permuted_with_a_failure("good", "out_of_order")
    verdict = order_independence.check(good.history(), good.final, good.run)
    assert verdict.status == INVALID
    assert [e.get("attachment_id") for e in verdict.evidence if "did not end" in e.get("message", "")] == [A]
