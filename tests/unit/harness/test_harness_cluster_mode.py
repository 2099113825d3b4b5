"""Cluster mode (issue 13): the broker_failover checker over hand-made histories, the grade skipping cluster
scenarios on a one-node stack, the kinds' node choice, the firehose and management reads on every node, and the
delivery trace gap a killed node leaves."""

from __future__ import annotations

import httpx
import pytest
from harness_histories import ATT, JOB, Builder, happy, job_message

from harness import adapter, scenarios
from harness.checkers import CHECKERS, broker_failover, delivery_accounting, fault_coverage
from harness.broker import FailoverClient, Management

NODE = "harness-1@localhost"
OTHER = "harness-2@localhost"


def lost_node(b: Builder, at: float, until: float, consumers, connections_on_node=3, action="partition_broker_node",
              target="leader"):
    """A node lost from ``at`` to ``until``, looked at every 0.5 s: ``consumers(t)`` through another node."""
    b.add(at, "fault", action=action, phase="start", node=NODE, target=target, service="rabbitmq",
          connections={NODE: connections_on_node, OTHER: 2})
    t = at + 0.1
    while t < until:
        b.add(t, "queue", kind="node_lost", node=NODE, target=target, consumers=consumers(t), ready=0,
              connections_elsewhere=1 if consumers(t) else 0)
        t += 0.5
    b.add(until, "fault", action=action, phase="end", node=NODE, service="rabbitmq")


def scenario(checks=("broker_failover",)):
    return {"name": "cluster-node-partitioned", "checks": list(checks)}


def test_roles_that_reconnect_elsewhere_are_valid_and_exercised():
    b = happy(0.0, builder=Builder(scenario=scenario()))
    lost_node(b, 0.5, 5.0, lambda t: 0 if t < 1.0 else 1)
    verdict = broker_failover.check(b.history(), b.final, b.run)
    assert verdict.status == "valid" and verdict.exercised, verdict.summary


def test_consumers_that_wait_for_their_node_are_invalid():
    b = happy(0.0, builder=Builder(scenario=scenario()))
    lost_node(b, 0.5, 5.0, lambda t: 0)
    verdict = broker_failover.check(b.history(), b.final, b.run)
    assert verdict.status == "invalid" and "no consumer" in verdict.summary
    assert verdict.evidence[0]["role"] == "worker"


def test_a_publisher_that_waits_for_its_node_is_invalid():
    b = Builder(scenario=scenario())
    lost_node(b, 0.5, 5.0, lambda t: 1)
    b.upload(0.8)  # accepted while the node is lost, more than GRACE before its last look
    b.add(5.6, "message", body=job_message(JOB, ATT), properties={})  # published only once it was back
    verdict = broker_failover.check(b.history(), b.final, b.run)
    assert verdict.status == "invalid" and "no job message published" in verdict.summary
    assert verdict.evidence[0]["attachment_ids"] == [ATT]


def test_a_publish_while_the_node_is_lost_is_valid():
    b = Builder(scenario=scenario())
    lost_node(b, 0.5, 5.0, lambda t: 1)
    b.upload(0.8)
    b.add(1.2, "message", body=job_message(JOB, ATT), properties={})
    assert broker_failover.check(b.history(), b.final, b.run).status == "valid"


def test_an_empty_connection_listing_is_not_taken_for_nothing_to_fail_over():
    """The management API listed no connection at the loss (its statistics lag behind roles just started), and no
    consumer came back for the whole outage: stuck, not idle (seen with the Go example, which reads AMQP_URL
    alone; the first version of this checker called it "nothing had to fail over")."""
    b = Builder(scenario=scenario())
    lost_node(b, 0.5, 5.0, lambda t: 0, connections_on_node=0)
    b.events[0]["connections"] = {}
    verdict = broker_failover.check(b.history(), b.final, b.run)
    assert verdict.status == "invalid", verdict.summary


def test_nothing_on_the_lost_node_is_not_exercised_and_too_short_is_unknown():
    b = Builder(scenario=scenario())
    lost_node(b, 0.5, 5.0, lambda t: 1, connections_on_node=0)
    verdict = broker_failover.check(b.history(), b.final, b.run)
    assert verdict.status == "valid" and not verdict.exercised
    b = Builder(scenario=scenario())
    lost_node(b, 0.5, 1.6, lambda t: 0)  # a second of looks: a reconnect may still be under way
    assert broker_failover.check(b.history(), b.final, b.run).status == "unknown"
    b = Builder(scenario=scenario(checks=()))
    assert broker_failover.check(b.history(), b.final, b.run).exercised is False  # no node lost at all
    assert "broker_failover" in CHECKERS


def test_a_killed_node_is_a_trace_gap_and_its_fault_is_covered():
    """The firehose is per node and off on a node that comes back: the kill is a gap until the tap restores it
    (failed before this change: only a whole-broker restart_service was a gap)."""
    b = Builder()
    lost_node(b, 0.5, 3.0, lambda t: 1, action="kill_broker_node")
    b.add(3.5, "observe", source="firehose", tracing_restored=True)
    assert delivery_accounting.trace_gaps(b.history()) == [(b.events[0]["wall"], b.events[-1]["wall"])]
    done, why = fault_coverage._happened({"action": "kill_broker_node", "node": "leader"}, b.history())
    assert done, why
    done, why = fault_coverage._happened({"action": "kill_broker_node", "node": "follower"}, b.history())
    assert not done


def test_a_grade_on_one_node_skips_cluster_scenarios_with_the_reason():
    catalogue = scenarios.catalogue()
    cluster = {s.name for s in catalogue if s.rabbitmq_nodes > 1}
    assert {"cluster-follower-killed", "cluster-leader-killed", "cluster-node-partitioned"} <= cluster
    chosen, skipped = scenarios.for_grade(catalogue, adapter.load("reference"), 4)
    assert not cluster & {s.name for s in chosen}
    reasons = {s.name: why for s, why in skipped}
    assert all("3-node RabbitMQ cluster" in reasons[name] for name in cluster)
    chosen, _ = scenarios.for_grade(catalogue, adapter.load("reference"), 4, rabbitmq_nodes=3)
    assert cluster <= {s.name for s in chosen}


def _transport(down: set[str], tracing: dict[str, bool], calls: list):
    def handler(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        calls.append((request.method, host, request.url.path))
        if host in down:
            raise httpx.ConnectError("refused", request=request)
        if request.method == "PUT" and request.url.path.startswith("/api/vhosts/"):
            tracing[host] = True
            return httpx.Response(204)
        if request.url.path.startswith("/api/vhosts/"):
            return httpx.Response(200, json={"tracing": tracing.get(host, False)})
        return httpx.Response(200, json={"leader": OTHER, "members": [NODE, OTHER]})
    return httpx.MockTransport(handler)


def test_management_on_a_cluster_fails_over_and_turns_the_firehose_on_at_every_node(monkeypatch):
    urls = ["http://127.0.0.1:1001", "http://127.0.0.1:1002", "http://127.0.0.1:1003"]
    calls, tracing, down = [], {}, {"127.0.0.1:1001"}
    real = httpx.Client

    def client(**options):
        return real(transport=_transport(down, tracing, calls), **options)
    monkeypatch.setattr(httpx, "Client", client)
    m = Management(urls[0], "amqp://u:p@127.0.0.1:5/vh", management_urls=urls)
    assert isinstance(m.client, FailoverClient) and m.clustered
    assert m.queue_leader("q")["leader"] == OTHER  # node 1 is down: the next one answered
    m.enable_tracing()
    assert tracing == {"127.0.0.1:1002": True, "127.0.0.1:1003": True}
    assert m.tracing_on()
    down.clear()  # node 1 is back, its firehose off: not on everywhere any more
    assert not m.tracing_on()
    single = Management(urls[0], "amqp://u:p@127.0.0.1:5/vh")
    assert not single.clustered


class _Ctx:
    def __init__(self, leader=NODE):
        class Node:
            def __init__(self, name, label):
                self.node_name, self.label = name, label
        self.stack = type("S", (), {"rabbitmq_nodes": [Node(NODE, "rabbitmq"), Node(OTHER, "rabbitmq-2"),
                                                      Node("harness-3@localhost", "rabbitmq-3")]})()
        self.adapter = type("A", (), {"broker": {"work_queue": "q"}})()
        self.seed = 4242
        members = [NODE, OTHER, "harness-3@localhost"]
        management = type("M", (), {"queue_leader": lambda _s, q: {"leader": leader, "members": members},
                                    "connections_by_node": lambda _s: {leader: 2}})()
        self.broker = type("B", (), {"management": management})()


def test_the_leader_and_a_seeded_follower_are_resolved_from_the_management_api():
    from chaos.kinds import REGISTRY
    from chaos.kinds._broker_nodes import NoCluster, resolve

    assert {"kill_broker_node", "partition_broker_node"} <= set(REGISTRY)
    leader = resolve(_Ctx(), {"action": "kill_broker_node", "node": "leader", "index": 0})
    assert leader["service"] == "rabbitmq" and leader["connections"] == {NODE: 2}
    follower = resolve(_Ctx(), {"action": "kill_broker_node", "node": "follower", "index": 0})
    assert follower["node"] != NODE and follower == resolve(_Ctx(), {"action": "kill_broker_node",
                                                                     "node": "follower", "index": 0})
    one = _Ctx()
    one.stack.rabbitmq_nodes = one.stack.rabbitmq_nodes[:1]
    with pytest.raises(NoCluster):
        resolve(one, {"action": "kill_broker_node", "node": "leader"})
