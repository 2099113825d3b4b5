"""Alembic environment of the reference. The URL comes from the caller
(reference.db.migrate) through config.attributes, never from an ini file."""

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config
url = str(config.attributes.get("sqlalchemy_url") or config.get_main_option("sqlalchemy.url") or "")


def run_migrations_offline() -> None:
    context.configure(url=url, literal_binds=True, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
