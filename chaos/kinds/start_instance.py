"""``start_instance``: one more instance of a role (a copy of its first instance's command and environment). With
``link = "tenant"`` the new instance is on the tenant-wide links, not its role's own proxies: a ``toxic`` with
``role`` then reaches the role's first instance(s) only, never this one (default ``"role"``: the same links)."""

from __future__ import annotations

from . import first_delay

ACTION = "start_instance"
RECORDS = "role lines of the new instance (supervisor); nothing else"
WEIGHT = 1


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    ctx.start_extra_instance(ctx.role(step), **({"link": step["link"]} if step.get("link") else {}))


def allowed(adapter, level: int) -> str | None:
    return None if adapter.roles_flagged("consumer") else "no role is flagged consumer"


def draw(rng, pick) -> dict | None:
    if not pick.consumers:
        return None
    return {"action": "start_instance", "role": rng.choice(pick.consumers), "at": pick.at}


def happened(step, history, final) -> tuple[bool, str]:
    return True, "instance started"
