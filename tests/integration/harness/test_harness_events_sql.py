"""[events] sql on a real database (harness/events_sql.py): the tenant's own role, the direct address, a READ ONLY
transaction and a statement timeout. On the session stack: a few seconds."""

from __future__ import annotations

import psycopg
import pytest

from harness.events_sql import SqlEvents, with_credentials_of

pytestmark = pytest.mark.integration

ID = "5F1D2C3B-8A9E-4B7C-9D0E-1F2A3B4C5D6E"


def test_transitions_are_read_as_the_tenant_read_only_and_bounded(stack, tenant):
    roles = tenant.env(proxied=True)["DATABASE_URL"]
    url = with_credentials_of(tenant.env(proxied=False)["DATABASE_URL"], roles)
    with psycopg.connect(url, autocommit=True) as conn:  # the service's own table, its own names
        conn.execute("CREATE TABLE task_log (seq bigserial PRIMARY KEY, file_id uuid, from_status text, "
                     "to_status text, at timestamptz DEFAULT now(), attempt int, actor text, reason text)")
        conn.execute("INSERT INTO task_log (file_id, from_status, to_status, attempt, actor, reason) VALUES "
                     "(%s, NULL, 'PENDING', 0, 'api', 'uploaded'), (%s, 'PENDING', 'RUNNING', 1, 'w1', 'claimed')",
                     (ID, ID))
    sql = ('SELECT seq, at, from_status AS "from", to_status AS "to", attempt, actor, reason FROM task_log '
           'WHERE file_id = %(attachment_id)s::uuid ORDER BY seq')
    reader = SqlEvents(url, sql)
    try:
        events = reader.read(ID.lower())
        assert [(e["seq"], e["from"], e["to"], e["attempt"]) for e in events] == [
            (1, None, "PENDING", 0), (2, "PENDING", "RUNNING", 1)]
        assert events[0]["at"].endswith("Z") and events[1]["actor"] == "w1"
        writer = SqlEvents(url, "DELETE FROM task_log WHERE file_id = %(attachment_id)s::uuid RETURNING seq, "
                                'from_status AS "from", to_status AS "to", at')
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            writer.read(ID)
        assert len(reader.read(ID)) == 2  # nothing deleted; the reader reconnects after another's error
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not the administrator: no server files
            SqlEvents(url, "SELECT pg_read_file('PG_VERSION') AS \"from\", '' AS \"to\", now() AS at "
                           "WHERE %(attachment_id)s::text IS NOT NULL").read(ID)
        slow = SqlEvents(url, "SELECT NULL AS \"from\", 'x' AS \"to\", now() AS at FROM pg_sleep(5) "
                              "WHERE %(attachment_id)s::text IS NOT NULL", timeout_ms=300)
        with pytest.raises(psycopg.errors.QueryCanceled):
            slow.read(ID)
    finally:
        reader.close()
