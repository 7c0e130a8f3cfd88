"""The LangChain / LangGraph bridge: `create_agent` agents paused by `HumanInTheLoopMiddleware`
(LangChain's `GenericFakeChatModel` playing the model, `InMemorySaver` keeping the thread),
their calls decided in the real bot, and the thread resumed with the `Command` the bridge
builds; each tool runs once, or never."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware, InterruptOnConfig
from langchain.agents.middleware.human_in_the_loop import InterruptMode
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

from nodbot.bot.serve import serving
from nodbot.core.bridges.common import NO_CALL_ID, StaleResume
from nodbot.core.bridges.langgraph import (
    Graph,
    UnanswerableInterrupt,
    resolve_and_resume,
    resolve_interruptions,
)
from nodbot.core.client import ApprovalClient
from tests.bridges.support import AGENT_TOKEN, bridged_bot
from tests.fakes.slack import interactive_request, slack_fake

WITHIN = 20.0
SEED_HITL: dict[str, bool | InterruptOnConfig] = {
    "send_email": {
        "allowed_decisions": ["approve", "reject"],
        "description": "Review email before sending",
    },
    "get_current_time": False,
}
EDITABLE: dict[str, bool | InterruptOnConfig] = {
    "send_email": {"allowed_decisions": ["approve", "edit", "reject"]}
}


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's fake chat model, which `create_agent` may bind tools to: its answers are
    the scripted messages whatever the tools."""

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self


def email_call(
    call_id: str | None, to: str, subject: str = "Hello", body: str = "Hello!"
) -> ToolCall:
    return ToolCall(
        name="send_email", args={"to": to, "subject": subject, "body": body}, id=call_id
    )


def email_agent(
    calls: Sequence[ToolCall],
    interrupt_on: dict[str, bool | InterruptOnConfig],
    *,
    mode: InterruptMode = "batched",
) -> tuple[Graph, list[dict[str, str]], list[BaseTool]]:
    """An agent whose model makes `calls` in one turn, then answers "Done."; the list of the
    emails its tool really sent; its tools."""
    sent: list[dict[str, str]] = []

    @tool
    def send_email(to: str, subject: str, body: str) -> str:
        """Send an email to the specified recipient."""
        sent.append({"to": to, "subject": subject, "body": body})
        return f"Email sent to {to} with subject '{subject}'"

    @tool
    def get_current_time() -> str:
        """Get the current time."""
        return "2025-01-01T09:00:00"

    turns = iter([AIMessage(content="", tool_calls=list(calls)), AIMessage(content="Done.")])
    tools: list[BaseTool] = [get_current_time, send_email]
    middleware: HumanInTheLoopMiddleware[Any, Any, Any] = HumanInTheLoopMiddleware(
        interrupt_on=interrupt_on, interrupt_mode=mode
    )
    agent = create_agent(
        ToolCallingFakeModel(messages=turns),
        tools,
        system_prompt="You are a helpful assistant.",
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    return agent, sent, tools


async def paused(agent: Graph, thread_id: str) -> RunnableConfig:
    """Start the thread; its config once the middleware paused it."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    ask = {"messages": [{"role": "user", "content": "Send the emails"}]}
    result = await agent.ainvoke(ask, config)
    assert result["__interrupt__"], result
    return config


async def assert_finished(agent: Graph, config: RunnableConfig) -> list[Any]:
    """The thread's messages, once it ran to its end (nothing next, nothing pending)."""
    state = await agent.aget_state(config)
    assert state.next == () and state.interrupts == ()
    messages: list[Any] = state.values["messages"]
    assert messages[-1].content == "Done."
    return messages


def tool_messages(messages: Sequence[Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def review_of(call_id: str, reviews: Sequence[dict[str, Any]]) -> str:
    [review] = [r for r in reviews if r["call_id"] == call_id]
    approval_id: str = review["approval_id"]
    return approval_id


async def test_an_approved_email_is_sent_once_and_the_thread_finishes(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call("toolu_01U8", "bob@example.com")], SEED_HITL)
    config = await paused(agent, "hitl-test-1")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resuming = asyncio.create_task(
            resolve_and_resume(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        assert (review["run_id"], review["call_id"]) == ("hitl-test-1", "toolu_01U8")
        assert review["arguments"] == {
            "to": "bob@example.com",
            "subject": "Hello",
            "body": "Hello!",
        }
        record = await bot.served.service.store.get(review["approval_id"])
        assert record.request.policy["description"] == (
            "Review email before sending\n\nAllowed decisions: approve, reject"
        )
        assert not resuming.done()  # nothing resumes before the reviewer decides
        await bot.decide(review["approval_id"], "approve")
        await resuming
    assert sent == [{"to": "bob@example.com", "subject": "Hello", "body": "Hello!"}]
    messages = await assert_finished(agent, config)
    assert tool_messages(messages)["toolu_01U8"].content == (
        "Email sent to bob@example.com with subject 'Hello'"
    )


async def test_a_rejected_email_is_never_sent_and_the_model_is_told_why(tmp_path: Path) -> None:
    agent, sent, tools = email_agent(
        [email_call("toolu_0181", "carol@example.com", "Meeting", "See you at 10am")], SEED_HITL
    )
    config = await paused(agent, "hitl-test-2")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resolving = asyncio.create_task(
            resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        await bot.decide(review["approval_id"], "deny", reason="not to customers")
        command = await resolving
    assert command.resume == {"decisions": [{"type": "reject", "message": "not to customers"}]}
    await agent.ainvoke(command, config)
    assert sent == []
    answer = tool_messages(await assert_finished(agent, config))["toolu_0181"]
    assert answer.status == "error"
    assert answer.content == (
        "User rejected the tool call for `send_email` with reason: not to customers"
    )


async def test_two_calls_of_one_turn_are_reviewed_and_decided_separately(tmp_path: Path) -> None:
    agent, sent, tools = email_agent(
        [
            email_call("toolu_018h", "alice@example.com", "Hi", "Hi"),
            ToolCall(name="get_current_time", args={}, id="toolu_time"),
            email_call("toolu_01PX", "bob@example.com", "Hello", "Hello"),
        ],
        SEED_HITL,
    )
    config = await paused(agent, "multi-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resolving = asyncio.create_task(
            resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        reviews = await bot.when_pending(2)
        assert sorted(r["call_id"] for r in reviews) == ["toolu_018h", "toolu_01PX"]
        await bot.decide(review_of("toolu_01PX", reviews), "deny", reason="not Bob")
        await bot.decide(review_of("toolu_018h", reviews), "approve")
        command = await resolving
    # In the middleware's order (alice, then bob); get_current_time is not gated.
    assert command.resume == {
        "decisions": [{"type": "approve"}, {"type": "reject", "message": "not Bob"}]
    }
    await agent.ainvoke(command, config)
    assert sent == [{"to": "alice@example.com", "subject": "Hi", "body": "Hi"}]
    answers = tool_messages(await assert_finished(agent, config))
    assert answers["toolu_01PX"].status == "error" and "not Bob" in str(
        answers["toolu_01PX"].content
    )
    assert answers["toolu_time"].content == "2025-01-01T09:00:00"


async def test_per_call_interrupts_are_answered_by_interrupt_id(tmp_path: Path) -> None:
    agent, sent, _ = email_agent(
        [
            email_call("call_alice", "alice@example.com", "Hi", "Hi"),
            email_call("call_bob", "bob@example.com", "Hello", "Hello"),
        ],
        {"send_email": True},
        mode="per_call",
    )
    config = await paused(agent, "per-call-test")
    interrupts = {
        i.value["tool_call_id"]: i.id for i in (await agent.aget_state(config)).interrupts
    }
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resolving = asyncio.create_task(
            # No tools given: the schema comes from the interrupts' `response_schema`.
            resolve_interruptions(agent, config, bot.client, within=WITHIN)
        )
        reviews = await bot.when_pending(2)
        record = await bot.served.service.store.get(review_of("call_bob", reviews))
        assert record.request.policy["schema"]["required"] == ["to", "subject", "body"]
        await bot.decide(review_of("call_alice", reviews), "approve")
        await bot.decide(review_of("call_bob", reviews), "edit", arguments={"subject": "Hi Bob"})
        command = await resolving
    edited = {"to": "bob@example.com", "subject": "Hi Bob", "body": "Hello"}
    assert command.resume == {
        interrupts["call_alice"]: {"type": "approve"},
        interrupts["call_bob"]: {
            "type": "edit",
            "edited_action": {"name": "send_email", "args": edited},
        },
    }
    await agent.ainvoke(command, config)
    assert sorted(sent, key=lambda e: e["to"]) == [
        {"to": "alice@example.com", "subject": "Hi", "body": "Hi"},
        edited,
    ]
    await assert_finished(agent, config)


async def test_an_edit_runs_the_tool_once_with_the_reviewers_arguments(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call("toolu_edit", "bob@example.com")], EDITABLE)
    config = await paused(agent, "edit-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resuming = asyncio.create_task(
            resolve_and_resume(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        await bot.decide(review["approval_id"], "edit", arguments={"to": "robert@example.com"})
        await resuming
    assert sent == [{"to": "robert@example.com", "subject": "Hello", "body": "Hello!"}]
    answer = tool_messages(await assert_finished(agent, config))["toolu_edit"]
    assert "a human reviewer replaced this tool call" in str(answer.content)


async def test_an_edit_the_review_does_not_allow_is_sent_as_a_rejection(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call("toolu_no_edit", "bob@example.com")], SEED_HITL)
    config = await paused(agent, "no-edit-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resolving = asyncio.create_task(
            resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        await bot.decide(review["approval_id"], "edit", arguments={"to": "robert@example.com"})
        command = await resolving
    assert isinstance(command.resume, dict)
    [decision] = command.resume["decisions"]
    assert decision["type"] == "reject" and '"to": "robert@example.com"' in decision["message"]
    await agent.ainvoke(command, config)
    assert sent == []
    answer = tool_messages(await assert_finished(agent, config))["toolu_no_edit"]
    assert answer.status == "error" and "robert@example.com" in str(answer.content)


async def test_a_thread_that_moved_on_while_reviewed_is_not_resumed(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call("toolu_moved", "bob@example.com")], SEED_HITL)
    config = await paused(agent, "moved-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resolving = asyncio.create_task(
            resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        await agent.aupdate_state(config, {"messages": [HumanMessage("Actually, wait.")]})
        await bot.decide(review["approval_id"], "approve")
        with pytest.raises(StaleResume, match="moved on"):
            await resolving
    assert sent == []


async def test_an_older_checkpoint_or_a_finished_thread_is_refused(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call("toolu_old", "bob@example.com")], SEED_HITL)
    config = await paused(agent, "old-test")
    at_pause = (await agent.aget_state(config)).config
    history = [state async for state in agent.aget_state_history(config)]
    older = history[1].config
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        with pytest.raises(StaleResume, match="not the thread's latest"):
            await resolve_interruptions(agent, older, bot.client, within=WITHIN, tools=tools)
        assert await bot.pending() == []  # refused before anyone was asked
        resuming = asyncio.create_task(
            resolve_and_resume(agent, at_pause, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)
        await bot.decide(review["approval_id"], "approve")
        await resuming
        await assert_finished(agent, config)
        # The paused checkpoint, once the thread went on: a time travel, refused.
        with pytest.raises(StaleResume, match="not the thread's latest"):
            await resolve_interruptions(agent, at_pause, bot.client, within=WITHIN, tools=tools)
        with pytest.raises(UnanswerableInterrupt, match="not paused"):
            await resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        assert await bot.pending() == []
    assert sent == [{"to": "bob@example.com", "subject": "Hello", "body": "Hello!"}]


async def test_a_call_without_an_id_is_denied_by_the_bridge(tmp_path: Path) -> None:
    agent, sent, tools = email_agent(
        [email_call("toolu_with_id", "alice@example.com"), email_call("", "bob@example.com")],
        SEED_HITL,
    )
    config = await paused(agent, "no-id-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        resolving = asyncio.create_task(
            resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
        [review] = await bot.when_pending(1)  # only the call with an id is put to anyone
        assert review["call_id"] == "toolu_with_id"
        await bot.decide(review["approval_id"], "approve")
        command = await resolving
        assert await bot.pending() == []
    assert command.resume == {
        "decisions": [{"type": "approve"}, {"type": "reject", "message": NO_CALL_ID}]
    }
    await agent.ainvoke(command, config)
    assert sent == [{"to": "alice@example.com", "subject": "Hello", "body": "Hello!"}]
    answers = tool_messages(await assert_finished(agent, config))
    assert answers[""].status == "error" and NO_CALL_ID in str(answers[""].content)


async def test_a_call_with_no_id_at_all_is_rejected_without_a_review(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call(None, "bob@example.com")], SEED_HITL)
    config = await paused(agent, "none-id-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        command = await resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        assert await bot.pending() == []
    assert command.resume == {"decisions": [{"type": "reject", "message": NO_CALL_ID}]}
    assert sent == []


async def test_a_review_that_allows_no_refusal_is_not_put_to_anyone(tmp_path: Path) -> None:
    agent, sent, tools = email_agent(
        [email_call("toolu_only", "bob@example.com")],
        {"send_email": {"allowed_decisions": ["approve"]}},
    )
    config = await paused(agent, "approve-only-test")
    async with bridged_bot(tmp_path, ["send_email"]) as bot:
        with pytest.raises(UnanswerableInterrupt, match="a denial could not be sent"):
            await resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        assert await bot.pending() == []
    assert sent == []


SLACK_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: "{agent_token}", scopes: [approvals:request]}}
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
external_tools: [send_email]
rules:
  - tool: send_email
    reviewers: [{lead}]
"""


async def test_a_click_in_slack_approves_the_email(tmp_path: Path) -> None:
    agent, sent, tools = email_agent([email_call("toolu_slack", "bob@example.com")], SEED_HITL)
    config = await paused(agent, "slack-test")
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        path = tmp_path / "nodbot.yml"
        path.write_text(
            SLACK_CONFIG.format(
                db=tmp_path / "nodbot.db",
                agent_token=AGENT_TOKEN,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                lead=lead.id,
            )
        )
        async with (
            serving(str(path)) as served,
            ApprovalClient(served.url, token=AGENT_TOKEN) as nodbot,
            httpx.AsyncClient(base_url=served.url) as http,
        ):
            resuming = asyncio.create_task(
                resolve_and_resume(agent, config, nodbot, within=WITHIN, tools=tools)
            )
            await slack.wait_until(
                lambda: bool(slack.messages(lead)), 10, "the review posted to the lead"
            )
            [message] = slack.messages(lead)
            assert "bob@example.com" in message.text + str(message.blocks)
            body, headers = interactive_request(
                slack.click(message, "nodbot.approve", lead), slack.signing_secret
            )
            answer = await http.post("/slack/events", content=body, headers=headers)
            assert answer.status_code == 200, answer.text
            await resuming
    assert sent == [{"to": "bob@example.com", "subject": "Hello", "body": "Hello!"}]
    await assert_finished(agent, config)
