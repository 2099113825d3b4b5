"""``sigterm``: a graceful stop, then a start — one instance of a role, or each instance in turn (a rolling deploy).

At its trigger the step sends SIGTERM to the instance's process group (CONTRACT §2: the harness stops a role with
SIGTERM) and waits for it to exit, at most the role's ``stop_timeout_seconds`` from the adapter (its shutdown
grace; a step's ``grace`` overrides it); an instance still running then gets SIGKILL, and the ``end`` line says so
(``killed = true``). The instance is started again ``restart_after`` seconds later (default 0.5). With
``each_instance = true`` every instance of the role follows in turn, as a rolling deploy does: the next one is
stopped only once the work queue counts as many consumers as before the first stop (a passive declare; at most the
step's ``timeout``), and ``between`` seconds more (default 1) — one instance down at a time, never two. Roles of
``hold`` are kept stopped from the trigger to the end.
"""

from __future__ import annotations

import signal
import time

from ..failpoints import failpoints_value
from . import first_delay

ACTION = "sigterm"
RECORDS = ("fault action=sigterm phase=start (role, pid, grace) and phase=end (role, pid, returncode, killed, "
           "exit_seconds) per instance stopped; the supervisor's exit (expected) and start lines")
WEIGHT = 2


def run(ctx, step) -> None:
    ctx.hold(step)
    if not ctx.wait_trigger(step, first_delay(step)):
        ctx.release(step)
        return
    role = ctx.role(step)
    names = ctx.instances_of(role) if step.get("each_instance") else [ctx.target(step)]
    before = consumers_now(ctx) if len(names) > 1 else None
    for n, name in enumerate(names):
        if ctx.stopping.is_set():
            break
        if n:
            wait_for_consumers(ctx, step, before)
            time.sleep(float(step.get("between", 1.0)))
        armed = dict(ctx.supervisor.instances[name].armed or {})
        stop_gracefully(ctx, step, name)
        time.sleep(float(step.get("restart_after", 0.5)))
        if name not in ctx.held and not ctx.stopping.is_set():
            # Started as it ran: a failpoint armed on it stays armed (a deploy does not disarm a fault under test).
            ctx.supervisor.ensure_running(name, {"FAILPOINTS": failpoints_value(armed)})
    time.sleep(float(step.get("hold_seconds", 0)))
    ctx.release(step)


def consumers_now(ctx) -> int | None:
    """The work queue's consumer count now (exact: a passive declare), None when it cannot be read."""
    from harness.broker import amqp_queue_depth

    exact = amqp_queue_depth(ctx.broker.amqp_url, ctx.adapter.broker["work_queue"])
    return None if exact is None else exact.get("consumers")


def wait_for_consumers(ctx, step, before: int | None) -> None:
    """Until the work queue has ``before`` consumers again (the instance started last consumes), at most the step's
    timeout; a count that never came back (or could not be read) is noted, and the roll goes on."""
    deadline = time.monotonic() + float(step.get("timeout", 30))
    now = None
    while before is not None and not ctx.stopping.is_set() and time.monotonic() < deadline:
        now = consumers_now(ctx)
        if now is not None and now >= before:
            ctx.history.append("observe", source="sigterm_consumers_back", queue=ctx.adapter.broker["work_queue"],
                               consumers=now, fault=step["index"])
            return
        time.sleep(0.2)
    ctx.history.append("note", message=f"sigterm: the work queue's consumers did not come back to {before} "
                       f"(last count {now}) before the next stop", fault=step["index"])


def stop_gracefully(ctx, step, name: str) -> None:
    """SIGTERM, wait up to the grace, SIGKILL after it (the supervisor's stop); both ends recorded."""
    instance = ctx.supervisor.instances[name]
    grace = float(step.get("grace") or ctx.adapter.roles[instance.role].stop_timeout_seconds)
    # A graceful stop means something only to a running instance: one that just crashed (another fault's kill, a
    # failpoint) is waited for until it is back, else the step says so and sends nothing — a SIGTERM "sent" to a
    # dead process once had its crash's retry charged to the stop (soak, Go example, seed 9000).
    if not instance.alive():
        deadline = time.monotonic() + float(step.get("timeout", 30))
        while not instance.alive() and time.monotonic() < deadline and not ctx.stopping.is_set():
            time.sleep(0.05)
        if not instance.alive():
            ctx.history.append("note", message=f"sigterm: {name} was not running (exited, not restarted within "
                               "the step's timeout): no SIGTERM sent", role=name, fault=step["index"])
            return
        time.sleep(0.5)  # started again just now: let it take deliveries, as a running instance has
        instance = ctx.supervisor.instances[name]
    pid = instance.pid
    ctx.history.append("fault", action=ACTION, phase="start", role=name, pid=pid, grace=grace,
                       trigger=step.get("when"), fault=step["index"])
    ctx.log(f"SIGTERM {name} (grace {grace:g}s)")
    began = time.monotonic()
    ctx.supervisor.stop(name, timeout=grace)
    returncode = instance.process.returncode if instance.process is not None else None
    killed = returncode == -signal.SIGKILL
    ctx.history.append("fault", action=ACTION, phase="end", role=name, pid=pid, returncode=returncode,
                       killed=killed, exit_seconds=round(time.monotonic() - began, 3), grace=grace,
                       fault=step["index"])
    if killed:
        ctx.log(f"{name} did not exit within {grace:g}s of SIGTERM: SIGKILL")


def draw(rng, pick) -> dict | None:
    if not pick.roles:
        return None
    return {"action": "sigterm", "role": rng.choice(pick.roles), "at": pick.at}


def happened(step, history, final) -> tuple[bool, str]:
    """A stop sent and its end seen (the instance exited, by itself or killed after the grace)."""
    index = step.get("index")
    mine = [e for e in history.of_type("fault") if e.get("action") == ACTION
            and (index is None or e.get("fault") in (None, index))]
    started = [e for e in mine if e.get("phase") == "start"]
    ended = [e for e in mine if e.get("phase") == "end"]
    killed = [e["role"] for e in ended if e.get("killed")]
    why = (f"sigterm sent {len(started)} times, {len(ended)} exits seen"
           + (f" ({', '.join(killed)} killed after the grace)" if killed else ""))
    return bool(started) and len(ended) == len(started), why
