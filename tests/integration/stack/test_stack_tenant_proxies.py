"""Each run's own Toxiproxy proxies: a fault on one tenant's proxy never reaches another tenant on the same stack
(what lets a grade run scenarios side by side), and closing a tenant removes its proxies."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from harness.stack.ports import port_listening

pytestmark = pytest.mark.integration


def _port(url: str) -> int:
    return int(url.rsplit("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def _query_ok(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute("select 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def test_a_cut_on_one_tenants_proxy_leaves_the_other_tenant_connected(stack):
    a = stack.new_tenant(f"proxy-a-{uuid.uuid4().hex[:6]}", private_proxies=True)
    b = stack.new_tenant(f"proxy-b-{uuid.uuid4().hex[:6]}", private_proxies=True)
    try:
        assert a.proxy_names["postgres"] != b.proxy_names["postgres"] != "postgres"
        assert _port(a.proxied.database_url) not in (_port(b.proxied.database_url), stack.proxy_ports["postgres"])
        assert _query_ok(a.proxied.database_url) and _query_ok(b.proxied.database_url)
        faults_a = stack.tenant_toxiproxy(a)
        faults_a.cut("postgres")
        assert not faults_a.is_clean()
        assert not _query_ok(a.proxied.database_url)
        assert _query_ok(b.proxied.database_url)  # b's proxy is untouched
        assert stack.tenant_toxiproxy(b).is_clean() and stack.toxiproxy.toxics("postgres") == []
        faults_a.latency("s3", ms=50)
        faults_a.reset()  # only a's proxies: enabled again, toxics gone
        assert faults_a.is_clean() and _query_ok(a.proxied.database_url)
    finally:
        stack.close_tenant(a)
        stack.close_tenant(b)
    names = set(stack.toxiproxy.proxies())
    assert not names & (set(a.proxy_names.values()) | set(b.proxy_names.values()))
    assert not port_listening(_port(a.proxied.database_url))  # its listener closed with it
    assert {"postgres", "rabbitmq", "s3"} <= names  # the shared proxies stay


def test_a_tenant_without_private_proxies_uses_the_shared_ones(stack):
    tenant = stack.new_tenant(f"proxy-shared-{uuid.uuid4().hex[:6]}")
    assert tenant.proxy_names == {"postgres": "postgres", "rabbitmq": "rabbitmq", "s3": "s3"}
    assert _port(tenant.proxied.database_url) == stack.proxy_ports["postgres"]
    stack.close_tenant(tenant)  # nothing private to remove; the shared proxies stay
    assert {"postgres", "rabbitmq", "s3"} <= set(stack.toxiproxy.proxies())
