"""A process killed with SIGKILL at the worst moments: nothing it wrote is lost or half-made,
and nothing it ran runs again.

Each test kills a child process that uses the store, then plays the restarted process: a new
store on the same database, and a new executor whose tool records every run in memory.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nodbot.core import Executor, ToolResult
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.store import CONCURRENT_USE_REASON
from tests.core.store.conftest import database_url
from tests.core.store.workers import (
    CALL,
    READY_AFTER,
    RUN_ID,
    build_executor,
    children,
    read_lines,
    send_request,
)

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@dataclass
class Restarted:
    """A process started after the kill: its own store, an executor, and what its tool ran."""

    store: SqlApprovalStore
    ran: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.executor: Executor = build_executor(self.store, self.send)

    def send(self, to: str) -> str:
        self.ran.append(to)
        return f"sent to {to}"

    async def resume(self) -> ToolResult:
        """Ask for the call again, with the same run and call id, as a resumed run does."""
        return await self.executor.run_call(CALL, self.executor.context(RUN_ID))


@contextlib.asynccontextmanager
async def restarted(url: str) -> AsyncIterator[Restarted]:
    async with SqlApprovalStore(url) as store:
        yield Restarted(store)


def approval_id(result: ToolResult) -> str:
    assert result.status == "pending" and result.error is not None, result
    return str(result.error.details["approval_id"])


async def paused_call(url: str, *, approve: bool = False) -> str:
    """Pause the call as a run would (approved by "ana" if `approve`); the approval's id."""
    async with restarted(url) as app:
        approval = approval_id(await app.resume())
        if approve:
            await app.executor.decide(approval, True, decided_by="ana")
        assert app.ran == []
    return approval


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_killed_after_deciding_the_decision_is_kept_and_used_once(
    backend: str, tmp_path: Path
) -> None:
    decided = tmp_path / "decided"
    async with database_url(backend, tmp_path) as url:
        approval = await paused_call(url)
        with children(tmp_path) as started:
            child = started.start("decide", url, approval, decided)
            started.wait_for("the child has decided", decided.exists)
            started.sigkill(child)
        async with restarted(url) as app:
            record = await app.store.get(approval)
            events = await app.store.events(approval)
            first = await app.resume()
            replay = await app.resume()
            after = await app.store.get(approval)

    assert record.status == "approved"
    assert record.decision is not None and record.decision.decided_by == "ana"
    assert not record.consumed
    assert [(e.kind, e.actor, e.channel) for e in events] == [
        ("created", None, None),
        ("decided", "ana", "web"),
    ]
    assert (first.status, first.value) == ("ok", "sent to ops@example.com")
    assert after.finished and after.outcome == "ok"
    assert approval_id(replay) != approval, "a replay is a new review, not a rerun"
    assert app.ran == ["ops@example.com"]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_killed_while_the_tool_runs_the_call_never_runs_again(
    backend: str, tmp_path: Path
) -> None:
    marker = tmp_path / "running.txt"
    async with database_url(backend, tmp_path) as url:
        approval = await paused_call(url, approve=True)
        with children(tmp_path) as started:
            child = started.start("consume", url, marker)
            started.wait_for("the child's tool is running", lambda: bool(read_lines(marker)))
            started.sigkill(child)
        async with restarted(url) as app:
            resumed = await app.resume()
            record = await app.store.get(approval)
            events = await app.store.events(approval)

    assert read_lines(marker) == [str(child.process.pid)]
    assert resumed.status == "error" and resumed.error is not None, resumed
    assert resumed.error.kind == "approval-denied"
    assert resumed.error.message.endswith(CONCURRENT_USE_REASON), resumed.error.message
    assert app.ran == []
    assert record.consumed and not record.finished
    assert record.decision is not None and record.decision.decided_by == "ana"
    assert [e.kind for e in events] == ["created", "voted", "decided", "consumed", "refused"]
    assert events[-1].detail == {"reason": CONCURRENT_USE_REASON}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_killed_while_writing_leaves_only_whole_records(backend: str, tmp_path: Path) -> None:
    writing = tmp_path / "writing"
    async with database_url(backend, tmp_path) as url:
        with children(tmp_path) as started:
            child = started.start("create", url, writing)
            started.wait_for("the child is writing", writing.exists)
            started.sigkill(child)
        async with restarted(url) as app:
            records = await app.store.list()
            events = await app.store.events()
            last = records[-1].request.call_id
            again = await app.store.create(send_request(last))
            fresh = await app.store.create(send_request("call_after_restart"))
            total = len(await app.store.list())

    assert len(records) >= READY_AFTER
    # The child created call_0, call_1, ... one at a time: what is there has no gap.
    assert [r.request.call_id for r in records] == [f"call_{i}" for i in range(len(records))]
    for record in records:
        assert record.request == send_request(record.request.call_id)
        assert record.status == "pending" and not record.consumed
    created = Counter(e.approval_id for e in events if e.kind == "created")
    assert created == Counter(r.approval_id for r in records), "one created event per record"
    assert {e.kind for e in events} == {"created"}
    assert again == records[-1], "the call still has its one active record"
    assert fresh.status == "pending" and fresh.approval_id not in created
    assert total == len(records) + 1
