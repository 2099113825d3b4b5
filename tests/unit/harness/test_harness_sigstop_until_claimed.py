"""sigstop with ``until_claimed``: the owner stays paused past its ``duration`` until a job it held is read
``processing`` at a higher attempt (claimed anew by another consumer) or terminal, at most ``until_claimed`` more
seconds; toxic with ``until = "idle"`` ends once every accepted job is terminal, at most its duration. Fake fault
context (no processes, no services): the API reads are scripted, the signals recorded with their times.

Why (worker-paused-past-lease, production adapter, seed 20261202, load ~16): the second instance took 19 s to start
consuming and the broker handed the recovered job's message back to the sleeping consumer (prefetch room); the fixed
9 s pause woke the owner before anyone else claimed the job, so owner_overlap was never exercised."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from chaos.kinds import sigstop, toxic

ATT = "att-1"


class ScriptedObserver:
    """Each poll_one of ``ATT`` moves to the next (state, attempt) of the script (the last one repeats)."""

    def __init__(self, script: list[tuple[str, int]]) -> None:
        self.script = list(script)
        self.ids = [ATT]
        self.states: dict[str, str] = {ATT: "processing"}
        self.attempts: dict[str, object] = {ATT: 1}
        self.polls = 0

    def poll_one(self, attachment_id: str) -> None:
        state, attempt = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        self.states[attachment_id] = state
        self.attempts[attachment_id] = attempt


class Recorder:
    def __init__(self) -> None:
        self.signals: list[tuple[str, str, float]] = []

    def sigstop(self, name: str) -> None:
        self.signals.append(("stop", name, time.monotonic()))

    def sigcont(self, name: str) -> None:
        self.signals.append(("cont", name, time.monotonic()))


def context(observer: ScriptedObserver | None) -> SimpleNamespace:
    notes: list[tuple[str, dict]] = []
    ctx = SimpleNamespace(
        observer=observer, processes=Recorder(), stopping=threading.Event(), notes=notes, started=[],
        adapter=SimpleNamespace(expand_roles=lambda roles, windows=None: []),
        supervisor=SimpleNamespace(instances={"worker": SimpleNamespace(role="worker")}),
        history=SimpleNamespace(append=lambda type_, **fields: notes.append((type_, fields))),
        log=lambda message: None, role=lambda step: "worker", target=lambda step: "worker",
        hold=lambda step: None, release=lambda step: None, wait_trigger=lambda step, delay=0.0: True)
    ctx.start_extra_instance = lambda role: ctx.started.append(role) or f"{role}#2"
    return ctx


def pause_seconds(ctx) -> float:
    (stop, _, t0), (cont, _, t1) = ctx.processes.signals
    assert (stop, cont) == ("stop", "cont")
    return t1 - t0


STEP = {"action": "sigstop", "role": "worker", "index": 0, "duration": 0.2, "start_instance_after": 0.05}


def test_the_pause_lasts_until_the_job_is_read_processing_at_a_higher_attempt():
    # Read at the pause: processing, attempt 1. While asleep: its own attempt still shows for a while (the sweeper has
    # not recovered it), then queued at attempt 2 (recovered, its message maybe back in the sleeper's buffer), then
    # processing at attempt 2: someone else claimed it.
    script = [("processing", 1)] * 8 + [("queued", 2)] * 5 + [("processing", 2)]
    ctx = context(ScriptedObserver(script))
    sigstop.run(ctx, {**STEP, "until_claimed": 20.0})
    paused = pause_seconds(ctx)
    assert paused > STEP["duration"] + 0.5, paused   # polls every 0.1 s: 12 reads past the first one
    assert paused < 15.0, paused                     # ended by the claim, far before the ceiling
    assert ctx.started == ["worker"]
    note = [f for t, f in ctx.notes if t == "note"][-1]
    assert "processing at attempt 2" in note["message"], note
    assert note["held_attempt"] == 1 and note["attempt"] == 2 and note["attachment_id"] == ATT


def test_the_sleepers_own_attempt_never_ends_the_pause_the_ceiling_does():
    ctx = context(ScriptedObserver([("processing", 1)]))
    sigstop.run(ctx, {**STEP, "until_claimed": 0.6})
    paused = pause_seconds(ctx)
    assert 0.75 <= paused < 2.0, paused
    note = [f for t, f in ctx.notes if t == "note"][-1]
    assert "ceiling" in note["message"] and note["held"] == {ATT: 1}, note


def test_a_job_that_ended_ends_the_pause():
    ctx = context(ScriptedObserver([("processing", 1), ("processing", 1), ("ready", 2)]))
    sigstop.run(ctx, {**STEP, "until_claimed": 5.0})
    assert pause_seconds(ctx) < 1.5
    assert "seen ready" in [f for t, f in ctx.notes if t == "note"][-1]["message"]


def test_without_until_claimed_the_pause_is_its_duration_and_nothing_is_read():
    observer = ScriptedObserver([("processing", 1), ("processing", 2)])
    ctx = context(observer)
    sigstop.run(ctx, dict(STEP))
    assert 0.18 <= pause_seconds(ctx) < 0.6
    assert observer.polls == 0 and not [f for t, f in ctx.notes if t == "note"]


def test_nothing_processing_at_the_pause_is_not_waited_for():
    ctx = context(ScriptedObserver([("queued", 1)]))
    ctx.observer.states[ATT] = "queued"
    sigstop.run(ctx, {**STEP, "until_claimed": 5.0})
    assert pause_seconds(ctx) < 0.6
    assert "no job was seen processing" in [f for t, f in ctx.notes if t == "note"][-1]["message"]


class Network:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def apply(self, service, kind, params, role=None):
        self.calls.append(("apply", time.monotonic()))
        return "toxic-1"

    def remove(self, service, kind, toxic_id, role=None):
        self.calls.append(("remove", time.monotonic()))


def toxic_context(idle_after: float) -> SimpleNamespace:
    ctx = context(None)
    ctx.network = Network()
    ctx.windows = []
    began = time.monotonic()
    ctx.condition = lambda when: when == "idle" and time.monotonic() - began >= idle_after
    return ctx


TOXIC = {"action": "toxic", "service": "s3", "toxic": "latency", "params": {"ms": 1500}, "index": 1}


def test_a_toxic_until_idle_ends_once_every_job_is_terminal():
    ctx = toxic_context(idle_after=0.3)
    toxic.run(ctx, {**TOXIC, "until": "idle", "duration": 5.0})
    (a, t0), (r, t1) = ctx.network.calls
    assert (a, r) == ("apply", "remove") and 0.25 <= t1 - t0 < 1.5, t1 - t0
    assert "every accepted job terminal" in [f for t, f in ctx.notes if t == "note"][-1]["message"]


def test_a_toxic_until_idle_ends_at_its_duration_when_jobs_never_end():
    ctx = toxic_context(idle_after=60)
    toxic.run(ctx, {**TOXIC, "until": "idle", "duration": 0.4})
    (_, t0), (_, t1) = ctx.network.calls
    assert 0.35 <= t1 - t0 < 1.5, t1 - t0
    assert "ceiling" in [f for t, f in ctx.notes if t == "note"][-1]["message"]


def test_a_toxic_without_until_lasts_its_duration_whatever_the_jobs():
    ctx = toxic_context(idle_after=0.0)
    toxic.run(ctx, {**TOXIC, "duration": 0.4})
    (_, t0), (_, t1) = ctx.network.calls
    assert t1 - t0 >= 0.38
