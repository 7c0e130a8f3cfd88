"""Agents of other frameworks hosted by the bot itself (`framework_agents:` in nodbot.yml): a
pydantic-ai agent, an OpenAI Agents SDK agent and a LangGraph agent, each on its
framework's own test model,
started by `POST /runs`, their paused calls reviewed by the rules and decided over the HTTP
API, resumed by the bot's workers from the state kept in its store, each tool run once (or
never) and the run finished with the agent's answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent as OpenAIAgent
from agents.testing import ScriptedModel, assistant_message, function_call

from nodbot.core.bridges.openai_agents import HostedOpenAIAgent
from nodbot.core.bridges.pydantic_ai import HostedPydanticAI
from tests.bridges.support import Hosted, hosted_bot
from tests.bridges.test_langgraph import SEED_HITL, email_call
from tests.bridges.test_langgraph_hosted import hosted_agent
from tests.bridges.test_openai_agents_hosted import refund_tool
from tests.bridges.test_pydantic_ai_hosted import Shop, refund_call

ROOT = Path(__file__).resolve().parents[2]
refunds: list[dict[str, Any]] = []
"""Every real run of the agents' refund tools."""
emails: list[dict[str, str]] = []
"""Every email the LangGraph agent's tool really sent."""


def langgraph_agent() -> Any:
    return hosted_agent([[email_call("toolu_01", "bob@example.com")]], SEED_HITL, emails)


def pydantic_agent() -> HostedPydanticAI:
    """Asks for two refunds in one turn, then answers with what the tools said."""
    shop = Shop([[refund_call("call_1", 500), refund_call("call_2", 20, "o-8")]], refunds)
    return shop.hosted()


def openai_agent() -> HostedOpenAIAgent:
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-9", "amount": 300}, call_id="call_1")],
            [assistant_message("refund handled")],
        ]
    )
    return HostedOpenAIAgent(OpenAIAgent(name="support", model=model, tools=[refund_tool(refunds)]))


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hosted]:
    monkeypatch.chdir(ROOT)
    refunds.clear()
    emails.clear()
    async with hosted_bot(
        tmp_path,
        {
            "shop": "tests.bridges.test_hosted_by_the_bot:pydantic_agent",
            "support": "tests.bridges.test_hosted_by_the_bot:openai_agent",
            "mailer": "tests.bridges.test_hosted_by_the_bot:langgraph_agent",
        },
        ["refund", "send_email"],
    ) as hosted:
        yield hosted


async def test_a_hosted_pydantic_ai_agent_is_reviewed_and_resumed(bot: Hosted) -> None:
    run = await bot.start("shop", "refunds")
    assert run["status"] == "waiting"
    by_call = {p["call_id"]: p for p in run["pending"]}
    assert sorted(by_call) == ["call_1", "call_2"]
    assert refunds == []
    await bot.decide(by_call["call_1"]["approval_id"], action="edit", arguments={"amount": 450})
    await bot.decide(by_call["call_2"]["approval_id"], action="deny", reason="no receipt")
    done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert refunds == [{"order_id": "o-7", "amount": 450}]
    assert "refunded 450.0 on o-7" in done["final_text"] and "no receipt" in done["final_text"]


async def test_a_hosted_openai_agent_is_reviewed_and_resumed(bot: Hosted) -> None:
    run = await bot.start("support", "refund o-9")
    [pending] = run["pending"]
    assert (pending["call_id"], pending["tool"]) == ("call_1", "refund")
    await bot.decide(pending["approval_id"], action="approve")
    done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert done["final_text"] == "refund handled"
    assert refunds == [{"order_id": "o-9", "amount": 300}]


async def test_a_hosted_langgraph_agent_is_reviewed_and_resumed(bot: Hosted) -> None:
    run = await bot.start("mailer", "Email Bob")
    [pending] = run["pending"]
    assert (pending["call_id"], pending["tool"]) == ("toolu_01", "send_email")
    await bot.decide(pending["approval_id"], action="approve")
    done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert emails == [{"to": "bob@example.com", "subject": "Hello", "body": "Hello!"}]
    assert done["final_text"].startswith("Done.")
