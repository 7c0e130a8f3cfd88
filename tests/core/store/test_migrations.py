"""The migrations build exactly the schema that `core/sqlstore/schema.py` describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from nodbot.core.sqlstore import SqlApprovalStore
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
