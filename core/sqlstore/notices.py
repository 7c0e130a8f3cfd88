"""Listening for the database's notices of decisions, on a connection that comes back.

PostgreSQL tells every listener when any process decides an approval (`pg_notify` in the
decide statements). The listening connection is a plain session, so it can be lost: the
server restarts, an administrator terminates it, the network drops. `Listener` keeps one
open: when it is lost it logs, connects again with backoff, and on every (re)connection
calls `woken()` once, because notices sent while nobody listened are gone for good and the
workers must look for themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

__all__ = ["Listener", "Listening", "NotListening"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds an attempt to connect may take before it counts as failed."""
RETRY_FIRST = 0.1
RETRY_MOST = 5.0
"""Seconds between attempts to listen again: doubling from the first to the most."""


class Listening:
    """What `listen` returns: call it to stop listening; `connected` says whether notices
    can arrive now (health checks report it)."""

    connected: bool = True

    async def __call__(self) -> None:
        """Stop listening."""


class NotListening(Listening):
    """For stores without notices between processes (SQLite): nothing to lose or close."""


class Listener(Listening):
    """LISTEN on `channel` of `dsn`, connected again whenever the connection is lost."""

    def __init__(self, dsn: str, channel: str, woken: Callable[[], None]) -> None:
        self._dsn = dsn
        self._channel = channel
        self._woken = woken
        self.connected = False
        self._lost = asyncio.Event()
        self._current: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Listener:
        """Connect once (raising what the first attempt raises), then keep connected."""
        connection = await self._connect()
        self._task = asyncio.create_task(self._keep(connection), name=f"listen {self._channel}")
        return self

    async def __call__(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.connected = False

    async def _connect(self) -> asyncpg.Connection:
        connection = await asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT)
        try:
            await connection.add_listener(self._channel, self._notified)
        except BaseException:
            await _close(connection)
            raise
        self._lost.clear()
        self._current = connection
        connection.add_termination_listener(self._terminated)
        self.connected = True
        return connection

    def _notified(self, *_: object) -> None:
        self._woken()

    def _terminated(self, connection: object) -> None:
        # asyncpg calls this from the loop, possibly late: a connection closed here after
        # its successor was made must not mark the successor lost.
        if connection is self._current:
            self.connected = False
            self._lost.set()

    async def _keep(self, connection: asyncpg.Connection) -> None:
        try:
            while True:
                await self._lost.wait()
                await _close(connection)
                log.warning("lost the database's notices of decisions; listening again")
                connection = await self._reconnect()
                log.warning("listening to the database's notices of decisions again")
                self._woken()  # what was decided meanwhile sent notices nobody heard
        finally:
            await _close(connection)

    async def _reconnect(self) -> asyncpg.Connection:
        wait = RETRY_FIRST
        while True:
            try:
                return await self._connect()
            except Exception as exc:  # every driver failure, whatever asyncpg calls it
                log.warning(
                    "cannot listen to the database yet (%s: %s); again in %.1f s",
                    type(exc).__name__,
                    exc,
                    wait,
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MOST)


async def _close(connection: asyncpg.Connection) -> None:
    if connection.is_closed():
        return
    try:
        await asyncio.wait_for(connection.close(), 2)
    except Exception:  # closing a connection that broke: let it go without a goodbye
        connection.terminate()
