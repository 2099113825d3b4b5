"""dead_letter (BE-JOB-003, row BE-JOB-003.3) over hand-made histories: injected unprocessable messages that end in
the declared dead-letter queue after one delivery are valid; a requeue loop, a silent drop, a consumer crash are
invalid; an undeclared dead-letter queue is judged by the seed's exception and says so; what cannot be observed is
unknown. Also: message_hygiene does not blame the implementation for the harness's own injected messages."""

from __future__ import annotations

from harness import inject
from harness.checkers import dead_letter, message_hygiene
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness.seeding import stream
from harness_histories import Builder, happy, job_message

SCENARIO = {"name": "unparseable-message-dead-lettered", "checks": ["dead_letter"]}
WORK, DLQ = "jobs.work", "jobs.dead"


def injected_run(deliveries=1, dead=True, dlq=DLQ, traced=True, crash_at=None, max_attempts=5, routed=True):
    """One good upload; the three kinds injected at 3 s, each delivered ``deliveries`` times (0.1 s apart) and found
    in the dead-letter queue when ``dead``."""
    b = happy(builder=Builder(scenario=SCENARIO, max_attempts=max_attempts))
    b.run["adapter"]["broker"] = {"work_queue": WORK, **({"dead_letter_queue": dlq} if dlq else {})}
    rng = stream(42, "inject-0")
    template = job_message()
    dead_letters = []
    for n, kind in enumerate(inject.KINDS):
        marker = f"harness-dl-{n:012x}"
        raw, body = inject.build(kind, marker, template, rng)
        b.add(3.0 + n * 0.01, "fault", action="inject", phase="publish", fault=0, kind=kind, marker=marker,
              message_id=marker, sha256=inject.digest(raw), raw=raw, body=body, job_id=(body or {}).get("job_id"),
              queue=WORK, routed=routed, deliveries_traced=traced)
        b.add(3.05 + n * 0.01, "message", exchange="", routing_key=WORK, source="firehose",
              properties={"message_id": marker}, body=body, body_raw=None if body is not None else raw)
        if traced:
            for d in range(deliveries):
                b.add(3.1 + d * 0.1, "delivery", queue=WORK, redelivered=int(d > 0), message_id=marker,
                      sha256=inject.digest(raw), job_id=(body or {}).get("job_id"))
        if dead:
            dead_letters.append({"routing_key": "x", "payload": raw, "payload_encoding": "string",
                                 "sha256": inject.digest(raw), "message_id": marker})
    if dlq:
        b.final["dead_letters"] = dead_letters
    if crash_at is not None:
        b.add(crash_at, "role", action="exit", role="worker", returncode=1, expected=False, log_tail="Traceback")
    return b


def check(b):
    return dead_letter.check(b.history(), b.final, b.run)


def test_valid_when_each_injected_message_is_dead_lettered_after_one_delivery():
    verdict = check(injected_run())
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "isolated in 'jobs.dead'" in verdict.summary and "at most 1 times" in verdict.summary
    isolated = [e for e in verdict.evidence if e.get("marker")]
    assert len(isolated) == 3 and all(e["sha256"] and e["deliveries"] == 1 and e["lines"] for e in isolated)
    assert any("replay_audit" in e["message"] for e in verdict.evidence)  # the row's other half is named


def test_invalid_requeue_loop():
    verdict = check(injected_run(deliveries=21))
    assert verdict.status == INVALID
    assert "delivered 21 times (bound 6" in verdict.evidence[0]["message"]


def test_bounded_redeliveries_are_allowed():
    assert check(injected_run(deliveries=6)).status == VALID


def test_invalid_when_dropped_while_a_dead_letter_queue_is_declared():
    verdict = check(injected_run(dead=False))
    assert verdict.status == INVALID
    assert "never reached the declared dead-letter queue" in verdict.evidence[0]["message"]


def test_invalid_when_a_consumer_crashes_after_the_injection():
    verdict = check(injected_run(crash_at=4.0))
    assert verdict.status == INVALID
    assert any("consumer worker exited" in e["message"] for e in verdict.evidence)


def test_a_crash_before_the_injection_is_not_this_checkers():
    assert check(injected_run(crash_at=1.0)).status == VALID


def test_no_dead_letter_queue_declared_is_judged_by_the_exception_and_says_so():
    verdict = check(injected_run(dlq=None, dead=False))
    assert verdict.status == VALID and verdict.exercised
    assert "isolation not declared" in verdict.summary


def test_no_dead_letter_queue_and_a_loop_is_invalid():
    assert check(injected_run(dlq=None, dead=False, deliveries=30)).status == INVALID


def test_no_dead_letter_queue_and_a_full_work_queue_at_the_end_is_invalid():
    b = injected_run(dlq=None, dead=False)
    b.final["queues"]["work"] = {"ready": 3}
    assert check(b).status == INVALID


def test_unknown_when_the_dead_letter_queue_was_not_read():
    b = injected_run()
    b.final.pop("dead_letters")
    verdict = check(b)
    assert verdict.status == UNKNOWN and "not read" in verdict.summary


def test_unknown_without_max_attempts():
    b = injected_run()
    del b.run["adapter"]["timings"]["max_attempts"]
    assert check(b).status == UNKNOWN


def test_unknown_when_nothing_was_routed():
    assert check(injected_run(routed=False)).status == UNKNOWN


def test_untraced_deliveries_are_said():
    verdict = check(injected_run(traced=False))
    assert verdict.status == VALID and "deliveries not counted" in verdict.summary


def test_not_exercised_without_injection():
    verdict = dead_letter.check(happy().history(), happy().final, happy().run)
    assert verdict.status == VALID and not verdict.exercised


def test_a_dead_letter_in_an_envelope_is_found_by_its_marker():
    b = injected_run()
    for d in b.final["dead_letters"]:
        d.update(sha256="00" * 32, message_id=None, payload='{"error": "bad", "original": ' + repr(d["payload"]) + "}")
    assert check(b).status == VALID


def test_message_hygiene_ignores_the_harness_own_injected_messages():
    verdict = message_hygiene.check(injected_run().history(), {}, injected_run().run)
    assert verdict.status == VALID, verdict.evidence
    assert verdict.summary.startswith("1 tapped")
