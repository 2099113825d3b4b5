"""``partition_broker_node``: on a RabbitMQ cluster stack, cut one node — the work queue's quorum ``leader`` or a
``follower`` (``node``) — off from every role for ``duration`` seconds: its Toxiproxy proxy (this run's own) is
disabled, so every connection through it ends and no new one gets through; the node itself keeps running and stays
in the cluster. Roles must reconnect through another node (AMQP_URLS).

Out of reach: a partition *between* nodes (the Erlang distribution links). All nodes run on one loopback
interface; cutting their distribution traffic needs network namespaces or packet filtering (root), which the
private stack does not use. So the cluster itself never splits here: only the link from the implementation to
one node is cut."""

from __future__ import annotations

from . import first_delay
from ._broker_nodes import not_on_one_node, resolve, watch_while_lost

ACTION = "partition_broker_node"
RECORDS = ("fault action=partition_broker_node phase=start (service, node, target, leader) and phase=end; "
           "fault action=toxic toxic=cut on that node's service")


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    chosen = resolve(ctx, step)
    ctx.log(f"cutting RabbitMQ node {chosen['node']} ({chosen['target']}) off from every role "
            f"for {step.get('duration', 3)}s")
    ctx.history.append("fault", action=ACTION, phase="start", how="cut", **chosen)
    ctx.network.apply(chosen["service"], "cut")
    watch_while_lost(ctx, chosen, float(step.get("duration", 3)))
    ctx.network.remove(chosen["service"], "cut", None)
    ctx.history.append("fault", action=ACTION, phase="end", service=chosen["service"], node=chosen["node"])


WEIGHT = 1
allowed = not_on_one_node


def draw(rng, pick) -> dict:
    """A node cut off for 3-6 s (a scenario needing a cluster; never drawn on soak's one node: ``allowed``)."""
    return {"action": ACTION, "node": rng.choice(("leader", "follower")), "at": pick.at,
            "duration": round(rng.uniform(3.0, 6.0), 2)}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
            and e.get("target", "leader") == step.get("node", "leader")]
    return bool(done), f"{ACTION} on the {step.get('node', 'leader')} node {len(done)} times"
