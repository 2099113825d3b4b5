"""permanent_failure (BE-JOB-003) and the s3_deny fault kind over hand-made histories: a job that met a store refusing
every write (403, proven by the harness's own PUT) must end failed with an error_code within max_attempts; one
retried or held forever (the s3_errors_as_outage variant's shape) is invalid."""

from __future__ import annotations

from chaos.kinds import s3_deny
from harness.checkers import permanent_failure
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import ATT, Builder

OTHER = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def denied(probe_status=403, end=None, asked=True, max_attempts=2):
    b = Builder(max_attempts=max_attempts,
                scenario={"name": "s3-write-denied", "checks": ["permanent_failure"] if asked else []})
    b.upload(0.1)
    b.add(1.0, "fault", action="s3_deny", phase="start", fault=1, service="s3", bucket="run-bucket", denied="write",
          probe_status=probe_status, probe_code="AccessDenied" if probe_status == 403 else "")
    if end is not None:
        b.add(end, "fault", action="s3_deny", phase="end", fault=1, service="s3", bucket="run-bucket", restored=True)
    return b


def check(b):
    return permanent_failure.check(b.history(), b.final, b.run)


def test_a_job_failed_with_an_error_code_within_the_budget_is_valid():
    b = denied()
    body = b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                               (3.2, "processing", "queued", 2, "worker"), (3.6, "queued", "processing", 2, "worker"),
                               (3.8, "processing", "failed", 2, "worker")], error_code="attempts_exhausted")
    assert body["state"] == "failed"
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert "failed (attempts_exhausted) at attempt 2 of 2, 2.8s after the refusal" in verdict.evidence[0]["message"]


def test_a_job_still_processing_at_the_final_read_is_invalid():
    b = denied()
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker")])
    verdict = check(b)
    assert verdict.status == INVALID, verdict.summary
    assert verdict.evidence[0]["attachment_id"] == ATT and "still processing" in verdict.evidence[0]["message"]


def test_failed_without_an_error_code_or_past_the_budget_is_invalid():
    b = denied()
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                        (3.8, "processing", "failed", 1, "worker")])
    assert check(b).status == INVALID
    b = denied(max_attempts=1)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                        (3.2, "processing", "queued", 2, "worker"), (3.6, "queued", "processing", 2, "worker"),
                        (3.8, "processing", "failed", 2, "worker")], error_code="attempts_exhausted")
    verdict = check(b)
    assert verdict.status == INVALID and "past max_attempts 1" in verdict.summary, verdict.summary


def test_a_job_done_before_the_refusal_is_not_judged():
    b = denied()
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (0.4, "queued", "processing", 1, "worker"),
                        (0.8, "processing", "ready", 1, "worker")])
    verdict = check(b)
    assert verdict.status == UNKNOWN and "no job was left" in verdict.summary, verdict.summary


def test_an_unproven_refusal_or_one_lifted_early_cannot_tell():
    b = denied(probe_status=200)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker")])
    verdict = check(b)
    assert verdict.status == UNKNOWN and "not proven" in verdict.summary, verdict.summary
    b = denied(end=2.0)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                        (4.0, "processing", "ready", 1, "worker")])
    assert check(b).status == UNKNOWN


def test_no_refusal_is_not_exercised():
    b = Builder()
    b.upload(0.1)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker")])
    verdict = check(b)
    assert verdict.status == VALID and not verdict.exercised


def test_the_kind_counts_only_a_refusal_its_own_put_proved():
    step = {"action": "s3_deny", "index": 1}
    b = denied()
    ok, why = s3_deny.happened(step, b.history(), b.final)
    assert ok and "403 AccessDenied" in why
    ok, why = s3_deny.happened(step, denied(probe_status=200).history(), {})
    assert not ok and "answered 200" in why
    assert not s3_deny.happened(step, Builder().history(), {})[0]


def test_the_refusing_policy_keeps_reads_lists_and_deletes_and_drops_every_write():
    from harness.stack.seaweedfs import tenant_policy

    closed = tenant_policy("b", writes=False)["Statement"][0]
    assert set(closed["Action"]) == {"s3:GetObject", "s3:ListBucket", "s3:DeleteObject"}
    assert closed["Resource"] == ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]
    assert tenant_policy("b", writes=True)["Statement"][0]["Action"] == ["s3:*"]


def test_lost_accepted_work_leaves_a_job_failed_under_a_permanent_refusal_to_this_check():
    from harness.checkers import lost_accepted_work

    b = denied()
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                        (3.2, "processing", "failed", 1, "worker")], error_code="storage_denied")
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == VALID
    b = denied(end=2.0)  # lifted before the job failed: a good upload failed, lost work as before
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (3.0, "queued", "processing", 1, "worker"),
                        (3.2, "processing", "failed", 1, "worker")], error_code="storage_denied")
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == INVALID


def test_the_kind_refuses_writes_of_the_runs_own_key_once_the_workload_ended_and_records_its_probe(monkeypatch):
    import threading
    from types import SimpleNamespace

    from harness.history import History

    calls = []
    monkeypatch.setattr(s3_deny, "set_writes", lambda store, bucket, writes: calls.append((bucket, writes)))
    monkeypatch.setattr(s3_deny, "probe", lambda store, bucket, key, secret: (403, "AccessDenied"))

    class Recorder:
        def __init__(self):
            self.lines = []

        def append(self, type_, **fields):
            self.lines.append({"type": type_, "seq": len(self.lines) + 1, "wall": 0.0, **fields})

    done = threading.Event()
    done.set()
    instance = SimpleNamespace(env={"S3_BUCKET": "run-b", "S3_ACCESS_KEY": "k", "S3_SECRET_KEY": "s"})
    ctx = SimpleNamespace(wait_trigger=lambda step, delay=0.0: True, workload_done=done, stopping=threading.Event(),
                          stack=SimpleNamespace(s3=SimpleNamespace(endpoint_url=lambda: "http://127.0.0.1:1")),
                          supervisor=SimpleNamespace(instances={"worker": instance}), history=Recorder(),
                          log=lambda message: None)
    step = {"action": "s3_deny", "index": 3}
    s3_deny.run(ctx, step)  # no duration: held to the end of the run (guarded), never given back here
    ctx.stopping.set()  # the run's end stops the guard
    assert calls == [("run-b", False)]
    start = ctx.history.lines[-1]
    assert (start["action"], start["phase"], start["bucket"], start["probe_status"]) == ("s3_deny", "start", "run-b", 403)
    assert s3_deny.happened(step, History(tuple(ctx.history.lines)), {})[0]
    step = {"action": "s3_deny", "index": 4, "duration": 0}
    ctx.stopping.clear()
    s3_deny.run(ctx, step)  # with a duration: the full policy is given back, and the end recorded
    assert calls[-1] == ("run-b", True) and ctx.history.lines[-1]["phase"] == "end"


def test_a_job_that_met_the_refusal_before_the_probe_proved_it_met_it_all_the_same():
    # A fast worker fails its job between the policy change (applied_wall) and the line written once the harness's
    # own PUT proved the refusal — a second later on a loaded machine (the TypeScript example's grade in CI, where
    # 4 of 4 such jobs were taken for good work lost).
    from harness_histories import T0

    b = denied()
    [start] = [e for e in b.events if e["type"] == "fault"]
    start["applied_wall"] = T0 + 0.5
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (0.6, "queued", "processing", 1, "worker"),
                        (0.8, "processing", "failed", 1, "worker")], error_code="storage_refused")
    verdict = check(b)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert permanent_failure.met_refusal(b.history(), b.final, ATT)
    del start["applied_wall"]  # the line alone: the job's failure predates it
    assert not permanent_failure.met_refusal(b.history(), b.final, ATT)


def test_the_refusal_counts_only_after_three_403s_in_a_row_and_is_set_again_after_a_write_that_went_through(
        monkeypatch):
    # A write of the store's identity configuration racing the harness's own gave a denied key its writes back
    # after one probe had answered 403 (the reference's L5 grade in CI): one 403 proves little.
    import threading
    from types import SimpleNamespace

    answers = iter([(403, "AccessDenied"), (200, ""), (403, "AccessDenied"), (403, "AccessDenied"),
                    (403, "AccessDenied")])
    calls = []
    monkeypatch.setattr(s3_deny, "PROBE_SPACING_SECONDS", 0)
    monkeypatch.setattr(s3_deny, "probe", lambda *args: next(answers))
    monkeypatch.setattr(s3_deny, "set_writes", lambda store, bucket, writes: calls.append(writes))
    ctx = SimpleNamespace(stopping=threading.Event())
    status, code, seen, reapplied = s3_deny.prove_refusal(ctx, None, "b", "k", "s", deadline=float("inf"))
    assert (status, code, seen, calls) == (403, "AccessDenied", [403, 200, 403, 403, 403], [False])
    assert reapplied is not None
    # Never three in a row before the deadline: not proven, and the answer that broke the streak is what is told.
    answers = iter([(200, ""), (403, "AccessDenied")] * 50)
    status, code, seen, _ = s3_deny.prove_refusal(ctx, None, "b", "k", "s", deadline=0)
    assert (status, seen) == (200, [200])
    answers = iter([(403, "AccessDenied")] * 50)
    status, code, seen, _ = s3_deny.prove_refusal(ctx, None, "b", "k", "s", deadline=0)
    assert (status, code, seen) == (None, "no 3 refusals in a row", [403])


def test_iam_writes_of_one_store_take_turns(tmp_path):
    # The embedded IAM API saves its whole configuration on each write: two at once lose one.
    import threading
    import time

    from harness.stack.seaweedfs import SeaweedFS

    store = SeaweedFS.__new__(SeaweedFS)
    store.root = tmp_path
    store.s3_port = 1
    order = []

    def write(name):
        with store.iam_lock():
            order.append(f"{name} in")
            time.sleep(0.2)
            order.append(f"{name} out")

    threads = [threading.Thread(target=write, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert order == ["a in", "a out", "b in", "b out"]


def test_a_refusal_that_lapses_is_set_again_and_the_lapse_recorded(monkeypatch):
    # The store's identity configuration lost the refusal 3 s after it was proven (the reference's L5 grade in a CI
    # rehearsal): the guard finds the PUT that went through, sets the refusal again, and says when.
    import threading
    from types import SimpleNamespace

    answers = iter([(403, "AccessDenied"), (200, ""), (403, "AccessDenied")])
    calls, lines = [], []
    stopping = threading.Event()

    def probe(*args):
        answer = next(answers, None)
        if answer is None:
            stopping.set()
            return 403, "AccessDenied"
        return answer

    monkeypatch.setattr(s3_deny, "GUARD_SPACING_SECONDS", 0)
    monkeypatch.setattr(s3_deny, "probe", probe)
    monkeypatch.setattr(s3_deny, "set_writes", lambda store, bucket, writes: calls.append(writes))
    ctx = SimpleNamespace(stopping=stopping, log=lambda message: None,
                          history=SimpleNamespace(append=lambda type_, **fields: lines.append({"type": type_, **fields})))
    s3_deny.guard(ctx, {"index": 2}, None, "b", "k", "s", until=None)
    assert calls == [False]
    [lapse] = lines
    assert (lapse["action"], lapse["phase"], lapse["fault"]) == ("s3_deny", "lapsed", 2)
    assert lapse["refused_until_wall"] <= lapse["lapsed_wall"] <= lapse["reapplied_wall"]


def test_a_job_ready_after_a_lapse_is_told_by_the_lapse_not_judged():
    from harness_histories import T0

    b = denied()
    b.add(2.0, "fault", action="s3_deny", phase="lapsed", fault=1, service="s3", bucket="run-bucket",
          refused_until_wall=T0 + 2.0, lapsed_wall=T0 + 2.3, reapplied_wall=T0 + 2.4)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (2.1, "queued", "processing", 1, "worker"),
                        (2.5, "processing", "ready", 1, "worker")])
    verdict = check(b)
    assert verdict.status == UNKNOWN and "while the refusal lapsed" in verdict.summary, verdict.summary
    b = denied()  # no lapse recorded: the job's effects predate the refusal
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (0.9, "queued", "processing", 1, "worker"),
                        (2.5, "processing", "ready", 1, "worker")])
    assert "written before the refusal" in check(b).summary
