"""The cluster's shared databases are closed to tenant roles once per server start, not once per role: two REVOKEs
of one database's privileges at the same moment fail with "tuple concurrently updated" (a broken variant's run
failed its setup so when variants made their tenants three at once). A fake connection stands in for the server."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from harness.stack import postgres as postgres_mod
from harness.stack.postgres import Postgres


class _Conn:
    def __init__(self, log, failures):
        self.log, self.failures = log, failures

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, statement, params=None):
        text = statement if isinstance(statement, str) else repr(statement)
        if "revoke all on database postgres" in text and self.failures:
            self.failures.pop()
            raise psycopg.errors.InternalError_("tuple concurrently updated")
        self.log.append(text)

        class _Result:
            @staticmethod
            def fetchone():
                return None

        return _Result()


def _server(monkeypatch, failures):
    log: list[str] = []
    monkeypatch.setattr(postgres_mod.psycopg, "connect", lambda *a, **k: _Conn(log, failures))
    monkeypatch.setattr(postgres_mod.time, "sleep", lambda seconds: None)
    return Postgres(root=Path("/nonexistent"), log_dir=Path("/nonexistent"), port=1), log


def test_a_role_made_after_the_server_was_waited_for_revokes_nothing_shared(monkeypatch):
    server, log = _server(monkeypatch, [])
    server.close_shared_databases()  # what wait_ready does once the server answers
    log.clear()
    server.create_role("tenant_a", "secret")
    assert not any("revoke" in line for line in log), log


def test_the_shared_revoke_is_tried_again_on_a_concurrent_update(monkeypatch):
    server, log = _server(monkeypatch, [True, True])
    server.close_shared_databases()
    assert server.shared_closed and sum("revoke all on database postgres" in line for line in log) == 1


def test_a_server_started_elsewhere_gets_its_shared_databases_closed_with_its_first_role(monkeypatch):
    server, log = _server(monkeypatch, [])
    server.create_role("tenant_a", "secret")
    assert any("revoke all on database template1" in line for line in log) and server.shared_closed


def test_a_lasting_error_is_raised(monkeypatch):
    server, _ = _server(monkeypatch, [True] * 5)
    with pytest.raises(psycopg.errors.InternalError_):
        server.close_shared_databases()
