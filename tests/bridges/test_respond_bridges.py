"""A respond (a reviewer's answer in the tool's place) through the real bot's one-use tokens,
to an executor of the caller's own and to each bridge, whose framework plays its own test
model: the tool never runs, and the model gets the answer the way its framework allows.

- a token handed out by `POST /approvals/{id}/consume` carries the answer under its
  signature, and `executor.run` with it returns the answer;
- LangChain gets its own `{"type": "respond", "message": ...}` (per call too), or, for a
  tool whose review does not allow `respond`, a `reject` whose message gives the answer;
- pydantic-ai and the OpenAI Agents SDK give the model the answer word for word as the
  call's result (their denial's message);
- Agent Framework and Google ADK can only refuse: the answer is in the refusal's record
  (`additional_properties`, the confirmation's payload);
- an agent the bot hosts is resumed the same way (`Resolution.response`), by hand and by the
  bot's own workers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from google.genai import types
from langchain_core.messages import ToolMessage
from pydantic_ai.messages import ToolReturnPart

from nodbot.core import Executor, ToolCall, ToolRegistry
from nodbot.core.approval_tokens import TokenApproval, token_key
from nodbot.core.bridges import openai_agents
from nodbot.core.bridges.agent_framework import resolve_approvals
from nodbot.core.bridges.common import RESPONDED, PendingCall, Resolution
from nodbot.core.bridges.google_adk import resolve_confirmations
from nodbot.core.bridges.langgraph import HostedLangGraph, resolve_interruptions
from nodbot.core.bridges.pydantic_ai import run_with_reviews
from tests.bridges import test_agent_framework as af
from tests.bridges import test_google_adk as adk
from tests.bridges import test_openai_agents as oa
from tests.bridges import test_pydantic_ai as pa
from tests.bridges.support import (
    AGENT_TOKEN,
    REVIEWER,
    Bridged,
    Hosted,
    bridged_bot,
    hosted_bot,
    review_rule,
)
from tests.bridges.test_langgraph import (
    SEED_HITL,
    assert_finished,
    email_agent,
    email_call,
    paused,
    tool_messages,
)
from tests.bridges.test_langgraph_hosted import hosted_agent, kept

ROOT = Path(__file__).resolve().parents[2]

ANSWER = "Bob already has the report: tell the user it was sent on Monday."
WITHIN = 20.0
RESPOND = "[approve, edit, deny, respond]"


def responding(tmp_path: Path, tool: str) -> Any:
    """The bot, its rule for `tool` allowing a respond."""
    return bridged_bot(tmp_path, [tool], [review_rule(tool, allowed_decisions=RESPOND)])


async def respond_to_each(bot: Bridged, count: int = 1) -> list[dict[str, Any]]:
    """Once `count` reviews are open, the reviewer answers each with `ANSWER`."""
    reviews = await bot.when_pending(count)
    for review in reviews:
        await bot.decide(review["approval_id"], "respond", reason=ANSWER)
    return reviews


async def resolved(bot: Bridged, work: Any, count: int = 1) -> Any:
    """`work` (a bridge's resolve) run while the reviewer answers its reviews."""
    task = asyncio.ensure_future(work)
    try:
        await respond_to_each(bot, count)
        return await task
    finally:
        task.cancel()


# --- the one-use token, to an executor of the caller's own ---------------------------------


async def test_a_consumed_respond_runs_nothing_and_returns_the_answer(tmp_path: Path) -> None:
    paid: list[tuple[str, float]] = []
    registry = ToolRegistry()

    @registry.tool(confirm=True, effects="destructive")
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        paid.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    executor = Executor(registry)
    asked = {"order_id": "o-7", "amount": 500}
    async with responding(tmp_path, "refund") as bot:
        approval = await bot.client.request("refund", asked, run_id="thread-42", call_id="call_1")
        await respond_to_each(bot)
        taken = await bot.client.consume(await bot.client.wait(approval.approval_id, within=5))
    assert (taken.approved, taken.claims.response) == (False, ANSWER)
    token = TokenApproval(taken.token, key=token_key(AGENT_TOKEN), arguments=taken.arguments)
    ctx = executor.context("thread-42", approval=token)
    call = ToolCall(name="refund", arguments=asked, id="call_1")
    assert await executor.run(call, ctx) == ANSWER
    assert paid == []


# --- LangChain / LangGraph ----------------------------------------------------------------


async def test_langchain_gets_its_own_respond_and_the_tool_never_runs(tmp_path: Path) -> None:
    agent, sent, tools = email_agent(
        [email_call("toolu_r1", "bob@example.com")], {"send_email": True}
    )
    config = await paused(agent, "respond-1")
    async with responding(tmp_path, "send_email") as bot:
        command = await resolved(
            bot, resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
    assert command.resume == {"decisions": [{"type": "respond", "message": ANSWER}]}
    await agent.ainvoke(command, config)
    assert sent == []
    answer = tool_messages(await assert_finished(agent, config))["toolu_r1"]
    assert (answer.content, answer.status) == (ANSWER, "success")


async def test_a_per_call_interrupt_gets_its_respond_by_interrupt_id(tmp_path: Path) -> None:
    agent, sent, _ = email_agent(
        [email_call("call_r2", "bob@example.com")], {"send_email": True}, mode="per_call"
    )
    config = await paused(agent, "respond-2")
    [interrupt] = (await agent.aget_state(config)).interrupts
    async with responding(tmp_path, "send_email") as bot:
        command = await resolved(bot, resolve_interruptions(agent, config, bot.client, within=20))
    assert command.resume == {interrupt.id: {"type": "respond", "message": ANSWER}}
    await agent.ainvoke(command, config)
    assert sent == []
    answer = tool_messages(await assert_finished(agent, config))["call_r2"]
    assert isinstance(answer, ToolMessage) and answer.content == ANSWER


async def test_a_tool_that_allows_no_respond_gets_a_reject_giving_the_answer(
    tmp_path: Path,
) -> None:
    agent, sent, tools = email_agent([email_call("toolu_r3", "bob@example.com")], SEED_HITL)
    config = await paused(agent, "respond-3")
    async with responding(tmp_path, "send_email") as bot:
        command = await resolved(
            bot, resolve_interruptions(agent, config, bot.client, within=WITHIN, tools=tools)
        )
    told = RESPONDED.format(response=ANSWER)
    assert command.resume == {"decisions": [{"type": "reject", "message": told}]}
    await agent.ainvoke(command, config)
    assert sent == []
    answer = tool_messages(await assert_finished(agent, config))["toolu_r3"]
    assert answer.content == f"User rejected the tool call for `send_email` with reason: {told}"


# --- pydantic-ai and the OpenAI Agents SDK: the denial's message is the call's result ------


async def test_pydantic_ai_gives_the_model_the_answer_as_the_result(tmp_path: Path) -> None:
    shop = pa.Shop([pa.refund_call("call_1")])
    async with responding(tmp_path, "refund") as bot:
        result = await resolved(
            bot, run_with_reviews(shop.agent(), "refund o-7", bot.client, run_id="r", within=20)
        )
    assert shop.refunds == []
    assert result.output == f"done: {ANSWER}"
    [returned] = [
        part
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    assert (returned.tool_call_id, returned.content) == ("call_1", ANSWER)


async def test_the_openai_agents_sdk_gives_the_model_the_answer_as_output(
    tmp_path: Path,
) -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [assistant_message("told")],
        ]
    )
    agent = oa.agent_of(model, ran)
    async with responding(tmp_path, "refund") as bot:
        first = await Runner.run(agent, "refund o-7", run_config=oa.NO_TRACES)
        state = await resolved(
            bot, openai_agents.resolve_interruptions(first, bot.client, run_id=oa.RUN, within=20)
        )
        done = await Runner.run(agent, state, run_config=oa.NO_TRACES)
    assert ran == []
    assert done.final_output == "told"
    assert oa.outputs(model.calls[1]) == {"call_1": ANSWER}


# --- Agent Framework and Google ADK: a refusal, the answer in its record ------------------


async def test_agent_framework_keeps_the_answer_with_its_rejection(tmp_path: Path) -> None:
    refunds = af.Refunds()
    client = af.ScriptedChatClient(
        [af.calls(("call_1", "refund", {"order_id": "o-7", "amount": 500})), af.text("done")]
    )
    agent = af.agent_of(client, refunds)
    session = agent.create_session()
    async with responding(tmp_path, "refund") as bot:
        response = await af.paused(agent, session)
        resume = await resolved(
            bot,
            resolve_approvals(
                response.user_input_requests,
                bot.client,
                run_id=session.session_id,
                session=session,
                within=20,
            ),
        )
        [answer] = resume.contents
        assert answer.type == "function_approval_response" and answer.approved is False
        assert answer.additional_properties["response"] == ANSWER
        assert answer.additional_properties["reason"] == RESPONDED.format(response=ANSWER)
        af.finished(await agent.run(resume, session=session))
    assert refunds.refunded == []
    assert client.results() == {"call_1": af.REJECTED}  # the framework's fixed text


async def test_google_adk_refuses_with_the_answer_in_the_payload(tmp_path: Path) -> None:
    shop = adk.Shop(adk.calls({"order_id": "o-7", "amount": 500}), adk.text("not refunded"))
    async with responding(tmp_path, "refund") as bot:
        await shop.ask("refund order o-7")
        session = await shop.session()
        answer: types.Content = await resolved(
            bot,
            resolve_confirmations(
                session,
                bot.client,
                run_id=session.id,
                within=20,
                session_service=shop.runner.session_service,
            ),
        )
    payload = {"message": RESPONDED.format(response=ANSWER), "response": ANSWER}
    assert adk.confirmations(answer) == [{"hint": "", "confirmed": False, "payload": payload}]
    assert adk.final_text(await shop.turn(answer)) == "not refunded"
    assert shop.refunds == []
    assert shop.tool_results() == [{"error": "This tool call is rejected."}]


# --- hosted by the bot ------------------------------------------------------------------------

emails: list[dict[str, str]] = []
"""Every email the hosted agents' tool really sent."""


def hosted_mailer() -> HostedLangGraph:
    """A hosted LangGraph agent whose model emails Bob once, then says what it was told."""
    return hosted_agent([[email_call("toolu_h1", "bob@example.com")]], {"send_email": True}, emails)


def responded(call: PendingCall) -> Resolution:
    return Resolution(
        call=call,
        approved=False,
        arguments=call.arguments,
        edited=False,
        message=None,
        decided_by=REVIEWER,
        consumed=None,
        response=ANSWER,
    )


async def test_a_hosted_adapter_resumes_with_the_respond(tmp_path: Path) -> None:
    emails.clear()
    step = await hosted_mailer().start("Email Bob", run_id="hosted-r1")
    [call] = step.pending
    done = await hosted_mailer().resume(kept(step, tmp_path), [responded(call)], run_id="hosted-r1")
    assert (done.pending, done.final_text) == ((), f"Done. | {ANSWER}")
    assert emails == []


async def test_the_bot_resumes_a_hosted_agent_with_the_respond(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # where this module is imported from
    emails.clear()
    bot: Hosted
    async with hosted_bot(
        tmp_path,
        {"mailer": "tests.bridges.test_respond_bridges:hosted_mailer"},
        ["send_email"],
        [review_rule("send_email", allowed_decisions=RESPOND)],
    ) as bot:
        run = await bot.start("mailer", "Email Bob")
        [pending] = run["pending"]
        await bot.decide(pending["approval_id"], action="respond", message=ANSWER)
        done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert done["final_text"] == f"Done. | {ANSWER}"
    assert emails == []
