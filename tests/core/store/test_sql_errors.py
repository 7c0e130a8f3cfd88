"""Bad databases get a clear error that names the URL (never its password) and change nothing."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from nodbot.core import ApprovalRequest, StoreSchemaError, StoreUnavailableError, arguments_digest
from nodbot.core.sqlstore import MIGRATE_COMMAND, SqlApprovalStore, head_revision
from tests.core.store.conftest import database_url
from tests.support import free_port, postgres_database

ROOT = Path(__file__).resolve().parents[3]
SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def request(call_id: str = "call_1") -> ApprovalRequest:
    arguments = {"to": "a@example.com"}
    return ApprovalRequest("run_1", call_id, "send", arguments, arguments_digest(arguments))


async def table_names(url: str) -> set[str]:
    store = SqlApprovalStore(url, auto_migrate=False)
    engine = create_async_engine(store.url)
    try:
        async with engine.connect() as connection:
            names = await connection.run_sync(lambda sync: set(sync.dialect.get_table_names(sync)))
    finally:
        await engine.dispose()
    return names


async def test_unreachable_postgresql_names_the_url_without_password() -> None:
    url = f"postgresql://nodbot:s3cret@127.0.0.1:{free_port()}/nodbot"
    store = SqlApprovalStore(url)
    with pytest.raises(StoreUnavailableError) as raised:
        await store.create(request())
    message = str(raised.value)
    assert f"postgresql+asyncpg://nodbot:***@127.0.0.1:{url.split(':')[3]}" in message
    assert "s3cret" not in message
    assert "s3cret" not in raised.value.url
    await store.close()


def test_missing_sqlite_directory_is_unavailable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'nodbot.db'}"
    with pytest.raises(StoreUnavailableError, match=r"cannot use the database sqlite.*does not"):
        SqlApprovalStore(url)


async def test_read_only_sqlite_file_is_refused_and_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.db"
    async with SqlApprovalStore(f"sqlite:///{path}") as store:
        first = await store.create(request("call_1"))
    before = path.read_bytes()
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    store = SqlApprovalStore(read_only)
    assert (await store.get(first.approval_id)).approval_id == first.approval_id  # reads work
    with pytest.raises(StoreUnavailableError, match="is read-only") as raised:
        await store.create(request("call_2"))
    assert str(path) in raised.value.url
    await store.close()
    assert path.read_bytes() == before
    with sqlite3.connect(path) as connection:
        assert connection.execute("select count(*) from approvals").fetchone() == (1,)
        assert connection.execute("select count(*) from events").fetchone() == (1,)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_schema_from_a_newer_nodbot_is_refused(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url:
        async with SqlApprovalStore(url) as store:
            await store.create(request())
            engine = create_async_engine(store.url)
            async with engine.begin() as connection:
                await connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
            await engine.dispose()
        for auto_migrate in (True, False):
            newer = SqlApprovalStore(url, auto_migrate=auto_migrate)
            with pytest.raises(StoreSchemaError, match=r"'9999'.*newer nodbot") as raised:
                await newer.create(request("call_2"))
            assert raised.value.url == newer.display_url
            await newer.close()
        reader = SqlApprovalStore(url)
        with pytest.raises(StoreSchemaError):
            await reader.list()  # reads are refused too
        await reader.close()
        engine = create_async_engine(reader.url)
        async with engine.connect() as connection:
            count = await connection.scalar(text("SELECT count(*) FROM approvals"))
        await engine.dispose()
        assert count == 1


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_without_auto_migration_an_empty_database_is_refused(
    backend: str, tmp_path: Path
) -> None:
    async with database_url(backend, tmp_path) as url:
        store = SqlApprovalStore(url, auto_migrate=False)
        with pytest.raises(StoreSchemaError) as raised:
            await store.open()
        assert "has no nodbot schema" in str(raised.value)
        assert MIGRATE_COMMAND in str(raised.value)
        await store.close()
        assert "approvals" not in await table_names(url)
        async with SqlApprovalStore(url) as migrating:
            await migrating.create(request())
        async with SqlApprovalStore(url, auto_migrate=False) as ready:
            assert len(await ready.list()) == 1


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_events_are_append_only_in_the_database(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url, SqlApprovalStore(url) as store:
        await store.create(request())
        engine = create_async_engine(store.url)
        try:
            for statement in ("UPDATE events SET kind = 'decided'", "DELETE FROM events"):
                with pytest.raises(Exception, match="append-only"):
                    async with engine.begin() as connection:
                        await connection.execute(text(statement))
        finally:
            await engine.dispose()
        assert [event.kind for event in await store.events()] == ["created"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@127.0.0.1/test", "unsupported database 'mysql'"),
        ("sqlite://", "in-memory SQLite"),
        ("sqlite:///:memory:", "in-memory SQLite"),
        ("postgresql://u:p@:bad:port/x", "not a database URL"),
    ],
)
def test_unusable_urls_are_refused_at_once(url: str, message: str) -> None:
    with pytest.raises(StoreUnavailableError, match=message) as raised:
        SqlApprovalStore(url)
    assert "u:p@" not in str(raised.value)


@pytest.mark.postgres
async def test_a_postgres_url_as_hosts_give_it_is_a_postgresql_store() -> None:
    # `postgres://` is the scheme of many hosts' DATABASE_URL.
    async with postgres_database() as url:
        given = url.replace("postgresql://", "postgres://", 1)
        assert given.startswith("postgres://")
        async with SqlApprovalStore(given) as store:
            assert store.display_url.startswith("postgresql+asyncpg://")
            record = await store.create(request())
            assert (await store.get(record.approval_id)).status == "pending"


def test_a_bare_path_means_a_sqlite_file(tmp_path: Path) -> None:
    store = SqlApprovalStore(str(tmp_path / "nodbot.db"))
    assert store.display_url == f"sqlite+aiosqlite:///{tmp_path / 'nodbot.db'}"


def test_head_revision_is_the_newest_migration() -> None:
    versions = Path(SqlApprovalStore.__module__.replace(".", "/")).parent / "migrations/versions"
    newest = max(path.name for path in (ROOT / versions).glob("[0-9]*.py"))
    assert head_revision() == newest.split("_", 1)[0]


def hold_write_lock(path: Path) -> sqlite3.Connection:
    """Another writer, as another process would be: it holds SQLite's write lock."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


async def test_sqlite_writer_waits_for_another_without_blocking_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.db"
    async with SqlApprovalStore(f"sqlite:///{path}") as store:
        other = hold_write_lock(path)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        async def release() -> None:
            await asyncio.sleep(0.2)
            other.execute("COMMIT")

        ticker = asyncio.create_task(tick())
        releaser = asyncio.create_task(release())
        record = await store.create(request())
        await releaser
        ticker.cancel()
        assert record.status == "pending"
        assert ticks >= 10  # the loop ran other work while the write waited
        other.close()


async def test_sqlite_writer_gives_up_after_the_lock_timeout(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.db"
    async with SqlApprovalStore(f"sqlite:///{path}", lock_timeout=0.1) as store:
        other = hold_write_lock(path)
        try:
            with pytest.raises(StoreUnavailableError, match="database is locked") as raised:
                await store.create(request())
            assert str(path) in raised.value.url
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert await store.list() == []
