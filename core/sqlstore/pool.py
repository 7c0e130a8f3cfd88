"""asyncpg's pool, with connections that broke under a query thrown away.

When the server ends a session under a running query (`pg_terminate_backend`, a restart, a
failover), asyncpg can hand the connection back to its pool in a state its protocol refuses
("cannot switch to state 11; another operation is in progress"), and every later query that
gets that connection fails the same way: one broken connection of ten fails a tenth of all
operations, for good. `GuardedPool` terminates a connection whose query failed for any reason
but a statement's own error (a constraint, a cast), so the pool opens a fresh one in its
place.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

__all__ = ["GuardedPool"]

_SESSION_ENDED = (
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.OperatorInterventionError,  # class 57: admin shutdown, terminated, crash
)


def _broken(error: Exception) -> bool:
    """Whether the connection cannot be trusted after `error`."""
    return not isinstance(error, asyncpg.PostgresError) or isinstance(error, _SESSION_ENDED)


class GuardedPool:
    """The few pool methods the store uses, each on a connection checked after use."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[PoolConnectionProxy]:
        async with self._pool.acquire() as connection:
            try:
                yield connection
            except Exception as error:
                if _broken(error):
                    # Released closed, the pool connects anew. A connection asyncpg saw
                    # closing is detached already (its proxy refuses every call): nothing to do.
                    with contextlib.suppress(asyncpg.InterfaceError):
                        connection.terminate()
                raise

    async def fetch(self, query: str, *arguments: Any) -> list[asyncpg.Record]:
        async with self.acquire() as connection:
            return list(await connection.fetch(query, *arguments))

    async def fetchrow(self, query: str, *arguments: Any) -> asyncpg.Record | None:
        async with self.acquire() as connection:
            return await connection.fetchrow(query, *arguments)

    async def fetchval(self, query: str, *arguments: Any) -> Any:
        async with self.acquire() as connection:
            return await connection.fetchval(query, *arguments)

    async def execute(self, query: str, *arguments: Any) -> str:
        async with self.acquire() as connection:
            return str(await connection.execute(query, *arguments))

    async def close(self) -> None:
        await self._pool.close()
