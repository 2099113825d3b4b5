"""Staged uploads: the staging sweep's own record, dated by the database clock (issue 10, defects 10 and 11).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

from reference.db.queries import schema_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(schema_sql("0002"))


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS staged_uploads;")
