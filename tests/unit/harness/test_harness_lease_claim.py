"""lease_ownership checks the adapter's declared lease_seconds against the implementation's own behaviour (issue 20,
item 13): a job whose only owner went down cannot be recovered sooner than a lease after its claim."""

from __future__ import annotations

from harness.checkers import lease_ownership
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, Builder


def crashed(lease=4, recovered_at=5.2, down="crash", second_instance=False, cont_at=None):
    """worker claims at 1.0 s, goes down at 1.5 s (a crash, a SIGKILL or a pause until ``cont_at``), the job is
    recovered (processing → queued by the sweeper) at ``recovered_at``, claimed again and finished."""
    b = Builder(lease=lease)
    b.add(0.2, "role", action="start", role="worker", pid=10)
    if second_instance:
        b.add(0.3, "role", action="start", role="worker#2", pid=11)
    b.upload(0.5, ATT)
    if down == "crash":
        b.add(1.5, "fault", action="crash", phase="hit", role="worker", window="after_s3_write_before_commit")
    elif down == "sigkill":
        b.add(1.5, "fault", action="sigkill", phase="start", role="worker", pid=10)
    else:
        b.add(1.5, "fault", action="sigstop", phase="start", role="worker", pid=10)
        b.add(cont_at, "fault", action="sigcont", phase="end", role="worker", pid=10)
    b.transitions(ATT, [(0.6, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker"),
                        (recovered_at, "processing", "queued", 2, "sweeper"),
                        (recovered_at + 0.5, "queued", "processing", 2, "worker"),
                        (recovered_at + 1.0, "processing", "ready", 2, "worker")])
    b.events.sort(key=lambda e: e["t"])
    return b


def check(b):
    return lease_ownership.check(b.history(), b.final, b.run)


def test_a_recovery_a_lease_after_the_claim_matches_the_declared_lease():
    for down in ("crash", "sigkill"):
        v = check(crashed(lease=4, recovered_at=5.2, down=down))
        assert v.status == VALID, v.summary
        item = next(e for e in v.evidence if "measured_seconds" in e)
        assert item["measured_seconds"] == 4.2 and item["declared_lease_seconds"] == 4


def test_a_declared_lease_the_implementation_does_not_keep_is_invalid():
    """The reference runs with LEASE_SECONDS=4, its adapter claims 30 (valid before issue 20)."""
    for down in ("crash", "sigkill"):
        v = check(crashed(lease=30, recovered_at=5.2, down=down))
        assert v.status == INVALID, v.summary
        item = v.evidence[0]
        assert item["attachment_id"] == ATT and "lease_seconds 30 does not match" in item["message"]
        assert item["measured_seconds"] == 4.2 and item["lines"]
    # Within a second of the declared lease: rounding, not a contradiction.
    assert check(crashed(lease=5, recovered_at=5.2)).status == VALID


def test_a_pause_counts_until_the_owner_wakes_and_two_instances_leave_the_owner_unknown():
    v = check(crashed(lease=30, recovered_at=5.2, down="sigstop", cont_at=9.0))
    assert v.status == INVALID and "does not match" in v.evidence[0]["message"], v.summary
    # Left processing only after SIGCONT: perhaps by the woken owner itself, nothing to measure.
    v = check(crashed(lease=30, recovered_at=9.5, down="sigstop", cont_at=9.0))
    assert not any("does not match" in e["message"] for e in v.evidence), v.summary
    # Two consumer instances when it went down: whose job it was is not known.
    v = check(crashed(lease=30, recovered_at=5.2, second_instance=True))
    assert v.status == VALID, v.summary
