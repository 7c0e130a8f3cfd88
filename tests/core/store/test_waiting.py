"""An app that runs the executor itself waits for the decision made in another process."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from nodbot.core import (
    ApprovalNotFound,
    ApprovalRequest,
    ApprovalStore,
    Decision,
    MemoryApprovalStore,
    SqlApprovalStore,
    arguments_digest,
    wait_for_decision,
)
from nodbot.core.waiting import set_within
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[3]

ARGUMENTS = {"to": "a@example.com"}


def request() -> ApprovalRequest:
    return ApprovalRequest("run_1", "call_1", "send", ARGUMENTS, arguments_digest(ARGUMENTS))


async def test_waiting_returns_once_decided(store: ApprovalStore) -> None:
    record = await store.create(request())

    async def decide_later() -> None:
        await asyncio.sleep(0.05)
        await store.decide(record.approval_id, Decision(approved=True, decided_by="ana"))

    decider = asyncio.create_task(decide_later())
    async with asyncio.timeout(10):
        decided = await wait_for_decision(store, record.approval_id, poll=0.02)
    await decider
    assert decided.status == "approved"


async def test_waiting_times_out_and_unknown_ids_fail(store: ApprovalStore) -> None:
    record = await store.create(request())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await wait_for_decision(store, record.approval_id, poll=0.02)
    with pytest.raises(ApprovalNotFound):
        await wait_for_decision(store, "apr_missing")


@pytest.mark.postgres
async def test_on_postgresql_a_decision_elsewhere_wakes_the_wait(postgres_url: str) -> None:
    async with SqlApprovalStore(postgres_url) as mine, SqlApprovalStore(postgres_url) as theirs:
        record = await mine.create(request())

        async def decide_elsewhere() -> None:
            await asyncio.sleep(0.1)
            await theirs.decide(record.approval_id, Decision(approved=False, decided_by="bob"))

        decider = asyncio.create_task(decide_elsewhere())
        started = time.monotonic()
        async with asyncio.timeout(30):
            decided = await wait_for_decision(mine, record.approval_id, poll=20)
        await decider
    assert decided.status == "denied"
    assert time.monotonic() - started < 5  # woken by the notice, not by the 20 s poll


class _Told(MemoryApprovalStore):
    """The memory store with PostgreSQL's `listen`: the test tells the listeners, as a
    notice of a decision made anywhere does."""

    def __init__(self) -> None:
        super().__init__()
        self.woken: list[Callable[[], None]] = []

    async def listen(self, woken: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        self.woken.append(woken)

        async def unlisten() -> None:
            self.woken.remove(woken)

        return unlisten


@pytest.mark.parametrize("turns", range(4))
async def test_a_wait_given_up_as_a_notice_wakes_it_ends(turns: int) -> None:
    """The caller gives up (its `asyncio.timeout` expires, its request is dropped) just as a
    notice of another approval's decision wakes the wait, `turns` loop turns after it: the
    wait ends. With `asyncio.wait_for` (Python 3.11) the wake-up won, the cancel was lost and
    the wait went on looking, unbounded."""
    store = _Told()
    record = await store.create(request())
    waiting = asyncio.create_task(wait_for_decision(store, record.approval_id, poll=60))

    async def listening() -> bool:
        return bool(store.woken)

    await eventually(listening, "the wait listening")
    for woken in store.woken:
        woken()  # another approval was decided
    for _ in range(turns):
        await asyncio.sleep(0)
    assert waiting.cancel()
    done, _ = await asyncio.wait({waiting}, timeout=5)
    assert done and waiting.cancelled()
    assert store.woken == []  # and it stopped listening


async def test_set_within_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    started = time.monotonic()
    assert await set_within(event, 0.05) is False
    assert time.monotonic() - started >= 0.05
    asyncio.get_running_loop().call_soon(event.set)
    assert await set_within(event, 60) is True


def test_nodbot_waits_with_timeouts_that_keep_a_cancel() -> None:
    """No `asyncio.wait_for` in nodbot's own code: on Python 3.11 it loses a cancel that
    arrives as what it awaits completes (see `set_within`), which left a killed IMAP reader
    reading on and a given-up wait waiting."""
    used = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("core", "bot")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bwait_for\(", line) and "wait_for_decision" not in line
    ]
    assert used == []
