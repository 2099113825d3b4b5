"""The fault context (chaos/context.py): what the runner hands every fault kind. A failpoint's crash is recorded with
the consumers still running, the unfinished jobs are read while the crashed role is down, and only then is it
started again; holds and releases keep their bookkeeping on the context."""

from __future__ import annotations

import threading
import time

from chaos.context import BrokerHandle, FaultContext


class History:
    def __init__(self):
        self.lines = []

    def append(self, type_, **fields):
        self.lines.append({"type": type_, "seq": len(self.lines) + 1, **fields})


class Instance:
    def __init__(self, name, role, alive=True):
        self.name, self.role, self._alive, self.armed = name, role, alive, {}

    def alive(self):
        return self._alive


class Supervisor:
    def __init__(self, *instances):
        self.instances = {i.name: i for i in instances}
        self.calls = []

    def ensure_running(self, name, env):
        self.calls.append(("start", name, time.monotonic()))

    def stop(self, name, *args):
        self.calls.append(("stop", name, time.monotonic()))


class Adapter:
    def expand_roles(self, roles, windows=()):
        return ["worker"] if "@consumers" in roles else [r for r in roles if r != "@recovers_work"] + (
            ["sweeper"] if "@recovers_work" in roles else [])

    def window_role(self, window):
        return "worker"


class Observer:
    def __init__(self, states):
        self.ids, self.states, self.read = list(states), dict(states), []

    def poll_one(self, attachment_id):
        self.read.append((attachment_id, time.monotonic()))
        self.states[attachment_id] = "ready"  # committed before the crash


def context(*instances):
    supervisor = Supervisor(*instances)
    return FaultContext(adapter=Adapter(), seed=1, windows=[], schedule=[], supervisor=supervisor, history=History(),
                        stack=None, broker=BrokerHandle(None, None, "amqp://x", "", "q"), base_url="http://x",
                        stopping=threading.Event(), log=lambda text: None)


def test_a_failpoint_crash_is_looked_at_while_down_and_restarted_after():
    worker, peer = Instance("worker", "worker"), Instance("worker#2", "worker")
    ctx = context(worker, peer, Instance("sweeper", "sweeper"))
    ctx.observer = Observer({"a1": "processing", "a2": "ready"})
    ctx.restart_after["worker"] = 0.3
    worker.armed = {"after_commit_before_ack": "1*crash"}
    began = time.monotonic()
    ctx.on_exit(worker, {"expected": False, "returncode": 137})
    hit = [line for line in ctx.history.lines if line["type"] == "fault"][0]
    assert hit["phase"] == "hit" and hit["consumers_running"] == ["worker#2"]
    assert ctx.hits["worker"].is_set() and ctx.window_hits[0]["windows"] == ["after_commit_before_ack"]
    deadline = time.monotonic() + 5
    while not ctx.supervisor.calls and time.monotonic() < deadline:
        time.sleep(0.02)
    (what, name, started), = ctx.supervisor.calls
    assert (what, name) == ("start", "worker") and started - began >= 0.29
    assert [a for a, _ in ctx.observer.read] == ["a1"] and all(t < started for _, t in ctx.observer.read)
    look = [line for line in ctx.history.lines if line.get("source") == "look_while_down"][0]
    assert look["ready"] == ["a1"] and look["read"] == 1


class SlowObserver(Observer):
    def poll_one(self, attachment_id):
        time.sleep(0.25)  # a loaded machine's read
        super().poll_one(attachment_id)


def test_the_heal_waits_for_a_look_under_way_before_it_restarts_the_crashed_role():
    """The heal restarts an armed role at once; a look still reading then would see what the restarted role did, not
    what the crash left (a loaded TypeScript grade lost window-commit-ack-failpoint's evidence so)."""
    worker = Instance("worker", "worker", alive=False)
    ctx = context(worker, Instance("sweeper", "sweeper"))
    ctx.observer = SlowObserver({"a1": "processing", "a2": "processing"})
    ctx.restart_after["worker"] = 2.0  # the look may take up to 1.6 s
    worker.armed = {"after_commit_before_ack": "1*crash"}
    ctx.on_exit(worker, {"expected": False, "returncode": 137})
    time.sleep(0.05)
    ctx.finish_looks()
    looked = time.monotonic()  # the heal would restart the role now
    assert [a for a, _ in ctx.observer.read] == ["a1", "a2"] and all(t <= looked for _, t in ctx.observer.read)
    assert any(line.get("source") == "look_while_down" for line in ctx.history.lines)
    ctx.cancel_restarts()


def test_finish_looks_is_bounded():
    ctx = context(Instance("worker", "worker"))
    ctx.looks.append(threading.Event())  # a look that never ends
    began = time.monotonic()
    ctx.finish_looks(timeout=0.2)
    assert time.monotonic() - began < 1.0


def test_hold_and_release_keep_their_bookkeeping_on_the_context():
    ctx = context(Instance("worker", "worker"), Instance("sweeper", "sweeper"))
    released = []
    ctx.after_release = released.extend
    step = {"index": 3, "action": "hold", "hold": ["@recovers_work"]}
    ctx.hold(step)
    assert ctx.held == {"sweeper"} and ctx.expected_running() == {"worker"}
    ctx.release(step)
    assert ctx.held == set() and released == ["sweeper"]
    assert [c[:2] for c in ctx.supervisor.calls] == [("stop", "sweeper"), ("start", "sweeper")]


def test_object_written_waits_for_an_object_beyond_the_originals_of_a_job_at_work():
    """The object_written trigger (worker-paused-past-lease): a job seen processing, and the object watch has seen more
    keys than uploads were accepted — the originals alone, or an original seen before its job is processing, do not
    set it off."""

    class Watch:
        seen: dict = {}

    ctx = context(Instance("worker", "worker"))
    ctx.observer = Observer({"a1": "queued"})
    assert not ctx.condition("object_written")  # no object watch: never
    ctx.objects = Watch()
    ctx.objects.seen = {"staging/a1": ()}
    assert not ctx.condition("object_written")
    ctx.objects.seen = {"staging/a1": (), "staging/orphan": ()}
    assert not ctx.condition("object_written")  # two objects, but nothing processing yet
    ctx.observer.states["a1"] = "processing"
    ctx.objects.seen = {"staging/a1": ()}
    assert not ctx.condition("object_written")  # processing, only its original written
    ctx.objects.seen = {"staging/a1": (), "variants/a1/v1/t1/thumbnail.webp": ()}
    assert ctx.condition("object_written")
