"""Dead-letter replays: the audit of operator replays from the dead-letter queue; index of queued jobs by deadline
(issue 12: BE-JOB-003 controlled replay, BE-JOB-005 expiry by the sweeper).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

from reference.db.queries import schema_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(schema_sql("0003"))


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS dlq_replays; DROP INDEX IF EXISTS jobs_queued_expiry;")
