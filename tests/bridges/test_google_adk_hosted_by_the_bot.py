"""A Google ADK agent hosted by the bot itself (`framework_agents:` in nodbot.yml), on a
scripted model: started by `POST /runs`, its pending confirmations reviewed by the rules and
decided over the HTTP API, resumed by the bot's workers from the session kept in its store,
each tool run once (or never) and the run finished with the agent's answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodbot.core.bridges.google_adk import HostedGoogleADK
from tests.bridges.support import Hosted, hosted_bot
from tests.bridges.test_google_adk import text
from tests.bridges.test_google_adk_hosted import Shop, refund_call, turn

ROOT = Path(__file__).resolve().parents[2]
refunds: list[tuple[str, float]] = []
"""Every real run of either agent's refund tool."""


def shop_agent() -> HostedGoogleADK:
    """Asks for two refunds in one turn (its tool reads edits from the payload), then
    answers."""
    replies = [turn(refund_call("call_1"), refund_call("call_2", "o-8", 20)), text("handled")]
    return Shop(replies, refunds).hosted("payload", payload_edits=["refund"])


def support_agent() -> HostedGoogleADK:
    """Asks for one refund (an ADK `FunctionTool` that needs confirmation), then answers."""
    return Shop([turn(refund_call("call_1", "o-9", 300)), text("refund handled")], refunds).hosted()


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hosted]:
    monkeypatch.chdir(ROOT)
    refunds.clear()
    async with hosted_bot(
        tmp_path,
        {
            "shop": "tests.bridges.test_google_adk_hosted_by_the_bot:shop_agent",
            "support": "tests.bridges.test_google_adk_hosted_by_the_bot:support_agent",
        },
        ["refund"],
    ) as hosted:
        yield hosted


async def test_a_hosted_adk_agent_is_reviewed_and_resumed_with_an_edit(bot: Hosted) -> None:
    run = await bot.start("shop", "refunds")
    assert run["status"] == "waiting", run
    by_call = {p["call_id"]: p for p in run["pending"]}
    assert sorted(by_call) == ["call_1", "call_2"]
    assert refunds == []
    await bot.decide(by_call["call_1"]["approval_id"], action="edit", arguments={"amount": 450})
    await bot.decide(by_call["call_2"]["approval_id"], action="deny", reason="no receipt")
    done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert done["final_text"] == "handled"
    assert refunds == [("o-7", 450)]


async def test_a_hosted_adk_agent_is_reviewed_and_resumed(bot: Hosted) -> None:
    run = await bot.start("support", "refund o-9")
    [pending] = run["pending"]
    assert (pending["call_id"], pending["tool"]) == ("call_1", "refund")
    await bot.decide(pending["approval_id"], action="approve")
    done = await bot.finished(run["run_id"])
    assert done["status"] == "finished", done
    assert done["final_text"] == "refund handled"
    assert refunds == [("o-9", 300)]
