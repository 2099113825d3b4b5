"""The environment a private RabbitMQ node runs in (nothing is started here)."""

from __future__ import annotations

from pathlib import Path

from harness.stack.rabbitmq import RabbitMQ


def test_no_erlang_vm_of_the_node_starts_an_epmd_of_its_own(tmp_path: Path):
    """The stack runs the node's epmd itself, in the foreground, stopped by PID. An Erlang VM left to start one runs
    `epmd -daemon`, which leaves the node's process group for a session of its own: in a CI rehearsal, one started
    while an interrupted boot was being stopped took the epmd port and outlived the stack (the lifecycle test's
    `nothing_left_running` finds such a process by the data folder in its environment)."""
    node = RabbitMQ(root=tmp_path / "rabbitmq", log_dir=tmp_path / "logs", amqp_port=1, management_port=2,
                    dist_port=3, epmd_port=4)
    env = node._env()
    assert env["ERL_FLAGS"].split() == ["-start_epmd", "false"]
    assert env["ERL_EPMD_PORT"] == "4"
