"""A pause failpoint at after_s3_write_before_commit is counted as happened (fault_coverage) only when the harness saw
it: the job's own objects written during its claim, then the job leaving ``processing`` at least 0.9 × the pause
later. Hand-built histories."""

from __future__ import annotations

from chaos.kinds import failpoint
from harness_histories import ATT, T0, Builder

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


def observed(b: Builder, at: float, frm, to, event_seq: int, not_before: float | None = None) -> None:
    """A transition the API observer first saw at ``at``; ``not_before``: when its previous read (which did not show
    this transition yet) began."""
    b.add(at, "transition", attachment_id=ATT, event_seq=event_seq, **{"from": frm, "to": to}, attempt=1, actor="w",
          at_server="x", **({"not_before_wall": T0 + not_before} if not_before is not None else {}))


def claimed_before_seen(variants: bool = True, final: bool = True) -> Builder:
    """A render is quicker than a poll: the object watch saw the original (1.4) and the variants (1.5-1.6) before the
    API observer's first read showed the job queued and claimed (1.8); it left processing 3 s after its writes."""
    b = Builder()
    b.upload(0.1)
    b.add(0.5, "fault", action="failpoint", phase="arm", role="worker", window=STEP["window"], spec=STEP["spec"])
    b.add(1.4, "object", key=f"originals/{ATT}", size=99, last_modified="x", etag="o")
    for i, v in enumerate(("thumbnail", "crop", "optimized") if variants else ()):
        b.add(1.5 + i * 0.05, "object", key=f"variants/{ATT}/v1/{v}.webp", size=10, last_modified="x", etag=f"e{i}")
    observed(b, 1.8, None, "queued", 1)
    observed(b, 1.8, "queued", "processing", 2)
    observed(b, 4.8, "processing", "ready", 3, not_before=4.5)
    if final:
        b.attachments[ATT] = {"status": 200, "body": {"state": "ready", "original": {"key": f"originals/{ATT}"}}}
    return b


def test_objects_seen_before_the_observer_saw_the_claim_still_belong_to_it():
    """The claim began after the upload did: the variants seen before the observer saw the claim are its own."""
    ok, why = happened(claimed_before_seen())
    assert ok, why
    assert "optimized" in why


def test_the_uploads_original_is_never_the_claims_write():
    """A claim that wrote nothing the watch saw: the original (the upload's write, named by the final read) does not
    stand in for its writes."""
    ok, why = happened(claimed_before_seen(variants=False))
    assert not ok, why


def test_without_a_final_read_the_claim_is_bounded_by_when_it_was_seen():
    """Without the final read the original is unknown, so the claim's window starts where the observer saw it (the
    variants before it are not counted): not shown, never wrongly shown."""
    ok, why = happened(claimed_before_seen(final=False))
    assert not ok, why


def test_an_earlier_claims_objects_do_not_show_a_later_claims_pause():
    """The first claim wrote its objects (1.5) and gave the job back at once (seen 2.2); the second claim wrote
    nothing the watch could see and committed 3.5 s after it began. The job's transitions before the second claim
    show it began after 2.0 (the read that did not show the give-back yet): the first claim's objects are not its."""
    b = Builder()
    b.upload(0.1)
    b.add(0.5, "fault", action="failpoint", phase="arm", role="worker", window=STEP["window"], spec=STEP["spec"])
    observed(b, 1.2, None, "queued", 1)
    observed(b, 1.2, "queued", "processing", 2)
    for i, v in enumerate(("thumbnail", "crop", "optimized")):
        b.add(1.5 + i * 0.05, "object", key=f"variants/{ATT}/v1/{v}.webp", size=10, last_modified="x", etag=f"e{i}")
    observed(b, 2.2, "processing", "queued", 3, not_before=2.0)
    observed(b, 2.7, "queued", "processing", 4, not_before=2.2)
    observed(b, 6.2, "processing", "ready", 5, not_before=6.0)
    ok, why = happened(b)
    assert not ok, why
