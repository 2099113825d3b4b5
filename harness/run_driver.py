"""The one run driver the commands share (``run``, ``grade``, ``grade-many``, ``soak``, ``explore``, ``mutate``):

- :func:`draw_seed`: the seed given (``--seed``) or one drawn at random, which the command prints;
- :func:`start_stack` / :func:`own_stack`: the grader's own services, started in a folder of the run, the time it
  took recorded; a stack that does not start is the grader's infrastructure failing (:class:`InfrastructureError`,
  exit 3: harness/errors.py), retried once when asked;
- :func:`busy_roles`: the roles a fault schedule already arms with a failpoint or strikes (kill, pause, hold), which
  a random schedule (``soak``, the long soak, ``explore``) must not give another process fault;
- :func:`recheck`: a stored folder (one run, a grade, a soak) judged again from its recorded histories.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import InfrastructureError, retry_once

SEED_RANGE = 1_000_000


def draw_seed(value: int | None = None) -> int:
    """``value`` when given, else a random seed below 1 000 000 (short enough to type back as ``--seed``)."""
    if value is not None:
        return int(value)
    return int.from_bytes(os.urandom(4), "big") % SEED_RANGE


def start_stack(folder: Path | None, *, progress=print, keep_data: bool = False, rabbitmq_nodes: int = 1,
                retry: bool = False, what: str = "the stack (PostgreSQL, RabbitMQ, SeaweedFS, Toxiproxy)"):
    """Start the grader's own services; returns ``(stack, seconds)``. A failure to start is an
    :class:`InfrastructureError` (exit 3), once more first when ``retry``."""
    from .stack import Stack

    began = time.monotonic()

    def start():
        try:
            return Stack.start(Path(folder) if folder else None, keep_data=keep_data, rabbitmq_nodes=rabbitmq_nodes)
        except Exception as exc:  # the grader's own services, not the implementation's fault
            raise InfrastructureError(f"{what} did not start", exc) from exc

    stack = retry_once(start, progress, "starting the stack") if retry else start()
    seconds = round(time.monotonic() - began, 2)
    progress(f"stack up in {seconds:.1f}s" + (f" ({rabbitmq_nodes} RabbitMQ nodes)" if rabbitmq_nodes > 1 else ""))
    return stack, seconds


@contextmanager
def own_stack(stack, folder: Path, *, progress=print, keep_data: bool = False, timings: dict | None = None):
    """The stack given, or one started in ``folder`` and stopped at the end (whatever happened); ``timings`` gets
    ``stack_start`` and ``stack_stop`` of a stack it started."""
    if stack is not None:
        yield stack
        return
    stack, seconds = start_stack(folder, progress=progress, keep_data=keep_data)
    if timings is not None:
        timings["stack_start"] = seconds
    try:
        yield stack
    finally:
        began = time.monotonic()
        stack.stop()
        if timings is not None:
            timings["stack_stop"] = round(time.monotonic() - began, 2)


def busy_roles(adapter, faults) -> tuple[set, set]:
    """``(armed, struck)`` for a fault schedule drawn so far: the roles a failpoint is armed on, and those killed,
    paused or held. Arming restarts a role with FAILPOINTS set, and a second arm, a kill (restarted without
    failpoints) or a hold would disarm it before its window came."""
    armed = {adapter.window_role(f["window"]) for f in faults if f["action"] == "failpoint"}
    struck = {f.get("role") for f in faults if f["action"] in ("sigkill", "sigstop")} | {
        r for f in faults if f["action"] == "hold" for r in f["hold"]}
    return armed, struck
