"""``toxic``: a Toxiproxy toxic (cut, blackhole, reset_peer, latency) on a service for ``duration`` seconds (with
``until = "idle"``: until every accepted job is terminal, at most ``duration``) — on every role's link, or with ``role`` on that role's own link only (the runner gives it a proxy of its own)."""

from __future__ import annotations

import time

from . import first_delay, own_lines

ACTION = "toxic"
RECORDS = "fault action=toxic phase=start (service, toxic, params, role) and phase=end"
WEIGHT = 3
SERVICES = ("postgres", "rabbitmq", "s3")
TOXICS = ("cut", "blackhole", "reset_peer", "latency")


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    # With a role: on that role's own link(s) only (the runner's _role_links); without: the whole service.
    roles = (ctx.adapter.expand_roles([step["role"]], ctx.windows)
             if step.get("role") else [None])
    toxics = [(role, ctx.network.apply(step["service"], step["toxic"], step.get("params"), role=role))
              for role in roles]
    ctx.log(f"{step['toxic']} on {step['service']}" + (f" of {', '.join(roles)}" if step.get("role") else "")
            + f" for {step.get('duration', 3)}s")
    if step.get("until") == "idle":
        # Until every accepted job is terminal, at most ``duration``: a toxic that must outlast a job whose length
        # depends on other faults (a pause prolonged until its job is claimed anew) ends on the event, not a guess.
        deadline = time.monotonic() + float(step.get("duration", 3))
        while time.monotonic() < deadline and not ctx.stopping.is_set() and not ctx.condition("idle"):
            time.sleep(0.1)
        ctx.history.append("note", message="toxic ended: " + ("every accepted job terminal" if ctx.condition("idle")
                                                              else "its duration (ceiling) elapsed"),
                           fault=step["index"])
    else:
        time.sleep(float(step.get("duration", 3)))
    for role, toxic in toxics:
        ctx.network.remove(step["service"], step["toxic"], toxic, role=role)


def draw(rng, pick) -> dict:
    toxic = rng.choice(TOXICS)
    params = {"latency": lambda: {"ms": rng.randint(50, 500), "jitter_ms": rng.randint(0, 100)},
              "reset_peer": lambda: {"after_ms": rng.randint(0, 500)}}.get(toxic, dict)()
    fault = {"action": "toxic", "service": rng.choice(SERVICES), "toxic": toxic, "params": params, "at": pick.at,
             "duration": round(rng.uniform(0.5, 3.0), 2)}
    if rng.random() < 0.4:  # one role's own link only (a partition of that role), else the whole service
        fault["role"] = rng.choice(list(pick.adapter.roles))
    return fault


def happened(step, history, final) -> tuple[bool, str]:
    """This step's toxic started. Its start line names the step (``fault``); a history recorded before it did is
    judged by the service alone, as it was then (another step's toxic on the same service then counts too)."""
    starts = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
              and e.get("service") == step.get("service")]
    done = own_lines(step, starts)
    if not done and starts:
        return False, f"{ACTION} on {step.get('service')} never started by this step (its trigger never came)"
    return bool(done), f"{ACTION} on {step.get('service')} {len(done)} times"
