"""lease_ownership judges an overtaken stale commit from the broker and the bucket alone (issue 20, mutant
``commit-without-fencing-token``): the result ``ready`` names landed before the job's message was published again,
while a newer claim had begun writing variants of its own. Hand-made histories without any event log."""

from __future__ import annotations

from harness.checkers import lease_ownership
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, T0, Builder, iso, job_message

VARIANTS = ("thumbnail", "crop", "optimized")


def whole_second(at: float) -> str:
    return iso(T0 + at).split(".")[0].rstrip("Z") + "Z"


def key(claim: int, variant: str) -> str:
    return f"variants/{ATT}/v1/t{claim}/{variant}.webp"


def overtaken(named_claim=1, newer=("thumbnail",), named_landed=2.2, republish=True, ready_at=12.0,
              newer_at=10.0, rewrite_same_keys=False, recovery_seen=True):
    """Upload at 0.1 (message 1 at 0.3), claim 1 writes its variants at ``named_landed``; the job's message is published
    again at 8.0 (a recovery); a newer claim writes ``newer`` at ``newer_at``; ready is first seen at ``ready_at``
    naming claim ``named_claim``'s keys. No transitions: the rule reads no event log."""
    b = Builder()
    b.add(0.0, "phase", name="object_watch_start", bucket="b")
    b.upload(0.1)
    b.add(0.3, "message", body=job_message(attachment_id=ATT), properties={})
    b.add(0.4, "object", key=f"staging/{ATT}", size=99, last_modified=whole_second(0.2))
    for v in VARIANTS:
        b.add(named_landed + 0.2, "object", key=key(1, v), size=10, last_modified=whole_second(named_landed))
    if republish:
        b.add(8.0, "message", body=job_message(attachment_id=ATT, attempt=2), properties={})
    b.add(1.0, "state", attachment_id=ATT, state="processing", attempt=1)  # the harness's polls: the first claim
    if recovery_seen:  # ... taken from it: back to queued, then the newer claim at work
        b.add(7.9, "state", attachment_id=ATT, state="queued", attempt=2)
        b.add(8.1, "state", attachment_id=ATT, state="processing", attempt=2)
    for i, v in enumerate(newer):
        written = key(1 if rewrite_same_keys else 2, v)
        b.add(newer_at + 0.1 * i + 0.2, "object", key=written, size=10, last_modified=whole_second(newer_at + 0.1 * i))
    named_last = newer_at if (rewrite_same_keys or named_claim == 2) else named_landed
    for v in VARIANTS:
        b.add(ready_at, "snapshot", attachment_id=ATT, key=key(named_claim, v), exists=True, etag="e", size=10,
              last_modified=whole_second(named_last), state="ready")
    b.add(ready_at + 0.01, "state", attachment_id=ATT, state="ready", attempt=2)
    body = {"attachment_id": ATT, "state": "ready", "pipeline_version": 1, "attempt": 2,
            "variants": [{"name": v, "key": key(named_claim, v), "sha256": "ab" * 32, "size": 10} for v in VARIANTS]}
    b.final["attachments"][ATT] = {"status": 200, "body": body, "events": [],
                                   "objects": {key(named_claim, v): {"exists": True, "size": 10,
                                                                     "last_modified": whole_second(named_last)}
                                               for v in VARIANTS}}
    return b


def verdict(b):
    return lease_ownership.check(b.history(), b.final, b.run)


def test_an_older_claims_result_published_over_a_newer_claim_at_work_is_invalid():
    # The mutant's shape: claim 1's objects (landed at 2) named by ready, seen at 12, after the republish at 8 and a
    # newer claim's thumbnail at 10. Before this rule (no event log, so no claims): valid.
    v = verdict(overtaken())
    assert v.status == INVALID, v.summary
    found = v.evidence[0]
    assert found["attachment_id"] == ATT and v.seed == 42
    assert list(found["newer"]) == [key(2, "thumbnail")] and set(found["named"]) == {key(1, x) for x in VARIANTS}
    assert "published again" in found["message"]


def test_evidence_names_the_republish_time():
    found = verdict(overtaken()).evidence[0]
    assert found["republished_at"].startswith(iso(T0 + 8.0)[:19])


def test_a_duplicate_publish_of_a_job_already_committed_is_not_a_stale_commit():
    # A relay re-sends the message of a job whose ready was committed (before the publish) but not yet polled; a
    # consumer renders it again under keys of its own before reading the state. The harness's polls never saw the
    # job taken from its first claim: the ready may predate the publish, so nothing is judged.
    v = verdict(overtaken(recovery_seen=False))
    assert v.status == VALID and not v.exercised, v.summary


def test_the_newer_claims_own_result_is_valid():
    assert verdict(overtaken(named_claim=2, newer=VARIANTS)).status == VALID


def test_reusing_the_older_objects_writes_nothing_new_and_is_valid():
    # A correct implementation whose newer claim finds claim 1's complete result and commits it: no newer object.
    assert verdict(overtaken(newer=())).status == VALID


def test_deterministic_keys_rewritten_after_the_republish_are_valid():
    # Same keys written again by the newer claim: the named objects landed after the republish.
    assert verdict(overtaken(newer=VARIANTS, rewrite_same_keys=True)).status == VALID


def test_one_publish_only_is_not_judged():
    assert verdict(overtaken(republish=False)).status == VALID


def test_an_object_landed_before_the_republish_though_seen_late_is_not_newer():
    # The newer object's Last-Modified is 6 (seen at 10.2 by a lagging watch) — before the republish at 8.
    b = overtaken(newer=())
    b.add(10.2, "object", key=key(2, "thumbnail"), size=10, last_modified=whole_second(6.0))
    assert verdict(b).status == VALID


def test_a_named_object_landing_within_a_second_of_the_republish_is_not_called_old():
    # Last-Modified 7 (it landed in [7, 8)) against the republish at 8.0: not surely before it (slack).
    assert verdict(overtaken(named_landed=7.2)).status == VALID


def test_the_newer_claims_result_after_a_republish_exercises_the_checker():
    v = verdict(overtaken(named_claim=2, newer=VARIANTS))
    assert v.status == VALID and v.exercised, v.summary
    assert "published again" in v.summary and any(e.get("fenced") for e in v.evidence)


def test_no_republish_does_not_exercise_it():
    v = verdict(overtaken(named_claim=2, newer=VARIANTS, republish=False))
    assert v.status == VALID and not v.exercised


# --- recorded histories of stale-commit-overtaken, seed 7 (`harness mutate --sut reference --only
# commit-without-fencing-token --seed 7`, and `harness run stale-commit-overtaken --seed 7` on the reference) -------
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from harness.history import History  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUN = {"seed": 7, "level": 4, "adapter": {"name": "reference", "level": 5, "timings": {"lease_seconds": 4},
                                          "consumers": ["worker"], "recovers_work": ["sweeper"]}}


def recorded(name: str, without_event_log: bool = False):
    events = list(History.from_lines((FIXTURES / "histories" / f"{name}.jsonl").read_text().splitlines()).events)
    final = json.loads((FIXTURES / "finals" / f"{name}.json").read_text())
    if without_event_log:  # only what the harness saw itself: publishes, object writes, polls, the ready snapshot
        events = [e for e in events if e["type"] != "transition"]
        for record in final["attachments"].values():
            record["events"] = []
    return History(tuple(events)), final


def test_the_recorded_mutant_is_invalid_from_the_broker_and_the_bucket_alone():
    history, final = recorded("mutant-commit-without-fencing-token-stale-commit-overtaken-s7", without_event_log=True)
    v = lease_ownership.check(history, final, RUN)
    assert v.status == INVALID, v.summary
    assert any("published again" in e["message"] and "/t1/" in next(iter(e["named"])) for e in v.evidence)


def test_the_recorded_mutant_is_invalid_with_its_event_log_too():
    history, final = recorded("mutant-commit-without-fencing-token-stale-commit-overtaken-s7")
    assert lease_ownership.check(history, final, RUN).status == INVALID


def test_the_recorded_reference_is_valid_and_exercised():
    for without in (False, True):
        history, final = recorded("reference-stale-commit-overtaken-s7", without_event_log=without)
        v = lease_ownership.check(history, final, RUN)
        assert v.status == VALID and v.exercised, v.summary
