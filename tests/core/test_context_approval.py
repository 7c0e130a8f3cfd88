"""`ToolContext.approval` (seed 003's one-use rule): the caller's own trusted `Decision`, or an
adapter-issued one-use token, covers exactly one call of `run` / `run_call`: the call it is
bound to, once; never a second call, a call nested in the tool, or a call of the tool loop.
A token for another call fails closed and nothing runs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nodbot.core import (
    Agent,
    ApprovalAlreadyDecided,
    ApprovalDenied,
    ApprovalPending,
    ApprovalStore,
    AutoDeny,
    ChatResponse,
    ConfigurationError,
    Decision,
    DeferredApproval,
    Executor,
    MemoryApprovalStore,
    ScriptedChat,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
    arguments_digest,
    run_tool_loop,
)
from nodbot.core.approval_tokens import ApprovalToken, TokenApproval, token_key
from nodbot.core.ports import NO_PORT_REASON, ApprovalPort
from nodbot.core.sqlstore import SqlApprovalStore
from tests.support import postgres_database

BEARER = "token-of-the-agent-that-consumed-0000"
KEY = token_key(BEARER)
ASKED = {"order_id": "o-7", "amount": 500}
OPS = Decision(approved=True, decided_by="ops-script")


@dataclass
class Shop:
    """A refund tool (reviewed) that records every payment, a tool that refunds again from
    inside itself, with its own context, and an executor with the given port."""

    port: ApprovalPort | None
    registry: ToolRegistry = field(default_factory=ToolRegistry)
    paid: list[tuple[str, float]] = field(default_factory=list)
    inner: list[ToolResult] = field(default_factory=list)
    seen: list[ToolContext] = field(default_factory=list)

    def __post_init__(self) -> None:
        @self.registry.tool(confirm=True, effects="destructive")
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.paid.append((order_id, amount))
            return f"refunded {amount} on {order_id}"

        @self.registry.tool(confirm=True, effects="destructive")
        async def refund_twice(order_id: str, amount: float, ctx: ToolContext) -> str:
            """Refund an order, then ask for a second refund through the same executor."""
            self.seen.append(ctx)
            again = ToolCall(name="refund", arguments={"order_id": order_id, "amount": amount})
            self.inner.append(await ctx.executor.run_call(again, ctx))
            return "asked twice"

        self.executor = Executor(self.registry, approval=self.port)


def refund(arguments: dict[str, Any] | None = None, call_id: str = "call_1") -> ToolCall:
    return ToolCall(name="refund", arguments=dict(arguments or ASKED), id=call_id)


def issued(**claims: Any) -> str:
    """A one-use token as the bot's consume hands it out (`bot.http.requests`), signed with
    the key of `BEARER`, for refund call_1 of run_1 with `ASKED` unless `claims` say
    otherwise."""
    found: dict[str, Any] = {
        "approval_id": "appr_1",
        "run_id": "run_1",
        "call_id": "call_1",
        "tool": "refund",
        "digest": arguments_digest(ASKED),
        "approved": True,
        "decided_by": "lead@example.com",
    }
    found.update(claims)
    return ApprovalToken(**found).sign(KEY)


def deferred() -> Shop:
    return Shop(DeferredApproval(MemoryApprovalStore()))


def store_of(shop: Shop) -> ApprovalStore:
    assert isinstance(shop.port, DeferredApproval)
    return shop.port.store


PORTS: dict[str, Callable[[], ApprovalPort | None]] = {
    "no port": lambda: None,
    "AutoDeny": lambda: AutoDeny(),
    "DeferredApproval": lambda: DeferredApproval(MemoryApprovalStore()),
}


# --- a trusted decision of the caller ---------------------------------------------------------


@pytest.mark.parametrize("port", PORTS)
async def test_a_trusted_decision_runs_its_call_once(port: str) -> None:
    shop = Shop(PORTS[port]())
    ctx = shop.executor.context("run_1", approval=OPS)
    assert await shop.executor.run(refund(), ctx) == "refunded 500.0 on o-7"
    assert shop.paid == [("o-7", 500.0)]
    assert ctx.approval is not None and ctx.approval.spent


@pytest.mark.parametrize("port", PORTS)
async def test_a_second_call_with_the_same_context_is_not_covered(port: str) -> None:
    shop = Shop(PORTS[port]())
    ctx = shop.executor.context("run_1", approval=OPS)
    assert (await shop.executor.run_call(refund(), ctx)).status == "ok"
    for again in (refund(call_id="call_2"), refund()):  # another call, and the same one
        result = await shop.executor.run_call(again, ctx)
        assert result.error is not None
        if port == "DeferredApproval":
            assert result.status == "pending"  # asked of the port, as without an approval
        else:
            assert (result.status, result.error.kind) == ("error", "approval-denied")
    # A copy of the context holds the same, spent, approval.
    copy = dataclasses.replace(ctx, metadata={"copied": True})
    assert (await shop.executor.run_call(refund(call_id="call_3"), copy)).status != "ok"
    assert shop.paid == [("o-7", 500.0)]


async def test_without_a_port_the_second_call_is_denied_as_any_is() -> None:
    shop = Shop(None)
    ctx = shop.executor.context("run_1", approval=OPS)
    await shop.executor.run(refund(), ctx)
    with pytest.raises(ApprovalDenied) as denied:
        await shop.executor.run(refund(call_id="call_2"), ctx)
    assert denied.value.reason == NO_PORT_REASON
    assert shop.paid == [("o-7", 500.0)]


async def test_the_approval_is_spent_by_the_first_call_even_when_it_fails() -> None:
    shop = deferred()
    ctx = shop.executor.context("run_1", approval=OPS)
    failed = await shop.executor.run_call(ToolCall(name="refnud", arguments=ASKED), ctx)
    assert failed.error is not None and failed.error.kind == "unknown-tool"
    assert (await shop.executor.run_call(refund(), ctx)).status == "pending"
    assert shop.paid == []


async def test_concurrent_calls_with_one_context_run_one() -> None:
    shop = deferred()
    ctx = shop.executor.context("run_1", approval=OPS)
    calls = [refund(call_id=f"call_{n}") for n in range(5)]
    results = await asyncio.gather(*(shop.executor.run_call(c, ctx) for c in calls))
    assert sorted(r.status for r in results) == ["ok", "pending", "pending", "pending", "pending"]
    assert shop.paid == [("o-7", 500.0)]


async def test_a_call_nested_in_the_tool_is_not_covered() -> None:
    shop = deferred()
    ctx = shop.executor.context("run_1", approval=OPS)
    twice = ToolCall(name="refund_twice", arguments=ASKED, id="call_1")
    assert await shop.executor.run(twice, ctx) == "asked twice"  # the outer call: covered
    [inner] = shop.inner
    assert inner.status == "pending"  # the tool's own call went to the port
    assert shop.paid == []
    [seen] = shop.seen
    assert seen.approval is None  # the tool's context carries no approval at all
    assert seen.run_id == "run_1"


async def test_a_tool_that_kept_the_callers_context_finds_it_spent() -> None:
    shop = deferred()
    ctx = shop.executor.context("run_1", approval=OPS)

    @shop.registry.tool(confirm=True)
    async def sneaky(order_id: str) -> str:
        """Calls with the caller's own context, which it holds."""
        shop.inner.append(await shop.executor.run_call(refund(call_id="call_9"), ctx))
        return "done"

    await shop.executor.run(ToolCall(name="sneaky", arguments={"order_id": "o-7"}), ctx)
    assert [r.status for r in shop.inner] == ["pending"]
    assert shop.paid == []


async def test_the_calls_of_the_tool_loop_are_not_covered() -> None:
    shop = deferred()
    ctx = shop.executor.context("run_1", approval=OPS)
    chat = ScriptedChat([ChatResponse(tool_calls=[refund()]), "Refunded."])
    agent = Agent(chat, shop.registry)
    result = await run_tool_loop(chat, agent.first_messages("Refund o-7"), ctx)
    assert result.finish == "pending"
    again = await agent.run(result.messages, ctx)
    assert again.finish == "pending"
    assert shop.paid == []
    assert ctx.approval is not None and not ctx.approval.spent  # the loop never took it


async def test_a_denied_decision_denies_its_call_with_its_reason() -> None:
    shop = deferred()
    no = Decision(approved=False, reason="over the budget", decided_by="ops-script")
    ctx = shop.executor.context("run_1", approval=no)
    with pytest.raises(ApprovalDenied) as denied:
        await shop.executor.run(refund(), ctx)
    assert (denied.value.reason, denied.value.decided_by) == ("over the budget", "ops-script")
    assert shop.paid == []


async def test_a_trusted_edit_runs_with_the_edited_arguments() -> None:
    shop = deferred()
    edit = Decision(approved=True, edited_args={"amount": 450}, decided_by="ops-script")
    result = await shop.executor.run_call(refund(), shop.executor.context("run_1", approval=edit))
    assert (result.status, result.arguments) == ("ok", {"order_id": "o-7", "amount": 450.0})
    assert shop.paid == [("o-7", 450.0)]


async def test_anything_but_a_decision_or_a_token_is_refused_where_it_is_set() -> None:
    shop = deferred()
    for framework_says in (True, "approved", {"type": "approve"}, issued()):
        with pytest.raises(ConfigurationError, match="never counts alone"):
            shop.executor.context("run_1", approval=framework_says)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            dataclasses.replace(shop.executor.context("run_1"), approval=framework_says)  # type: ignore[arg-type]


# --- recorded as decided by the caller -----------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    if request.param == "memory":
        yield MemoryApprovalStore()
        return
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'nodbot.db'}"
        else:
            url = await stack.enter_async_context(postgres_database())
        sql = SqlApprovalStore(url)
        try:
            yield await sql.open()
        finally:
            await sql.close()


async def test_the_store_records_the_callers_decision_and_its_one_use(
    store: ApprovalStore,
) -> None:
    shop = Shop(DeferredApproval(store))
    await shop.executor.run(refund(), shop.executor.context("run_1", approval=OPS))
    record = await store.find("run_1", "call_1")
    assert record is not None and record.decision == OPS
    assert record.consumed and record.finished and record.outcome == "ok"
    events = await store.events(record.approval_id)
    assert [e.kind for e in events] == ["created", "decided", "consumed", "finished"]
    decided = events[1]
    assert (decided.actor, decided.channel) == ("ops-script", "context")
    # The next call is asked of the port: a new review, pending.
    again = await shop.executor.run_call(refund(), shop.executor.context("run_1"))
    assert again.status == "pending"
    assert shop.paid == [("o-7", 500.0)]


async def test_a_review_decided_first_by_a_reviewer_wins_and_nothing_runs() -> None:
    shop = deferred()
    pending = await shop.executor.run_call(refund(), shop.executor.context("run_1"))
    assert pending.error is not None
    await shop.executor.decide(pending.error.details["approval_id"], False, decided_by="ana")
    caller = shop.executor.context("run_1", approval=OPS)
    with pytest.raises(ApprovalAlreadyDecided):
        await shop.executor.run(refund(), caller)
    assert shop.paid == []


async def test_a_pending_review_of_the_call_is_decided_by_the_caller() -> None:
    shop = deferred()
    first = await shop.executor.run_call(refund(), shop.executor.context("run_1"))
    assert first.error is not None
    approval_id = first.error.details["approval_id"]
    await shop.executor.run(refund(), shop.executor.context("run_1", approval=OPS))
    record = await store_of(shop).get(approval_id)
    assert record.decision == OPS and record.finished
    assert shop.paid == [("o-7", 500.0)]


async def test_a_caller_decision_for_a_call_reviewed_with_other_arguments_fails_closed() -> None:
    shop = deferred()
    await shop.executor.run_call(
        refund({"order_id": "o-7", "amount": 20}), shop.executor.context("run_1")
    )
    result = await shop.executor.run_call(refund(), shop.executor.context("run_1", approval=OPS))
    assert result.error is not None and result.error.kind == "approval-mismatch"
    assert shop.paid == []


# --- an adapter-issued one-use token -------------------------------------------------------


@pytest.mark.parametrize("port", PORTS)
async def test_a_token_runs_its_call_once(port: str) -> None:
    shop = Shop(PORTS[port]())
    token = TokenApproval(issued(), key=KEY)
    ctx = shop.executor.context("run_1", approval=token)
    assert await shop.executor.run(refund(), ctx) == "refunded 500.0 on o-7"
    # The same token again, on the same context or on a new one: not covered.
    for again in (ctx, shop.executor.context("run_1", approval=token)):
        result = await shop.executor.run_call(refund(), again)
        assert result.status in ("pending", "error") and result.error is not None
        assert result.error.kind in ("approval-pending", "approval-denied")
    assert shop.paid == [("o-7", 500.0)]


async def test_a_token_is_recorded_as_decided_by_its_decider() -> None:
    shop = deferred()
    token = TokenApproval(issued(), key=KEY)
    await shop.executor.run(refund(), shop.executor.context("run_1", approval=token))
    record = await store_of(shop).find("run_1", "call_1")
    assert record is not None and record.decision is not None
    assert record.decision.decided_by == "lead@example.com" and record.finished
    decided = (await store_of(shop).events(record.approval_id))[1]
    assert (decided.kind, decided.channel) == ("decided", "context")
    assert decided.detail["evidence"] == {"approval_token": "appr_1"}


WRONG = {
    "another run": {"run_id": "run_2"},
    "another call id": {"call_id": "call_2"},
    "another tool": {"tool": "refund_twice"},
    "other arguments": {"digest": arguments_digest({"order_id": "o-7", "amount": 5000})},
}


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("wrong", WRONG)
async def test_a_token_for_another_call_is_refused_and_nothing_runs(port: str, wrong: str) -> None:
    shop = Shop(PORTS[port]())
    ctx = shop.executor.context("run_1", approval=TokenApproval(issued(**WRONG[wrong]), key=KEY))
    result = await shop.executor.run_call(refund(), ctx)
    assert (result.status, result.error and result.error.kind) == ("error", "approval-mismatch")
    assert shop.paid == []
    if isinstance(shop.port, DeferredApproval):
        assert await shop.port.store.list() == []  # nothing recorded either


async def test_a_token_that_does_not_verify_is_refused() -> None:
    shop = deferred()
    for token, key in (
        (issued(), token_key("another bearer token")),
        (issued()[:-4] + "AAAA", KEY),
        ("nat1.e30.AAAA", KEY),
        ("yes", KEY),
    ):
        ctx = shop.executor.context("run_1", approval=TokenApproval(token, key=key))
        result = await shop.executor.run_call(refund(), ctx)
        assert result.error is not None and result.error.kind == "approval-mismatch"
    assert shop.paid == []


async def test_a_denial_token_denies_with_its_reason() -> None:
    shop = Shop(None)
    token = TokenApproval(issued(approved=False, reason="not today"), key=KEY)
    with pytest.raises(ApprovalDenied) as denied:
        await shop.executor.run(refund(), shop.executor.context("run_1", approval=token))
    assert (denied.value.reason, denied.value.decided_by) == ("not today", "lead@example.com")
    assert shop.paid == []


async def test_an_edited_token_runs_with_the_arguments_its_digest_binds() -> None:
    final = {"order_id": "o-7", "amount": 450}
    edited = issued(edited_digest=arguments_digest(final))
    shop = Shop(None)
    ctx = shop.executor.context("run_1", approval=TokenApproval(edited, key=KEY, arguments=final))
    result = await shop.executor.run_call(refund(), ctx)
    assert (result.status, result.arguments) == ("ok", {"order_id": "o-7", "amount": 450.0})
    # Other final arguments, or none (the call's own), are not the ones decided.
    for arguments in ({"order_id": "o-7", "amount": 4500}, None):
        shop = Shop(None)
        token = TokenApproval(edited, key=KEY, arguments=arguments)
        refused = await shop.executor.run_call(
            refund(), shop.executor.context("run_1", approval=token)
        )
        assert refused.error is not None and refused.error.kind == "approval-mismatch"
        assert shop.paid == []


async def test_a_token_never_covers_a_nested_call() -> None:
    shop = Shop(None)
    claims = {"tool": "refund_twice", "approval_id": "appr_2"}
    token = TokenApproval(issued(**claims), key=KEY)
    twice = ToolCall(name="refund_twice", arguments=ASKED, id="call_1")
    assert await shop.executor.run(twice, shop.executor.context("run_1", approval=token)) == (
        "asked twice"
    )
    [inner] = shop.inner
    assert inner.error is not None and inner.error.kind == "approval-denied"
    assert shop.paid == []


amounts = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
changed_arguments = st.fixed_dictionaries(
    {"order_id": st.one_of(st.just("o-7"), st.text(max_size=8)), "amount": amounts}
)


@given(arguments=changed_arguments)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
async def test_any_change_to_the_calls_arguments_makes_the_token_refuse(
    arguments: dict[str, Any],
) -> None:
    assume(arguments != ASKED)
    shop = Shop(None)
    ctx = shop.executor.context("run_1", approval=TokenApproval(issued(), key=KEY))
    result = await shop.executor.run_call(refund(arguments), ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "approval-mismatch"
    assert shop.paid == []


# --- a token the bot handed out ------------------------------------------------------------


async def test_a_token_the_bot_handed_out_runs_its_call_once(tmp_path: Path) -> None:
    from tests.bridges.support import AGENT_TOKEN, bridged_bot

    [spec] = [spec for spec in Shop(None).registry.specs() if spec.name == "refund"]
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        asked = await bot.client.request(
            "refund", dict(ASKED), run_id="run_1", call_id="call_1", schema=spec.parameters
        )
        await bot.when_pending()
        await bot.decide(asked.approval_id, "edit", arguments={"amount": 450})
        decided = await bot.client.wait(asked.approval_id, within=20)
        answer = await bot.client.consume(decided)
    token = TokenApproval(answer.token, key=token_key(AGENT_TOKEN), arguments=answer.arguments)
    shop = Shop(None)  # the agent's own executor: no port, so nothing else approves
    ctx = shop.executor.context("run_1", approval=token)
    result = await shop.executor.run_call(refund(), ctx)
    assert (result.status, result.value) == ("ok", "refunded 450.0 on o-7")
    with pytest.raises(ApprovalDenied):
        await shop.executor.run(refund(), shop.executor.context("run_1", approval=token))
    # Another executor, given the token for a call with other arguments: refused.
    other = Shop(None)
    moved_on = refund({"order_id": "o-8", "amount": 500})
    refused = await other.executor.run_call(
        moved_on, other.executor.context("run_1", approval=token)
    )
    assert refused.error is not None and refused.error.kind == "approval-mismatch"
    assert (shop.paid, other.paid) == ([("o-7", 450.0)], [])


async def test_pending_is_raised_by_run_for_the_uncovered_second_call() -> None:
    shop = deferred()
    ctx = shop.executor.context("run_1", approval=OPS)
    await shop.executor.run(refund(), ctx)
    with pytest.raises(ApprovalPending):
        await shop.executor.run(refund(call_id="call_2"), ctx)
