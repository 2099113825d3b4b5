"""``hold``: roles kept stopped while work piles up — from before the workload (no trigger; ``hold_seconds`` count
from the workload start, ``until_fault`` holds on until that step's fault is in force, ``until_workload`` until every
upload was answered) or from a trigger — then
started again, sampling the work queue's consumers if asked."""

from __future__ import annotations

import time

from . import first_delay, untimed

ACTION = "hold"
RECORDS = "phase hold_start / hold_end (roles, instances, fault); consumer_sampling_start with sample_consumers"
WEIGHT = 1


def prepare(ctx, step) -> None:
    if untimed(step):
        ctx.hold(step)


def run(ctx, step) -> None:
    if untimed(step):
        time.sleep(max(0.0, ctx.workload_started + float(step.get("hold_seconds", 5)) - time.monotonic()))
        if step.get("until_fault") is not None:
            wait_for_fault(ctx, step, int(step["until_fault"]))
        if step.get("until_workload"):
            wait_for_workload(ctx, step)
    else:
        if not ctx.wait_trigger(step, first_delay(step)):
            return
        ctx.hold(step)
        time.sleep(float(step.get("hold_seconds", 5)))
    if step.get("sample_consumers"):
        ctx.start_sampler(step)
    ctx.release(step)


def wait_for_fault(ctx, step, index: int) -> None:
    """Held on past ``hold_seconds`` until step ``index``'s fault is in force (its start line), at most the step's
    ``timeout``: on a loaded machine a clock alone can release the roles before the fault they were held for."""
    deadline = time.monotonic() + float(step.get("timeout", 30))
    while not ctx.history.wait_fault_started(index, 0.1):
        if time.monotonic() > deadline or ctx.stopping.is_set():
            ctx.history.append("note", message=f"hold: fault {index} was not in force within the timeout; released",
                               fault=step["index"])
            return


def wait_for_workload(ctx, step) -> None:
    """Held on past ``hold_seconds`` until every upload of the workload was answered, at most the step's ``timeout``:
    the whole workload then waits in the queue as a backlog, however fast the consumers would have taken it."""
    deadline = time.monotonic() + float(step.get("timeout", 30))
    while not ctx.workload_done.wait(0.1):
        if time.monotonic() > deadline or ctx.stopping.is_set():
            ctx.history.append("note", message="hold: the workload did not end within the timeout; released",
                               fault=step["index"])
            return


def allowed(adapter, level: int) -> str | None:
    return None if held_roles(adapter) else "every role is the HTTP role"


def held_roles(adapter) -> list[str]:
    """Roles that may be stopped for a while: all but the HTTP role (uploads need it)."""
    return [r for r in adapter.roles if r != adapter.http.get("role", "api")]


def draw(rng, pick) -> dict | None:
    held = [r for r in held_roles(pick.adapter) if r in pick.roles]
    if not held:
        return None
    return {"action": "hold", "hold": [rng.choice(held)], "at": pick.at,
            "hold_seconds": pick.duration(rng, 0.25, 1.0)}


def happened(step, history, final) -> tuple[bool, str]:
    held = [e for e in history.of_type("phase") if e.get("name") == "hold_end" and e.get("fault") == step.get("index")]
    return bool(held), f"roles held and released {len(held)} times"
