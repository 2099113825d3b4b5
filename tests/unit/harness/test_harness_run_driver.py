"""The run driver every command shares (harness/run_driver.py) and the one error type (harness/errors.py)."""

from __future__ import annotations

import json

import pytest

from harness import cli, errors, recheck, run_driver


def test_a_seed_given_is_kept_and_one_drawn_is_short_enough_to_type_back():
    assert run_driver.draw_seed(42) == 42 and run_driver.draw_seed("7") == 7
    drawn = {run_driver.draw_seed() for _ in range(20)}
    assert all(0 <= s < run_driver.SEED_RANGE for s in drawn) and len(drawn) > 1


class Adapter:
    roles = ["api", "worker", "relay"]

    @staticmethod
    def window_role(window):
        return {"after_commit_before_ack": "worker", "after_commit_before_publish": "relay"}[window]


def test_busy_roles_names_the_armed_and_the_struck():
    faults = [{"action": "failpoint", "window": "after_commit_before_ack"},
              {"action": "sigkill", "role": "api"}, {"action": "hold", "hold": ["relay"]},
              {"action": "toxic", "service": "postgres"}]
    assert run_driver.busy_roles(Adapter, faults) == ({"worker"}, {"api", "relay"})
    assert run_driver.busy_roles(Adapter, []) == (set(), set())


def test_a_stack_that_does_not_start_is_the_graders_infrastructure_retried_once(tmp_path, monkeypatch):
    from harness.stack import Stack

    starts = []

    def no_stack(*args, **kwargs):
        starts.append(kwargs)
        raise TimeoutError("rabbitmq not ready")

    monkeypatch.setattr(Stack, "start", no_stack)
    said = []
    with pytest.raises(errors.InfrastructureError) as raised:
        run_driver.start_stack(tmp_path / "stack", progress=said.append, retry=True)
    assert len(starts) == 2 and raised.value.exit_code == errors.EXIT_INFRASTRUCTURE
    assert "did not start" in str(raised.value) and "rabbitmq not ready" in str(raised.value)
    assert any("retrying once" in line for line in said)
    starts.clear()
    with pytest.raises(errors.InfrastructureError):
        run_driver.start_stack(tmp_path / "stack", progress=said.append)
    assert len(starts) == 1


def test_own_stack_stops_only_a_stack_it_started_and_times_it(tmp_path, monkeypatch):
    from harness.stack import Stack

    class Fake:
        stopped = 0

        def stop(self):
            Fake.stopped += 1

    monkeypatch.setattr(Stack, "start", lambda *a, **k: Fake())
    given = Fake()
    with run_driver.own_stack(given, tmp_path, progress=lambda t: None) as on:
        assert on is given
    assert Fake.stopped == 0
    timings: dict = {}
    with pytest.raises(RuntimeError):
        with run_driver.own_stack(None, tmp_path, progress=lambda t: None, timings=timings) as on:
            assert isinstance(on, Fake)
            raise RuntimeError("a scenario failed")
    assert Fake.stopped == 1 and set(timings) == {"stack_start", "stack_stop"}  # stopped whatever happened


def test_recheck_goes_by_what_the_folder_stored(tmp_path):
    assert recheck.stored_kind(tmp_path) == "run"
    (tmp_path / "results.json").write_text(json.dumps({"kind": "soak"}))
    assert recheck.stored_kind(tmp_path) == "soak"
    (tmp_path / "results.json").write_text(json.dumps({"kind": "grade"}))
    assert recheck.stored_kind(tmp_path) == "grade"
    (tmp_path / "results.json").write_text("{cut short")
    assert recheck.stored_kind(tmp_path) == "run"


def test_every_command_error_is_one_type_with_its_exit_code(capsys, monkeypatch):
    from harness import soak_command
    from harness.explore import ExploreError
    from harness.soak import SoakError

    for kind in (SoakError, ExploreError, errors.UsageError):
        assert issubclass(kind, errors.HarnessError) and issubclass(kind, ValueError)
        assert kind("x").exit_code == errors.EXIT_UNKNOWN
    assert errors.InfrastructureError("disk").exit_code == errors.EXIT_INFRASTRUCTURE

    def refused(args, progress):
        raise SoakError("soak refused: the adapter claims level 9")

    monkeypatch.setattr(soak_command, "run_command", refused)
    assert cli.main(["soak", "--sut", "reference"]) == 2  # printed in one line on stderr, with its exit code
    assert capsys.readouterr().err.strip() == "harness: soak refused: the adapter claims level 9"

    def no_stack(args, progress):
        raise errors.InfrastructureError("the stack did not start", TimeoutError("rabbitmq not ready"))

    monkeypatch.setattr(soak_command, "run_command", no_stack)
    assert cli.main(["soak", "--sut", "reference"]) == 3
    assert "infrastructure failure" in capsys.readouterr().err
