"""version_isolation (level 5, pipeline versions) over hand-made histories, and the per-version reading of an event
stream that carries several versions' jobs (state_regression, duplicate_effects)."""

from __future__ import annotations

from harness.checkers import duplicate_effects, state_regression, version_isolation
from harness.checkers.base import INVALID, UNKNOWN, VALID, transitions_of

from harness_histories import ATT, T0, happy, iso

V1_KEYS = {v: f"variants/{ATT}/1/{v}" for v in ("thumbnail", "crop", "optimized")}  # what happy() publishes
V2_KEYS = {v: f"variants/{ATT}/v2/{v}" for v in ("thumbnail", "crop", "optimized")}


def listed(version, state, keys=None, sha="ab"):
    variants = [{"name": n, "key": k, "sha256": sha * 32} for n, k in (keys or {}).items()] if state == "ready" else []
    return {"pipeline_version": version, "state": state, "variants": variants}


def rolled_out(*, v2_state="ready", stop=False, served_after="ready", checks=("version_isolation",)):
    """v1 ready (happy), the operator reprocesses for v2 (refused without a token, idempotent), v2 works beside and
    ends ``v2_state``; GET serves the newest ready version."""
    b = happy()
    b.run["level"] = 5
    b.run["scenario"] = {"name": "pipeline-rollout", "checks": list(checks)}
    b.add(2.5, "versions", attachment_id=ATT, served_version=1, served_state="ready",
          versions=[listed(1, "ready", V1_KEYS)])
    for n, key in V1_KEYS.items():
        b.add(2.5, "version_snapshot", attachment_id=ATT, pipeline_version=1, key=key, variant=n, exists=True,
              etag='"e1"', size=10, last_modified=iso(T0 + 1.5))
    b.add(3.0, "invoke", op="r1", f="reprocess", attachment_id=ATT, pipeline_version=2, fault=1)
    b.add(3.1, "ok", op="r1", f="reprocess", attachment_id=ATT, pipeline_version=2, status=202,
          unauthenticated_status=401, repeat_status=200, job_id="j2", repeat_job_id="j2", fault=1)
    b.add(3.2, "versions", attachment_id=ATT, served_version=1, served_state="ready",
          versions=[listed(1, "ready", V1_KEYS), listed(2, "queued")])
    if stop:
        b.add(3.5, "fault", action="stop_version", phase="start", instance="worker@v2#1", pipeline_version=2, fault=2)
    if v2_state == "ready":
        b.add(4.0, "versions", attachment_id=ATT, served_version=2, served_state=served_after,
              versions=[listed(1, "ready", V1_KEYS), listed(2, "ready", V2_KEYS)])
        for n, key in V2_KEYS.items():
            b.add(4.0, "version_snapshot", attachment_id=ATT, pipeline_version=2, key=key, variant=n, exists=True,
                  etag='"e2"', size=10, last_modified=iso(T0 + 3.8))
    record = b.attachments[ATT]
    body = record["body"]
    body["versions"] = [listed(1, "ready", V1_KEYS), listed(2, v2_state, V2_KEYS)]
    for key in V1_KEYS.values():
        record["objects"][key] = {"exists": True, "sha256": "ab" * 32, "size": 10, "etag": '"e1"',
                                  "last_modified": iso(T0 + 1.5)}
    if v2_state == "ready":
        for key in V2_KEYS.values():
            record["objects"][key] = {"exists": True, "sha256": "ab" * 32, "size": 10, "etag": '"e2"',
                                      "last_modified": iso(T0 + 3.8)}
    return b


def verdict(b):
    return version_isolation.check(b.history(), b.final, b.run)


def test_a_roll_out_with_both_versions_ready_and_untouched_is_valid_and_exercised():
    v = verdict(rolled_out())
    assert v.status == VALID and v.exercised, v.summary
    assert "2 (attachment, version) results" in v.summary and "6 objects unchanged" in v.summary


def test_nothing_reprocessed_proves_nothing():
    b = happy()
    v = version_isolation.check(b.history(), b.final, b.run)
    assert v.status == VALID and not v.exercised
    b.run["scenario"] = {"name": "pipeline-rollout", "checks": ["version_isolation"]}
    assert version_isolation.check(b.history(), b.final, b.run).status == UNKNOWN


def test_an_api_without_versions_is_unknown_not_valid():
    b = happy()
    b.add(3.0, "ok", op="r1", f="reprocess", attachment_id=ATT, pipeline_version=2, status=202,
          unauthenticated_status=401, repeat_status=202, job_id="j2", repeat_job_id="j2")
    v = verdict(b)
    assert v.status == UNKNOWN and "versions[]" in v.summary


def test_an_object_of_a_ready_version_rewritten_by_another_version_is_invalid():
    """The broken variant version_less_keys: version 2's claim PUTs over version 1's objects (same key)."""
    b = rolled_out()
    b.attachments[ATT]["objects"][V1_KEYS["crop"]].update(etag='"e2"', last_modified=iso(T0 + 3.8))
    v = verdict(b)
    assert v.status == INVALID
    assert any("rewritten after the version was ready" in e["message"] and "version 1" in e["message"]
               for e in v.evidence)


def test_an_object_of_a_ready_version_gone_at_the_end_is_invalid():
    b = rolled_out()
    b.attachments[ATT]["objects"][V2_KEYS["thumbnail"]] = {"exists": False}
    assert verdict(b).status == INVALID


def test_a_late_older_attempt_replacing_a_newer_versions_result_is_invalid():
    b = rolled_out()
    # A late version-1 attempt republishes version 2's result with its own render (other checksums).
    b.add(6.0, "versions", attachment_id=ATT, served_version=2, served_state="ready",
          versions=[listed(1, "ready", V1_KEYS), listed(2, "ready", V2_KEYS, sha="cd")])
    v = verdict(b)
    assert v.status == INVALID and any("version 2's ready result changed" in e["message"] for e in v.evidence)


def test_a_ready_version_going_back_is_invalid():
    b = rolled_out()
    b.add(6.0, "versions", attachment_id=ATT, served_version=1, served_state="ready",
          versions=[listed(1, "ready", V1_KEYS), listed(2, "processing")])
    v = verdict(b)
    assert v.status == INVALID and any("version 2 went ready -> processing" in e["message"] for e in v.evidence)


def test_get_leaving_ready_while_the_new_version_works_is_invalid():
    b = rolled_out(v2_state="queued")
    b.add(3.3, "versions", attachment_id=ATT, served_version=2, served_state="queued",
          versions=[listed(1, "ready", V1_KEYS), listed(2, "queued")])
    b.add(3.6, "fault", action="stop_version", phase="start", instance="worker@v2#1", pipeline_version=2)
    v = verdict(b)
    assert v.status == INVALID and any("stopped being readable" in e["message"] for e in v.evidence)


def test_unauthenticated_or_non_idempotent_reprocessing_is_invalid():
    b = rolled_out()
    ok = [e for e in b.events if e["type"] == "ok" and e.get("f") == "reprocess"][0]
    ok.update(unauthenticated_status=202)
    assert any("without a token" in e["message"] for e in verdict(b).evidence)
    ok.update(unauthenticated_status=401, repeat_job_id="another-job")
    v = verdict(b)
    assert v.status == INVALID and any("not idempotent" in e["message"] for e in v.evidence)


def test_a_version_left_queued_is_lost_work_unless_its_consumers_were_rolled_back():
    v = verdict(rolled_out(v2_state="queued"))
    assert v.status == INVALID and any("reprocessed work was not done" in e["message"] for e in v.evidence)
    v = verdict(rolled_out(v2_state="queued", stop=True))
    assert v.status == VALID, v.evidence
    assert "rollback" in v.summary


def test_ready_twice_for_one_version_is_invalid_when_the_events_name_versions():
    b = rolled_out()
    events = b.attachments[ATT]["events"]
    for e in events:
        e["pipeline_version"] = 1
    events.append({"seq": 9, "at": iso(T0 + 7), "from": "processing", "to": "ready", "attempt": 2,
                   "reason": None, "actor": "w", "pipeline_version": 1})
    v = verdict(b)
    assert v.status == INVALID and any("version 1 reached ready 2 times" in e["message"] for e in v.evidence)


# --- the per-version reading of one event stream (level 5) ---------------------------------------------------------

def two_version_stream():
    """One attachment's /events with two versions' jobs interleaved (each event names its version); GET serves v2.
    Read as one path it is illegal (null→queued after ready); read per version, both paths are legal."""
    b = rolled_out()
    steps = [(0.1, None, "queued", 1, 1), (1, "queued", "processing", 1, 1), (2, "processing", "ready", 1, 1),
             (3.1, None, "queued", 1, 2), (3.5, "queued", "processing", 1, 2), (3.8, "processing", "ready", 1, 2)]
    b.attachments[ATT]["events"] = [
        {"seq": i, "at": iso(T0 + at), "from": frm, "to": to, "attempt": attempt, "reason": None, "actor": "x",
         "pipeline_version": version}
        for i, (at, frm, to, attempt, version) in enumerate(steps, start=1)]
    body = b.attachments[ATT]["body"]
    body["pipeline_version"] = 2
    body["variants"] = [{"name": n, "key": k, "sha256": "ab" * 32, "size": 10, "content_type": "image/webp"}
                        for n, k in V2_KEYS.items()]
    return b


def test_several_versions_in_one_event_stream_are_read_per_version():
    b = two_version_stream()
    trans = transitions_of(b.history(), b.final, ATT)
    assert [(t["from"], t["to"]) for t in trans] == [(None, "queued"), ("queued", "processing"),
                                                     ("processing", "ready")]
    assert state_regression.check(b.history(), b.final, b.run).status == VALID
    assert duplicate_effects.check(b.history(), b.final, b.run).status == VALID


def test_a_single_version_stream_is_read_as_before():
    b = happy()
    for e in b.attachments[ATT]["events"]:
        e["pipeline_version"] = 1
    assert len(transitions_of(b.history(), b.final, ATT)) == 3
