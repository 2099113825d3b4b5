"""Deadline per execution (jobs.claimed_at) and the indexes of retention (issue 23, production expectations).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

from reference.db.queries import schema_sql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(schema_sql("0005"))


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS dlq_replays_by_time; DROP INDEX IF EXISTS replay_audit_by_time; "
               "DROP INDEX IF EXISTS attachment_events_by_job; DROP INDEX IF EXISTS jobs_finished; "
               "DROP INDEX IF EXISTS jobs_claims; ALTER TABLE jobs DROP COLUMN IF EXISTS claimed_at;")
