"""graceful_stop over hand-made histories: a consumer's SIGTERM (the sigterm fault kind) loses nothing and spends no
attempt — valid when the job in flight finishes or is released at the same attempt, invalid when it comes back as a
new attempt after its lease ran out (a worker that acked it unfinished) or never ends; unknown when asked and
nothing was in flight."""

from __future__ import annotations

from chaos.kinds import sigterm
from harness.checkers import CHECKERS, graceful_stop
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import ATT, Builder

ASKED = {"name": "rolling-deploy", "checks": ["graceful_stop"]}


def stopped_at(b: Builder, at=2.0, killed=False, role="worker"):
    start = b.add(at, "fault", action="sigterm", phase="start", role=role, pid=11, grace=5.0, fault=0)
    end = b.add(at + (5.0 if killed else 0.8), "fault", action="sigterm", phase="end", role=role, pid=11,
                returncode=-9 if killed else 0, killed=killed, exit_seconds=5.0 if killed else 0.8, grace=5.0,
                fault=0)
    return start, end


def check(b: Builder):
    return graceful_stop.check(b.history(), b.final, b.run)


def test_it_is_registered_by_discovery_alone():
    assert CHECKERS["graceful_stop"] is graceful_stop


def test_a_job_finished_before_the_exit_is_valid_and_exercised():
    b = Builder(scenario=ASKED)
    b.upload(0.1)
    stopped_at(b)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:a"),
                        (2.5, "processing", "ready", 1, "worker:a")])
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "1 job(s) in flight at 1 consumer SIGTERMs" in verdict.summary and verdict.seed == 42


def test_a_job_released_at_the_same_attempt_and_redone_elsewhere_is_valid():
    b = Builder(scenario=ASKED)
    b.upload(0.1)
    stopped_at(b)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:a"),
                        (2.4, "processing", "queued", 1, "worker:a"), (2.6, "queued", "processing", 1, "worker:b"),
                        (3.5, "processing", "ready", 1, "worker:b")])
    assert check(b).status == VALID


def test_a_job_acked_unfinished_comes_back_by_lease_recovery_as_a_new_attempt_invalid():
    """The broken variant's shape (tests/broken/ack_in_flight_on_sigterm): the stopped worker acked its delivery
    and exited; the job stays processing until its lease runs out, and the sweeper's recovery counts attempt 2."""
    b = Builder(scenario=ASKED)
    b.upload(0.1)
    start, _ = stopped_at(b, killed=False)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:a"),
                        (5.2, "processing", "queued", 2, "sweeper"), (5.6, "queued", "processing", 2, "worker:b"),
                        (6.5, "processing", "ready", 2, "worker:b")])
    verdict = check(b)
    assert verdict.status == INVALID, verdict.summary
    first = verdict.evidence[0]
    assert first["attachment_id"] == ATT and first["attempt_at_stop"] == 1 and first["attempt_after"] == 2
    assert "'sweeper'" in first["message"] and "spent an attempt" in first["message"]
    assert first["lines"] == [start["line"]] and first["wall"] == start["wall"]


def test_an_attempt_counted_at_the_next_claim_is_spent_too():
    b = Builder(scenario=ASKED)
    b.upload(0.1)
    stopped_at(b)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                        (5.2, "processing", "queued", 1, "sweeper"), (5.6, "queued", "processing", 2, "w"),
                        (6.5, "processing", "ready", 2, "w")])
    assert check(b).status == INVALID


def test_a_job_in_flight_that_never_ends_is_lost():
    b = Builder(scenario=ASKED)
    b.upload(0.1)
    stopped_at(b, killed=True)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w")])
    verdict = check(b)
    assert verdict.status == INVALID and "never terminal" in verdict.evidence[0]["message"]
    assert any("SIGKILL after the grace" in e["message"] for e in verdict.evidence)


def test_jobs_before_or_after_the_stop_are_not_judged_and_nothing_in_flight_is_unknown_when_asked():
    b = Builder(scenario=ASKED)
    b.upload(0.1)
    stopped_at(b, at=5.0)
    # Done before the SIGTERM; a retry later (a real failure of its own) is not the stop's.
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                        (2.0, "processing", "ready", 1, "w")])
    assert check(b).status == UNKNOWN
    b.run["scenario"] = {"name": "other", "checks": []}
    verdict = check(b)
    assert verdict.status == VALID and not verdict.exercised


def test_no_consumer_sigterm_is_not_exercised_and_a_non_consumer_stop_does_not_count():
    b = Builder()
    b.upload(0.1)
    stopped_at(b, role="sweeper")
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                        (5.2, "processing", "queued", 2, "sweeper"), (6.5, "queued", "processing", 2, "w"),
                        (7.0, "processing", "ready", 2, "w")])
    verdict = check(b)
    assert verdict.status == VALID and not verdict.exercised, verdict.summary
    b.run["scenario"] = ASKED
    assert check(b).status == UNKNOWN


def test_the_kind_says_it_happened_only_when_every_stop_ended():
    b = Builder()
    assert sigterm.happened({"index": 0}, b.history(), {})[0] is False
    b.add(1.0, "fault", action="sigterm", phase="start", role="worker", pid=1, grace=5, fault=0)
    assert sigterm.happened({"index": 0}, b.history(), {})[0] is False
    b.add(1.5, "fault", action="sigterm", phase="end", role="worker", pid=1, returncode=-9, killed=True, fault=0)
    ok, why = sigterm.happened({"index": 0}, b.history(), {})
    assert ok and "1 exits seen" in why and "worker killed after the grace" in why


def test_a_sigterm_to_an_instance_that_had_already_crashed_stopped_nothing():
    """Soak of the Go example, seed 9000: a failpoint crash killed the worker, and the random SIGTERM came 0.08 s
    later to the same (dead) pid; the crash's retry was charged to the stop (invalid). A stop of an exited process is
    not a graceful stop: nothing to judge."""
    b = Builder(scenario={"name": "soak", "checks": []})
    b.upload(0.1)
    b.add(1.9, "role", role="worker", action="exit", pid=11, returncode=-9, expected=False)
    stopped_at(b, killed=True)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:a"),
                        (5.2, "processing", "queued", 2, "sweeper"), (5.6, "queued", "processing", 2, "worker:b"),
                        (6.5, "processing", "ready", 2, "worker:b")])
    verdict = check(b)
    assert verdict.status == VALID and not verdict.exercised, verdict.summary
