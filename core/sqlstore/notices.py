"""Listening for the database's notices of decisions and of runs' ends, on a connection that
comes back, and sending them.

A run's end is told as a decision is (after its commit, only when another store listens), so
that a wait for the run in another process answers when the run stops, not at its next look.

PostgreSQL tells the listeners of other stores when a store decides an approval: after the
decision commits, in a statement of its own (`Teller`), and only when a session of another
store listens (the `listeners` table, migration 0015: a NOTIFY inside the deciding
transaction would hold a lock of the whole server until the commit is durable, so deciders
would take turns with their fsyncs). A wait in the deciding store is woken in its process.
The listening connection is a plain session, so it can be lost: the server restarts, an
administrator terminates it, the network drops. `Listener` keeps one open, and its row in
`listeners` with it: when it is lost it logs, connects again with backoff, and on every
reconnection calls `woken()` once, because notices sent while nobody listened are gone for
good and the workers must look for themselves. Listeners look at the store every poll on
their own as well, so a notice lost on its way (the deciding process died after its commit,
or a decision made while a listener was starting did not see its row yet) costs time, never
a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

import asyncpg

__all__ = ["Listener", "Listening", "NotListening", "Teller"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds an attempt to connect may take before it counts as failed."""
RETRY_FIRST = 0.1
RETRY_MOST = 5.0
"""Seconds between attempts to listen again: doubling from the first to the most."""
UNREGISTER_TIMEOUT = 2.0
"""Seconds a stopping listener waits to remove its row; a row left is cleared later."""

# The listener's row, made once it listens; and the rows of sessions that have gone (their
# process died, their connection was lost) cleared, so that decisions stop telling them.
_REGISTER = """
WITH cleared AS (
    DELETE FROM listeners
    WHERE pid <> pg_backend_pid() AND pid NOT IN (SELECT pid FROM pg_stat_activity)
)
INSERT INTO listeners (pid, store, since) VALUES (pg_backend_pid(), $1, now())
ON CONFLICT (pid) DO UPDATE SET store = excluded.store, since = excluded.since"""
_UNREGISTER = "DELETE FROM listeners WHERE pid = pg_backend_pid()"


class Listening:
    """What `listen` returns: call it to stop listening; `connected` says whether notices
    can arrive now (health checks report it)."""

    connected: bool = True

    @property
    def ended(self) -> bool:
        """Whether it stopped listening by itself (a fault it could not get over): the bot
        then listens again."""
        return False

    async def __call__(self) -> None:
        """Stop listening."""


class NotListening(Listening):
    """For stores without notices between processes (SQLite): nothing to lose or close."""


class Listener(Listening):
    """LISTEN on each of `channels` of `dsn` (calling its function with each notice's
    payload) for the store `store` (its row in `listeners`, so that other stores tell it),
    connected again whenever the connection is lost; `woken()` is called when notices may
    have been missed (see the module's docstring)."""

    def __init__(
        self,
        dsn: str,
        channels: Mapping[str, Callable[[str], None]],
        woken: Callable[[], None],
        *,
        store: str,
    ) -> None:
        self._dsn = dsn
        self._channels = dict(channels)
        self._channel = ", ".join(self._channels)
        self._woken = woken
        self._store = store
        self.connected = False
        self._lost = asyncio.Event()
        self._current: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Listener:
        """Connect once (raising what the first attempt raises), then keep connected."""
        connection = await self._connect()
        self._task = asyncio.create_task(self._keep(connection), name=f"listen {self._channel}")
        # Its end wakes the workers, which listen again (`ended`) and look for themselves.
        self._task.add_done_callback(lambda _: self._woken())
        return self

    @property
    def ended(self) -> bool:
        return self._task is not None and self._task.done()

    async def __call__(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # it ended by itself: said here, where it is looked at
                log.exception("listening to the database's notices had stopped")
        self.connected = False

    async def _connect(self) -> asyncpg.Connection:
        connection = await asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT)
        try:
            for channel in self._channels:
                await connection.add_listener(channel, self._notified)
            await connection.execute(_REGISTER, self._store)
        except BaseException:
            await _close(connection)
            raise
        self._lost.clear()
        self._current = connection
        connection.add_termination_listener(self._terminated)
        self.connected = True
        return connection

    def _notified(self, _connection: object, _pid: int, channel: str, payload: object) -> None:
        try:
            self._channels[channel](str(payload))
        except Exception:  # a listener's bug must not stop the notices of the others
            log.exception("a listener of the database's notices on %s failed", channel)

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
            if not connection.is_closed():
                with contextlib.suppress(Exception):  # a row left is cleared by the next one
                    async with asyncio.timeout(UNREGISTER_TIMEOUT):
                        await connection.execute(_UNREGISTER)
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
        async with asyncio.timeout(2):
            await connection.close()
    except Exception:  # closing a connection that broke: let it go without a goodbye
        connection.terminate()


class Teller:
    """Sends notices (of decisions, of runs' ends) once what they tell has committed, with
    `send(run_ids)` (one statement): the run ids told while one is on its way go out together
    in the next, so that writers at once share statements as they share commits. `what`
    names the runs in its log lines."""

    def __init__(self, send: Callable[[list[str]], Awaitable[None]], what: str) -> None:
        self._send = send
        self._what = what
        self._runs: set[str] = set()
        self._next: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def tell(self, run_ids: Iterable[str]) -> None:
        """Send a notice of each of `run_ids`; returns once sent, or once sending failed
        (logged, not raised: the decisions stand, and listeners look for themselves)."""
        self._runs.update(run_ids)
        if not self._runs:
            return
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        sent = self._next
        if self._task is None:
            self._task = asyncio.create_task(self._sending(), name=f"notices of {self._what}")
        await asyncio.shield(sent)

    async def drain(self) -> None:
        """Wait for the notices on their way (a store closes after)."""
        if self._task is not None:
            await asyncio.wait([self._task])  # its end, whatever it was

    async def _sending(self) -> None:
        sent: asyncio.Future[None] | None = None
        try:
            while self._runs:
                runs, self._runs = sorted(self._runs), set()
                sent, self._next = self._next, None
                try:
                    await self._send(runs)
                except Exception as exc:  # every driver failure, whatever asyncpg calls it
                    log.warning(
                        "could not send the notices of %d %s (%s: %s); other processes "
                        "find them when they next look",
                        len(runs),
                        self._what,
                        type(exc).__name__,
                        exc,
                    )
                if sent is not None:
                    sent.set_result(None)
        finally:
            # Cancelled (the loop is closing): nobody waits for what was not sent.
            for waiting in (sent, self._next):
                if waiting is not None and not waiting.done():
                    waiting.set_result(None)
            self._next, self._task = None, None
