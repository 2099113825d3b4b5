"""Exit codes a CI can act on (harness/errors.py): 0 valid, 1 invalid or tampered, 2 unknown or not proven, 3 the
grader's own infrastructure failed — retried once by itself first."""

from __future__ import annotations

import errno

import pytest

from harness import cli, errors, grade_many
from harness.report import table


def test_each_verdict_maps_to_its_exit_code():
    assert [errors.exit_code(v) for v in ("valid", "invalid", "tampered", "unknown", "not proven")] == [0, 1, 1, 2, 2]
    assert errors.exit_code("did not start") == 2 and errors.exit_code("invalid adapter") == 2
    assert errors.worst_exit([0, 2, 1]) == 1 and errors.worst_exit([0, 2]) == 2 and errors.worst_exit([0]) == 0
    assert errors.worst_exit([1, 3]) == 3
    assert cli.EXIT["tampered"] == 1 and cli.EXIT["unknown"] == 2


def test_infrastructure_failures_are_recognised_through_their_causes():
    assert errors.is_infrastructure(errors.InfrastructureError("stack"))
    assert errors.is_infrastructure(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "disk full")
        except OSError as exc:
            raise RuntimeError("writing history") from exc
    except RuntimeError as wrapped:
        assert errors.is_infrastructure(wrapped)
    assert not errors.is_infrastructure(ValueError("adapter says nonsense"))
    assert not errors.is_infrastructure(OSError(errno.ENOENT, "no such file"))

    class IsolationError(RuntimeError):  # harness/isolation.py's, matched by name
        pass

    assert errors.is_infrastructure(IsolationError("no cgroup"))


def test_an_infrastructure_failure_is_retried_once_then_raised():
    calls, said = [], []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise errors.InfrastructureError("the stack did not start")
        return "graded"

    assert errors.retry_once(flaky, said.append) == "graded" and len(calls) == 2 and "retrying once" in said[0]
    calls.clear()

    def broken():
        calls.append(1)
        raise OSError(errno.ENOSPC, "disk full")

    with pytest.raises(errors.InfrastructureError, match="failed twice"):
        errors.retry_once(broken, said.append)
    assert len(calls) == 2
    calls.clear()

    def wrong():  # not the infrastructure: never retried
        calls.append(1)
        raise ValueError("bad adapter")

    with pytest.raises(ValueError):
        errors.retry_once(wrong, said.append)
    assert len(calls) == 1


def test_grade_exits_3_when_the_stack_does_not_start_twice(tmp_path, monkeypatch, capsys):
    from harness.stack import Stack

    starts = []

    def no_stack(*args, **kwargs):
        starts.append(1)
        raise TimeoutError("postgres not ready in 60s")

    monkeypatch.setattr(Stack, "start", no_stack)
    code = cli.main(["grade", "--sut", "reference", "--level", "3", "--seed", "1", "--only", "batch-poison-positions",
                     "--reports", str(tmp_path), "--no-isolation"])
    err = capsys.readouterr()
    assert code == 3, err
    assert len(starts) == 2 and "retrying once" in err.out and "infrastructure failure" in err.err


def test_run_exits_3_when_the_stack_does_not_start_twice(tmp_path, monkeypatch, capsys):
    from harness.stack import Stack

    starts = []
    monkeypatch.setattr(Stack, "start", lambda *a, **k: starts.append(1) or (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    code = cli.main(["run", "batch-poison-positions", "--seed", "1", "--no-isolation", "--run-dir", str(tmp_path / "r")])
    assert code == 3 and len(starts) == 2


def test_grade_many_exits_3_when_its_shared_stack_does_not_start_twice(tmp_path, monkeypatch, capsys):
    from harness.stack import Stack

    starts = []

    def no_stack(*args, **kwargs):
        starts.append(1)
        raise TimeoutError("rabbitmq not ready")

    monkeypatch.setattr(Stack, "start", no_stack)
    code = cli.main(["grade-many", "reference", "--level", "3", "--seed", "2", "--only", "batch-poison-positions",
                     "--reports", str(tmp_path), "--no-isolation"])
    out = capsys.readouterr().out
    assert code == 3 and len(starts) == 2 and "infrastructure failed" in out
    rows = [table.Row("a", "a", "valid"), table.Row("b", "b", "tampered")]
    assert grade_many.exit_code(rows) == 1 and grade_many.exit_code(rows, infrastructure=True) == 3
