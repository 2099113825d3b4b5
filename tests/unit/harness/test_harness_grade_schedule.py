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
