"""``sigkill``: SIGKILL of a role's whole process group at a trigger (``count`` times, each after its drawn delay),
restarted ``restart_after`` seconds later (the work queue peeked at while it is down when asked); the roles of
``hold`` (and, for a peek, every other consumer instance) are kept stopped from before the trigger to the end."""

from __future__ import annotations

import time

from . import own_lines, peek_while_down

ACTION = "sigkill"
RECORDS = "fault action=sigkill phase=start (role, pid, window, exactness, trigger, delay) per kill; window_hits"
WEIGHT = 3


def run(ctx, step) -> None:
    delays = step.get("delay_drawn") or [0.0]
    name = ctx.target(step)
    ctx.hold(step)  # before the trigger: stopping a held role takes time the kill cannot wait for
    for n, delay in enumerate(delays):
        if n == 0:
            if not ctx.wait_trigger(step, delay):
                ctx.release(step)
                return
        else:
            if not ctx.wait_trigger({**step, "at": None}, delay):
                return
        ctx.processes.sigkill(name, window=",".join(ctx.windows) or None,
                              exactness="approximate", trigger=step.get("when"), delay=delay)
        ctx.window_hits.append({"role": name, "windows": ctx.windows,
                                "exactness": "approximate", "wall": time.time()})
        ctx.log(f"SIGKILL {name} ({step.get('when') or 'timed'} + {delay:.2f}s)")
        if step.get("peek_queue"):
            peek_while_down(ctx, step)
        else:
            time.sleep(float(step.get("restart_after", 0.5)))
        if name not in ctx.held:
            ctx.supervisor.ensure_running(name, {"FAILPOINTS": ""})
    time.sleep(float(step.get("hold_seconds", 0)))
    ctx.release(step)


def draw(rng, pick) -> dict | None:
    if not pick.roles:
        return None
    return {"action": "sigkill", "role": rng.choice(pick.roles), "at": pick.at,
            "restart_after": round(rng.uniform(0.3, 2.0), 2)}


def landed(step, history) -> bool:
    """Whether a kill was sent at all (a timed kill may land outside the window it aims at: ``happened`` is False
    then, but the fault itself was done — fault_coverage tells the two apart). This step's own kills only."""
    return bool(own_lines(step, [e for e in history.of_type("fault") if e.get("action") == ACTION
                                 and e.get("phase") == "start"]))


def happened(step, history, final) -> tuple[bool, str]:
    """A kill sent by this step; a timed one (``exactness="approximate"``) only with the evidence of the window it
    aimed at."""
    from ._windows import windows_hit

    done = own_lines(step, [e for e in history.of_type("fault") if e.get("action") == ACTION
                            and e.get("phase") == "start"])
    timed = [e for e in done if e.get("exactness") == "approximate" and e.get("window")]
    if timed:
        return windows_hit(timed, history, final or {})
    return bool(done), f"sigkill sent {len(done)} times"
