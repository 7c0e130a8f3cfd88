"""Alembic's entry point. nodbot runs migrations itself (`core.sqlstore.migrations`), always
on a connection it opened and locked: there is no offline (SQL script) mode."""

from __future__ import annotations

from alembic import context

from nodbot.core.sqlstore.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
