"""Template databases on a real PostgreSQL ([setup] template = true): the adapter's setup command runs once, against
a template database of its own; tenants are copies of it (CREATE DATABASE … TEMPLATE), with its schema, and
independent of each other. An adapter without the key keeps its setup command in every tenant."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import psycopg
import pytest

from harness import adapter as adapter_mod
from harness import run_setup
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

SETUP = '''
import os, sys
import psycopg
url = os.environ["DATABASE_URL"]
with open(sys.argv[1], "a") as runs:
    runs.write(url.rsplit("/", 1)[1] + "\\n")
with psycopg.connect(url, autocommit=True) as conn:
    conn.execute("create table if not exists migrated (id int primary key)")
    conn.execute("insert into migrated values (1) on conflict do nothing")
'''


class _Scenario:
    name = "template-db"
    raw = {"timings": {}}


def _adapter(tmp_path: Path, template: bool) -> adapter_mod.Adapter:
    """The reference's adapter file with a setup command of its own (it records each database it ran in)."""
    (tmp_path / "setup.py").write_text(SETUP)
    text = (REPO_ROOT / "reference" / "adapter.toml").read_text()
    text = text.replace('command = ["reference", "migrate"]',
                        f'command = ["{{python}}", "{tmp_path / "setup.py"}", "{tmp_path / "runs.txt"}"]'
                        + ("\ntemplate = true" if template else ""), 1)
    (tmp_path / "adapter.toml").write_text(text)
    return adapter_mod.load(tmp_path / "adapter.toml")


def _rows(url: str) -> list[int]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return [r[0] for r in conn.execute("select id from migrated order by id")]


def _runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs.txt"
    return path.read_text().split() if path.exists() else []


def test_a_template_made_once_gives_tenants_its_schema_each_independent(stack, tmp_path):
    sut = _adapter(tmp_path, template=True)
    template, made = run_setup.database_template(sut, _Scenario(), 4, stack)
    assert template is not None and template.ok and made > 0, template
    again, made_again = run_setup.database_template(sut, _Scenario(), 4, stack)
    assert again is template and made_again == 0.0
    assert _runs(tmp_path) == [template.database]  # the setup ran once, against the template's own database
    # Two tenants made at once: their copies of the template are made one at a time (no session left on it).
    tenants: list = []
    threads = [threading.Thread(target=lambda: tenants.append(
        stack.new_tenant(f"tpl-clone-{uuid.uuid4().hex[:6]}", private_proxies=True, template=template)))
        for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(tenants) == 2 and all(t.template == template.database for t in tenants), template.clone_errors
        a, b = tenants
        assert _rows(a.direct.database_url) == [1] and _rows(b.direct.database_url) == [1]
        with psycopg.connect(a.proxied.database_url, autocommit=True) as conn:  # through the tenant's own proxy
            conn.execute("insert into migrated values (2)")
        assert _rows(a.direct.database_url) == [1, 2] and _rows(b.direct.database_url) == [1]
        assert run_setup.prepare_ahead(sut, _Scenario(), 4, a) is None  # a copy: nothing to run in it
        assert _runs(tmp_path) == [template.database]
        with pytest.raises(psycopg.OperationalError):  # sealed: no run can change what the next tenants copy
            psycopg.connect(stack.postgres.url(template.database), connect_timeout=5).close()
        assert template.clones == 2 and any(s["database"] == template.database for s in stack.template_stats())
    finally:
        for tenant in tenants:
            stack.close_tenant(tenant)
        stack.drop_templates()
    with psycopg.connect(stack.postgres.url(), connect_timeout=5) as conn:
        assert conn.execute("select 1 from pg_database where datname = %s", (template.database,)).fetchone() is None


def test_an_adapter_without_the_key_keeps_its_setup_in_every_tenant(stack, tmp_path):
    sut = _adapter(tmp_path, template=False)
    assert run_setup.database_template(sut, _Scenario(), 4, stack) == (None, 0.0)
    tenant = stack.new_tenant(f"tpl-plain-{uuid.uuid4().hex[:6]}", private_proxies=True)
    try:
        assert tenant.template == ""
        prepared = run_setup.prepare_ahead(sut, _Scenario(), 4, tenant)  # the setup, run in this tenant
        assert prepared is not None
        prepared.discard()
        assert _runs(tmp_path) == [tenant.direct.database_url.rsplit("/", 1)[1]]
        assert _rows(tenant.direct.database_url) == [1]
    finally:
        stack.close_tenant(tenant)
