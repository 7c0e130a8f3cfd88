"""A Google ADK agent hosted by the bot itself (`framework_agents:` in nodbot.yml), on a
scripted model: started by `POST /runs`, its pending confirmations reviewed by the rules and
decided over the HTTP API, resumed by the bot's workers from the session kept in its store,
each tool run once (or never) and the run finished with the agent's answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.serve import Served, serving
from nodbot.core.bridges.google_adk import HostedGoogleADK
from tests.bridges.test_google_adk import text
from tests.bridges.test_google_adk_hosted import Shop, refund_call, turn

ROOT = Path(__file__).resolve().parents[2]
STARTER = {"Authorization": "Bearer token-of-the-starter-00000000000"}
LEAD = {"Authorization": "Bearer token-of-the-lead-00000000000"}
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


CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: starter, token: token-of-the-starter-00000000000, scopes: [runs:write]}}
    - {{name: lead@example.com, token: token-of-the-lead-00000000000,
        scopes: [approvals:read, approvals:decide]}}
framework_agents:
  shop: tests.bridges.test_google_adk_hosted_by_the_bot:shop_agent
  support: tests.bridges.test_google_adk_hosted_by_the_bot:support_agent
external_tools: [refund]
rules:
  - tool: refund
    reviewers: [lead@example.com]
"""


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.chdir(ROOT)
    refunds.clear()
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db"))
    async with serving(str(path)) as served:
        yield served


async def decide(client: httpx.AsyncClient, approval_id: str, **body: Any) -> None:
    answer = await client.post(f"/approvals/{approval_id}/decide", json=body, headers=LEAD)
    assert answer.status_code == 200, answer.text


async def test_a_hosted_adk_agent_is_reviewed_and_resumed_with_an_edit(bot: Served) -> None:
    async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
        run = (
            await client.post("/runs", json={"agent": "shop", "input": "refunds"}, headers=STARTER)
        ).json()
        assert run["status"] == "waiting", run
        by_call = {p["call_id"]: p for p in run["pending"]}
        assert sorted(by_call) == ["call_1", "call_2"]
        assert refunds == []
        await decide(
            client, by_call["call_1"]["approval_id"], action="edit", arguments={"amount": 450}
        )
        await decide(client, by_call["call_2"]["approval_id"], action="deny", reason="no receipt")
        done = (await client.get(f"/runs/{run['run_id']}?wait=15", headers=LEAD)).json()
    assert done["status"] == "finished", done
    assert done["final_text"] == "handled"
    assert refunds == [("o-7", 450)]


async def test_a_hosted_adk_agent_is_reviewed_and_resumed(bot: Served) -> None:
    async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
        body = {"agent": "support", "input": "refund o-9"}
        run = (await client.post("/runs", json=body, headers=STARTER)).json()
        [pending] = run["pending"]
        assert (pending["call_id"], pending["tool"]) == ("call_1", "refund")
        await decide(client, pending["approval_id"], action="approve")
        done = (await client.get(f"/runs/{run['run_id']}?wait=15", headers=LEAD)).json()
    assert done["status"] == "finished", done
    assert done["final_text"] == "refund handled"
    assert refunds == [("o-9", 300)]
