"""dead_letter_replay: a real job's dead letter replayed twice behind the token ends terminal once; an unmappable
dead letter stays through a replay of everything; an adapter without the replay path is unknown, never valid."""

from __future__ import annotations

from harness.checkers import dead_letter_replay
from harness_histories import Builder

ATT, JOB = "a-dead-1", "j-dead-1"
POISON = {"marker": "harness-dl-000000000001", "sha256": "ff" * 32, "kind": "not_json", "routed": True}


def builder(answers=(200, 200, 200), unauth=401, readies=1, stays=True, state_before="queued") -> Builder:
    b = Builder()
    b.upload(0, ATT, job_id=JOB)
    steps = [(0.1, None, "queued", 1, "api")]
    for n in range(readies):
        steps += [(5.5 + n, "queued" if n == 0 else "ready", "processing", 1, "worker"),
                  (5.8 + n, "processing", "ready", 1, "worker")]
    b.transitions(ATT, steps)
    b.add(0.5, "fault", action="inject", phase="publish", **POISON)
    b.add(0.6, "fault", action="dlq_replay", phase="move", job_id=JOB, attachment_id=ATT, routed=True)
    for n, (status, scope) in enumerate(zip(answers, ("job", "job", "all"))):
        b.add(5 + n, "invoke", op=f"d{n}", f="dlq_replay", scope=scope, round=1 + (n == 1),
              state_before=state_before if n == 0 else "ready")
        b.add(5.1 + n, "ok" if 200 <= status < 300 else "fail", op=f"d{n}", f="dlq_replay", scope=scope,
              round=1 + (n == 1), status=status, unauthenticated_status=unauth if n == 0 else None, answer="{}")
    b.final["dead_letters"] = [{"sha256": POISON["sha256"], "message_id": POISON["marker"]}] if stays else []
    return b


def check(b: Builder):
    return dead_letter_replay.check(b.history(), b.final, b.run)


def test_a_replayed_dead_letter_ending_ready_once_with_the_unmappable_kept_is_valid_and_exercised():
    v = check(builder())
    assert (v.status, v.exercised) == ("valid", True), v.summary
    assert "unmappable letters stayed" in v.summary


def test_a_second_replay_that_errors_or_an_open_endpoint_is_invalid():
    v = check(builder(answers=(200, 409, 200)))
    assert v.status == "invalid" and "second replay" in v.summary
    assert check(builder(unauth=200)).status == "invalid"


def test_a_replay_that_drops_the_unmappable_or_renders_twice_is_invalid():
    v = check(builder(stays=False))
    assert v.status == "invalid" and "unmappable" in v.summary
    assert check(builder(readies=2)).status == "invalid"


def test_without_the_adapter_keys_it_is_unknown_with_why_and_without_the_fault_not_exercised():
    b = Builder()
    b.add(1, "fault", action="dlq_replay", phase="skip",
          why="the adapter declares no [broker] dead_letter_queue or no [admin] dlq_replay_path")
    v = check(b)
    assert v.status == "unknown" and "dlq_replay_path" in v.summary
    v = check(Builder())
    assert (v.status, v.exercised) == ("valid", False)


def test_a_job_finished_before_its_replay_leaves_the_replay_unproven():
    # A safety net republished the lost message first: the replay revived nothing, whatever it answered.
    v = check(builder(state_before="ready"))
    assert (v.status, v.exercised) == ("unknown", False)
    assert "already ready" in v.summary
