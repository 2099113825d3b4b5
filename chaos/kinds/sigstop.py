"""``sigstop``: SIGSTOP of a role's process group for ``duration`` seconds, then SIGCONT (optionally another
instance started ``start_instance_after`` seconds into the pause, and the queue and job states probed for
``probe_seconds`` after the resume); the roles of ``hold`` — never the paused one — are kept stopped meanwhile."""

from __future__ import annotations

import time

from . import first_delay

ACTION = "sigstop"
RECORDS = ("fault action=sigstop phase=start (role, pid) and action=sigcont phase=end; resume_probe phase and queue "
           "kind=resume_probe lines with probe_seconds")
WEIGHT = 3


def run(ctx, step) -> None:
    # hold: keep those roles stopped from the step's start until after the probe (the paused role itself
    # is never held: it is the owner under test, and if it recovers work too, it sleeps with its job).
    paused_role = ctx.role(step)
    step = {**step, "hold": [r for r in ctx.adapter.expand_roles(step.get("hold") or []) if r != paused_role]}
    ctx.hold(step)
    if not ctx.wait_trigger(step, first_delay(step)):
        ctx.release(step)
        return
    name = ctx.target(step)
    ctx.processes.sigstop(name)
    ctx.log(f"SIGSTOP {name} for {step.get('duration', 5)}s")
    if step.get("start_instance_after") is not None:
        time.sleep(float(step["start_instance_after"]))
        ctx.start_extra_instance(ctx.supervisor.instances[name].role)
    remaining = float(step.get("duration", 5)) - float(step.get("start_instance_after") or 0)
    time.sleep(max(0.0, remaining))
    ctx.processes.sigcont(name)
    ctx.log(f"SIGCONT {name}")
    if step.get("probe_seconds") is not None:
        probe_after_resume(ctx, step)
    ctx.release(step)


def probe_after_resume(ctx, step) -> None:
    """After SIGCONT, for ``probe_seconds`` (roles of ``hold`` still stopped): where each accepted job stands.
    Each sample takes the work queue's exact ready count (passive declare) and the management API's unacked count
    (refreshed every statistics interval: it lags), THEN a fresh read of every job's state — a delivery settled
    after its outcome shows as a terminal state, never as a missing message (stale_ack)."""
    from harness.broker import amqp_queue_depth

    queue = ctx.adapter.broker["work_queue"]
    until = time.monotonic() + float(step["probe_seconds"])
    ctx.history.append("phase", name="resume_probe_start", queue=queue, fault=step["index"],
                       seconds=float(step["probe_seconds"]))
    while time.monotonic() < until and not ctx.stopping.is_set():
        exact = amqp_queue_depth(ctx.broker.amqp_url, queue)
        try:
            stats = ctx.broker.management.depth(queue)
        except Exception:
            stats = None
        states = {}
        for attachment_id in ctx.observer.ids:
            try:
                ctx.observer.poll_one(attachment_id)
            except Exception:
                pass
            states[attachment_id] = ctx.observer.states.get(attachment_id)
        ctx.history.append("queue", kind="resume_probe", queue=queue, dead_letter=False, fault=step["index"],
                           ready=None if exact is None else exact.get("ready"),
                           consumers=None if exact is None else exact.get("consumers"),
                           unacked=None if stats is None else stats.get("unacked"),
                           stats_ready=None if stats is None else stats.get("ready"), states=states)
        time.sleep(0.2)
    ctx.history.append("phase", name="resume_probe_end", queue=queue, fault=step["index"])


def draw(rng, pick) -> dict | None:
    if not pick.roles:
        return None
    return {"action": "sigstop", "role": rng.choice(pick.roles), "at": pick.at,
            "duration": pick.duration(rng, 0.25, 1.75)}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"]
    return bool(done), f"sigstop sent {len(done)} times"
