"""The PostgreSQL store's own connection pool (core/sqlstore/pool.py), on a real server: at
most `max_size` connections, waiters served in turn, a connection the server ended thrown
away for a fresh one, a statement's own error keeping its connection, and close() refusing
whoever waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from nodbot.core.sqlstore.pool import GuardedPool, PoolClosed
from tests.support import eventually, postgres_database


@contextlib.asynccontextmanager
async def pooled(max_size: int, url: str | None = None) -> AsyncIterator[GuardedPool]:
    """A pool of at most `max_size` connections to `url` (by default a fresh database),
    closed at the end."""
    async with contextlib.AsyncExitStack() as stack:
        if url is None:
            url = await stack.enter_async_context(postgres_database())
        pool = await GuardedPool.connect(url, max_size=max_size)
        stack.push_async_callback(pool.close)
        yield pool


async def held(pool: GuardedPool, release: asyncio.Event) -> asyncio.Task[None]:
    """A task holding one of the pool's connections until `release` is set."""
    acquired = asyncio.Event()

    async def holder() -> None:
        async with pool.acquire():
            acquired.set()
            await release.wait()

    task = asyncio.create_task(holder())
    await asyncio.wait_for(acquired.wait(), timeout=10)
    return task


async def until_waiting(pool: GuardedPool, count: int) -> None:
    """Until `count` tasks wait for a connection."""

    async def enough() -> bool:
        return pool.waiting >= count

    await eventually(enough, f"{count} tasks waiting for a connection", every=0.001)


async def backend_pids(pool: GuardedPool, count: int) -> set[int]:
    """The server processes of `count` connections held at once."""
    held = asyncio.Event()
    pids: set[int] = set()

    async def hold() -> None:
        async with pool.acquire() as connection:
            pids.add(await connection.fetchval("SELECT pg_backend_pid()"))
            if len(pids) == count:
                held.set()
            await held.wait()

    await asyncio.wait_for(asyncio.gather(*(hold() for _ in range(count))), timeout=10)
    return pids


async def test_at_most_max_size_connections_and_waiters_served_in_turn() -> None:
    async with pooled(2) as pool:
        in_use = 0
        most = 0

        async def use() -> int:
            nonlocal in_use, most
            async with pool.acquire() as connection:
                in_use += 1
                most = max(most, in_use)
                value = await connection.fetchval("SELECT pg_sleep(0.01)::text || '1'")
                in_use -= 1
                return int(value)

        assert await asyncio.wait_for(asyncio.gather(*(use() for _ in range(12))), 20) == [1] * 12
        assert most == 2
        assert pool.size == 2


async def test_saturated_while_every_connection_is_in_use_or_someone_waits() -> None:
    async with pooled(2) as pool:
        assert not pool.saturated  # one connection open (connect's), idle
        release = asyncio.Event()
        first = await held(pool, release)
        assert not pool.saturated  # a second may still be opened
        second = await held(pool, release)
        assert pool.saturated
        third = asyncio.create_task(held(pool, release))
        await until_waiting(pool, 1)
        assert pool.saturated
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second, await third), timeout=10)
        assert not pool.saturated and pool.waiting == 0


async def test_a_connection_the_server_ended_under_a_query_is_replaced() -> None:
    async with postgres_database() as url, pooled(1, url) as pool:
        admin = await asyncpg.connect(url)
        try:
            (pid,) = await backend_pids(pool, 1)
            sleeping = asyncio.create_task(pool.fetchval("SELECT pg_sleep(30)"))

            async def asleep() -> bool:
                query = "SELECT state FROM pg_stat_activity WHERE pid = $1"
                return await admin.fetchval(query, pid) == "active"

            await eventually(asleep, f"backend {pid} running the query")
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
            # asyncpg says so in one of several ways, depending on timing: the session was
            # ended, the connection is gone, or its protocol is in a state it refuses.
            ended = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)
            with pytest.raises((*ended, OSError)):
                await asyncio.wait_for(sleeping, timeout=10)
            assert pool.size == 0  # thrown away, not handed out again
            assert await pool.fetchval("SELECT 2") == 2
            (fresh,) = await backend_pids(pool, 1)
            assert fresh != pid
        finally:
            await admin.close()


async def test_a_statements_own_error_keeps_the_connection() -> None:
    async with pooled(1) as pool:
        (pid,) = await backend_pids(pool, 1)
        with pytest.raises(asyncpg.DataError):
            await pool.fetchval("SELECT 'not a number'::integer")
        assert await backend_pids(pool, 1) == {pid}


async def test_a_connection_left_in_a_transaction_is_not_handed_out_again() -> None:
    async with pooled(1) as pool:
        async with pool.acquire() as connection:
            pid = await connection.fetchval("SELECT pg_backend_pid()")
            await connection.execute("BEGIN")
        assert pool.size == 0
        async with pool.acquire() as connection:
            assert not connection.is_in_transaction()
            assert await connection.fetchval("SELECT pg_backend_pid()") != pid


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    async with pooled(1) as pool:
        release = asyncio.Event()
        holding = await held(pool, release)
        cancelled = asyncio.create_task(pool.fetchval("SELECT 1"))
        served = asyncio.create_task(pool.fetchval("SELECT 3"))
        await until_waiting(pool, 2)
        cancelled.cancel()
        release.set()
        assert await asyncio.wait_for(served, timeout=10) == 3
        await holding
        with pytest.raises(asyncio.CancelledError):
            await cancelled


async def test_close_refuses_waiters_and_later_acquires() -> None:
    async with postgres_database() as url:
        pool = await GuardedPool.connect(url, max_size=1)
        release = asyncio.Event()
        holding = await held(pool, release)
        waiting = asyncio.create_task(pool.fetchval("SELECT 1"))
        await until_waiting(pool, 1)
        await pool.close()
        with pytest.raises(PoolClosed):
            await waiting
        release.set()
        await holding
        assert pool.size == 0
        with pytest.raises(PoolClosed):
            await pool.fetchval("SELECT 1")


async def test_a_pool_that_cannot_connect_says_so_at_once() -> None:
    async with postgres_database() as url:
        wrong = url.rsplit("/", 1)[0] + "/nodbot_no_such_database"
        with pytest.raises(asyncpg.InvalidCatalogNameError):
            await GuardedPool.connect(wrong)
