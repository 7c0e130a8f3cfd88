"""An app that runs the executor itself waits for the decision made in another process."""

from __future__ import annotations

import asyncio
import time

import pytest

from nodbot.core import (
    ApprovalNotFound,
    ApprovalRequest,
    ApprovalStore,
    Decision,
    SqlApprovalStore,
    arguments_digest,
    wait_for_decision,
)

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
