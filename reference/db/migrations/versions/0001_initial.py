"""Initial schema: attachments, jobs, results, events, outbox, idempotency, replay audit.

Revision ID: 0001
Revises:
"""

from alembic import op

from reference.db.queries import schema_sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(schema_sql("0001"))


def downgrade() -> None:
    op.execute(
        "DROP TABLE IF EXISTS replay_audit, idempotency_keys, outbox, attachment_events, results, jobs, "
        "attachments CASCADE;"
        "DROP FUNCTION IF EXISTS outbox_notify();"
    )
