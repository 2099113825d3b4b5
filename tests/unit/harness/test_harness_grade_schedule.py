"""How a grade schedules scenarios side by side: who runs alone, and how an interrupted grade stops the others."""

from __future__ import annotations

import threading
import time

import pytest

from harness import scenarios as catalogue_mod
from harness.grade import _run_side_by_side, runs_alone


class _Scenario:
    def __init__(self, name: str, raw: dict) -> None:
        self.name, self.raw = name, raw


def test_scenarios_that_restart_a_service_or_say_so_run_alone():
    by_name = {s.name: s for s in catalogue_mod.catalogue()}
    assert runs_alone(by_name["broker-restart"]) == "restarts rabbitmq"
    assert runs_alone(by_name["database-restart"]) == "restarts postgres"
    # Network faults go through the run's own proxies: they can share the stack.
    assert runs_alone(by_name["database-outage"]) is None
    assert runs_alone(by_name["window-s3-commit-failpoint"]) is None
    assert runs_alone(_Scenario("x", {"exclusive": True, "faults": []})) == "declared exclusive"


class _Run:
    def __init__(self) -> None:
        self.stopping = threading.Event()

    def abort(self) -> None:
        self.stopping.set()


def test_one_failing_scenario_aborts_the_others_and_waits_for_them():
    active: dict[str, _Run] = {}
    lock = threading.Lock()
    finished: list[str] = []

    def run_one(scenario) -> None:
        if scenario.name == "boom":
            time.sleep(0.2)  # the others are running by now
            raise RuntimeError("scenario crashed")
        run = _Run()
        with lock:
            active[scenario.name] = run
        try:
            assert run.stopping.wait(10), "never aborted"
        finally:
            with lock:
                active.pop(scenario.name)
            finished.append(scenario.name)

    names = ["slow-1", "boom", "slow-2", "never-started"]
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="scenario crashed"):
        _run_side_by_side([_Scenario(n, {}) for n in names], run_one, 2, active, lock)
    assert time.monotonic() - began < 5
    # The one running beside the failure was aborted and waited for; what never started, never starts.
    assert "slow-1" in finished and "never-started" not in finished
    assert active == {}


class _FakeStack:
    started: list["_FakeStack"] = []
    refuse_second = False

    def __init__(self, run_dir) -> None:
        self.run_dir, self.stopped = run_dir, False

    @classmethod
    def start(cls, run_dir, keep_data=False, **_):
        if cls.started and cls.refuse_second:
            raise RuntimeError("no free port")
        stack = cls(run_dir)
        cls.started.append(stack)
        return stack

    def stop(self) -> None:
        self.stopped = True


def _fake_grade(monkeypatch, tmp_path, refuse_second: bool):
    """grade() with its services and runs replaced: each run records its stack and when it ran."""
    import harness.grade as grade_mod
    import harness.stack as stack_mod

    _FakeStack.started, _FakeStack.refuse_second = [], refuse_second
    ran: dict[str, tuple] = {}
    restart = {"faults": [{"action": "restart_service", "service": "postgres"}]}
    chosen = [_Scenario("restart-a", restart), _Scenario("restart-b", restart),
              _Scenario("shared-1", {}), _Scenario("shared-2", {}), _Scenario("shared-3", {})]
    for scenario in chosen:
        scenario.level, scenario.raw["requirements"] = 4, ["BE-JOB-001"]

    class Run:
        def __init__(self, scenario, adapter, stack, seed, level, run_dir=None, progress=None):
            self.scenario, self.stack = scenario, stack

        def execute(self):
            began = time.monotonic()
            time.sleep(0.3)
            ran[self.scenario.name] = (self.stack, began, time.monotonic())
            return {"verdict": "valid", "timings": {}, "timings_detail": {}}

        def abort(self):
            pass

    monkeypatch.setattr(stack_mod, "Stack", _FakeStack)
    import harness.grade_schedule as schedule_mod

    monkeypatch.setattr(schedule_mod, "ScenarioRun", Run)  # the scheduler runs them; grade() plans and judges
    monkeypatch.setattr(grade_mod, "plan", lambda adapter, level, only: (chosen, [], [], {}))
    monkeypatch.setattr(schedule_mod, "scenario_entry", lambda result, run_dir, base, seconds: {"verdict": "valid"})
    monkeypatch.setattr(grade_mod, "aggregate", lambda *a, **k: {"verdict": "valid"})
    monkeypatch.setattr(grade_mod, "write_grade_reports", lambda *a: None)
    monkeypatch.setattr(grade_mod.tenants_ahead, "enabled", lambda: False)
    adapter = type("A", (), {"name": "fake", "timings": {}, "summary": lambda self: {}})()
    results, _ = grade_mod.grade(adapter, 4, 1, reports_dir=tmp_path, progress=lambda text: None, parallel=2)
    return ran, results


def test_scenarios_that_restart_a_service_run_on_a_second_stack_beside_the_others(monkeypatch, tmp_path):
    ran, results = _fake_grade(monkeypatch, tmp_path, refuse_second=False)
    main, second = _FakeStack.started
    assert {n for n, (stack, *_) in ran.items() if stack is second} == {"restart-a", "restart-b"}
    assert {n for n, (stack, *_) in ran.items() if stack is main} == {"shared-1", "shared-2", "shared-3"}
    a, b = ran["restart-a"], ran["restart-b"]
    assert a[2] <= b[1] or b[2] <= a[1], "the second stack's scenarios restart its services: one at a time"
    first_shared = min(ran[n][1] for n in ("shared-1", "shared-2", "shared-3"))
    assert first_shared < max(a[2], b[2]), "the shared ones did not wait for them"
    assert second.stopped and main.stopped
    assert results["time_went"]["beside"]["scenarios"] == ["restart-a", "restart-b"]


def test_without_a_second_stack_they_run_alone_on_the_first_after_the_others(monkeypatch, tmp_path):
    ran, _ = _fake_grade(monkeypatch, tmp_path, refuse_second=True)
    (main,) = _FakeStack.started
    assert all(stack is main for stack, *_ in ran.values()) and len(ran) == 5
    last_shared = max(ran[n][2] for n in ("shared-1", "shared-2", "shared-3"))
    assert min(ran["restart-a"][1], ran["restart-b"][1]) >= last_shared
