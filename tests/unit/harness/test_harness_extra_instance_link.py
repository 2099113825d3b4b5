"""An extra instance's links (chaos/context.py start_extra_instance): by default a copy of its role's first instance,
own proxied links included (a toxic with ``role`` reaches it too); with ``link = "tenant"`` the URL variables its
role's own proxies replaced are the tenant's again, so a role-scoped toxic reaches the first instance only."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from chaos.context import FaultContext
from chaos.kinds import start_instance

TENANT = {"DATABASE_URL": "postgresql://h:5001/t", "AMQP_URL": "amqp://h:5002/t", "S3_ENDPOINT_URL": "http://h:5003"}
ROLE_LINK = {"DATABASE_URL": "postgresql://h:6001/t"}  # the worker's own proxy to postgres (a toxic with role)


class Supervisor:
    def __init__(self):
        self.instances = {"worker": SimpleNamespace(role="worker", command=["w"],
                                                    env={**TENANT, "X": "1", **ROLE_LINK}),
                          "api": SimpleNamespace(role="api", command=["a"], env=dict(TENANT))}
        self.started = []

    def add(self, name, role, command, env):
        self.instances[name] = SimpleNamespace(role=role, command=command, env=env)

    def start(self, name, extra):
        self.started.append(name)


def context():
    notes = []
    ctx = FaultContext(adapter=SimpleNamespace(), seed=7, windows=[], schedule=[], supervisor=Supervisor(),
                       history=SimpleNamespace(append=lambda type_, **f: notes.append((type_, f))), stack=None,
                       broker=None, base_url="", stopping=threading.Event(), log=lambda m: None,
                       instance_env=lambda name, role: {"METRICS_PORT": "9"},
                       tenant_links={"worker": {"DATABASE_URL": TENANT["DATABASE_URL"]}})
    return ctx, notes


def test_default_copies_the_role_links():
    ctx, notes = context()
    name = ctx.start_extra_instance("worker")
    env = ctx.supervisor.instances[name].env
    assert name == "worker#2" and env["DATABASE_URL"] == ROLE_LINK["DATABASE_URL"]
    assert env["X"] == "1" and env["METRICS_PORT"] == "9"
    assert not notes


def test_tenant_link_gives_back_the_tenant_urls():
    ctx, notes = context()
    name = ctx.start_extra_instance("worker", link="tenant")
    env = ctx.supervisor.instances[name].env
    assert env["DATABASE_URL"] == TENANT["DATABASE_URL"]  # not the worker's own proxy
    assert env["AMQP_URL"] == TENANT["AMQP_URL"] and env["X"] == "1" and env["METRICS_PORT"] == "9"
    assert ctx.supervisor.instances["worker"].env["DATABASE_URL"] == ROLE_LINK["DATABASE_URL"]  # the first keeps its
    assert notes and notes[0][1]["role"] == name and "link = tenant: DATABASE_URL" in notes[0][1]["message"]


def test_unknown_link_refused():
    ctx, _ = context()
    with pytest.raises(ValueError):
        ctx.start_extra_instance("worker", link="own")


def test_start_instance_step_passes_link():
    ctx, _ = context()
    ctx.adapter = SimpleNamespace(expand_roles=lambda names, windows=None: ["worker"])
    ctx.wait_trigger = lambda step, delay=0.0: True
    start_instance.run(ctx, {"action": "start_instance", "role": "worker", "link": "tenant", "index": 0})
    assert ctx.supervisor.instances["worker#2"].env["DATABASE_URL"] == TENANT["DATABASE_URL"]
