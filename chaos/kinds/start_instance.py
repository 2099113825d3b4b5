"""``start_instance``: one more instance of a role (a copy of its first instance's command and environment). With
``link = "tenant"`` the new instance is on the tenant-wide links, not its role's own proxies: a ``toxic`` with
``role`` then reaches the role's first instance(s) only, never this one (default ``"role"``: the same links)."""

from __future__ import annotations

from . import first_delay

ACTION = "start_instance"
RECORDS = "fault action=start_instance phase=done (role: the new instance's name), and its role lines (supervisor)"
WEIGHT = 1


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    name = ctx.start_extra_instance(ctx.role(step), **({"link": step["link"]} if step.get("link") else {}))
    ctx.history.append("fault", action=ACTION, phase="done", role=name, fault=step["index"])  # no end: not a fault in force


def allowed(adapter, level: int) -> str | None:
    return None if adapter.roles_flagged("consumer") else "no role is flagged consumer"


def draw(rng, pick) -> dict | None:
    if not pick.consumers:
        return None
    return {"action": "start_instance", "role": rng.choice(pick.consumers), "at": pick.at}


def happened(step, history, final) -> tuple[bool, str]:
    """This step started its instance. A step whose trigger never came (or that failed) started none; a history
    recorded before the kind wrote its own line is taken at its word otherwise, as it was then."""
    mine = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "done"
            and e.get("fault") == step.get("index")]
    if mine:
        return True, f"instance {mine[0].get('role')} started"
    missed = [e for e in history.of_type("note") if e.get("fault") == step.get("index")
              and ("never came" in str(e.get("message")) or e.get("message") == "fault step failed")]
    if missed:
        return False, f"no instance started by this step: {missed[0].get('message')}"
    return True, "instance started"
