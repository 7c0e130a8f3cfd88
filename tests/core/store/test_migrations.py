"""The migrations build exactly the schema that `core/sqlstore/schema.py` describes."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from nodbot.core import ApprovalRequest
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.sqlstore.engine import SQLITE_PAGE_SIZE
from nodbot.core.sqlstore.schema import metadata
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def differences(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection)
    return list(compare_metadata(context, metadata))


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_migrated_schema_matches_the_declared_one(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url:
        async with SqlApprovalStore(url) as store:
            engine = create_async_engine(store.url)
        try:
            async with engine.connect() as connection:
                found = await connection.run_sync(differences)
        finally:
            await engine.dispose()
    assert found == []


def page_size(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        size: int = db.execute("PRAGMA page_size").fetchone()[0]
    return size


async def test_a_new_sqlite_file_has_small_pages_and_an_older_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    new, old = tmp_path / "new.db", tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(old)) as db:  # a file made with SQLite's default
        db.execute("PRAGMA page_size = 4096")
        db.execute("CREATE TABLE made_before (x INTEGER)")
    for path in (new, old):
        async with SqlApprovalStore(f"sqlite:///{path}") as store:
            made = await store.create(
                ApprovalRequest(run_id="r", call_id="c", tool="t", arguments={}, digest="d")
            )
            assert (await store.get(made.approval_id)).status == "pending"
    assert page_size(new) == SQLITE_PAGE_SIZE == 2048
    assert page_size(old) == 4096
