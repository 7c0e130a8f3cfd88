"""Schema management: the store's tables are created and upgraded by Alembic migrations that
ship in this package (`migrations/versions/`).

`ensure_schema` runs on a store's first use: it upgrades to the newest revision when
auto-migration is on, and otherwise refuses with the command to run. A database whose
revision this nodbot does not know (written by a newer nodbot) is always refused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from nodbot.core.errors import StoreSchemaError
from nodbot.core.sqlstore.engine import redact, translate_errors, write_transaction

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["MIGRATE_COMMAND", "ensure_schema", "head_revision"]

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
MIGRATE_COMMAND = "nodbot migrate --store URL"
# Serializes migrations of several processes on one PostgreSQL database (any constant works).
_PG_LOCK_KEY = 0x6E6F64626F74


# Alembic is imported where it is used: it is needed once per store, and importing it costs
# more than half a second, which every `import core` would otherwise pay.


def _config(connection: Connection | None = None, audit_key: str | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    # 0007 chains the events already there, with the key the store's new events get.
    config.attributes["audit_key"] = audit_key
    return config


def head_revision() -> str:
    """The newest schema revision this nodbot knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


async def ensure_schema(
    engine: AsyncEngine, url: URL, *, auto_migrate: bool, audit_key: str | None = None
) -> None:
    """Make sure the database has this nodbot's schema; an upgrade chains the events already
    there with `audit_key` (see `core.audit`). Raises `StoreSchemaError`, or
    `StoreUnavailableError` when the database cannot be used at all."""
    with translate_errors(url):
        async with write_transaction(engine) as connection:
            if connection.dialect.name == "postgresql":
                await connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY}
                )
            await connection.run_sync(_check_and_upgrade, redact(url), auto_migrate, audit_key)


def _check_and_upgrade(
    connection: Connection, shown_url: str, auto_migrate: bool, audit_key: str | None
) -> None:
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    config = _config(connection, audit_key)
    scripts = ScriptDirectory.from_config(config)
    head = scripts.get_current_head()
    current = MigrationContext.configure(connection).get_current_revision()
    if current == head:
        # One line at each start, whatever alembic says (its lines are debug ones).
        log.info("store up to date at revision %s", head, extra={"store": shown_url})
        return
    if current is not None:
        try:
            scripts.get_revision(current)
        except CommandError:
            raise StoreSchemaError(
                f"the database {shown_url} has schema revision {current!r}, which this nodbot "
                f"does not know (its newest is {head!r}): it was written by a newer nodbot; "
                "upgrade nodbot to use it",
                url=shown_url,
            ) from None
    if not auto_migrate:
        state = "has no nodbot schema" if current is None else f"has schema revision {current!r}"
        raise StoreSchemaError(
            f"the database {shown_url} {state}, and this nodbot needs {head!r}; "
            f"run `{MIGRATE_COMMAND}` (or turn auto-migration on)",
            url=shown_url,
        )
    command.upgrade(config, "head")
    applied = len(list(scripts.iterate_revisions(head, current or "base")))
    log.info(
        "store migrated to revision %s (%d migration%s applied)",
        head,
        applied,
        "" if applied == 1 else "s",
        extra={"store": shown_url, "from_revision": current},
    )
