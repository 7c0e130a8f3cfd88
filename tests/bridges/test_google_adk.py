"""The Google ADK bridge against a real `InMemoryRunner` with a scripted model (a `BaseLlm`
that answers from a list: no network), decided through the real bot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.sessions.session import Session
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import Field

from nodbot.core.bridges.common import NO_CALL_ID, StaleResume
from nodbot.core.bridges.google_adk import (
    REQUEST_CONFIRMATION,
    pending_confirmations,
    resolve_confirmations,
)
from tests.bridges.support import Bridged, bridged_bot

APP = "shop"
USER = "u-1"
REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}


class ScriptedModel(BaseLlm):
    """Answers each model turn with the next of `replies`, and keeps the requests."""

    model: str = "scripted"
    replies: list[types.Content] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        yield LlmResponse(content=self.replies.pop(0))


def calls(*arguments: dict[str, Any]) -> types.Content:
    parts = [
        types.Part(function_call=types.FunctionCall(name="refund", args=args)) for args in arguments
    ]
    return types.Content(role="model", parts=parts)


def text(words: str) -> types.Content:
    return types.Content(role="model", parts=[types.Part(text=words)])


class Shop:
    """An agent whose `refund` needs confirmation, its runner and one session."""

    def __init__(self, *replies: types.Content, reads_payload: bool = False) -> None:
        self.refunds: list[tuple[str, float]] = []
        self.model = ScriptedModel(replies=list(replies))
        tool = FunctionTool(
            self.payload_refund_tool() if reads_payload else self.refund_tool(),
            require_confirmation=True,
        )
        agent = LlmAgent(name="shop", model=self.model, tools=[tool])
        self.runner = InMemoryRunner(agent=agent, app_name=APP)
        self.session_id = ""

    def refund_tool(self) -> Callable[[str, float], str]:
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.refunds.append((order_id, amount))
            return f"refunded {amount} on {order_id}"

        return refund

    def payload_refund_tool(self) -> Callable[[str, float, ToolContext], str]:
        run = self.refund_tool()

        def refund(order_id: str, amount: float, tool_context: ToolContext) -> str:
            """Refund an order, with the arguments its confirmation carries."""
            confirmation = tool_context.tool_confirmation
            if confirmation is not None and isinstance(confirmation.payload, dict):
                return run(confirmation.payload["order_id"], confirmation.payload["amount"])
            return run(order_id, amount)

        return refund

    async def turn(self, message: types.Content) -> list[Event]:
        if not self.session_id:
            created = await self.runner.session_service.create_session(app_name=APP, user_id=USER)
            self.session_id = created.id
        return [
            event
            async for event in self.runner.run_async(
                user_id=USER, session_id=self.session_id, new_message=message
            )
        ]

    async def ask(self, words: str) -> list[Event]:
        return await self.turn(types.Content(role="user", parts=[types.Part(text=words)]))

    async def session(self) -> Session:
        found = await self.runner.session_service.get_session(
            app_name=APP, user_id=USER, session_id=self.session_id
        )
        assert found is not None
        return found

    def tool_results(self) -> list[dict[str, Any]]:
        """What the model was told of the tool calls, on its last turn."""
        last = self.model.requests[-1].contents[-1]
        return [
            dict(part.function_response.response or {})
            for part in last.parts or []
            if part.function_response is not None
        ]


def final_text(events: list[Event]) -> str:
    last = events[-1]
    assert last.is_final_response() and last.content and last.content.parts
    return "".join(part.text or "" for part in last.content.parts)


async def deciding(
    bot: Bridged, resolving: Awaitable[types.Content], *actions: str
) -> types.Content:
    """Run `resolving` while the reviewer decides the reviews it opens, by order id: each
    action is `<order id>:<approve|deny|edit>`."""
    task = asyncio.ensure_future(resolving)
    opened = asyncio.ensure_future(bot.when_pending(len(actions)))
    await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        opened.cancel()
        await task  # raises what made it end before its reviews opened
        raise AssertionError("resolved before its reviews opened")
    reviews = await opened
    by_order = {review["arguments"]["order_id"]: review for review in reviews}
    for order_id, action in (item.split(":") for item in actions):
        review = by_order[order_id]
        if action == "deny":
            await bot.decide(review["approval_id"], "deny", reason="refund policy: max 100")
        elif action == "edit":
            edited = {**review["arguments"], "amount": 45.0}
            await bot.decide(review["approval_id"], "edit", arguments=edited)
        else:
            await bot.decide(review["approval_id"], "approve")
    return await task


def confirmations(content: types.Content) -> list[dict[str, Any]]:
    return [
        dict(part.function_response.response or {})
        for part in content.parts or []
        if part.function_response is not None
        and part.function_response.name == REQUEST_CONFIRMATION
    ]


async def test_approved_call_runs_once(tmp_path: Path) -> None:
    shop = Shop(calls({"order_id": "o-7", "amount": 500}), text("refunded"))
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        await shop.ask("refund order o-7")
        assert shop.refunds == []
        session = await shop.session()
        [review_call] = pending_confirmations(session)
        resolving = resolve_confirmations(
            session,
            bot.client,
            run_id=session.id,
            within=20,
            session_service=shop.runner.session_service,
        )
        answer = await deciding(bot, resolving, "o-7:approve")
        listed = await bot.reviewer.get("/approvals", params={"status": "approved"})
        [review] = listed.json()
        record = await bot.served.service.store.get(review["approval_id"])
    assert review["call_id"] == review_call.call.call_id  # keyed by the original call's id
    description = record.request.policy["description"]
    assert description.startswith("Please approve or reject the tool call refund()")
    assert confirmations(answer) == [{"hint": "", "confirmed": True}]
    assert final_text(await shop.turn(answer)) == "refunded"
    assert shop.refunds == [("o-7", 500)]


async def test_denied_call_never_runs(tmp_path: Path) -> None:
    shop = Shop(calls({"order_id": "o-9", "amount": 900}), text("not refunded"))
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        await shop.ask("refund order o-9")
        session = await shop.session()
        resolving = resolve_confirmations(
            session,
            bot.client,
            run_id=session.id,
            within=20,
            session_service=shop.runner.session_service,
        )
        answer = await deciding(bot, resolving, "o-9:deny")
    assert confirmations(answer) == [
        {"hint": "", "confirmed": False, "payload": {"message": "refund policy: max 100"}}
    ]
    assert final_text(await shop.turn(answer)) == "not refunded"
    assert shop.refunds == []
    assert shop.tool_results() == [{"error": "This tool call is rejected."}]


async def test_two_confirmations_in_one_turn_are_decided_each(tmp_path: Path) -> None:
    shop = Shop(
        calls({"order_id": "o-1", "amount": 20}, {"order_id": "o-2", "amount": 900}),
        text("one refunded"),
    )
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        await shop.ask("refund orders o-1 and o-2")
        session = await shop.session()
        assert len(pending_confirmations(session)) == 2
        resolving = resolve_confirmations(
            session,
            bot.client,
            run_id=session.id,
            within=20,
            session_service=shop.runner.session_service,
        )
        answer = await deciding(bot, resolving, "o-2:deny", "o-1:approve")
    assert [item["confirmed"] for item in confirmations(answer)] == [True, False]
    assert final_text(await shop.turn(answer)) == "one refunded"
    assert shop.refunds == [("o-1", 20)]
    assert shop.tool_results() == [
        {"result": "refunded 20 on o-1"},
        {"error": "This tool call is rejected."},
    ]


@pytest.mark.parametrize("reads_payload", [True, False])
async def test_edit_reaches_only_a_tool_reading_its_payload(
    tmp_path: Path, reads_payload: bool
) -> None:
    shop = Shop(
        calls({"order_id": "o-7", "amount": 500}), text("handled"), reads_payload=reads_payload
    )
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        await shop.ask("refund order o-7")
        session = await shop.session()
        resolving = resolve_confirmations(
            session,
            bot.client,
            run_id=session.id,
            within=20,
            payload_edits=["refund"] if reads_payload else [],
            schemas={"refund": REFUND_SCHEMA},
            session_service=shop.runner.session_service,
        )
        answer = await deciding(bot, resolving, "o-7:edit")
        [review] = (await bot.reviewer.get("/approvals", params={"status": "approved"})).json()
        record = await bot.served.service.store.get(review["approval_id"])
    [confirmation] = confirmations(answer)
    assert final_text(await shop.turn(answer)) == "handled"
    if reads_payload:
        assert confirmation["payload"] == {"order_id": "o-7", "amount": 45.0}
        assert shop.refunds == [("o-7", 45.0)]
    else:
        assert "Edits cannot be applied" in record.request.policy["description"]
        assert confirmation["confirmed"] is False
        assert f"edited the call refund (call id {review['call_id']})" in str(
            confirmation["payload"]["message"]
        )
        assert shop.refunds == []


async def test_session_moved_on_is_stale(tmp_path: Path) -> None:
    shop = Shop(calls({"order_id": "o-7", "amount": 500}), text("something else then"))
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        await shop.ask("refund order o-7")
        session = await shop.session()
        resolving = asyncio.ensure_future(
            resolve_confirmations(
                session,
                bot.client,
                run_id=session.id,
                within=20,
                session_service=shop.runner.session_service,
            )
        )
        [review] = await bot.when_pending(1)
        # the user moves on while the review is open
        assert final_text(await shop.ask("never mind")) == "something else then"
        await bot.decide(review["approval_id"], "approve")
        with pytest.raises(StaleResume, match="moved on"):
            await resolving
        # a snapshot read before the session moved on is refused before any review opens
        with pytest.raises(StaleResume, match="moved on"):
            await resolve_confirmations(
                session,
                bot.client,
                run_id=session.id,
                within=20,
                session_service=shop.runner.session_service,
            )
        assert await bot.pending() == []
    assert pending_confirmations(await shop.session()) == []
    assert shop.refunds == []


async def test_call_without_call_id_is_denied_by_the_bridge(tmp_path: Path) -> None:
    shop = Shop(
        calls({"order_id": "o-1", "amount": 20}, {"order_id": "o-2", "amount": 30}),
        text("one refunded"),
    )
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        await shop.ask("refund orders o-1 and o-2")
        events = [event.model_copy(deep=True) for event in (await shop.session()).events]
        for event in events:  # as if stored without the id of o-1's call
            for function_call in event.get_function_calls():
                if function_call.name != REQUEST_CONFIRMATION:
                    continue
                original: dict[str, Any] = (function_call.args or {})["originalFunctionCall"]
                if original["args"]["order_id"] == "o-1":
                    del original["id"]
        resolving = resolve_confirmations(events, bot.client, run_id=shop.session_id, within=20)
        answer = await deciding(bot, resolving, "o-2:approve")
        [review] = (await bot.reviewer.get("/approvals")).json()
    assert review["arguments"]["order_id"] == "o-2"  # no review for the call without an id
    first, second = confirmations(answer)
    assert first == {"hint": "", "confirmed": False, "payload": {"message": NO_CALL_ID}}
    assert second["confirmed"] is True
    assert final_text(await shop.turn(answer)) == "one refunded"
    assert shop.refunds == [("o-2", 30)]
