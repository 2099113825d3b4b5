"""Which RabbitMQ node of a cluster stack a broker-node fault takes: the work queue's quorum leader (as the
management API reports it) or one of its followers (chosen by the run's seed). Shared by ``kill_broker_node`` and
``partition_broker_node``."""

from __future__ import annotations

import random
import time


class NoCluster(RuntimeError):
    pass


def resolve(ctx, step) -> dict:
    """{"service": stack service of the node ("rabbitmq", "rabbitmq-2", ...), "node", "target", "leader",
    "members"}. The leader is asked of the management API at the moment of the fault."""
    nodes = list(getattr(ctx.stack, "rabbitmq_nodes", []) or [])
    if len(nodes) < 2:
        raise NoCluster(f"{step['action']} needs a RabbitMQ cluster (scenario rabbitmq_nodes >= 2); "
                        "this stack has one node")
    label_of = {n.node_name: n.label for n in nodes}
    queue = ctx.adapter.broker["work_queue"]
    info = None
    for _ in range(20):  # the queue may not be declared yet, or a leader election may be under way
        info = ctx.broker.management.queue_leader(queue)
        if info and info.get("leader") in label_of:
            break
        time.sleep(0.25)
    target = step.get("node", "leader")
    leader = (info or {}).get("leader")
    members = sorted((info or {}).get("members") or label_of)
    if target == "leader":
        if leader not in label_of:
            raise RuntimeError(f"the work queue {queue!r} reports no leader node (not a quorum queue, or not "
                               f"declared): cannot tell which node leads it")
        node = leader
    else:
        followers = sorted(n for n in members if n != leader and n in label_of)
        if not followers:
            raise RuntimeError(f"the work queue {queue!r} has no follower on another node (members {members})")
        node = random.Random(f"{ctx.seed}-{step.get('index', 0)}-follower").choice(followers)
    return {"service": label_of[node], "node": node, "target": target, "leader": leader, "members": members,
            "connections": connections(ctx)}


def connections(ctx) -> dict[str, int] | None:
    """The implementation's connections per node (None when the management API could not say)."""
    try:
        return ctx.broker.management.connections_by_node()
    except Exception:
        return None


def watch_while_lost(ctx, chosen: dict, seconds: float, interval: float = 0.5) -> None:
    """While the node is lost, count the work queue's consumers exactly (a passive declare through another node,
    direct, not through any proxy) and the implementation's connections on the other nodes (management API):
    ``queue kind=node_lost`` lines. Consumers and connections back while the node is still lost show the roles
    failed over to another node (``broker_failover``)."""
    from harness.broker import amqp_queue_depth

    others = [url for url, node in zip(str(ctx.broker.amqp_urls).split(","),
                                       [n.node_name for n in ctx.stack.rabbitmq_nodes]) if node != chosen["node"]]
    queue = ctx.adapter.broker["work_queue"]
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        exact = None
        for url in others:
            exact = amqp_queue_depth(url, queue, timeout=2.0)
            if exact is not None:
                break
        by_node = connections(ctx)
        ctx.history.append("queue", kind="node_lost", queue=queue, dead_letter=False, node=chosen["node"],
                           target=chosen["target"], ready=(exact or {}).get("ready"),
                           consumers=(exact or {}).get("consumers"),
                           connections_elsewhere=None if by_node is None else
                           sum(n for node, n in by_node.items() if node != chosen["node"]))
        time.sleep(max(0.0, min(interval, seconds - (time.monotonic() - began))))


def not_on_one_node(adapter, level: int) -> str:
    """``allowed`` of the broker-node kinds: `harness soak` and `harness explore` run on a one-node stack."""
    return "needs a RabbitMQ cluster (a scenario with rabbitmq_nodes = 3); soak and explore run on one node"
