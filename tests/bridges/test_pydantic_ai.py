"""The pydantic-ai bridge against a real bot: an agent on pydantic-ai's `FunctionModel` calls
a `requires_approval=True` tool, the run ends in `DeferredToolRequests`, a reviewer decides
over HTTP, and the run is resumed with the bridge's `DeferredToolResults`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nodbot.core.bridges.common import NO_CALL_ID, StaleResume
from nodbot.core.bridges.pydantic_ai import resolve_deferred, run_with_reviews, tool_schemas
from nodbot.core.client import DecisionAlreadyTaken
from tests.bridges.support import Bridged, bridged_bot

RUN = "support-42"
WITHIN = 20.0
T = TypeVar("T")


@dataclass
class Shop:
    """An agent whose model asks for `calls` once, then answers with what the tools said;
    `refunds` records every real run of the `refund` tool."""

    calls: list[ToolCallPart]
    refunds: list[dict[str, Any]] = field(default_factory=list)

    def agent(self) -> Agent[None, str | DeferredToolRequests]:
        agent = Agent(FunctionModel(self._reply), output_type=[str, DeferredToolRequests])

        @agent.tool_plain(requires_approval=True)
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.refunds.append({"order_id": order_id, "amount": amount})
            return f"refunded {amount} on {order_id}"

        return agent

    def _reply(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(message, ModelResponse) for message in messages):
            return ModelResponse(parts=list(self.calls))
        said = [str(part.content) for part in _returns(messages)]
        return ModelResponse(parts=[TextPart("done: " + "; ".join(said))])


def refund_call(call_id: str, amount: float = 500, order_id: str = "o-7") -> ToolCallPart:
    return ToolCallPart("refund", {"order_id": order_id, "amount": amount}, tool_call_id=call_id)


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def deciding(
    bot: Bridged,
    work: Awaitable[T],
    actions: dict[str, Callable[[str], Awaitable[Any]]],
) -> T:
    """Run `work` while the reviewer decides: `actions[call_id](approval_id)` for each review,
    once all of them are open."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    try:
        for review in await bot.when_pending(len(actions)):
            await actions[review["call_id"]](review["approval_id"])
        return await task
    finally:
        task.cancel()


async def paused(shop: Shop) -> tuple[Agent[None, str | DeferredToolRequests], Any]:
    agent = shop.agent()
    result = await agent.run("refund order o-7")
    assert isinstance(result.output, DeferredToolRequests)
    return agent, result


async def test_approve_runs_the_tool_once(tmp_path: Path) -> None:
    shop = Shop([refund_call("call_1")])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        result = await deciding(
            bot,
            run_with_reviews(shop.agent(), "refund o-7", bot.client, run_id=RUN, within=WITHIN),
            {"call_1": lambda approval_id: bot.decide(approval_id, "approve")},
        )
    assert shop.refunds == [{"order_id": "o-7", "amount": 500}]
    assert result.output == "done: refunded 500.0 on o-7"


async def test_deny_tells_the_model_the_reason(tmp_path: Path) -> None:
    shop = Shop([refund_call("call_1")])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        agent, first = await paused(shop)
        history = first.all_messages()
        decided = await deciding(
            bot,
            resolve_deferred(first.output, bot.client, run_id=RUN, messages=history, within=WITHIN),
            {"call_1": lambda a: bot.decide(a, "deny", reason="refund policy: max 400")},
        )
        assert decided.approvals == {"call_1": ToolDenied(message="refund policy: max 400")}
        result = await agent.run(message_history=history, deferred_tool_results=decided)
    assert shop.refunds == []
    [told] = _returns(result.all_messages())
    assert (told.tool_call_id, told.content, told.outcome) == (
        "call_1",
        "refund policy: max 400",
        "denied",
    )
    assert result.output == "done: refund policy: max 400"


async def test_two_calls_are_decided_separately(tmp_path: Path) -> None:
    shop = Shop([refund_call("call_1", 50, "o-1"), refund_call("call_2", 900, "o-2")])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        agent, first = await paused(shop)
        assert [part.tool_call_id for part in first.output.approvals] == ["call_1", "call_2"]
        history = first.all_messages()
        decided = await deciding(
            bot,
            resolve_deferred(first.output, bot.client, run_id=RUN, messages=history, within=WITHIN),
            {
                "call_1": lambda a: bot.decide(a, "approve"),
                "call_2": lambda a: bot.decide(a, "deny", reason="too much"),
            },
        )
        assert decided.approvals == {
            "call_1": ToolApproved(),
            "call_2": ToolDenied(message="too much"),
        }
        result = await agent.run(message_history=history, deferred_tool_results=decided)
    assert shop.refunds == [{"order_id": "o-1", "amount": 50}]
    told = {part.tool_call_id: part.content for part in _returns(result.all_messages())}
    assert told == {"call_1": "refunded 50.0 on o-1", "call_2": "too much"}
    assert isinstance(result.output, str)


async def test_an_edit_runs_once_with_the_edited_arguments(tmp_path: Path) -> None:
    shop = Shop([refund_call("call_1", 500)])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        agent, first = await paused(shop)
        history = first.all_messages()
        decided = await deciding(
            bot,
            resolve_deferred(
                first.output,
                bot.client,
                run_id=RUN,
                messages=history,
                within=WITHIN,
                schemas=tool_schemas(agent),
            ),
            {"call_1": lambda a: bot.decide(a, "edit", arguments={"amount": 450})},
        )
        assert decided.approvals == {
            "call_1": ToolApproved(override_args={"order_id": "o-7", "amount": 450})
        }
        result = await agent.run(message_history=history, deferred_tool_results=decided)
    assert shop.refunds == [{"order_id": "o-7", "amount": 450}]
    assert result.output == "done: refunded 450.0 on o-7"


async def test_a_call_without_an_id_is_denied_by_the_bridge(tmp_path: Path) -> None:
    # pydantic-ai keeps the id a model gives, even an empty one
    shop = Shop([refund_call("")])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        result = await run_with_reviews(
            shop.agent(), "refund o-7", bot.client, run_id=RUN, within=WITHIN
        )
        assert await bot.pending() == []  # nobody was asked
        by_hand = DeferredToolRequests(approvals=[refund_call("")])
        decided = await resolve_deferred(by_hand, bot.client, run_id=RUN, within=WITHIN)
    assert decided.approvals == {"": ToolDenied(message=NO_CALL_ID)}
    assert shop.refunds == []
    [told] = _returns(result.all_messages())
    assert (told.content, told.outcome) == (NO_CALL_ID, "denied")
    assert result.output == f"done: {NO_CALL_ID}"


async def test_a_history_that_moved_on_is_refused_before_any_review(tmp_path: Path) -> None:
    shop = Shop([refund_call("call_1")])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        _, first = await paused(shop)
        moved_on = [
            *first.all_messages(),
            ModelRequest(parts=[ToolReturnPart("refund", "refunded elsewhere", "call_1")]),
            ModelResponse(parts=[TextPart("done")]),
        ]
        with pytest.raises(StaleResume, match="moved on"):
            await resolve_deferred(
                first.output, bot.client, run_id=RUN, messages=moved_on, within=WITHIN
            )
        answered = [*first.all_messages(), moved_on[-2]]
        with pytest.raises(StaleResume, match="moved on"):
            await resolve_deferred(
                first.output, bot.client, run_id=RUN, messages=answered, within=WITHIN
            )
        assert await bot.pending() == []
    assert shop.refunds == []


def fork(history: list[ModelMessage]) -> None:
    history[-1] = ModelResponse(parts=[refund_call("call_1", 5000)])


def change_in_place(history: list[ModelMessage]) -> None:
    [part] = history[-1].parts
    assert isinstance(part, ToolCallPart) and isinstance(part.args, dict)
    arguments = cast("dict[str, Any]", part.args)  # narrowed to a union of TypedDicts
    arguments["amount"] = 5000  # the same part as in the DeferredToolRequests


@pytest.mark.parametrize("change", [fork, change_in_place])
async def test_a_history_changed_during_the_review_is_refused(
    tmp_path: Path, change: Callable[[list[ModelMessage]], None]
) -> None:
    shop = Shop([refund_call("call_1", 500)])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        _, first = await paused(shop)
        history = first.all_messages()

        async def change_then_approve(approval_id: str) -> None:
            change(history)
            await bot.decide(approval_id, "approve")

        with pytest.raises(StaleResume, match="was changed"):
            await deciding(
                bot,
                resolve_deferred(
                    first.output, bot.client, run_id=RUN, messages=history, within=WITHIN
                ),
                {"call_1": change_then_approve},
            )
    assert shop.refunds == []


async def test_a_replayed_resolve_opens_a_fresh_review(tmp_path: Path) -> None:
    shop = Shop([refund_call("call_1")])
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        agent, first = await paused(shop)
        history = first.all_messages()
        opened: list[str] = []

        async def approve(approval_id: str) -> None:
            opened.append(approval_id)
            await bot.decide(approval_id, "approve")

        async def deny(approval_id: str) -> None:
            opened.append(approval_id)
            await bot.decide(approval_id, "deny", reason="already refunded")

        def resolve() -> Awaitable[DeferredToolResults]:
            return resolve_deferred(
                first.output, bot.client, run_id=RUN, messages=history, within=WITHIN
            )

        decided = await deciding(bot, resolve(), {"call_1": approve})
        done = await agent.run(message_history=history, deferred_tool_results=decided)
        assert shop.refunds == [{"order_id": "o-7", "amount": 500}]

        with pytest.raises(DecisionAlreadyTaken):  # the first decision is spent
            await bot.client.consume(await bot.client.get(opened[0]))
        again = await deciding(bot, resolve(), {"call_1": deny})  # a new review, not a rerun
        assert opened[1] != opened[0]
        assert again.approvals == {"call_1": ToolDenied(message="already refunded")}
        replayed = await agent.run(message_history=history, deferred_tool_results=again)
    assert shop.refunds == [{"order_id": "o-7", "amount": 500}]
    assert done.output == "done: refunded 500.0 on o-7"
    assert replayed.output == "done: already refunded"
