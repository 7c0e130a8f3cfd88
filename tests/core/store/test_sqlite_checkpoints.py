"""SQLite's WAL checkpoints are made aside: the store's own connection (on the event loop)
never checkpoints inside a commit (`wal_autocheckpoint = 0`), and a connection of its own,
in a thread, checkpoints the log in the background once something was written."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from nodbot.core import ApprovalRequest
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.sqlstore.sqlite import CHECKPOINT_EVERY, SqliteBackend
from nodbot.core.tools import arguments_digest


def request(number: int) -> ApprovalRequest:
    arguments = {"order_id": f"o-{number}"}
    return ApprovalRequest(
        run_id="run_1",
        call_id=f"call_{number}",
        tool="refund",
        arguments=arguments,
        digest=arguments_digest(arguments),
    )


async def test_checkpoints_run_aside_from_the_commits(tmp_path: Path) -> None:
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        await store.create(request(0))
        backend = store._backend  # the store's backend, as it runs
        assert isinstance(backend, SqliteBackend)
        assert backend._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        async with asyncio.timeout(20 * CHECKPOINT_EVERY):
            number = 0
            while backend.checkpoints == 0:  # writes go on; the checkpointer catches up
                number += 1
                await store.create(request(number))
                await asyncio.sleep(CHECKPOINT_EVERY / 10)
        # What was written is all there for any other connection.
        other = sqlite3.connect(tmp_path / "nodbot.db")
        try:
            [count] = other.execute("SELECT count(*) FROM approvals").fetchone()
        finally:
            other.close()
        assert count == number + 1
