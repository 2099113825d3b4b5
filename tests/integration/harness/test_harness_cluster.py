"""The distributed engine: a private 3-node RabbitMQ cluster (`harness stack up --rabbitmq-nodes 3`) and the three
cluster scenarios on the reference — a follower node killed, the work queue's quorum leader killed, the leader
node cut off from every role — each valid, with no accepted upload lost and the relay and worker failing over
to another node (AMQP_URLS)."""

from __future__ import annotations

import json
import time

import pytest

from harness import adapter, scenarios
from harness.runner import ScenarioRun
from harness.stack import Stack

pytestmark = pytest.mark.integration

SCENARIOS = ("cluster-follower-killed", "cluster-leader-killed", "cluster-node-partitioned")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    began = time.monotonic()
    started = Stack.start(tmp_path_factory.mktemp("cluster"), rabbitmq_nodes=3)
    print(f"\n[cluster] 3 nodes ready in {time.monotonic() - began:.1f}s: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in started.ready_seconds.items()))
    yield started
    started.stop()


def test_cluster_stack_has_three_nodes_each_behind_its_own_proxy(cluster):
    want = sorted(n.node_name for n in cluster.rabbitmq_nodes)
    assert len(want) == 3 and cluster.rabbitmq.cluster_nodes() == want
    tenant = cluster.new_tenant("cluster-shape", private_proxies=True)
    try:
        env = tenant.env()
        urls = env["AMQP_URLS"].split(",")
        assert len(urls) == 3 and urls[0] == env["AMQP_URL"] and len(set(urls)) == 3
        assert {"rabbitmq", "rabbitmq-2", "rabbitmq-3"} <= set(tenant.proxy_names)
        assert len(tenant.rabbitmq_management_urls) == 3
    finally:
        cluster.close_tenant(tenant)


@pytest.mark.parametrize("name", SCENARIOS)
def test_cluster_scenario_is_valid_on_the_reference(cluster, name, tmp_path):
    scenario = scenarios.find(name)
    assert scenario.rabbitmq_nodes == 3
    run = ScenarioRun(scenario, adapter.load("reference"), cluster, 4242, 4, run_dir=tmp_path / name,
                      progress=print)
    results = run.execute()
    failing = {v["invariant"]: v["summary"] for v in results["verdicts"] if v["status"] != "valid"}
    assert results["verdict"] == "valid", (failing, results.get("error"))
    verdicts = {v["invariant"]: v for v in results["verdicts"]}
    # Node loss with nothing lost: every accepted upload terminal, the fault really happened.
    assert verdicts["lost_accepted_work"]["status"] == "valid"
    assert verdicts["fault_coverage"]["status"] == "valid"
    # The relay and the worker moved to another node: the lost leader held their connections (the reference
    # connects to the first node of AMQP_URLS, where it also declared the queue, so the queue's leader is there).
    if name != "cluster-follower-killed":
        assert verdicts["broker_failover"]["exercised"], verdicts["broker_failover"]["summary"]
    faults = [json.loads(line) for line in (tmp_path / name / "history.jsonl").read_text().splitlines()
              if '"fault"' in line]
    action = "partition_broker_node" if "partitioned" in name else "kill_broker_node"
    assert any(f.get("action") == action and f.get("phase") == "start" for f in faults), faults
