"""SQLite's WAL checkpoints are made aside (`core/sqlstore/checkpoints.py`): the store's own
connection (on the event loop) never checkpoints inside a commit (`wal_autocheckpoint = 0`);
a connection of its own, in a thread, checkpoints the log once something was written, every
`CHECKPOINT_WRITES` commits even when the loop never waits, and starts the log over once it
is past its limit, so that a steady load does not grow it without end."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from nodbot.core import ApprovalRequest
from nodbot.core.audit import EventHasher
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.sqlstore.checkpoints import CHECKPOINT_EVERY, CHECKPOINT_WRITES, Checkpointer
from nodbot.core.sqlstore.sqlite import SqliteBackend
from nodbot.core.sqlstore.store import _new_row
from nodbot.core.store import utc_now
from nodbot.core.tools import arguments_digest
from tests.support import eventually


def request(number: int) -> ApprovalRequest:
    arguments = {"order_id": f"o-{number}", "note": "x" * 200}
    return ApprovalRequest(
        run_id="run_1",
        call_id=f"call_{number}",
        tool="refund",
        arguments=arguments,
        digest=arguments_digest(arguments),
    )


def checkpointer_of(store: SqlApprovalStore) -> Checkpointer:
    backend = store._backend  # the store's backend, as it runs
    assert isinstance(backend, SqliteBackend)
    assert backend._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    assert backend.checkpointer is not None
    return backend.checkpointer


def wal_size(path: Path) -> int:
    """The bytes of the database's write-ahead log."""
    return Path(f"{path}-wal").stat().st_size


def count_rows(path: Path) -> int:
    other = sqlite3.connect(path)
    try:
        [count] = other.execute("SELECT count(*) FROM approvals").fetchone()
    finally:
        other.close()
    return int(count)


async def test_checkpoints_run_aside_from_the_commits(tmp_path: Path) -> None:
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        await store.create(request(0))
        checkpointer = checkpointer_of(store)
        async with asyncio.timeout(20 * CHECKPOINT_EVERY):
            number = 0
            while checkpointer.checkpoints == 0:  # writes go on; the checkpointer catches up
                number += 1
                await store.create(request(number))
                await asyncio.sleep(CHECKPOINT_EVERY / 10)
    # What was written is all there for any other connection.
    assert count_rows(tmp_path / "nodbot.db") == number + 1


async def test_a_loop_that_never_waits_is_checkpointed_all_the_same(tmp_path: Path) -> None:
    """A script calling the store in a loop never lets the event loop turn (SQLite never
    suspends): the commits themselves start the checkpoints, in the checkpointer's thread."""
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        await store.create(request(0))
        checkpointer = checkpointer_of(store)
        number = 0
        for _ in range(CHECKPOINT_WRITES):  # without a pause: the timer's task never runs
            number += 1
            await store.create(request(number))
        assert checkpointer._running is not None  # started by a commit

        async def checkpointed() -> bool:
            return checkpointer.checkpoints > 0

        await eventually(checkpointed, "a checkpoint", within=30)
    assert count_rows(tmp_path / "nodbot.db") == number + 1


async def test_a_steady_load_starts_the_log_over_at_its_limit(tmp_path: Path) -> None:
    """Writes that never pause add to the log during every PASSIVE checkpoint, which then
    never leaves the log empty: past its limit a RESTART starts it over, and the file is cut
    back to the limit. The writer waits for it (without blocking the loop), and goes on."""
    path = tmp_path / "nodbot.db"
    async with SqlApprovalStore(f"sqlite:///{path}"):
        pass  # the schema
    limit = 1024 * 1024
    backend = SqliteBackend(
        str(path), uri=False, busy_timeout=30.0, hasher=EventHasher(None), wal_limit=limit
    )
    number = 0

    async def create() -> None:
        nonlocal number
        number += 1
        now = utc_now()
        await backend.create(_new_row(request(number), now), now)

    try:
        checkpointer = backend.checkpointer
        assert checkpointer is not None
        largest = 0
        async with asyncio.timeout(60):
            while checkpointer.restarts < 3:
                await create()
                largest = max(largest, wal_size(path))
                await asyncio.sleep(0)

        async def idle() -> bool:
            return checkpointer._running is None or checkpointer._running.done()

        await eventually(idle, "the last checkpoint")
        await create()  # the first write after a RESTART starts the log over, cut back
        assert wal_size(path) <= limit < largest, (wal_size(path), largest)
    finally:
        await backend.close()
    assert count_rows(path) == number
