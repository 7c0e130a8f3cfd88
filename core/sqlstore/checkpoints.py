"""WAL checkpoints of a SQLite file, made aside from the event loop, and a log that stays small.

The store's connection never checkpoints inside a commit (`wal_autocheckpoint = 0`: SQLite
would otherwise copy the log into the file inside the commit that fills it, stalling the loop
for tens of milliseconds). A `Checkpointer` makes them instead, on a connection of its own in a
thread of its own:

- every `CHECKPOINT_WRITES` commits, started by the commit itself, so that a process whose
  loop never waits (a script that calls the store in a loop) checkpoints as often as a busy
  bot does; and `CHECKPOINT_EVERY` seconds after the last commit, for the few writes of a
  quiet moment;
- PASSIVE: as much of the log as no reader needs, waiting for nobody. While writes go on they
  add to the log during each checkpoint, so a PASSIVE one seldom ends with the whole log in
  the file, and SQLite starts the log over only then: under a steady load the log would grow
  without end (measured: 40 MB a second, 470 MB after 12 seconds of eight busy runs);
- RESTART, once the log is over `wal_limit` bytes: the checkpointer waits for the write in
  progress, holds off the next ones while it copies what the PASSIVE one left (a few
  milliseconds; the store's writers wait for it without blocking the loop, as they wait for
  any other writer), and the next write starts the log over. The store's connection sets
  `journal_size_limit` to `wal_limit`, so that the file is cut back to it then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sqlite3

__all__ = ["CHECKPOINT_EVERY", "CHECKPOINT_WRITES", "WAL_LIMIT", "Checkpointer"]

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 0.5
"""Seconds after a commit before a checkpoint is made, when fewer than `CHECKPOINT_WRITES`
commits have been made since the last one."""
CHECKPOINT_WRITES = 200
"""Commits after which a checkpoint is started at once (about 1.5 MB of log, at the 1 KB pages
of the store's files and about 8 pages a commit)."""
WAL_LIMIT = 16 * 1024 * 1024
"""Bytes of log past which a checkpoint starts the log over (RESTART), and the size the file
is cut back to when it does."""
RESTART_WAIT_MS = 5000
"""How long a RESTART checkpoint waits for the write in progress before it gives up (and is
tried again at the next checkpoint)."""


class Checkpointer:
    """Checkpoints the WAL of the file `target` (as `sqlite3.connect` takes it) aside."""

    def __init__(self, target: str, *, uri: bool, wal_limit: int = WAL_LIMIT) -> None:
        self._target, self._uri = target, uri
        self.wal_limit = wal_limit
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._running: concurrent.futures.Future[None] | None = None
        self._connection: sqlite3.Connection | None = None
        self._frame = 0
        """Bytes of one frame of the log: a page and its header."""
        self._written = 0
        """Commits since the last checkpoint began."""
        self._timer: asyncio.Task[None] | None = None
        self.checkpoints = 0
        """Checkpoints made (PASSIVE ones; a RESTART follows some of them)."""
        self.restarts = 0
        """RESTART checkpoints made: the times the log was started over."""
        self.failing: str | None = None
        """Why the last checkpoint failed, while they fail (`/healthz` says so)."""

    def wrote(self) -> None:
        """Note a commit (called on the loop's thread, after each one)."""
        self._written += 1
        if self._written >= CHECKPOINT_WRITES:
            self._start()
        elif self._timer is None or self._timer.done():
            if self._timer is not None and not self._timer.cancelled():
                error = self._timer.exception()  # looked at, and said: it is started again
                log.error("the WAL checkpoints' timer stopped; starting it again", exc_info=error)
            self._timer = asyncio.get_running_loop().create_task(self._tick())

    async def close(self) -> None:
        """Stop, after the checkpoint in progress (if any) has ended."""
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        if self._running is not None:
            await asyncio.wrap_future(self._running)
            self._running = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _start(self) -> None:
        if self._running is not None and not self._running.done():
            return  # one at a time; the commits since go into the next one
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="nodbot-checkpoint"
            )
        self._written = 0
        self._running = self._pool.submit(self._checkpoint)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_EVERY)
            if self._written:
                try:
                    self._start()
                except Exception as exc:  # never the end of the timer: tried at the next tick
                    self.failing = f"{type(exc).__name__}: {exc}"
                    log.warning("a WAL checkpoint could not be started: %s", self.failing)

    def _checkpoint(self) -> None:
        """One checkpoint, in the checkpointer's thread; a failure is tried again next time."""
        try:
            db = self._connect()
            _, frames, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            if frames * self._frame > self.wal_limit:
                busy, _, _ = db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                self.restarts += not busy
            self.failing = None
        except sqlite3.OperationalError as exc:  # busy or locked: tried again next time
            log.debug("WAL checkpoint failed: %s", exc)
        except Exception as exc:  # the file's or the disk's fault: said, and tried again
            self.failing = f"{type(exc).__name__}: {exc}"
            log.warning("WAL checkpoint failed: %s", self.failing)

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            db = sqlite3.connect(
                self._target, uri=self._uri, isolation_level=None, check_same_thread=False
            )
            db.execute(f"PRAGMA busy_timeout = {RESTART_WAIT_MS}")  # RESTART waits; PASSIVE not
            self._frame = db.execute("PRAGMA page_size").fetchone()[0] + 24
            self._connection = db
        return self._connection
