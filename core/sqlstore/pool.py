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

Why an idle connection is checked before it is handed out: a session the server ends while
its connection is idle says goodbye (a FATAL error) and then closes its socket. asyncpg reads
the goodbye as soon as it arrives, its protocol then refuses every statement ("cannot switch
to state 12; another operation (2) is in progress"), but the connection looks open until the
close has been read too, an event-loop turn or more later (longer when the close is slow to
arrive). After each `pg_terminate_backend` of a busy bot's sessions, a few statements met
such a connection. So the pool sits between each connection's transport and asyncpg's
protocol (`_Heard`), keeps the last bytes the server sent, and hands an idle connection out
only when they end with the answer that left it idle (a ReadyForQuery, not in a
transaction): a connection the server spoke on unasked is terminated instead. This is exact,
unlike a peek at the socket, and costs a slice of each read.

And why a statement is sent again: a statement whose connection failed before asyncpg sent
it has not run, so `fetch`, `fetchval`, `fetchrow` and `execute` send it once more on
another connection, a few times at most. Not sent is known two ways: asyncpg refused to
begin an operation ("cannot switch to state ..."), which it does before writing anything,
and the statement's own operation is always its call's last (after a preparation, or a
look at new types, which change nothing); or the connection was lost with `queries_count`
unchanged (asyncpg counts a statement once its messages are written). A statement that may
have been sent is never sent again here: whether it ran is unknown, and it is the caller's
to decide. A transaction (`acquire`) is the caller's too: it begins on a connection
checked as above, and its failures are raised; a session that ended between two of its
statements as `SessionEnded`, a lost connection, rather than as the protocol's refusal.

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

__all__ = ["GuardedPool", "PoolClosed", "SessionEnded"]

_SESSION_ENDED = (
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.OperatorInterventionError,  # class 57: admin shutdown, terminated, crash
)

_IDLE = b"Z\x00\x00\x00\x05I"
"""ReadyForQuery, not in a transaction: the last message of every answer that leaves a
connection fit to go back to the pool."""

_SENDS = 3
"""How many connections a statement is tried on when it could not be sent on the first."""


def _broken(error: BaseException) -> bool:
    """Whether the connection cannot be trusted after `error`."""
    return not isinstance(error, asyncpg.PostgresError) or isinstance(error, _SESSION_ENDED)


def _refused(error: BaseException | None) -> bool:
    """Whether `error` is asyncpg's protocol refusing to begin an operation (after the
    server's goodbye): raised before the operation sends anything."""
    return isinstance(error, asyncpg.InternalClientError) and str(error).startswith(
        "cannot switch to state"
    )


class PoolClosed(asyncpg.InterfaceError):
    """The pool was closed: no connection is handed out any more."""


class SessionEnded(asyncpg.ConnectionDoesNotExistError):
    """The server ended the connection's session (it said goodbye, a FATAL error) between
    two statements of a transaction: raised instead of the protocol's refusal of the next
    one ("cannot switch to state 12; another operation (2) is in progress")."""


class _Heard(asyncio.Protocol):
    """Between a connection's transport and asyncpg's protocol: passes everything on, and
    keeps the last bytes received, so that the pool can tell whether the server has said
    anything since the answer that left the connection idle."""

    __slots__ = ("_protocol", "_tail", "connection")

    def __init__(self, connection: asyncpg.Connection) -> None:
        self.connection = connection
        # asyncpg's private attributes, pinned with its version: no public API tells a
        # connection that has read its session's end from one that has not.
        transport: asyncio.Transport = connection._transport  # type: ignore[attr-defined]
        self._protocol: asyncio.Protocol = transport.get_protocol()  # type: ignore[assignment]
        self._tail = _IDLE  # connected: its last message said idle
        transport.set_protocol(self)

    @property
    def idle(self) -> bool:
        """Whether the server has said nothing since an answer left the connection idle."""
        return self._tail == _IDLE and not self.connection.is_closed()

    def told(self, error: Exception) -> Exception:
        """`error`, or `SessionEnded` if it is (or follows: a transaction's end on the
        connection asyncpg then closed) asyncpg's refusal of an operation after the server
        spoke unasked (its last bytes are not an answer's end: they are its goodbye)."""
        refusal = error if _refused(error) else error.__context__
        if _refused(refusal) and self._tail[:5] != _IDLE[:5]:
            return SessionEnded(f"the server ended the session between two statements ({refusal})")
        return error

    def unsent(self, error: Exception, sent: int) -> bool:
        """Whether the statement whose call failed with `error` never reached the server, the
        connection having said `sent` (`sent`) before the call: asyncpg refused to begin an
        operation (which it does before sending anything, and the statement's is always the
        call's last: a preparation, or a look at new types, may come first), or the
        connection was lost before asyncpg counted the statement sent."""
        return _refused(error) or (self.sent == sent and self.connection.is_closed())

    @property
    def sent(self) -> int:
        """How many statements asyncpg has sent on the connection."""
        count: int = self.connection._protocol.queries_count  # type: ignore[attr-defined]
        return count

    def data_received(self, data: bytes) -> None:
        self._tail = data[-6:] if len(data) >= 6 else (self._tail + data)[-6:]
        self._protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self._protocol.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()


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
        self._idle: collections.deque[_Heard] = collections.deque()
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

    async def _take(self) -> _Heard:
        while True:
            if self._closed:
                raise PoolClosed("the store's connection pool is closed")
            while self._idle:
                heard = self._idle.pop()  # the most recently used: warm, and the others
                if heard.idle:  # may time out idle on the server
                    return heard
                heard.connection.terminate()  # its session ended, or is ending
                self._open -= 1
            if self._open < self._max_size:
                self._open += 1
                try:
                    connection = await asyncpg.connect(
                        self._dsn, server_settings=self._server_settings
                    )
                    return _Heard(connection)
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

    def _give_back(self, heard: _Heard, trusted: bool) -> None:
        connection = heard.connection
        if not trusted or self._closed or connection.is_closed():
            # Terminated, the server ends the session; the place is free for a new one.
            connection.terminate()
            self._open -= 1
        else:
            self._idle.append(heard)
        self._wake()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        heard = await self._take()
        connection = heard.connection
        trusted = False
        try:
            yield connection
            trusted = not connection.is_in_transaction()
        except Exception as error:
            trusted = not _broken(error) and not connection.is_in_transaction()
            told = heard.told(error)
            if told is error:
                raise
            raise told from error
        finally:
            self._give_back(heard, trusted)

    async def _run(self, method: str, query: str, arguments: tuple[Any, ...]) -> Any:
        # The single statements the store sends most, without a context manager's frames.
        for tries_left in range(_SENDS - 1, -1, -1):
            heard = await self._take()
            connection = heard.connection
            sent = heard.sent
            trusted = False
            try:
                result = await getattr(connection, method)(query, *arguments)
                trusted = True
                return result
            except Exception as error:
                trusted = not _broken(error) and not connection.is_in_transaction()
                if trusted or not tries_left or not heard.unsent(error, sent):
                    told = heard.told(error)
                    if told is error:
                        raise
                    raise told from error
                # The connection failed before the statement was sent: on another one.
            finally:
                self._give_back(heard, trusted)
        raise AssertionError("unreachable")  # the last try raises or returns

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
        idle, self._idle = [heard.connection for heard in self._idle], collections.deque()
        self._open -= len(idle)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosed("the store's connection pool is closed"))
        for connection in idle:
            try:
                async with asyncio.timeout(5):
                    await connection.close()
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                connection.terminate()
