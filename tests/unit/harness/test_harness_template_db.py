"""Template databases ([setup] template = true): the decision, the key, the fallback and the serialised clones,
without services (a Stack over fake services). The real PostgreSQL side: tests/integration/stack/
test_stack_template_db.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness import adapter as adapter_mod
from harness import run_setup, tenants_ahead, timing
from harness.adapter_check import check
from harness.schemas import REPO_ROOT
from harness.stack.stack import DatabaseTemplate, ServiceUrls, Stack, Tenant

REFERENCE = REPO_ROOT / "reference" / "adapter.toml"


def _opted_in(tmp_path: Path, value: str = "true", source: Path = REFERENCE) -> Path:
    """A copy of an adapter file with ``template = <value>`` in its [setup] (commands resolved from its folder)."""
    text = source.read_text().replace("{adapter_dir}", str(source.parent))
    text = text.replace("[setup]\n", f"[setup]\ntemplate = {value}\n", 1)
    path = tmp_path / "adapter.toml"
    path.write_text(text)
    return path


class _Scenario:
    def __init__(self, name: str = "s", timings: dict | None = None) -> None:
        self.name = name
        self.raw = {"timings": timings or {}}


# --- the key is opt-in only -------------------------------------------------------------------------------------
def _shipped_adapters() -> list[Path]:
    return [REFERENCE, REPO_ROOT / "examples" / "go-pipeline" / "adapter.toml",
            *sorted((REPO_ROOT / "tests" / "broken").glob("*/adapter.toml")),
            *sorted((REPO_ROOT / "tests" / "cheats").glob("*/adapter.toml"))]


class _Spy:
    run_dir = Path("/nonexistent")

    def database_template(self, key, make):  # pragma: no cover - must not be reached
        raise AssertionError("a template asked for an adapter that did not opt in")


def test_no_shipped_adapter_opts_in_so_each_keeps_its_per_tenant_setup():
    paths = _shipped_adapters()
    assert len(paths) > 30
    for path in paths:
        sut = adapter_mod.load(path)
        assert not sut.setup_template, path

        assert run_setup.database_template(sut, _Scenario(), 4, _Spy()) == (None, 0.0), path


def test_the_key_is_accepted_by_the_schema_and_adapter_check_only_as_a_boolean(tmp_path):
    sut = adapter_mod.load(_opted_in(tmp_path))
    assert sut.setup_template
    report = check(_opted_in(tmp_path), level=4)
    assert not [p for p in report.problems if p.field.startswith("setup")], report.problems
    with pytest.raises(adapter_mod.AdapterError, match="template"):
        adapter_mod.load(_opted_in(tmp_path, '"yes"'))
    assert any(p.field == "setup.template" for p in check(_opted_in(tmp_path, '"yes"'), level=4).problems)


def test_adapter_check_warns_that_a_template_setup_declares_no_queue_in_a_tenant(tmp_path):
    # The reference's relay declares the topology at start, but the check cannot know that: with template = true the
    # setup command no longer runs in a tenant's vhost, so the same warning as without [setup] is due.
    plain = check(REFERENCE, level=4)
    opted = check(_opted_in(tmp_path), level=4)
    assert not [w for w in plain.warnings if w.field == "setup"]
    assert [w for w in opted.warnings if w.field == "setup" and "template = true" in w.reason]


# --- the key of a template ---------------------------------------------------------------------------------------
def test_the_template_key_leaves_out_the_tenant_and_keeps_what_the_setup_sees(tmp_path):
    sut = adapter_mod.load(_opted_in(tmp_path))
    base = run_setup.template_key(sut, _Scenario("a"), 4)
    assert run_setup.template_key(sut, _Scenario("b"), 4) == base  # another scenario, same environment: shared
    # A scenario whose [timings] reach the environment (job_ttl_seconds -> JOB_TTL_SECONDS) has one of its own.
    assert run_setup.template_key(sut, _Scenario("ttl", {"job_ttl_seconds": 3}), 4) != base
    assert run_setup.template_key(sut, _Scenario("a"), 5) != base  # LEVEL is in the setup's environment
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    assert run_setup.template_key(adapter_mod.load(_opted_in(other_dir)), _Scenario("a"), 4) != base  # its path
    changed = adapter_mod.Adapter(path=sut.path, raw={**sut.raw, "setup": {**sut.setup, "command": ["x", "migrate"]}})
    assert run_setup.template_key(changed, _Scenario("a"), 4) != base
    with_env = adapter_mod.Adapter(path=sut.path, raw={**sut.raw, "setup": {**sut.setup, "env": {"A": "1"}}})
    assert run_setup.template_key(with_env, _Scenario("a"), 4) != base
    # Every variable a tenant (one node or a cluster) hands the setup is left out of the key.
    urls = ServiceUrls("postgresql://h/db", "amqp://h/v", "http://h:1", "amqp://h:1/v,amqp://h:2/v")
    tenant = Tenant("t", urls, urls, "bucket", "http://m", "v")
    _, env = run_setup.run_environment(sut, _Scenario("a"), 4, tenant, 8123, "/tmp/x")
    tenant_specific = {k for k in env if k in tenant.env() or k in ("HTTP_PORT", "TMPDIR")}
    assert tenant_specific - {"S3_ACCESS_KEY", "S3_SECRET_KEY"} <= set(run_setup.TENANT_VARIABLES)
    assert {"DATABASE_URL", "AMQP_URLS", "S3_BUCKET", "HTTP_PORT", "TMPDIR"} <= tenant_specific


# --- the stack's side, over fake services ------------------------------------------------------------------------
class _Postgres:
    port = 5000

    def __init__(self, fail_clone: bool = False) -> None:
        self.created: list[tuple[str, str | None]] = []
        self.sealed: list[str] = []
        self.dropped: list[str] = []
        self.fail_clone = fail_clone
        self.copying = 0
        self.overlaps = 0
        self.lock = threading.Lock()
        self.roles: list[str] = []

    def url(self, database: str = "postgres", port: int | None = None, user: str = "h", password: str = "h") -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{port or self.port}/{database}"

    def create_role(self, name: str, password: str) -> None:
        self.roles.append(name)

    def create_database(self, name: str, template: str | None = None, owner: str | None = None) -> None:
        if template:
            with self.lock:
                self.copying += 1
                self.overlaps += self.copying > 1  # PostgreSQL refuses a template another session is on
            time.sleep(0.02)
            with self.lock:
                self.copying -= 1
            if self.fail_clone:
                raise RuntimeError("source database is being accessed by other users")
        with self.lock:
            self.created.append((name, template))

    def seal_template(self, name: str) -> None:
        self.sealed.append(name)

    def drop_template(self, name: str) -> None:
        self.dropped.append(name)


class _RabbitMQ:
    amqp_port, management_url = 5001, "http://127.0.0.1:5002"

    def amqp_url(self, vhost: str, port: int | None = None, user: str = "h", password: str = "h") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{port or self.amqp_port}/{vhost}"

    def create_vhost(self, name: str) -> None:
        pass

    def create_user(self, user: str, password: str, vhost: str) -> None:
        pass


class _S3:
    s3_port = 5003

    def endpoint_url(self, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.s3_port}"

    def create_bucket(self, name: str) -> None:
        pass

    def create_credentials(self, bucket: str) -> tuple[str, str]:
        return f"key-{bucket}", f"secret-{bucket}"

    def remove_credentials(self, bucket: str) -> None:
        pass


class _Toxi:
    def __init__(self) -> None:
        self.proxies: set[str] = set()
        self.next = 6000

    def client(self):
        return self

    def create_proxy(self, name: str, upstream: int) -> int:
        self.proxies.add(name)
        self.next += 1
        return self.next

    def scoped(self, names: dict):
        toxi = self

        class _Scoped:
            def close(self) -> None:
                toxi.proxies -= set(names.values())
        return _Scoped()


def _stack(tmp_path: Path, postgres: _Postgres | None = None) -> Stack:
    return Stack(tmp_path, tmp_path, postgres or _Postgres(), _RabbitMQ(), _S3(), _Toxi(),
                 {"postgres": 7001, "rabbitmq": 7002, "s3": 7003})


def test_a_template_is_made_once_per_key_and_sealed_and_tenants_are_cloned_from_it(tmp_path):
    stack = _stack(tmp_path)
    calls: list[str] = []

    def make(tenant):
        calls.append(tenant.env()["DATABASE_URL"])
        time.sleep(0.05)
        return True, 0.05, "setup.log"

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(stack.database_template("ab" * 32, make))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and calls[0].endswith("/tpl_abababababababab")  # its tenant's shape, its own database
    assert sorted(made for _, made in got) == [False, False, False, True]
    template = got[0][0]
    assert template.ok and stack.postgres.sealed == [template.database]
    assert not stack.toxiproxy_server.proxies  # the template's private proxies are gone once it is made
    tenant = stack.new_tenant("h1-run-a", private_proxies=True, template=template)
    assert tenant.template == template.database and ("h1_run_a", template.database) in stack.postgres.created
    plain = stack.new_tenant("h1-run-b", private_proxies=True)  # no template given: an empty database, as before
    assert plain.template == "" and ("h1_run_b", None) in stack.postgres.created
    stats = stack.template_stats()
    assert stats[0]["clones"] == 1 and stats[0]["ok"] and stack.template_stats(keys=set()) == []
    stack.drop_templates()
    assert stack.postgres.dropped == [template.database]


def test_tenants_made_in_parallel_copy_the_template_one_at_a_time(tmp_path):
    stack = _stack(tmp_path)
    template, _ = stack.database_template("cd" * 32, lambda tenant: (True, 0.0, ""))
    threads = [threading.Thread(target=stack.new_tenant, args=(f"t{i}",), kwargs={"template": template})
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert template.clones == 6 and stack.postgres.overlaps == 0


def test_a_failed_template_setup_is_not_used_nor_tried_again(tmp_path):
    stack = _stack(tmp_path)
    calls = []
    template, made = stack.database_template("ef" * 32, lambda tenant: calls.append(1) or (False, 1.0, "tpl.log"))
    assert made and not template.ok and "setup command failed" in template.error
    again, made_again = stack.database_template("ef" * 32, lambda tenant: calls.append(1) or (True, 1.0, ""))
    assert again is template and not made_again and len(calls) == 1
    assert stack.postgres.sealed == []
    tenant = stack.new_tenant("h2-run", private_proxies=True, template=template)
    assert tenant.template == "" and ("h2_run", None) in stack.postgres.created  # empty: the run runs its setup


def test_a_template_that_cannot_be_made_or_copied_falls_back_to_an_empty_database(tmp_path):
    stack = _stack(tmp_path, _Postgres(fail_clone=True))

    def broken(tenant):
        raise OSError("no such program")

    template, _ = stack.database_template("01" * 32, broken)
    assert not template.ok and "OSError" in template.error
    good, _ = stack.database_template("23" * 32, lambda tenant: (True, 0.1, ""))
    tenant = stack.new_tenant("h3-run", template=good)  # the copy fails: made empty, the run runs its setup
    assert tenant.template == "" and ("h3_run", None) in stack.postgres.created
    assert good.clones == 0 and good.clone_errors


# --- the grade's and the run's side -------------------------------------------------------------------------------
class _AheadStack:
    def __init__(self) -> None:
        self.kwargs: list[dict] = []

    def new_tenant(self, name: str, private_proxies: bool = False, **kwargs):
        self.kwargs.append(kwargs)
        return type("T", (), {"name": name, "template": kwargs.get("template") and "tpl_x" or ""})()

    def close_tenant(self, tenant) -> None:
        pass


def test_tenants_made_ahead_are_cloned_and_the_setup_time_counts_once():
    template = DatabaseTemplate("k" * 64, "tpl_x", ok=True, done=True)
    asked = []

    def make(name):
        asked.append(name)
        return template, (1.5 if len(asked) == 1 else 0.0)  # the first made it: 1.5 s of setup, once

    stack = _AheadStack()
    ahead = tenants_ahead.TenantsAhead(stack, 1, ["a", "b", "c"], depth=3, template=make,
                                       prepare=lambda name, tenant: None)
    deadline = time.monotonic() + 5
    while len(ahead.ready) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = ahead.close()
    assert asked == ["a", "b", "c"] and all(k == {"template": template} for k in stack.kwargs)
    assert stats["setup_seconds"] == 1.5
    plain = _AheadStack()  # no template callback (an adapter that did not opt in): new_tenant exactly as before
    tenants_ahead.TenantsAhead(plain, 1, ["a"], depth=1).close()
    assert all(k == {} for k in plain.kwargs)


def test_a_cloned_tenant_gets_no_setup_run_ahead(tmp_path):
    sut = adapter_mod.load(_opted_in(tmp_path))
    cloned = type("T", (), {"template": "tpl_x"})()
    assert run_setup.prepare_ahead(sut, _Scenario(), 4, cloned) is None  # nothing run (it would need a stack)


def test_where_the_time_went_shows_the_setup_once_and_the_clones():
    summary = timing.summarise([("a", {"setup": 2.0}, {"tenant": 0.3, "setup_command": 1.2}),
                                ("b", {"setup": 0.4}, {"tenant": 0.3})], wall=5.0,
                               extra={"templates": [{"database": "tpl_1", "ok": True, "setup_seconds": 1.2,
                                                     "make_seconds": 1.4, "clones": 2, "clone_seconds": 0.2}]})
    tail = timing.table_lines(summary)[-1]
    assert "database templates: the setup command ran 1 time (1.2s, 1.4s with their tenants)" in tail
    assert "2 tenants cloned from them in 0.2s (0.10s each)" in tail
    failed = timing.summarise([("a", {"setup": 2.0}, {})], extra={"templates": [
        {"database": "tpl_2", "ok": False, "error": "the setup command failed in the template"}]})
    assert "not used (the setup command failed in the template)" in timing.table_lines(failed)[-1]
