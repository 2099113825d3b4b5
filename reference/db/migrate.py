"""`reference migrate`: Alembic upgrade to head, serialised by an advisory lock
so that several roles may run it at once; idempotent."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from alembic import command
from alembic.config import Config

if TYPE_CHECKING:
    from reference.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
MIGRATION_LOCK_ID = 7_340_001  # arbitrary, constant: the advisory lock of schema changes


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["sqlalchemy_url"] = settings.sqlalchemy_url
    return config


def upgrade_head(settings: Settings) -> None:
    with psycopg.connect(settings.psycopg_conninfo, autocommit=True,
                         connect_timeout=max(1, int(settings.db_connect_timeout_seconds))) as lock_conn:
        lock_conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_ID,))
        try:
            command.upgrade(alembic_config(settings), "head")
        finally:
            lock_conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_ID,))
