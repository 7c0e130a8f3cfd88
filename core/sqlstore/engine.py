"""Database URLs, the SQLAlchemy engines that migrate the schema, and the translation of
driver failures into `StoreError`s that name the URL (never its password)."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from nodbot.core.errors import StoreUnavailableError

__all__ = [
    "DRIVER_ERRORS",
    "connect_error",
    "normalize_url",
    "open_engine",
    "redact",
    "translate_errors",
    "write_transaction",
]

_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",  # the common DATABASE_URL form (Heroku, Fly, Render)
}
_SUPPORTED = set(_DRIVERS.values())
# How long a SQLite writer waits for another process's write lock before giving up.
SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_PAGE_SIZE = 2048
"""Bytes per page of a new SQLite file (SQLite's default is 4096). The store's transactions
are small and many, and each commit writes every page it changed to the WAL: a review's row,
its indexes, its event, its run. With 1 KB pages a page holds two or three of the rows a
cycle adds (a review; an event, with its two hashes), so pages split and are allocated more
often: 29 frames of 1 KB an approval cycle, against 25 of 2 KB. Measured alternately
(bench/cycle.py's cycle, medians of 4 and of 6 rounds): 2 KB pages 1,804 and 1,531 cycles/s,
1 KB 1,748 and 1,485, 4 KB 1,526. A file made before keeps its size."""


def normalize_url(url: str | URL) -> URL:
    """The async URL for `url`: `sqlite:///x.db`, `postgresql://...` (or `postgres://...`),
    or a bare file path.

    Raises `StoreUnavailableError` for a URL nodbot cannot use.
    """
    if isinstance(url, str) and "://" not in url:
        url = f"sqlite+aiosqlite:///{Path(url).expanduser()}"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        shown = _mask_password(str(url))
        raise StoreUnavailableError(f"not a database URL: {shown} ({exc})", url=shown) from None
    driver = _DRIVERS.get(parsed.drivername, parsed.drivername)
    if driver not in _SUPPORTED:
        raise StoreUnavailableError(
            f"unsupported database {parsed.drivername!r} in {redact(parsed)}: "
            "use sqlite:///path.db or postgresql://user@host/db",
            url=redact(parsed),
        )
    parsed = parsed.set(drivername=driver)
    if driver == "sqlite+aiosqlite":
        _check_sqlite_file(parsed)
    return parsed


def _check_sqlite_file(url: URL) -> None:
    database = url.database or ""
    if database in ("", ":memory:") or "mode=memory" in database:
        raise StoreUnavailableError(
            "an in-memory SQLite database is private to one connection: use a file path, "
            "or MemoryApprovalStore",
            url=redact(url),
        )
    # Checked here rather than left to the driver, whose failed connections linger.
    path = Path(database.removeprefix("file:").split("?", 1)[0])
    if not path.parent.is_dir():
        raise StoreUnavailableError(
            f"cannot use the database {redact(url)}: the folder {path.parent} does not exist",
            url=redact(url),
        )


def _mask_password(text: str) -> str:
    """Hide the password of a URL that could not be parsed: `scheme://user:***@...`."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", text)


def redact(url: URL) -> str:
    """The URL as text, with any password replaced by `***`."""
    return url.render_as_string(hide_password=True)


def open_engine(url: URL) -> AsyncEngine:
    """An engine for `url`, used to migrate the schema. SQLite files get WAL (which persists
    in the file, for the store's own connection too), a busy timeout and IMMEDIATE
    transactions, so that processes migrating at once queue instead of failing."""
    if url.get_backend_name() != "sqlite":
        return create_async_engine(url, pool_pre_ping=False)
    engine = create_async_engine(url)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver: BEGIN is emitted in _on_begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        # Taken only by a file that has no page yet (then WAL fixes it for good).
        cursor.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


DRIVER_ERRORS = (
    OSError,  # TimeoutError and ConnectionError included
    SQLAlchemyError,
    sqlite3.Error,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,  # ConnectionDoesNotExistError: closed in the middle of a query
    # A pooled connection terminated under a query can be left in a state asyncpg's protocol
    # refuses ("cannot switch to state 15; another operation is in progress").
    asyncpg.InternalClientError,
)
"""What the drivers raise when the database cannot be used: each becomes a
`StoreUnavailableError`, so that no caller sees a driver's own exception."""


class translate_errors:
    """Turn driver failures into `StoreUnavailableError` naming the URL (no password).

    A class rather than a generator: it wraps every store operation.
    """

    __slots__ = ("url",)

    def __init__(self, url: URL) -> None:
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> None:
        if error is not None and isinstance(error, DRIVER_ERRORS):
            raise connect_error(self.url, error) from error


def connect_error(url: URL, exc: BaseException) -> StoreUnavailableError:
    """The error to raise for a driver failure on `url`."""
    shown = redact(url)
    reason = _reason(exc)
    if "readonly" in reason.replace("-", "").replace(" ", "").lower():
        return StoreUnavailableError(f"the database {shown} is read-only: {reason}", url=shown)
    return StoreUnavailableError(f"cannot use the database {shown}: {reason}", url=shown)


def _reason(exc: BaseException) -> str:
    original = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = str(original).strip().splitlines()
    return f"{type(original).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextlib.asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One read-write transaction (IMMEDIATE on SQLite)."""
    async with engine.begin() as connection:
        yield connection
