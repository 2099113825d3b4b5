"""lease_ownership judges fencing from the objects ``ready`` names, not from the implementation's event log (issue 20,
hole 4): hand-made histories of an owner paused past its lease whose stale commit is logged as the new owner's."""

from __future__ import annotations

from harness.checkers import lease_ownership
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, T0, Builder, iso

LEASE = 4
VARIANTS = ("thumbnail", "crop", "optimized")


def whole_second(at: float) -> str:
    return iso(T0 + at).split(".")[0].rstrip("Z") + "Z"


def paused_owner_committed(landed: dict[str, float], commit_actor="worker:w2", commit_attempt=2):
    """w1 claims at 1.0 and is paused at 3.5 (its first object in the bucket); the sweeper recovers the job at 8.0;
    w2 claims at 9.0; w1 wakes at 12.5 and one commit lands at 15.0, logged (a trigger's view of the row) with the
    current owner's actor and attempt. ``landed``: variant -> when the object ready names landed."""
    b = Builder(lease=LEASE)
    b.add(0.0, "phase", name="object_watch_start", bucket="b")
    b.upload(0.1)
    b.add(3.5, "fault", action="sigstop", phase="start", role="worker")
    b.add(12.5, "fault", action="sigcont", phase="end", role="worker")
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:w1"),
                        (8.0, "processing", "queued", 2, "sweeper"), (9.0, "queued", "processing", 2, "worker:w2"),
                        (15.0, "processing", "ready", commit_attempt, commit_actor)])
    for variant in VARIANTS:
        key = f"variants/{ATT}/1/{variant}"
        b.add(landed[variant] + 0.3, "object", key=key, size=10, last_modified=whole_second(landed[variant]))
        b.add(15.3, "snapshot", attachment_id=ATT, key=key, exists=True, etag="e", size=10,
              last_modified=whole_second(landed[variant]), state="ready")
        b.final["attachments"][ATT]["objects"][key]["last_modified"] = whole_second(landed[variant])
    return b


def test_a_stale_commit_logged_as_the_new_owners_is_invalid_by_the_objects_it_names():
    # The stale owner's first object landed at 3.2 (before its pause), the others once it woke: ready names them,
    # though the event log shows one claim (w2, attempt 2) committing once. Before this check: valid.
    b = paused_owner_committed({"thumbnail": 3.2, "crop": 13.0, "optimized": 14.5})
    verdict = lease_ownership.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID, verdict.summary
    found = verdict.evidence[0]
    assert found["key"] == f"variants/{ATT}/1/thumbnail" and found["attachment_id"] == ATT
    assert "older claim" in found["message"] and found["commit_actor"] == "worker:w2" and verdict.seed == 42


def test_a_result_the_newest_claim_wrote_again_is_valid():
    # The new owner wrote every variant again after its claim (to its own keys, or over the same ones).
    b = paused_owner_committed({"thumbnail": 10.5, "crop": 12.0, "optimized": 14.0})
    verdict = lease_ownership.check(b.history(), b.final, b.run)
    assert verdict.status == VALID, verdict.summary


def test_an_object_landing_within_the_second_of_the_newest_claim_is_not_called_stale():
    # Last-Modified 8 (whole seconds: it landed in [8, 9)) against a claim at 9.0: not surely before it.
    b = paused_owner_committed({"thumbnail": 8.4, "crop": 12.0, "optimized": 14.0})
    assert lease_ownership.check(b.history(), b.final, b.run).status == VALID


def test_one_claim_only_is_not_judged_by_its_objects():
    b = Builder(lease=LEASE)
    b.upload(0.1)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "worker:w1"),
                        (5.0, "processing", "ready", 1, "worker:w1")])
    for variant in VARIANTS:
        b.final["attachments"][ATT]["objects"][f"variants/{ATT}/1/{variant}"]["last_modified"] = whole_second(2.0)
    assert lease_ownership.check(b.history(), b.final, b.run).status == VALID
