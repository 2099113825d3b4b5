"""Operators: per-operator tokens (hashed) and the audit of every operator request's outcome (issue 23 defect 11).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

from reference.db.queries import schema_sql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(schema_sql("0004"))


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS operator_audit; DROP TABLE IF EXISTS operator_tokens;")
