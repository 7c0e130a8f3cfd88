"""The rules of 003 through the executor, on every store backend: the decision is bound to
its call, used once, and a replay opens a new review."""

from __future__ import annotations

import asyncio

import pytest

from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalMismatchError,
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    ToolCall,
    ToolRegistry,
    ToolResult,
)


class Refunds:
    """A refund tool that records each payment, behind a deferred executor on `store`."""

    def __init__(self, store: ApprovalStore) -> None:
        self.store = store
        self.paid: list[float] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.running = asyncio.Event()
        registry = ToolRegistry()

        @registry.tool(confirm=True, effects="destructive")
        async def refund(order_id: str, amount: float) -> str:
            self.paid.append(amount)
            self.running.set()
            await self.gate.wait()
            return f"refunded {amount} on {order_id}"

        self.executor = Executor(registry, approval=DeferredApproval(store))
        self.ctx = self.executor.context("run_support_42")

    async def call(self, amount: float = 500, call_id: str = "call_1") -> ToolResult:
        arguments = {"order_id": "o-7", "amount": amount}
        return await self.executor.run_call(
            ToolCall(name="refund", arguments=arguments, id=call_id), self.ctx
        )


def approval_id(result: ToolResult) -> str:
    assert result.status == "pending" and result.error is not None, result
    return str(result.error.details["approval_id"])


@pytest.fixture
def refunds(store: ApprovalStore) -> Refunds:
    return Refunds(store)


async def test_pause_edit_resume_runs_once_with_the_edit(refunds: Refunds) -> None:
    pending = approval_id(await refunds.call())
    [waiting] = await refunds.store.list(run_id="run_support_42", status="pending")
    assert waiting.request.arguments == {"order_id": "o-7", "amount": 500.0}
    edit = Decision(approved=True, edited_args={"amount": 450}, decided_by="ana")
    await refunds.executor.decide(pending, edit)
    with pytest.raises(ApprovalAlreadyDecided):
        await refunds.store.decide(pending, Decision(approved=False, decided_by="bob"))
    resumed = await refunds.call()
    assert (resumed.status, resumed.value) == ("ok", "refunded 450.0 on o-7")
    assert (await refunds.store.get(pending)).consumed
    replay = await refunds.call()
    assert approval_id(replay) != pending
    assert refunds.paid == [450.0]


async def test_denial_reaches_the_caller_and_nothing_runs(refunds: Refunds) -> None:
    pending = approval_id(await refunds.call(900, "call_2"))
    no = Decision(approved=False, reason="refund policy: max 500", decided_by="ana")
    await refunds.store.decide(pending, no)
    denied = await refunds.call(900, "call_2")
    assert denied.error is not None
    assert denied.error.message == "approval denied for tool 'refund': refund policy: max 500"
    assert refunds.paid == []


async def test_a_decision_is_bound_to_its_arguments(refunds: Refunds) -> None:
    pending = approval_id(await refunds.call(500))
    await refunds.executor.decide(pending, True)
    result = await refunds.call(5000)
    assert result.error is not None and result.error.kind == ApprovalMismatchError.kind
    record = await refunds.store.get(pending)
    assert record.status == "approved" and not record.consumed
    assert refunds.paid == []


async def test_concurrent_resumes_one_runs_the_rest_are_denied(refunds: Refunds) -> None:
    pending = approval_id(await refunds.call())
    await refunds.executor.decide(pending, True)
    refunds.gate.clear()  # the winner stays in flight while the others arrive
    winner = asyncio.create_task(refunds.call())
    await refunds.running.wait()
    losers = await asyncio.gather(*(refunds.call() for _ in range(5)))
    refunds.gate.set()
    assert (await winner).status == "ok"
    assert {loser.error.message for loser in losers if loser.error} == {
        "approval denied for tool 'refund': approval already used by a concurrent request"
    }
    assert refunds.paid == [500.0]
