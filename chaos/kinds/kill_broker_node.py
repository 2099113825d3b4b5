"""``kill_broker_node``: on a RabbitMQ cluster stack (scenario ``rabbitmq_nodes``), SIGKILL one node — the work
queue's quorum ``leader`` or a ``follower`` (``node``) — keep it down ``duration`` seconds and start it again on
the same data. The other nodes keep a quorum: accepted work must not be lost, and every role connected to the lost
node must reconnect to another one (AMQP_URLS). The killed node's firehose is off once it is back, until the tap
turns it on again (delivery_accounting counts that gap as untraced)."""

from __future__ import annotations

import threading
import time

from . import first_delay
from ._broker_nodes import not_on_one_node, resolve, watch_while_lost

ACTION = "kill_broker_node"
RECORDS = ("fault action=kill_broker_node phase=start (service, node, target, leader, members) and phase=end "
           "(ready_seconds, leader_after)")


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    chosen = resolve(ctx, step)
    ctx.log(f"killing RabbitMQ node {chosen['node']} ({chosen['target']}, service {chosen['service']}) "
            f"for {step.get('duration', 1)}s")
    ctx.history.append("fault", action=ACTION, phase="start", how="kill", **chosen)
    ctx.stack.kill(chosen["service"])
    watch_while_lost(ctx, chosen, float(step.get("duration", 1.0)))
    # Still lost while it boots again: the roles' consumers are counted through another node meanwhile.
    box: list[float] = []
    restarting = threading.Thread(target=lambda: box.append(ctx.stack.restart(chosen["service"],
                                                                              float(step.get("timeout", 60)))),
                                  daemon=True, name="restart-broker-node")
    began = time.monotonic()
    restarting.start()
    while restarting.is_alive():
        watch_while_lost(ctx, chosen, 0.5)
    if not box:
        raise RuntimeError(f"RabbitMQ node {chosen['node']} did not come back (see the stack's logs)")
    took = time.monotonic() - began
    after = None
    try:
        after = (ctx.broker.management.queue_leader(ctx.adapter.broker["work_queue"]) or {}).get("leader")
    except Exception:  # the leader after is informative only
        pass
    ctx.history.append("fault", action=ACTION, phase="end", service=chosen["service"], node=chosen["node"],
                       ready_seconds=round(took, 3), leader_after=after)
    ctx.log(f"RabbitMQ node {chosen['node']} back after {took:.1f}s (leader now {after})")


def heal(ctx, step) -> None:
    """Nothing of its own: the heal starts every stack service that is down (a cluster's nodes among them)."""
    ctx.release(step)


WEIGHT = 1
allowed = not_on_one_node


def draw(rng, pick) -> dict:
    """A node lost for 1-3 s (a scenario needing a cluster; never drawn on soak's one node: ``allowed``)."""
    return {"action": ACTION, "node": rng.choice(("leader", "follower")), "at": pick.at,
            "duration": round(rng.uniform(1.0, 3.0), 2), "timeout": 60}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
            and e.get("target", "leader") == step.get("node", "leader")]
    return bool(done), f"{ACTION} on the {step.get('node', 'leader')} node {len(done)} times"
