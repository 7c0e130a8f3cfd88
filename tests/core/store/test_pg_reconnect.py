"""The PostgreSQL store's pool when the server ends sessions: a connection whose session has
ended is never handed out, and a statement that never reached the server is sent again on
another connection, so that the fault costs a reconnection, not an error.

A terminated session says goodbye (a FATAL error) and then closes its socket. Between the
two, asyncpg has read the error on a connection that still looks open, and its protocol
refuses the next statement: "cannot switch to state 12; another operation (2) is in
progress". On a loaded bot that window caught a few operations after every
`pg_terminate_backend`. Here the window is held open on purpose, by a proxy that passes the
goodbye on and holds the close back (`tests/fakes/pgproxy.py`), so each test sees it every
time."""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from nodbot.core.sqlstore.pool import GuardedPool, SessionEnded
from tests.fakes.pgproxy import FaultProxy, proxying
from tests.support import eventually, postgres_database

PID = "SELECT pg_backend_pid()"


@contextlib.asynccontextmanager
async def through_proxy() -> AsyncIterator[tuple[GuardedPool, FaultProxy, asyncpg.Connection]]:
    """A pool of one connection to a fresh database through a `FaultProxy`, the proxy, and
    an administrator's connection (direct) to terminate sessions with."""
    async with postgres_database() as url:
        address = urlsplit(url)
        assert address.hostname is not None and address.port is not None
        async with proxying(address.hostname, address.port) as proxy:
            pool = await GuardedPool.connect(proxy.url(url), max_size=1)
            admin = await asyncpg.connect(url)
            try:
                yield pool, proxy, admin
            finally:
                await admin.close()
                await pool.close()


async def held_goodbye(pool: GuardedPool, proxy: FaultProxy, admin: asyncpg.Connection) -> int:
    """Terminate the session of the pool's idle connection, and return once its client has
    read the goodbye but not the close (held by the proxy). Returns the session's pid."""
    async with pool.acquire() as connection:
        pid: int = await connection.fetchval(PID)
        socket = connection._transport.get_extra_info("socket")  # type: ignore[attr-defined]
    proxy.hold_goodbyes = True
    await admin.execute("SELECT pg_terminate_backend($1)", pid)
    await eventually(lambda: goodbye_read(proxy, socket), "the client reading the goodbye")
    return pid


async def goodbye_read(proxy: FaultProxy, socket: Any) -> bool:
    """Whether the server has closed its side and the client (its `socket`) has read what
    the server sent before."""
    readable, _, _ = select.select([socket.fileno()], [], [], 0)
    return any(link.server_closed for link in proxy.links) and not readable


@pytest.mark.postgres
async def test_a_statement_after_a_goodbye_read_runs_on_a_new_connection() -> None:
    async with through_proxy() as (pool, proxy, admin):
        pid = await held_goodbye(pool, proxy, admin)
        # Before: InternalClientError: cannot switch to state 12; another operation (2) ...
        assert await pool.fetchval(PID) != pid
        proxy.let_go()


@pytest.mark.postgres
async def test_a_transaction_after_a_goodbye_read_runs_on_a_new_connection() -> None:
    async with through_proxy() as (pool, proxy, admin):
        pid = await held_goodbye(pool, proxy, admin)
        # Before: InternalClientError: cannot switch to state 15 (its BEGIN) ...
        async with pool.acquire() as connection, connection.transaction():
            assert await connection.fetchval(PID) != pid
        proxy.let_go()


@pytest.mark.postgres
async def test_a_goodbye_read_inside_a_transaction_is_told_as_the_session_ended() -> None:
    async with through_proxy() as (pool, proxy, admin):
        pids = []

        async def transaction() -> None:
            async with pool.acquire() as connection, connection.transaction():
                pids.append(await connection.fetchval(PID))
                socket = connection._transport.get_extra_info("socket")  # type: ignore[attr-defined]
                proxy.hold_goodbyes = True
                await admin.execute("SELECT pg_terminate_backend($1)", pids[0])
                await eventually(lambda: goodbye_read(proxy, socket), "the goodbye read")
                # Before: InternalClientError: cannot switch to state 12; another operation (2)
                await connection.fetchval(PID)

        # Nothing can save a transaction whose session ended: the error says so, as a lost
        # connection (which the store turns into StoreUnavailableError, to be retried).
        with pytest.raises(SessionEnded, match="ended the session"):
            await transaction()
        proxy.let_go()
        assert await pool.fetchval(PID) != pids[0]


@pytest.mark.postgres
async def test_a_statement_whose_session_ended_before_it_ran_is_sent_again() -> None:
    async with through_proxy() as (pool, proxy, admin):
        pid = await pool.fetchval(PID)
        [link] = proxy.links
        link.stall(60)  # what the client sends next waits in the proxy
        # A statement the connection has not prepared yet: asyncpg prepares it first, and
        # the session ends with the preparation on its way, before the statement is sent.
        asked = asyncio.create_task(pool.fetchval("SELECT 40 + 2"))

        async def terminated() -> bool:
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
            gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1"
            return bool(await admin.fetchval(gone, pid))

        await eventually(terminated, f"session {pid} terminated")
        link.resume()
        # Before: ConnectionDoesNotExistError: connection was closed in the middle of
        # operation: terminating connection due to administrator command.
        assert await asyncio.wait_for(asked, 10) == 42
        assert await pool.fetchval(PID) != pid


@pytest.mark.postgres
async def test_a_statement_whose_session_ended_while_it_ran_is_not_sent_again() -> None:
    async with through_proxy() as (pool, _, admin):
        pid = await pool.fetchval(PID)
        await pool.fetchval("SELECT pg_sleep($1::float)", 0.0)  # prepared: sent at once
        sleeping = asyncio.create_task(pool.fetchval("SELECT pg_sleep($1::float)", 30.0))

        async def asleep() -> bool:
            query = "SELECT state FROM pg_stat_activity WHERE pid = $1"
            return await admin.fetchval(query, pid) == "active"

        await eventually(asleep, f"session {pid} running the statement")
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        # Whether it ran is unknown to the client: it is the caller's to retry, not the pool's.
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
            await asyncio.wait_for(sleeping, 10)
        assert pool.size == 0
