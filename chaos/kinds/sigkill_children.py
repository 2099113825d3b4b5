"""``sigkill_children``: SIGKILL of a role's child processes — never the role's own process — as an OOM killer or a
cgroup kill takes a service's helpers (render processes, a sandbox, a pool of forks). ``count`` times (default 1),
``between`` seconds apart (default 1.0), from ``at`` or a trigger. Each time it kills the *leaves* among the
descendants of the role's process (found by parent PID in /proc, never by name): the processes that have no children
of their own, so a fork server that makes them stays and the role can replace what it lost.

A role without child processes has nothing an OOM killer could take but itself: the step is recorded as applied with
nothing to kill (``landed``), and ``happened`` says the fault did not exercise it (fault_coverage: valid, not
exercised; the scenario proves no row for that implementation)."""

from __future__ import annotations

import os
import signal
import time

from . import own_lines

ACTION = "sigkill_children"
RECORDS = ("fault action=sigkill_children phase=start (role, pid, killed: the child pids, n) per kill, "
           "phase=end after the last")
WEIGHT = 1


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):  # dead already (a zombie its parent has not reaped): nothing left to kill
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return children


def leaf_descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """The descendants of ``pid`` that have no children themselves (pure over ``children``: parent → child pids)."""
    children = _children_by_parent() if children is None else children
    leaves, stack, seen = [], list(children.get(pid, [])), {pid}
    while stack:
        child = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        below = children.get(child, [])
        if below:
            stack.extend(below)
        else:
            leaves.append(child)
    return sorted(leaves)


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step):
        return
    name = ctx.target(step)
    count, between = int(step.get("count", 1)), float(step.get("between", 1.0))
    for n in range(count):
        if n:
            if ctx.stopping.is_set():
                break
            time.sleep(between)
        pid = ctx.supervisor.instances[name].pid
        killed = []
        for child in leaf_descendants(pid) if pid else []:
            try:
                os.kill(child, signal.SIGKILL)
                killed.append(child)
            except ProcessLookupError:
                pass
        ctx.history.append("fault", action=ACTION, phase="start", role=name, pid=pid, killed=killed, n=n + 1,
                           fault=step.get("index"))
        ctx.log(f"SIGKILL of {len(killed)} child processes of {name}: {killed}")
    ctx.history.append("fault", action=ACTION, phase="end", role=name, fault=step.get("index"))


def draw(rng, pick) -> dict | None:
    if not pick.roles:
        return None
    return {"action": ACTION, "role": rng.choice(pick.roles), "at": pick.at, "count": rng.randint(1, 3),
            "between": round(rng.uniform(0.5, 2.0), 2)}


def landed(step, history) -> bool:
    """The step was applied (whether or not the role had children to kill)."""
    return bool(own_lines(step, [e for e in history.of_type("fault") if e.get("action") == ACTION
                                 and e.get("phase") == "start"]))


def happened(step, history, final) -> tuple[bool, str]:
    done = own_lines(step, [e for e in history.of_type("fault") if e.get("action") == ACTION
                            and e.get("phase") == "start"])
    killed = [pid for e in done for pid in (e.get("killed") or [])]
    if not done:
        return False, "no child processes were signalled"
    if not killed:
        return False, f"the role had no child processes to kill ({len(done)} tries): nothing an OOM killer could take"
    return True, f"{len(killed)} child processes killed in {len(done)} tries: {killed[:8]}"
