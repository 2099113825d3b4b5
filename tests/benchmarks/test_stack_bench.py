"""How long the stack takes to become ready, per service (target: all four under 10 s on this machine)."""
from __future__ import annotations

import pytest

from harness.stack import Stack

pytestmark = [pytest.mark.benchmark, pytest.mark.integration]


def test_stack_ready_time(tmp_path):
    stack = Stack.start(tmp_path / "bench-stack")
    try:
        timings = dict(stack.ready_seconds)
    finally:
        stack.stop()
    # Baseline of the same run: the slowest single service. The parallel start should cost little beyond it.
    slowest = max(v for k, v in timings.items() if k != "total")
    print("\n[bench] stack ready: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items())
          + f"; total/slowest-service ratio {timings['total'] / slowest:.2f}")
    assert timings["total"] < 30, f"stack took {timings['total']:.1f}s to become ready"
