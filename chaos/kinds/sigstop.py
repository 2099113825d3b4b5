"""``sigstop``: SIGSTOP of a role's process group for ``duration`` seconds, then SIGCONT (optionally another
instance started ``start_instance_after`` seconds into the pause, the pause prolonged until a job the paused owner
held is claimed anew, at most ``until_claimed`` seconds more, and the queue and job states probed for
``probe_seconds`` after the resume; ``link = "tenant"``: that instance on the tenant-wide links, see start_instance);
the roles of ``hold`` — never the paused one — are kept stopped meanwhile."""

from __future__ import annotations

import time

from . import first_delay, own_lines

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
    held = jobs_in_flight(ctx) if step.get("until_claimed") is not None else {}
    ctx.processes.sigstop(name)
    paused_at = time.monotonic()
    ctx.log(f"SIGSTOP {name} for {step.get('duration', 5)}s")
    if step.get("start_instance_after") is not None:
        time.sleep(float(step["start_instance_after"]))
        ctx.start_extra_instance(ctx.supervisor.instances[name].role,
                                 **({"link": step["link"]} if step.get("link") else {}))
    time.sleep(max(0.0, paused_at + float(step.get("duration", 5)) - time.monotonic()))
    if step.get("until_claimed") is not None:
        wait_claimed_anew(ctx, step, held, paused_at)
    ctx.processes.sigcont(name)
    ctx.log(f"SIGCONT {name}")
    if step.get("probe_seconds") is not None:
        probe_after_resume(ctx, step)
    ctx.release(step)


def jobs_in_flight(ctx) -> dict[str, object]:
    """Just before the pause: the jobs the API shows ``processing`` (one fresh read of each unfinished one), with the
    attempt each showed — those the owner about to sleep may hold."""
    observer = ctx.observer
    if observer is None:
        return {}
    held = {}
    for attachment_id in [a for a in observer.ids if observer.states.get(a) not in ("ready", "failed")]:
        try:
            observer.poll_one(attachment_id)
        except Exception:
            pass
        if observer.states.get(attachment_id) == "processing":
            held[attachment_id] = getattr(observer, "attempts", {}).get(attachment_id)
    return held


def claimed_anew(ctx, held: dict[str, object]) -> tuple[str, object, object] | None:
    """A job of ``held`` read now as ``processing`` at a higher attempt than it had at the pause (the sleeping owner
    cannot have claimed it: another consumer did), or ended (nothing left to wait for)."""
    observer = ctx.observer
    for attachment_id, attempt in held.items():
        try:
            observer.poll_one(attachment_id)
        except Exception:
            continue
        state = observer.states.get(attachment_id)
        now = getattr(observer, "attempts", {}).get(attachment_id)
        if state in ("ready", "failed"):
            return attachment_id, state, now
        if (state == "processing" and isinstance(now, int) and isinstance(attempt, int)
                and not isinstance(now, bool) and now > attempt):
            return attachment_id, state, now
    return None


def wait_claimed_anew(ctx, step, held: dict[str, object], paused_at: float) -> None:
    """After the pause's ``duration``: keep the owner asleep until a job it held is claimed anew by another consumer,
    at most ``until_claimed`` seconds more. A new instance can take long to start on a loaded machine, and a broker may
    hand the recovered job's message back to the sleeping consumer (it still has prefetch room): until someone else
    claimed the job, waking the owner lets it take its own job again and there is no old and new owner at once."""
    ceiling = time.monotonic() + float(step["until_claimed"])
    found = None
    while held and time.monotonic() < ceiling and not ctx.stopping.is_set():
        found = claimed_anew(ctx, held)
        if found is not None:
            break
        time.sleep(0.1)
    extra = round(max(0.0, time.monotonic() - paused_at - float(step.get("duration", 5))), 3)
    if found is not None:
        attachment_id, state, attempt = found
        ctx.history.append("note", message=f"pause ended: a job the paused owner held was seen {state} at attempt "
                           f"{attempt} while it slept", fault=step["index"], attachment_id=attachment_id,
                           held_attempt=held.get(attachment_id), attempt=attempt, extra_seconds=extra)
    else:
        ctx.history.append("note", message=("pause ended at its ceiling: no job the paused owner held was claimed "
                                            "anew while it slept" if held else
                                            "pause not prolonged: no job was seen processing when it began"),
                           fault=step["index"], held=held, extra_seconds=extra)


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
    """This step sent its SIGSTOP (a step whose trigger never came sent none, though another step's did)."""
    done = own_lines(step, [e for e in history.of_type("fault") if e.get("action") == ACTION
                            and e.get("phase") == "start"])
    return bool(done), (f"sigstop sent {len(done)} times" if done else
                        "sigstop never sent by this step (its trigger never came)")
