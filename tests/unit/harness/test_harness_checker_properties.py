"""Property tests of the checkers against a model of a correct pipeline (``model_histories``).

(a) Every checker accepts every history the model of a *correct* implementation produces — in all the variety
    the contract allows — and says ``unknown`` only for the reasons its docstring names.
(b) One mutation that breaks one invariant is ``invalid`` by the checker that names it, and by no other checker
    except the consequences each test names (``invalid_by``: a job left unfinished, say, is also a lost job).

Hypothesis runs derandomized with no example database, so CI sees the same examples every time; a failure is
shrunk to a minimal history (fewest episodes, first options, shortest delays).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from harness.checkers import CHECKERS, run_checks
from harness.checkers.base import INVALID, UNKNOWN, VALID
from model_histories import LEVEL_VARIANTS, T0, build, iso, models, uid

PROPERTY = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(n: int) -> settings:
    return settings(PROPERTY, max_examples=n)

# The only reasons a checker may give for `unknown` on a correct history (each named in its docstring).
ALLOWED_UNKNOWN = {
    "state_regression": "exposes no events",              # events capability off: transitions not observable
    "replay_audit": "exposes no events",
    "expiry": "expiry not proven",                         # asked for, but nothing proved it (no /events, ...)
    # a short drain (fewer than 5 busy sampling ticks), or a backlog no larger than prefetch × consumers
    "bounded_concurrency": ("too few samples", "never reached"),
    "batch_independence": "cannot tell",                   # no multi-delivery sample, or no failure inside one
    "ack_after_commit": "could not be judged",             # no queue samples in the probe window
    "redundant_publish": "declares no stale_queued_seconds",  # held consumers, no threshold declared
    "fault_coverage": "no evidence it was hit",            # a timed SIGKILL that landed outside its window
}


def verdicts(history, final, run) -> dict:
    return {v.invariant: v for v in run_checks(history, final, run)}


def assert_correct_history_accepted(model) -> None:
    history, final, run = build(model)
    for episode in sorted(set(model.episodes)):   # pytest --hypothesis-show-statistics: what was covered
        event(f"episode {episode}")
    event(f"attempts counted at {model.cfg.convention}; events {'on' if model.cfg.events else 'off'}")
    found = verdicts(history, final, run)
    assert set(found) == set(CHECKERS)
    for name, verdict in found.items():
        if verdict.status == VALID:
            event(f"{name} valid{'' if verdict.exercised else ' (not exercised)'}")
            continue
        allowed = ALLOWED_UNKNOWN.get(name)
        reasons = (allowed,) if isinstance(allowed, str) else tuple(allowed or ())
        assert verdict.status == UNKNOWN and any(r in verdict.summary for r in reasons), (
            f"{name} said {verdict.status} on a correct history ({model.episodes}): {verdict.summary}",
            verdict.evidence[:3])


# --- (a) correct histories ------------------------------------------------------------------------------------

@examples(100)
@given(model=models())
def test_every_checker_accepts_every_correct_history(model):
    assert_correct_history_accepted(model)


@pytest.mark.parametrize("require, kwargs", [
    (("crash",), {}),
    (("crash",), {"force": {"held": True, "peek": True}, "own_recoverer": True}),
    (("pause",), {"level": 4}),
    (("backlog", "backlog"), {}),
    (("replay",), {}),
    (("orphan", "flow"), {}),
    ((), {"expiry": True}),
], ids=["crash", "crash-probed", "pause", "backlog", "replay", "orphan", "expiry"])
@examples(30)
@given(data=st.data())
def test_every_checker_accepts_each_kind_of_correct_episode(require, kwargs, data):
    model = data.draw(models(require=require, **({"expiry": False} | kwargs)))
    assert_correct_history_accepted(model)


# --- (b) one mutation, one invariant broken -------------------------------------------------------------------

def invalid_by(name, history, final, run, also=frozenset()):
    """The named checker's verdict on a mutated history, after checking that the mutation is pinned on it alone:
    no other checker calls it invalid (``also``: checkers the same fault necessarily breaks too, each named)."""
    found = verdicts(history, final, run)
    others = {n: (v.summary, v.evidence[:2]) for n, v in found.items()
              if v.status == INVALID and n != name and n not in also}
    assert not others, f"one mutation, yet invalid by {sorted(others)} besides {name}: {others}"
    return found[name]


# A job left unfinished breaks every invariant that follows a job to its end: it is lost (lost_accepted_work), past
# a TTL never expired (expiry), its retries never reached the terminal result the budget promises (bounded_retries),
# held by an owner paused past its lease it was never recovered (lease_ownership), as a member of a multi-delivery
# batch it was left unsettled (batch_independence), and once replayed it never ended (replay_audit).
NEVER_FINISHED = frozenset({"lost_accepted_work", "expiry", "bounded_retries", "lease_ownership", "batch_independence",
                            "replay_audit"})


def known_jobs(model, state=None):
    """Jobs the harness got a 202 for (the others it never polls), optionally in a final state."""
    return [j for j in model.jobs.values() if j.ok is not None and (state is None or j.state == state)]


def later(job, by=1.0):
    return job.trans[-1]["at"] + by


@examples(30)
@given(model=models(events=True), data=st.data())
def test_a_second_ready_is_a_duplicate_effect(model, data):
    ready = known_jobs(model, "ready")
    assume(ready)
    job = data.draw(st.sampled_from(ready))
    last = job.trans[-1]
    # A redelivery re-runs the ready job (in-memory de-duplication lost at restart): ready twice.
    job.trans += [dict(last, at=later(job), **{"from": "ready", "to": "processing"}),
                  dict(last, at=later(job, 2), **{"from": "processing", "to": "ready"})]
    # ready → processing is itself an illegal step (state_regression); inside a multi-delivery batch the item was
    # re-executed (batch_independence).
    verdict = invalid_by("duplicate_effects", *build(model), also={"state_regression", "batch_independence"})
    assert verdict.status == INVALID, verdict.summary
    assert any(job.att == e.get("attachment_id") and "ready" in e["message"] for e in verdict.evidence)


@examples(30)
@given(model=models(events=True), data=st.data())
def test_ready_back_to_processing_is_a_regression(model, data):
    ready = known_jobs(model, "ready")
    assume(ready)
    job = data.draw(st.sampled_from(ready))
    job.trans.append(dict(job.trans[-1], at=later(job), **{"from": "ready", "to": "processing"}))
    job.state = "processing"
    job.tags.add("lost")
    # It now ends in processing: never finished (see NEVER_FINISHED).
    verdict = invalid_by("state_regression", *build(model), also=NEVER_FINISHED)
    assert verdict.status == INVALID, verdict.summary


@examples(30)
@given(model=models(), data=st.data())
def test_an_accepted_job_that_never_ends_is_lost(model, data):
    jobs = known_jobs(model)
    assume(jobs)
    job = data.draw(st.sampled_from(jobs))
    # Cut its life short before any terminal state: accepted, then (maybe claimed and) never finished.
    cuts = [i for i, t in enumerate(job.trans, start=1) if t["to"] in ("queued", "processing")]
    cut = data.draw(st.sampled_from(cuts))
    job.trans = job.trans[:cut]
    job.state, job.error_code, job.written = job.trans[-1]["to"], None, {}
    job.tags.add("lost")
    verdict = invalid_by("lost_accepted_work", *build(model), also=NEVER_FINISHED)
    assert verdict.status == INVALID, verdict.summary
    assert [e["attachment_id"] for e in verdict.evidence] == [job.att]


@examples(30)
@given(model=models(), data=st.data())
def test_attempts_past_the_bound_are_unbounded_retries(model, data):
    jobs = [j for j in known_jobs(model) if j.trans[-1]["from"] == "processing"]
    assume(jobs)
    job = data.draw(st.sampled_from(jobs))
    replays = sum(1 for j in model.jobs.values() for t in j.trans if (t["from"], t["to"]) == ("failed", "queued"))
    # Past any reading of the bound: max_attempts for each budget (the first and one per operator replay).
    top = model.cfg.max_attempts * (1 + replays) + 1
    end = job.trans.pop()
    start, stop = job.trans[-1]["at"], end["at"]
    extra = top - job.attempt
    step = (stop - start) / (2 * extra + 1)
    for i in range(extra):
        job.attempt += 1
        for n, (frm, to) in enumerate([("processing", "queued"), ("queued", "processing")], start=1):
            job.trans.append({"at": start + step * (2 * i + n), "from": frm, "to": to, "attempt": job.attempt,
                              "actor": end["actor"], "reason": "transient"})  # its own owner
    job.trans.append(dict(end, attempt=job.attempt))
    verdict = invalid_by("bounded_retries", *build(model))
    assert verdict.status == INVALID, verdict.summary
    assert any(e.get("attachment_id") == job.att for e in verdict.evidence)


PROBED_CRASH = dict(require=("crash",), expiry=False, own_recoverer=True, events=True,
                    force={"held": True, "peek": True, "race": False})


@examples(30)
@given(model=models(**PROBED_CRASH), data=st.data())
def test_a_delivery_missing_from_the_queue_while_its_consumer_is_down_was_acked_before_commit(model, data):
    probed = [c for c in model.crashes if c["held"] and c["peeks"] and c["in_flight"]]
    assume(probed)
    crash = data.draw(st.sampled_from(probed))
    lost = data.draw(st.sampled_from(crash["in_flight"]))
    history, final, run = build(model)
    for peek in crash["peeks"]:             # acked at delivery: the broker had nothing to give back
        peek["messages"] = [m for m in peek["messages"] if m["attachment_id"] != lost]
        peek["ready"] = len(peek["messages"])
    # In a multi-delivery batch the missing delivery is also a batch item lost (batch_independence).
    verdict = invalid_by("ack_after_commit", history, final, run, also={"batch_independence"})
    assert verdict.status == INVALID, verdict.summary
    assert [e["attachment_id"] for e in verdict.evidence] == [lost]


@examples(30)
@given(model=models(events=True, expiry=False), data=st.data())
def test_a_stale_owner_writing_after_a_newer_attempt_claimed_breaks_ownership(model, data):
    candidates = []
    for job in known_jobs(model):
        claims = [(i, t) for i, t in enumerate(job.trans) if t["to"] == "processing"]
        for (_, old), (i, new) in zip(claims, claims[1:]):
            if new["attempt"] > old["attempt"]:
                candidates.append((job, i, old["attempt"]))
    assume(candidates)
    job, index, stale = data.draw(st.sampled_from(candidates))
    claim = job.trans[index]
    after = job.trans[index + 1]["at"] if index + 1 < len(job.trans) else claim["at"] + 1
    # The old owner, woken, records a retry of its own attempt: its write was not fenced.
    job.trans.insert(index + 1, {"at": (claim["at"] + after) / 2, "from": "processing", "to": "queued",
                                 "attempt": stale, "actor": "worker", "reason": "stale"})
    # The stale write also breaks the job's chain of states (state_regression), and beside a live new owner it is
    # an overlap too (owner_overlap: the same fault seen from the other owner).
    verdict = invalid_by("lease_ownership", *build(model), also={"state_regression", "owner_overlap"})
    assert verdict.status == INVALID, verdict.summary
    assert any("stale owner" in e["message"] and e["attachment_id"] == job.att for e in verdict.evidence)


@examples(40)
@given(model=models(), data=st.data())
def test_a_message_leaking_a_location_or_naming_another_job_breaks_hygiene(model, data):
    history, final, run = build(model)
    known = {j.att for j in known_jobs(model)}
    tapped = [e for e in history.of_type("message") if e["body"]["attachment_id"] in known]
    assume(tapped)
    message = data.draw(st.sampled_from(tapped))
    job = model.jobs[message["body"]["attachment_id"]]
    original_key = final["attachments"][job.att]["body"]["original"]["key"]
    stem = job.filename.rsplit(".", 1)[0]
    how = data.draw(st.sampled_from(["url", "key", "filename", "path", "job_id"]))
    if how == "url":
        message["body"]["source_url"] = f"https://cdn.example.com/{job.att}.png"
    elif how == "key":
        message["body"]["object"] = original_key
    elif how == "filename":
        message["properties"] = dict(message.get("properties") or {}, headers={"x-name": stem})
    elif how == "path":
        message["properties"] = dict(message.get("properties") or {}, headers={"x-tmp": f"/tmp/render/{job.att}"})
    else:
        message["body"]["job_id"] = uid("another", "job")
    verdict = invalid_by("message_hygiene", history, final, run)
    assert verdict.status == INVALID, (how, verdict.summary)


@examples(30)
@given(model=models(require=("replay",), events=True), data=st.data())
def test_failed_to_queued_without_the_harness_replay_call_is_a_regression(model, data):
    history, final, run = build(model)
    replayed = sorted({e["attachment_id"] for e in history.of_type("ok") if e.get("f") == "replay"})
    assume(replayed)
    target = data.draw(st.sampled_from(replayed))
    kept = [e for e in history.events if not (e.get("f") == "replay" and e.get("attachment_id") == target)]
    # Without the replay call the new attempts also exceed the first budget (bounded_retries).
    verdict = invalid_by("state_regression", type(history)(tuple(kept)), final, run, also={"bounded_retries"})
    assert verdict.status == INVALID, verdict.summary
    assert any(e["attachment_id"] == target and "asked for 0" in e["message"] for e in verdict.evidence)


@examples(30)
@given(model=models(expiry=True), data=st.data())
def test_an_expired_job_with_variants_breaks_expiry(model, data):
    history, final, run = build(model)
    expired = [a for a, r in final["attachments"].items() if r["body"]["error_code"] == model.cfg.expiry_code]
    assume(expired)
    target = data.draw(st.sampled_from(expired))
    record = final["attachments"][target]
    names = LEVEL_VARIANTS[min(model.cfg.level, 4)]
    record["body"]["variants"] = [{"name": n, "key": f"variants/{target}/1/{n}", "sha256": "ab" * 32, "size": 10,
                                   "content_type": "image/webp"} for n in names]
    for v in record["body"]["variants"]:
        final["bucket_objects"].append({"key": v["key"], "size": 10, "last_modified": iso(T0 + 1)})
    verdict = invalid_by("expiry", history, final, run)
    assert verdict.status == INVALID, verdict.summary
    assert any(e.get("attachment_id") == target and "business effect" in e["message"] for e in verdict.evidence)
