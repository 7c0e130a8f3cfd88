"""The Microsoft Agent Framework bridge against a real bot: an `Agent` with a tool that always
needs approval, run on a scripted chat client (the framework ships no test model: this is
the smallest `BaseChatClient` with its function invocation layer), decided by the reviewer
over HTTP and resumed with the bridge's `Message`."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentResponse,
    AgentSession,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    FunctionTool,
    Message,
    tool,
)

from nodbot.core.bridges.agent_framework import EDITS_NOT_RUN, resolve_approvals, tool_schemas
from nodbot.core.bridges.common import StaleResume
from tests.bridges.support import Bridged, bridged_bot

REJECTED = "Error: Tool call invocation was rejected by user."


class ScriptedChatClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """Answers each model call with the next scripted message; records what it was sent."""

    def __init__(self, replies: Sequence[Message]) -> None:
        super().__init__()
        self.replies = list(replies)
        self.sent: list[list[Message]] = []

    def _inner_get_response(
        self,
        *,
        messages: Sequence[Message],
        stream: bool,
        options: Mapping[str, Any],
        **kwargs: Any,
    ) -> Awaitable[ChatResponse[Any]]:
        assert not stream
        return self._reply(messages)

    async def _reply(self, messages: Sequence[Message]) -> ChatResponse[Any]:
        self.sent.append(list(messages))
        return ChatResponse(messages=[self.replies.pop(0)])

    def results(self) -> dict[str, Any]:
        """The function results the model was last sent, by call id."""
        return {
            str(content.call_id): content.result
            for message in self.sent[-1]
            for content in message.contents
            if content.type == "function_result"
        }


def calls(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    return Message(
        role="assistant",
        contents=[
            Content.from_function_call(call_id=call_id, name=name, arguments=arguments)
            for call_id, name, arguments in calls
        ],
    )


def text(words: str) -> Message:
    return Message(role="assistant", contents=[words])


class Refunds:
    """The tools of the tests, counting their real calls."""

    def __init__(self) -> None:
        self.refunded: list[tuple[str, float]] = []
        self.notified: list[str] = []

        @tool(approval_mode="always_require")
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.refunded.append((order_id, amount))
            return f"refunded {amount} on {order_id}"

        @tool(approval_mode="always_require")
        def notify(customer: str) -> str:
            """Tell a customer."""
            self.notified.append(customer)
            return f"told {customer}"

        self.tools: list[FunctionTool] = [refund, notify]


def agent_of(client: ScriptedChatClient, refunds: Refunds) -> Agent[Any]:
    return Agent(client, tools=refunds.tools)


async def paused(agent: Agent[Any], session: AgentSession) -> AgentResponse[Any]:
    response = await agent.run("refund order o-7", session=session)
    assert response.user_input_requests, "the run did not pause"
    return response


async def decided(
    bot: Bridged, requests: Sequence[Content], session: AgentSession, *decisions: dict[str, Any]
) -> Message:
    """Resolve `requests` while the reviewer takes `decisions` (one per review, by tool)."""
    resolving = asyncio.create_task(
        resolve_approvals(
            requests, bot.client, run_id=session.session_id, session=session, within=20
        )
    )
    try:
        waiting = await bot.when_pending(len(decisions))
        by_tool = {review["tool"]: review for review in waiting}
        for decision in decisions:
            taken = dict(decision)
            review = by_tool[taken.pop("tool")]
            await bot.decide(review["approval_id"], taken.pop("action"), **taken)
    except BaseException:
        resolving.cancel()
        raise
    return await resolving


def finished(response: AgentResponse[Any]) -> None:
    assert not response.user_input_requests
    assert response.text == "done"


async def test_approve_runs_the_call_once(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [calls(("call_1", "refund", {"order_id": "o-7", "amount": 500})), text("done")]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        response = await paused(agent, session)
        resume = await decided(
            bot, response.user_input_requests, session, {"tool": "refund", "action": "approve"}
        )
        [answer] = resume.contents
        assert answer.type == "function_approval_response" and answer.approved is True
        finished(await agent.run(resume, session=session))
    assert refunds.refunded == [("o-7", 500.0)]
    assert client.results() == {"call_1": "refunded 500.0 on o-7"}


async def test_deny_carries_the_reviewers_message(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [calls(("call_1", "refund", {"order_id": "o-7", "amount": 900})), text("done")]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        response = await paused(agent, session)
        resume = await decided(
            bot,
            response.user_input_requests,
            session,
            {"tool": "refund", "action": "deny", "reason": "refund policy: max 500"},
        )
        [answer] = resume.contents
        assert answer.approved is False
        assert answer.additional_properties["reason"] == "refund policy: max 500"
        finished(await agent.run(resume, session=session))
    assert refunds.refunded == []
    assert client.results() == {"call_1": REJECTED}  # the framework's fixed text


async def test_two_calls_of_one_turn_are_decided_apart(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [
            calls(
                ("call_1", "refund", {"order_id": "o-7", "amount": 500}),
                ("call_2", "notify", {"customer": "c-9"}),
            ),
            text("done"),
        ]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund", "notify"]) as bot:
        response = await paused(agent, session)
        assert len(response.user_input_requests) == 2
        resume = await decided(
            bot,
            response.user_input_requests,
            session,
            {"tool": "refund", "action": "deny", "reason": "not this one"},
            {"tool": "notify", "action": "approve"},
        )
        assert [answer.approved for answer in resume.contents] == [False, True]
        finished(await agent.run(resume, session=session))
    assert refunds.refunded == []
    assert refunds.notified == ["c-9"]
    assert client.results() == {"call_1": REJECTED, "call_2": "told c-9"}


async def test_an_edit_is_denied_naming_the_edited_call(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [calls(("call_1", "refund", {"order_id": "o-7", "amount": 500})), text("done")]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        response = await paused(agent, session)
        resolving = asyncio.create_task(
            resolve_approvals(
                response.user_input_requests,
                bot.client,
                run_id=session.session_id,
                session=session,
                within=20,
                schemas=tool_schemas(agent),
            )
        )
        [review] = await bot.when_pending(1)
        record = await bot.served.service.store.get(review["approval_id"])
        assert record.request.policy["description"] == EDITS_NOT_RUN  # told before editing
        await bot.decide(
            review["approval_id"], "edit", arguments={"order_id": "o-7", "amount": 450}
        )
        resume = await resolving
        [answer] = resume.contents
        assert answer.approved is False
        reason = answer.additional_properties["reason"]
        assert "refund" in reason and "call_1" in reason and '"amount": 450' in reason
        finished(await agent.run(resume, session=session))
    assert refunds.refunded == []
    assert client.results() == {"call_1": REJECTED}


async def test_a_thread_that_moved_on_is_stale(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [
            calls(("call_1", "refund", {"order_id": "o-7", "amount": 500})),
            text("fine, no refund"),
        ]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        response = await paused(agent, session)
        moved_on = await agent.run("never mind", session=session)
        assert not moved_on.user_input_requests
        with pytest.raises(StaleResume, match="no longer open in the history"):
            await resolve_approvals(
                response.user_input_requests,
                bot.client,
                run_id=session.session_id,
                session=session,
                within=20,
            )
        assert await bot.pending() == []  # nothing was put to the reviewer
    assert refunds.refunded == []


async def test_a_thread_that_moved_on_during_the_review_is_stale(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [
            calls(("call_1", "refund", {"order_id": "o-7", "amount": 500})),
            text("fine, no refund"),
        ]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        response = await paused(agent, session)
        resolving = asyncio.create_task(
            resolve_approvals(
                response.user_input_requests,
                bot.client,
                run_id=session.session_id,
                session=session,
                within=20,
            )
        )
        [review] = await bot.when_pending(1)
        await agent.run("never mind", session=session)
        await bot.decide(review["approval_id"], "approve")
        with pytest.raises(StaleResume, match="no longer open in the history"):
            await resolving
    assert refunds.refunded == []


async def test_a_request_the_session_does_not_hold_is_stale(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [calls(("call_1", "refund", {"order_id": "o-7", "amount": 500})), text("done")]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        response = await paused(agent, session)
        [request] = response.user_input_requests
        assert request.function_call is not None
        changed = Content.from_function_approval_request(
            id=str(request.id),
            function_call=Content.from_function_call(
                call_id="call_1",
                name="refund",
                arguments={"order_id": "o-7", "amount": 5000},
                id=request.function_call.id,
            ),
        )
        with pytest.raises(StaleResume, match="no longer pending in the session"):
            await resolve_approvals(
                [changed], bot.client, run_id=session.session_id, session=session, within=20
            )
        assert await bot.pending() == []
    assert refunds.refunded == []


async def test_a_call_without_a_call_id_is_denied_by_the_bridge(tmp_path: Path) -> None:
    refunds = Refunds()
    client = ScriptedChatClient(
        [calls(("", "refund", {"order_id": "o-7", "amount": 500})), text("done")]
    )
    agent = agent_of(client, refunds)
    session = agent.create_session()
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        with warnings.catch_warnings():
            # The framework warns that it stands its own occurrence id in for the call id.
            warnings.simplefilter("ignore", FutureWarning)
            response = await paused(agent, session)
        resume = await resolve_approvals(
            response.user_input_requests,
            bot.client,
            run_id=session.session_id,
            session=session,
            within=20,
        )
        [answer] = resume.contents
        assert answer.approved is False
        assert "no native call id" in answer.additional_properties["reason"]
        assert await bot.pending() == []  # no review was opened for it
        finished(await agent.run(resume, session=session))
    assert refunds.refunded == []
