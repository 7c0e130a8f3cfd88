"""The executor: pause, review, resume, deny, the one-use rule and bad input (003)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalDenied,
    ApprovalMismatchError,
    ApprovalPending,
    ApprovalRequest,
    AutoDeny,
    CallbackApproval,
    ConfigurationError,
    Decision,
    DeferredApproval,
    Executor,
    InterruptRule,
    InvalidArgumentsError,
    MemoryApprovalStore,
    ToolCall,
    ToolContext,
    ToolDecision,
    ToolExecutionError,
    ToolRegistry,
    ToolResult,
    UnknownToolError,
    gt,
)


@dataclass
class Shop:
    """A registry with a refund tool that records every payment, and a deferred executor."""

    store: MemoryApprovalStore = field(default_factory=MemoryApprovalStore)
    registry: ToolRegistry = field(default_factory=ToolRegistry)
    paid: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        @self.registry.tool(confirm=True, effects="destructive")
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.paid.append((order_id, amount))
            return f"refunded {amount} on {order_id}"

        @self.registry.tool
        def lookup(order_id: str) -> str:
            return f"order {order_id}"

        self.executor = Executor(self.registry, approval=DeferredApproval(self.store))
        self.ctx = self.executor.context(run_id="run_1", requested_by="carol")


def refund_call(amount: Any = 500, call_id: str = "call_1", **extra: Any) -> ToolCall:
    return ToolCall(
        name="refund", arguments={"order_id": "o-7", "amount": amount, **extra}, id=call_id
    )


def approval_id(result: ToolResult) -> str:
    assert result.status == "pending" and result.error is not None
    assert result.error.kind == "approval-pending"
    return str(result.error.details["approval_id"])


@pytest.fixture
def shop() -> Shop:
    return Shop()


async def test_a_call_that_needs_review_pauses_and_nothing_runs(shop: Shop) -> None:
    result = await shop.executor.run_call(refund_call(), shop.ctx)
    record = await shop.store.get(approval_id(result))
    assert record.status == "pending"
    assert record.request.arguments == {"order_id": "o-7", "amount": 500.0}
    assert (record.request.run_id, record.request.call_id) == ("run_1", "call_1")
    assert record.request.requested_by == "carol"
    assert shop.paid == []


async def test_run_raises_approval_pending_with_the_id(shop: Shop) -> None:
    with pytest.raises(ApprovalPending) as raised:
        await shop.executor.run(refund_call(), shop.ctx)
    [record] = await shop.store.list(status="pending")
    assert raised.value.approval_id == record.approval_id
    assert shop.paid == []


async def test_asking_again_before_a_decision_keeps_one_review(shop: Shop) -> None:
    first = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    second = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    assert first == second
    assert len(await shop.store.list()) == 1


async def test_approved_call_runs_once_on_resume(shop: Shop) -> None:
    pending = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    await shop.executor.decide(pending, True, decided_by="ana")
    result = await shop.executor.run_call(refund_call(), shop.ctx)
    assert (result.status, result.value) == ("ok", "refunded 500.0 on o-7")
    assert result.arguments == {"order_id": "o-7", "amount": 500.0}
    record = await shop.store.get(pending)
    assert record.consumed and record.finished and record.outcome == "ok"
    assert shop.paid == [("o-7", 500.0)]


async def test_edit_merges_into_the_arguments_and_runs_with_them(shop: Shop) -> None:
    pending = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    edit = ToolDecision(action="edit", arguments={"amount": 450})
    await shop.executor.decide(pending, edit, decided_by="ana")
    result = await shop.executor.run_call(refund_call(), shop.ctx)
    assert result.value == "refunded 450.0 on o-7"
    assert result.arguments == {"order_id": "o-7", "amount": 450.0}
    assert shop.paid == [("o-7", 450.0)]


async def test_invalid_edit_is_refused_at_decide_and_nothing_is_recorded(shop: Shop) -> None:
    pending = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    bad = ToolDecision(action="edit", arguments={"amount": "lots"})
    with pytest.raises(InvalidArgumentsError, match=r"invalid edited arguments.*amount") as raised:
        await shop.executor.decide(pending, bad, decided_by="ana")
    assert raised.value.errors[0]["field"] == "amount"
    with pytest.raises(InvalidArgumentsError, match="not an argument"):
        await shop.executor.decide(pending, {"action": "edit", "arguments": {"x": 1}})
    record = await shop.store.get(pending)
    assert record.status == "pending"
    assert [e.kind for e in await shop.store.events(pending)] == ["created"]


async def test_invalid_edit_stored_directly_fails_closed_at_resume(shop: Shop) -> None:
    pending = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    bad = Decision(approved=True, edited_args={"amount": "lots"}, decided_by="ana")
    await shop.store.decide(pending, bad)  # bypasses the executor's validation
    result = await shop.executor.run_call(refund_call(), shop.ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "invalid-arguments"
    assert "invalid edited arguments for tool 'refund'" in result.error.message
    assert shop.paid == []
    record = await shop.store.get(pending)
    assert record.finished and record.outcome == "invalid-arguments"  # the decision is spent


async def test_denied_call_never_runs_and_carries_the_reason(shop: Shop) -> None:
    pending = approval_id(await shop.executor.run_call(refund_call(900), shop.ctx))
    no = Decision(approved=False, reason="refund policy: max 500", decided_by="ana")
    await shop.executor.decide(pending, no)
    with pytest.raises(ApprovalDenied) as raised:
        await shop.executor.run(refund_call(900), shop.ctx)
    assert str(raised.value) == "approval denied for tool 'refund': refund policy: max 500"
    assert (raised.value.reason, raised.value.decided_by) == ("refund policy: max 500", "ana")
    assert raised.value.approval_id == pending
    assert shop.paid == []


async def test_run_call_reports_a_denial_as_an_error_result(shop: Shop) -> None:
    pending = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    await shop.executor.decide(pending, {"action": "deny", "message": "no"}, decided_by="bob")
    result = await shop.executor.run_call(refund_call(), shop.ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "approval-denied"
    assert result.error.details == {
        "approval_id": pending,
        "tool": "refund",
        "reason": "no",
        "decided_by": "bob",
    }


async def test_a_replay_after_consumption_is_a_new_review_not_a_rerun(shop: Shop) -> None:
    first = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    await shop.executor.decide(first, True)
    assert (await shop.executor.run_call(refund_call(), shop.ctx)).status == "ok"
    replay = await shop.executor.run_call(refund_call(), shop.ctx)
    assert approval_id(replay) != first
    assert shop.paid == [("o-7", 500.0)]


async def test_a_decision_after_consumption_is_refused(shop: Shop) -> None:
    first = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    await shop.executor.decide(first, True, decided_by="ana")
    await shop.executor.run_call(refund_call(), shop.ctx)
    with pytest.raises(ApprovalAlreadyDecided):
        await shop.executor.decide(first, False, decided_by="bob")
    record = await shop.store.get(first)
    assert record.decision is not None and record.decision.decided_by == "ana"


async def test_a_decision_for_another_call_does_not_approve_this_one(shop: Shop) -> None:
    first = approval_id(await shop.executor.run_call(refund_call(call_id="call_1"), shop.ctx))
    await shop.executor.decide(first, True)
    other_call = await shop.executor.run_call(refund_call(call_id="call_2"), shop.ctx)
    other_run = await shop.executor.run_call(refund_call(), shop.executor.context("run_2"))
    assert len({first, approval_id(other_call), approval_id(other_run)}) == 3
    assert not (await shop.store.get(first)).consumed
    assert shop.paid == []


async def test_a_record_for_other_arguments_fails_closed(shop: Shop) -> None:
    first = approval_id(await shop.executor.run_call(refund_call(500), shop.ctx))
    await shop.executor.decide(first, True)
    result = await shop.executor.run_call(refund_call(5000), shop.ctx)  # same call id
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "approval-mismatch"
    assert "made for other arguments" in result.error.message
    with pytest.raises(ApprovalMismatchError):
        await shop.executor.run(refund_call(5000), shop.ctx)
    record = await shop.store.get(first)
    assert record.status == "approved" and not record.consumed
    assert shop.paid == []


async def test_a_record_for_another_tool_fails_closed(shop: Shop) -> None:
    @shop.registry.tool(confirm=True)
    def delete_order(order_id: str, amount: float) -> str:
        return "deleted"

    first = approval_id(await shop.executor.run_call(refund_call(), shop.ctx))
    await shop.executor.decide(first, True)
    impostor = ToolCall(
        name="delete_order", arguments={"order_id": "o-7", "amount": 500}, id="call_1"
    )
    with pytest.raises(ApprovalMismatchError, match="made for tool 'refund'"):
        await shop.executor.run(impostor, shop.ctx)
    assert not (await shop.store.get(first)).consumed


async def test_unknown_tool_is_an_error_and_changes_nothing(shop: Shop) -> None:
    call = ToolCall(name="wire_money", arguments={}, id="call_9")
    result = await shop.executor.run_call(call, shop.ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "unknown-tool"
    assert "'wire_money'" in result.error.message and "'refund'" in result.error.message
    with pytest.raises(UnknownToolError):
        await shop.executor.run(call, shop.ctx)
    assert await shop.store.list() == []


async def test_arguments_of_the_wrong_type_are_an_error_and_change_nothing(shop: Shop) -> None:
    result = await shop.executor.run_call(refund_call("a lot"), shop.ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "invalid-arguments"
    assert result.error.message.startswith("invalid arguments for tool 'refund': amount:")
    assert result.error.details["errors"][0]["field"] == "amount"
    extra = await shop.executor.run_call(refund_call(note="hi"), shop.ctx)
    assert extra.error is not None and "note: not an argument" in extra.error.message
    assert await shop.store.list() == []
    assert shop.paid == []


async def test_concurrent_resumes_of_one_decision_run_the_tool_once() -> None:
    store = MemoryApprovalStore()
    registry = ToolRegistry()
    release, started = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    @registry.tool(confirm=True)
    async def send(to: str) -> str:
        runs.append(to)
        started.set()
        await release.wait()  # hold the winner in flight while the others arrive
        return "sent"

    executor = Executor(registry, approval=DeferredApproval(store))
    ctx = executor.context("run_1")
    call = ToolCall(name="send", arguments={"to": "a@example.com"}, id="call_1")
    pending = approval_id(await executor.run_call(call, ctx))
    await executor.decide(pending, True)

    winner = asyncio.create_task(executor.run_call(call, ctx))
    await started.wait()
    losers = await asyncio.gather(*(executor.run_call(call, ctx) for _ in range(9)))
    release.set()
    assert (await winner).status == "ok"
    for loser in losers:
        assert loser.status == "error" and loser.error is not None
        assert loser.error.kind == "approval-denied"
        assert loser.error.message.endswith("approval already used by a concurrent request")
    assert runs == ["a@example.com"]
    kinds = [e.kind for e in await store.events(pending)]
    assert kinds.count("consumed") == 1 and kinds.count("refused") == 9


async def test_a_cancelled_call_spends_its_decision() -> None:
    store = MemoryApprovalStore()
    registry = ToolRegistry()
    started = asyncio.Event()

    @registry.tool(confirm=True)
    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()

    executor = Executor(registry, approval=DeferredApproval(store))
    ctx = executor.context("run_1")
    call = ToolCall(name="slow", id="call_1")
    pending = approval_id(await executor.run_call(call, ctx))
    await executor.decide(pending, True)
    task = asyncio.create_task(executor.run_call(call, ctx))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await store.get(pending)
    assert record.finished and record.outcome == "cancelled"


async def test_a_failing_tool_is_reported_and_spends_its_decision(shop: Shop) -> None:
    @shop.registry.tool(confirm=True)
    def explode() -> None:
        raise RuntimeError("disk full")

    call = ToolCall(name="explode", id="call_x")
    pending = approval_id(await shop.executor.run_call(call, shop.ctx))
    await shop.executor.decide(pending, True)
    result = await shop.executor.run_call(call, shop.ctx)
    assert result.error is not None and result.error.kind == "tool-failed"
    assert result.error.message == "tool 'explode' failed: RuntimeError: disk full"
    assert (await shop.store.get(pending)).outcome == "tool-failed"
    replay = await shop.executor.run_call(call, shop.ctx)
    assert approval_id(replay) != pending

    @shop.registry.tool
    def explode_unreviewed() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(ToolExecutionError) as raised:
        await shop.executor.run(ToolCall(name="explode_unreviewed"), shop.ctx)
    assert isinstance(raised.value.__cause__, RuntimeError)


async def test_calls_without_review_run_directly(shop: Shop) -> None:
    result = await shop.executor.run_call(
        ToolCall(name="lookup", arguments={"order_id": "o-1"}), shop.ctx
    )
    assert (result.status, result.value) == ("ok", "order o-1")
    assert await shop.store.list() == []


@pytest.mark.parametrize("is_async", [False, True])
async def test_confirm_rule_decides_which_calls_are_reviewed(is_async: bool) -> None:
    registry = ToolRegistry()

    def big(call: ToolCall, ctx: ToolContext) -> bool:
        return float(call.arguments["amount"]) > 100

    async def big_async(call: ToolCall, ctx: ToolContext) -> bool:
        return big(call, ctx)

    @registry.tool(confirm=big_async if is_async else big)
    def refund(amount: float) -> float:
        return amount

    executor = Executor(registry, approval=DeferredApproval(MemoryApprovalStore()))
    ctx = executor.context()
    assert (
        await executor.run_call(ToolCall(name="refund", arguments={"amount": 20}), ctx)
    ).value == 20.0
    big_one = await executor.run_call(ToolCall(name="refund", arguments={"amount": 200}), ctx)
    assert big_one.status == "pending"


async def test_a_confirm_rule_that_raises_means_review() -> None:
    registry = ToolRegistry()

    def broken(call: ToolCall, ctx: ToolContext) -> bool:
        raise KeyError("amount")

    @registry.tool(confirm=broken)
    def refund(amount: float) -> float:
        return amount

    executor = Executor(registry, approval=DeferredApproval(MemoryApprovalStore()))
    result = await executor.run_call(
        ToolCall(name="refund", arguments={"amount": 1}), executor.context()
    )
    assert result.status == "pending"


async def test_interrupt_rules_on_the_executor_pause_matching_calls() -> None:
    registry = ToolRegistry()

    @registry.tool
    def refund(amount: float) -> float:
        return amount

    executor = Executor(
        registry,
        approval=DeferredApproval(MemoryApprovalStore()),
        rules=[InterruptRule(tool="refund", match=gt("amount", 100))],
    )
    ctx = executor.context()
    assert (
        await executor.run_call(ToolCall(name="refund", arguments={"amount": 50}), ctx)
    ).status == "ok"
    assert (
        await executor.run_call(ToolCall(name="refund", arguments={"amount": 150}), ctx)
    ).status == "pending"


async def test_without_a_port_every_reviewed_call_is_denied(shop: Shop) -> None:
    executor = Executor(shop.registry)
    with pytest.raises(ApprovalDenied, match="no approval port configured"):
        await executor.run(refund_call(), executor.context())
    assert shop.paid == []


async def test_auto_deny_gives_its_reason(shop: Shop) -> None:
    executor = Executor(shop.registry, approval=AutoDeny(reason="read-only mode"))
    with pytest.raises(ApprovalDenied, match="read-only mode") as raised:
        await executor.run(refund_call(), executor.context())
    assert raised.value.decided_by == "nodbot:auto-deny"
    assert shop.paid == []


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (True, ("o-7", 500.0)),
        (ToolDecision(action="edit", arguments={"amount": 1}), ("o-7", 1.0)),
        ({"action": "approve"}, ("o-7", 500.0)),
        ("yes", None),
        (False, None),
        (ToolDecision(action="deny", message="nope"), None),
    ],
)
@pytest.mark.parametrize("is_async", [False, True])
async def test_callback_approval_answers_now(
    shop: Shop, answer: object, expected: tuple[str, float] | None, is_async: bool
) -> None:
    seen: list[ApprovalRequest] = []

    def decide(request: ApprovalRequest) -> object:
        seen.append(request)
        return answer

    async def decide_async(request: ApprovalRequest) -> object:
        return decide(request)

    executor = Executor(
        shop.registry, approval=CallbackApproval(decide_async if is_async else decide)
    )
    result = await executor.run_call(refund_call(), executor.context("run_cb"))
    assert seen[0].interrupt.tool_name == "refund" and seen[0].run_id == "run_cb"
    assert shop.paid == ([expected] if expected else [])
    assert result.status == ("ok" if expected else "error")


async def test_a_callback_that_raises_denies(shop: Shop) -> None:
    def broken(request: ApprovalRequest) -> object:
        raise RuntimeError("policy service down")

    executor = Executor(shop.registry, approval=CallbackApproval(broken))
    with pytest.raises(ApprovalDenied, match="approval callback failed: RuntimeError"):
        await executor.run(refund_call(), executor.context())
    assert shop.paid == []


async def test_decide_needs_a_deferred_port(shop: Shop) -> None:
    with pytest.raises(ConfigurationError, match="DeferredApproval"):
        await Executor(shop.registry).decide("apr_x", True)


async def test_context_keeps_or_makes_a_run_id(shop: Shop) -> None:
    assert shop.executor.context("run_9").run_id == "run_9"
    made = {shop.executor.context().run_id for _ in range(3)}
    assert len(made) == 3 and all(run_id.startswith("run_") for run_id in made)
