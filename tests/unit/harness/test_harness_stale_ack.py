"""stale_ack (BE-JOB-006.4) over hand-made histories: valid, invalid, unknown, and not exercised."""

from __future__ import annotations

from harness.checkers import lease_ownership, stale_ack
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import ATT, Builder

OTHER = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def paused_owner(samples, steps=None, hold=True, pause=(2.0, 8.0), probe_end=None, other=None):
    """One job claimed at 1.0; its worker paused from ``pause[0]`` to ``pause[1]`` with the sweeper held from 0.5 to
    the end of the probe (if ``hold``); ``samples``: [(at, exact ready, stats ready, unacked, state)] after the wake."""
    b = Builder(lease=4)
    b.upload(0.1)
    if hold:
        b.add(0.5, "phase", name="hold_start", roles=["sweeper"], instances=["sweeper"], fault=0)
    b.add(pause[0], "fault", action="sigstop", phase="start", role="worker", pid=1)
    b.add(pause[1], "fault", action="sigcont", phase="end", role="worker", pid=1)
    b.add(pause[1], "phase", name="resume_probe_start", queue="q", fault=0, seconds=9)
    for at, ready, stats_ready, unacked, state in samples:
        states = {ATT: state}
        if other:
            states[OTHER] = other
        b.add(at, "queue", kind="resume_probe", queue="q", dead_letter=False, fault=0, ready=ready,
              stats_ready=stats_ready, unacked=unacked, consumers=1, states=states)
    end = probe_end if probe_end is not None else (samples[-1][0] + 0.1 if samples else pause[1] + 9)
    b.add(end, "phase", name="resume_probe_end", queue="q", fault=0)
    if hold:
        b.add(end, "phase", name="hold_end", roles=["sweeper"], instances=["sweeper"], fault=0)
    b.transitions(ATT, steps or [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                                 (end + 1.5, "processing", "queued", 2, "s"), (end + 2.0, "queued", "processing", 2, "w"),
                                 (end + 3.0, "processing", "ready", 2, "w")])
    return b


def series(start, end, ready=0, stats_ready=0, unacked=0, state="processing", step=0.25):
    out, at = [], start
    while at <= end + 1e-9:
        out.append((round(at, 2), ready, stats_ready, unacked, state))
        at += step
    return out


def check(b):
    return stale_ack.check(b.history(), b.final, b.run)


def test_an_owner_that_revives_its_lease_and_commits_is_valid_and_exercised():
    samples = series(8.2, 9.0, unacked=1) + series(9.25, 17.0, unacked=1, state="ready")
    b = paused_owner(samples, steps=[(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                                     (9.1, "processing", "ready", 1, "w")])
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "left processing (ready)" in verdict.evidence[0]["message"] and verdict.evidence[0]["attachment_id"] == ATT
    # Recovery held: lease_ownership does not ask for a recovery that could not happen.
    assert lease_ownership.check(b.history(), b.final, b.run).status == VALID


def test_a_delivery_given_back_or_still_held_is_valid():
    # Nacked at the wake-up: the exact ready count sees it at once, the lagging snapshot later (still unacked).
    samples = series(8.2, 17.0, ready=1, unacked=1)
    assert check(paused_owner(samples)).status == VALID
    # Still held (unacked at the owner) to the end of the probe.
    verdict = check(paused_owner(series(8.2, 17.0, unacked=1)))
    assert verdict.status == VALID and "still in the work queue" in verdict.evidence[0]["message"]
    # A redelivery between two samples: the snapshot shows it ready, the exact count already delivered: not empty.
    samples = series(8.2, 12.0, unacked=1) + series(12.25, 12.5, stats_ready=1) + series(12.75, 17.0, unacked=1)
    assert check(paused_owner(samples)).status == VALID


def test_a_job_left_processing_with_no_message_while_recovery_is_held_is_invalid():
    # Acked at the wake-up: the snapshot catches up ~5 s later, then the queue is empty to the end of the probe.
    samples = series(8.2, 13.0, unacked=1) + series(13.25, 17.0)
    verdict = check(paused_owner(samples))
    assert verdict.status == INVALID and verdict.seed == 42
    item = verdict.evidence[0]
    assert item["attachment_id"] == ATT and item["empty_for_seconds"] >= 3.5 and item["held"] == ["sweeper"]
    assert item["paused_wall"] < item["resumed_wall"] <= item["probe_from_wall"]


def test_an_empty_queue_for_less_than_the_statistics_lag_or_unattributable_counts_are_unknown():
    # Empty only for the last 0.5 s: inconclusive.
    verdict = check(paused_owner(series(8.2, 16.5, unacked=1) + series(16.75, 17.0)))
    assert verdict.status == UNKNOWN and "inconclusive" in verdict.summary
    # Another unfinished job in every sample: the counts are not this job's.
    verdict = check(paused_owner(series(8.2, 17.0), other="queued"))
    assert verdict.status == UNKNOWN and "attributed" in verdict.summary
    # The management API had no counts yet.
    verdict = check(paused_owner(series(8.2, 17.0, unacked=None)))
    assert verdict.status == UNKNOWN
    # No sample at all.
    verdict = check(paused_owner([], probe_end=17.0))
    assert verdict.status == UNKNOWN and "no sample" in verdict.summary
    # No lease declared.
    b = paused_owner(series(8.2, 17.0))
    del b.run["adapter"]["timings"]["lease_seconds"]
    assert check(b).status == UNKNOWN


def test_not_exercised_without_a_pause_past_the_lease_with_recovery_held_and_a_probe():
    empty = series(8.2, 17.0)
    # Recovery not held: a lease recovery could give the job back whatever the owner did.
    verdict = check(paused_owner(empty, hold=False))
    assert verdict.status == VALID and not verdict.exercised and "not held" in verdict.summary
    # A pause shorter than the lease.
    verdict = check(paused_owner(series(5.2, 14.0), pause=(2.0, 5.0)))
    assert verdict.status == VALID and not verdict.exercised and "not past the lease" in verdict.summary
    # No pause at all.
    b = Builder(lease=4)
    b.upload(0.1)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                        (2.0, "processing", "ready", 1, "w")])
    verdict = check(b)
    assert verdict.status == VALID and not verdict.exercised
    # The job was done before the owner woke (its commit landed as the pause began).
    verdict = check(paused_owner(series(8.2, 17.0, state="ready"),
                                 steps=[(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                                        (2.5, "processing", "ready", 1, "w")]))
    assert verdict.status == VALID and not verdict.exercised and "before the wake-up" in verdict.summary


# --- after a recovery (issue 20, hole 4): the old owner's delivery is given back, never acked ----------------------

def recovered_while_paused(redelivered_at=None, work_ready=0, traced=True):
    """One worker instance holds the job's delivery (traced at 1.05) when it is paused at 2.0; the sweeper recovers the
    job at 6.5 and worker#2 (started at 2.5) claims its new message at 7.0; the old owner wakes at 11.0. The old
    delivery is redelivered at ``redelivered_at`` (nacked), or never (acked by its owner)."""
    b = Builder(lease=4)
    b.add(0.0, "role", action="start", role="worker", pid=1)
    b.upload(0.1)
    if traced:
        b.add(1.05, "delivery", queue="q", attachment_id=ATT, attempt=1, sha256="s1", redelivered=0)
    b.add(2.0, "fault", action="sigstop", phase="start", role="worker", pid=1)
    b.add(2.5, "role", action="start", role="worker#2", pid=2)
    if traced:
        b.add(6.9, "delivery", queue="q", attachment_id=ATT, attempt=2, sha256="s2", redelivered=0)
    b.add(11.0, "fault", action="sigcont", phase="end", role="worker", pid=1)
    if redelivered_at is not None:
        b.add(redelivered_at, "delivery", queue="q", attachment_id=ATT, attempt=1, sha256="s1", redelivered=1)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:1"),
                        (6.5, "processing", "queued", 2, "sweeper"), (7.0, "queued", "processing", 2, "worker:2"),
                        (14.0, "processing", "ready", 2, "worker:2")])
    b.final["queues"]["work"]["ready"] = work_ready
    return b


def test_an_old_owner_that_acks_its_delivery_after_the_job_was_recovered_is_invalid():
    # ack_after_recovery: woken past its lost lease, the owner acks; its message is never seen again. Before: valid
    # (not exercised: "not probed, recovery not held").
    b = recovered_while_paused()
    verdict = stale_ack.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "never seen again" in verdict.summary, verdict.summary
    assert verdict.evidence[0]["attachment_id"] == ATT and verdict.evidence[0]["message_sha256"] == "s1"


def test_an_old_owner_that_gives_its_delivery_back_is_valid():
    b = recovered_while_paused(redelivered_at=11.3)
    verdict = stale_ack.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised and "given back" in verdict.summary, verdict.summary


def test_no_trace_or_a_message_left_in_the_queue_is_unknown_where_the_scenario_asks():
    asks = {"name": "worker-paused-past-lease", "checks": ["stale_ack"]}
    for b in (recovered_while_paused(traced=False), recovered_while_paused(work_ready=1)):
        b.run["scenario"] = asks
        assert stale_ack.check(b.history(), b.final, b.run).status == UNKNOWN
        # Elsewhere (a scenario that does not rely on stale_ack): not judged, a note.
        b.run["scenario"] = {"name": "other", "checks": []}
        verdict = stale_ack.check(b.history(), b.final, b.run)
        assert verdict.status == VALID and not verdict.exercised and "not judged" in verdict.summary
