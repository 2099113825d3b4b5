"""`harness stack up --rabbitmq-nodes 3`, without starting anything: every node its own ports, data and name, one
shared epmd and private cookie, the later nodes seeded with the first, a Toxiproxy proxy in front of each, the
stop order by PID, and AMQP_URLS only on a cluster."""

from __future__ import annotations

from harness.stack.data_dir import remove_data_dir
from harness.stack.stack import Stack, stop_order


def test_a_three_node_stack_is_laid_out_before_it_starts(tmp_path):
    stack = Stack.create(tmp_path / "run", rabbitmq_nodes=3)
    try:
        nodes = stack.rabbitmq_nodes
        assert [n.label for n in nodes] == ["rabbitmq", "rabbitmq-2", "rabbitmq-3"]
        assert len({n.node_name for n in nodes}) == 3 and len({n.amqp_port for n in nodes}) == 3
        assert len({n.root for n in nodes}) == 3 and {n.epmd_port for n in nodes} == {stack.rabbitmq.epmd_port}
        assert [n.own_epmd for n in nodes] == [True, False, False]
        assert nodes[0].cookie and {n.cookie for n in nodes} == {nodes[0].cookie}
        for node in nodes[1:]:
            node.init()
            config = (node.root / "rabbitmq.conf").read_text()
            assert "classic_config" in config and f"nodes.1 = {nodes[0].node_name}" in config
            assert (node.root / "home" / ".erlang.cookie").read_text() == nodes[0].cookie
        assert {"rabbitmq", "rabbitmq-2", "rabbitmq-3"} <= set(stack.proxy_ports)
        assert stack.service_names() == ["postgres", "rabbitmq", "s3", "rabbitmq-2", "rabbitmq-3"]
        urls = stack.proxied.amqp_urls.split(",")
        assert len(urls) == 3 and urls[0] == stack.proxied.amqp_url
        assert [n["service"] for n in stack.describe()["rabbitmq_nodes"]] == ["rabbitmq", "rabbitmq-2", "rabbitmq-3"]
    finally:
        remove_data_dir(stack.data_dir)


def test_one_node_stays_the_default_without_amqp_urls(tmp_path):
    stack = Stack.create(tmp_path / "run")
    try:
        assert stack.rabbitmq_peers == [] and stack.proxied.amqp_urls == ""
        assert "rabbitmq_nodes" not in stack.describe()
        stack.rabbitmq.init()
        assert "classic_config" not in (stack.rabbitmq.root / "rabbitmq.conf").read_text()
    finally:
        remove_data_dir(stack.data_dir)


def test_cluster_nodes_stop_after_the_first_and_before_epmd():
    order = stop_order(["postgres", "rabbitmq", "rabbitmq-3", "rabbitmq-2", "epmd", "s3", "toxiproxy"])
    assert order.index("rabbitmq") < order.index("rabbitmq-2") < order.index("rabbitmq-3") < order.index("epmd")
    assert stop_order(["rabbitmq", "epmd"]) == ["toxiproxy", "s3", "postgres", "rabbitmq", "epmd"]
