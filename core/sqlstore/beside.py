"""The base of the store's side tables (`sessions.py`, `remembered.py`, `run_states.py`): each
has an engine of its own, made on first use once the store has checked (or migrated) the
schema, so the store's hot path, which goes straight to the drivers, is left alone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from nodbot.core.sqlstore.engine import translate_errors
from nodbot.core.store import utc_now

__all__ = ["BesideTheStore"]


class BesideTheStore:
    """An engine on the store's database at `url`: `ready` opens the store before the first
    use, a SQLite write waits up to `lock_timeout` seconds for another writer, and every
    failure of the database is a `StoreUnavailableError` (`translate_errors`)."""

    def __init__(
        self,
        url: URL,
        *,
        ready: Callable[[], Awaitable[object]],
        clock: Callable[[], datetime] = utc_now,
        lock_timeout: float = 30.0,
    ) -> None:
        self._url = url
        self._ready = ready
        self._clock = clock
        self._lock_timeout = lock_timeout
        self._engine: AsyncEngine | None = None
        self._opening = asyncio.Lock()

    async def close(self) -> None:
        """Close the connections; they are opened again on the next use."""
        engine, self._engine = self._engine, None
        if engine is not None:
            with translate_errors(self._url):
                await engine.dispose()

    async def _opened(self) -> AsyncEngine:
        if self._engine is not None:
            return self._engine
        async with self._opening:
            if self._engine is None:
                await self._ready()
                self._engine = self._connect()
        return self._engine

    def _connect(self) -> AsyncEngine:
        if self._url.get_backend_name() == "sqlite":
            # The schema check set WAL on the file; reads then never wait for writers.
            return create_async_engine(self._url, connect_args={"timeout": self._lock_timeout})
        return create_async_engine(self._url)

    async def _rows(self, query: Any) -> Sequence[Row[Any]]:
        """The rows of a read (`query`), on a connection of this table's engine."""
        engine = await self._opened()
        with translate_errors(self._url):
            async with engine.connect() as connection:
                return list((await connection.execute(query)).all())
