"""A Microsoft Agent Framework agent hosted by the bot itself (`framework_agents:` in
nodbot.yml): an `Agent` on the scripted chat client of `test_agent_framework`, started by
`POST /runs`, its two paused calls reviewed by the rules and decided over the HTTP API,
resumed by the bot's workers from the session kept in its store, the approved tool run once,
the denied one never, and the run finished with the agent's answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent

from nodbot.core.bridges.agent_framework import HostedAgentFramework
from tests.bridges.support import Hosted, hosted_bot
from tests.bridges.test_agent_framework import REJECTED, ScriptedChatClient, calls, text
from tests.bridges.test_agent_framework_hosted import shop_tools

ROOT = Path(__file__).resolve().parents[2]
ran: list[tuple[str, dict[str, Any]]] = []
"""Every real run of the agent's tools."""
clients: list[ScriptedChatClient] = []
"""The chat client of each agent the bot built."""


def agent_framework_agent() -> HostedAgentFramework:
    """Asks for a refund and a notice in one turn, then answers."""
    client = ScriptedChatClient(
        [
            calls(
                ("call_1", "refund", {"order_id": "o-7", "amount": 500}),
                ("call_2", "notify", {"customer": "c-9"}),
            ),
            text("refund handled"),
        ]
    )
    clients.append(client)
    return HostedAgentFramework(Agent(client, name="support", tools=shop_tools(ran)))


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hosted]:
    monkeypatch.chdir(ROOT)
    ran.clear()
    clients.clear()
    async with hosted_bot(
        tmp_path,
        {"support": "tests.bridges.test_agent_framework_hosted_by_the_bot:agent_framework_agent"},
        ["refund", "notify"],
    ) as hosted:
        yield hosted


async def test_a_hosted_agent_framework_agent_is_reviewed_and_resumed(bot: Hosted) -> None:
    run = await bot.start("support", "refund o-7 and tell c-9")
    assert run["status"] == "waiting", run
    by_call = {p["call_id"]: p for p in run["pending"]}
    assert {call: p["tool"] for call, p in by_call.items()} == {
        "call_1": "refund",
        "call_2": "notify",
    }
    assert ran == []
    await bot.decide(by_call["call_1"]["approval_id"], action="approve")
    await bot.decide(by_call["call_2"]["approval_id"], action="deny", reason="not now")
    done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert done["final_text"] == "refund handled"
    assert ran == [("refund", {"order_id": "o-7", "amount": 500.0})]
    results = {
        str(content.call_id): content.result
        for client_ in clients
        for sent in client_.sent
        for message in sent
        for content in message.contents
        if content.type == "function_result"
    }
    assert results == {"call_1": "refunded 500.0 on o-7", "call_2": REJECTED}
