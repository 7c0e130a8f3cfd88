"""The PostgreSQL store's connections: a small pool of its own, with broken ones thrown away.

Why not `asyncpg.Pool`: handing a connection out and taking it back cost 25-40 µs of CPU
there (its holders, futures and timeouts on every acquire and release), a third of the
Python side of an approval cycle's four statements. Here an idle connection is a deque pop
and a push; a connection is made only when none is idle and fewer than `max_size` are open.

Why connections are thrown away: when the server ends a session under a running query
(`pg_terminate_backend`, a restart, a failover), the connection can be left in a state its
protocol refuses ("cannot switch to state 11; another operation is in progress"), and every
later query on it fails the same way: one broken connection of ten would fail a tenth of all
operations, for good. A connection whose use ended in any error but a statement's own (a
constraint, a cast), or in a cancellation, or still inside a transaction, is terminated and
forgotten, and the next acquire opens a fresh one in its place.

The store never changes session state (no SET, LISTEN or session locks), so a connection
goes back to the pool as it is, without asyncpg's reset round trip.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

__all__ = ["GuardedPool"]

_SESSION_ENDED = (
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.OperatorInterventionError,  # class 57: admin shutdown, terminated, crash
)


def _broken(error: BaseException) -> bool:
    """Whether the connection cannot be trusted after `error`."""
    return not isinstance(error, asyncpg.PostgresError) or isinstance(error, _SESSION_ENDED)


class PoolClosed(asyncpg.InterfaceError):
    """The pool was closed: no connection is handed out any more."""


class GuardedPool:
    """Up to `max_size` connections to `dsn`, handed out one task at a time."""

    def __init__(
        self, dsn: str, *, max_size: int = 10, server_settings: dict[str, str] | None = None
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, not {max_size}")
        self._dsn = dsn
        self._max_size = max_size
        self._server_settings = dict(server_settings or {})
        self._idle: collections.deque[asyncpg.Connection] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._open = 0  # connections open or being opened, idle or in use
        self._closed = False

    @classmethod
    async def connect(
        cls, dsn: str, *, max_size: int = 10, server_settings: dict[str, str] | None = None
    ) -> GuardedPool:
        """A pool with one connection open already, so that a wrong address, a refused
        login or a missing database is an error here rather than at the first query."""
        pool = cls(dsn, max_size=max_size, server_settings=server_settings)
        async with pool.acquire():
            pass
        return pool

    @property
    def size(self) -> int:
        """The connections open (or being opened) now."""
        return self._open

    @property
    def waiting(self) -> int:
        """The tasks waiting for a connection now."""
        return sum(not waiter.done() for waiter in self._waiters)

    @property
    def saturated(self) -> bool:
        """Whether the next acquire would wait: every connection is in use (`max_size` of
        them), or tasks are waiting for one already."""
        return self.waiting > 0 or (not self._idle and self._open >= self._max_size)

    async def _take(self) -> asyncpg.Connection:
        while True:
            if self._closed:
                raise PoolClosed("the store's connection pool is closed")
            while self._idle:
                connection = self._idle.pop()  # the most recently used: warm, and the
                if not connection.is_closed():  # others may time out idle on the server
                    return connection
                self._open -= 1
            if self._open < self._max_size:
                self._open += 1
                try:
                    return await asyncpg.connect(self._dsn, server_settings=self._server_settings)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                # Woken and cancelled at once: pass the turn on, or it is lost.
                if waiter.done() and not waiter.cancelled():
                    self._wake()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise

    def _wake(self) -> None:
        """Let the longest waiter try again: a connection went idle or a place came free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _give_back(self, connection: asyncpg.Connection, trusted: bool) -> None:
        if not trusted or self._closed or connection.is_closed():
            # Terminated, the server ends the session; the place is free for a new one.
            connection.terminate()
            self._open -= 1
        else:
            self._idle.append(connection)
        self._wake()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        connection = await self._take()
        trusted = False
        try:
            yield connection
            trusted = not connection.is_in_transaction()
        except BaseException as error:
            trusted = not _broken(error) and not connection.is_in_transaction()
            raise
        finally:
            self._give_back(connection, trusted)

    async def _run(self, method: str, query: str, arguments: tuple[Any, ...]) -> Any:
        # The single statements the store sends most, without a context manager's frames.
        connection = await self._take()
        trusted = False
        try:
            result = await getattr(connection, method)(query, *arguments)
            trusted = True
            return result
        except BaseException as error:
            trusted = not _broken(error) and not connection.is_in_transaction()
            raise
        finally:
            self._give_back(connection, trusted)

    async def fetch(self, query: str, *arguments: Any) -> list[asyncpg.Record]:
        return list(await self._run("fetch", query, arguments))

    async def fetchrow(self, query: str, *arguments: Any) -> asyncpg.Record | None:
        record: asyncpg.Record | None = await self._run("fetchrow", query, arguments)
        return record

    async def fetchval(self, query: str, *arguments: Any) -> Any:
        return await self._run("fetchval", query, arguments)

    async def execute(self, query: str, *arguments: Any) -> str:
        return str(await self._run("execute", query, arguments))

    async def close(self) -> None:
        """Close the idle connections now and each one in use when it comes back; whoever
        waits for a connection gets `PoolClosed`."""
        self._closed = True
        idle, self._idle = list(self._idle), collections.deque()
        self._open -= len(idle)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosed("the store's connection pool is closed"))
        for connection in idle:
            try:
                await asyncio.wait_for(connection.close(), timeout=5)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                connection.terminate()
