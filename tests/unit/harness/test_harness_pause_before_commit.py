"""A pause failpoint at after_s3_write_before_commit is counted as happened (fault_coverage) only when the harness saw
it: the job's own objects written during its claim, then the job leaving ``processing`` at least 0.9 × the pause
later. Hand-built histories."""

from __future__ import annotations

from chaos.kinds import failpoint
from harness_histories import ATT, Builder

STEP = {"action": "failpoint", "window": "after_s3_write_before_commit", "spec": "pause(3000)", "index": 0}


def paused_job(left_at: float, objects: bool = True, key_of=ATT) -> Builder:
    """One job claimed at 1.0 (seen at 1.2), its three variant objects seen at 1.5-1.6, leaving processing at
    ``left_at`` (seen 0.2 s later)."""
    b = Builder()
    b.upload(0.1)
    b.add(0.5, "fault", action="failpoint", phase="arm", role="worker", window=STEP["window"], spec=STEP["spec"])
    if objects:
        b.add(0.2, "object", key=f"staging/{key_of}", size=99, last_modified="x", etag="e0")
        for i, v in enumerate(("thumbnail", "crop", "optimized")):
            b.add(1.5 + i * 0.05, "object", key=f"variants/{key_of}/v1/{v}.webp", size=10, last_modified="x",
                  etag=f"e{i + 1}")
    b.transitions(ATT, [(0.0, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                        (left_at, "processing", "failed", 1, "w")], error_code="expired")
    return b


def happened(b: Builder):
    return failpoint.happened(STEP, b.history(), b.final)


def test_a_job_that_left_processing_a_pause_after_its_last_object_shows_the_pause():
    ok, why = happened(paused_job(left_at=4.6))
    assert ok, why
    assert ATT in why and "optimized" in why


def test_a_job_committed_right_after_its_writes_does_not_show_the_pause():
    ok, why = happened(paused_job(left_at=2.0))
    assert not ok and "no job seen leaving processing" in why


def test_objects_not_naming_the_job_prove_nothing():
    ok, why = happened(paused_job(left_at=4.6, key_of="someone-else"))
    assert not ok, why


def test_without_an_object_watch_the_pause_is_not_observable():
    ok, why = happened(paused_job(left_at=4.6, objects=False))
    assert not ok and "no object watch" in why
