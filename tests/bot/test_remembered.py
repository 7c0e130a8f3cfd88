"""Remembered approvals (a rule's `remember:`): a reviewer approves "and remember", a later
identical call under the same rule is approved at once as that reviewer's decision (recorded
as a review of its own whose event names the original), other arguments are reviewed, and a
forgotten approval, or one made under a rule whose text changed since, covers nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.cli.approvals import run_approvals_command
from nodbot.bot.cli.commands import build_parser
from nodbot.bot.serve import serving

ROOT = Path(__file__).resolve().parents[2]
AGENT = {"Authorization": "Bearer token-of-the-agent-0000000000000"}
LEAD = {"Authorization": "Bearer token-of-the-lead-00000000000"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: token-of-the-agent-0000000000000, scopes: [approvals:request]}}
    - {{name: lead@example.com, token: token-of-the-lead-00000000000,
        scopes: [approvals:read, approvals:decide]}}
external_tools: [send_email, refund]
rules:
  - tool: send_email
    description: {description}
    reviewers: [lead@example.com]
    remember: 1d
    remember_by: [to]
  - tool: refund
    reviewers: [lead@example.com]
"""


class Bot:
    def __init__(self, client: httpx.AsyncClient, config: Path) -> None:
        self.client, self.config = client, config
        self.calls = 0

    async def ask(self, tool: str, **arguments: Any) -> dict[str, Any]:
        self.calls += 1
        body = {"tool": tool, "arguments": arguments, "run_id": "t-1", "call_id": f"c{self.calls}"}
        answer = await self.client.post("/approvals", json=body, headers=AGENT)
        assert answer.status_code == 201, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def decide(self, approval_id: str, **body: Any) -> httpx.Response:
        return await self.client.post(f"/approvals/{approval_id}/decide", json=body, headers=LEAD)

    async def events(self, approval_id: str) -> list[dict[str, Any]]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=LEAD)
        events: list[dict[str, Any]] = found.json()["events"]
        return events


def write(tmp_path: Path, description: str = "mail leaves the company") -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db", description=description))
    return path


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    path = write(tmp_path)
    async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
        yield Bot(client, path)


async def remembered(bot: Bot) -> str:
    """An email to ana approved by the lead, remembered; its review's id."""
    first = await bot.ask("send_email", to="ana@example.com", body="hello")
    assert first["status"] == "pending"
    answer = await bot.decide(first["approval_id"], action="approve", remember=True)
    assert answer.status_code == 200, answer.text
    return str(first["approval_id"])


async def test_a_remembered_approval_approves_the_same_call_at_once(bot: Bot) -> None:
    origin = await remembered(bot)
    # remember_by: [to]: another body to the same recipient is the same call for the rule.
    again = await bot.ask("send_email", to="ana@example.com", body="second mail")
    assert again["status"] == "approved"
    assert again["decision"]["decided_by"] == "lead@example.com"
    [decided] = [e for e in await bot.events(again["approval_id"]) if e["kind"] == "decided"]
    assert decided["channel"] == "remembered"
    assert decided["detail"]["evidence"]["from_review"] == origin
    other = await bot.ask("send_email", to="bo@example.com", body="hello")
    assert other["status"] == "pending"


async def test_a_forgotten_approval_covers_nothing(bot: Bot) -> None:
    await remembered(bot)
    listing = build_parser().parse_args(["approvals", "remembered", "--config", str(bot.config)])
    listed = await run_approvals_command(listing)
    remember_id = listed.split()[0]
    assert remember_id.startswith("rem_") and "ana@example.com" in listed
    forget = ["approvals", "forget", remember_id, "--config", str(bot.config)]
    said = await run_approvals_command(build_parser().parse_args(forget))
    assert said.startswith(f"forgotten: {remember_id}")
    assert (await bot.ask("send_email", to="ana@example.com", body="x"))["status"] == "pending"
    listed = await run_approvals_command(listing)
    assert listed == "no remembered approvals"


async def test_remember_is_refused_where_the_rule_has_none_or_not_an_approve(bot: Bot) -> None:
    refund = await bot.ask("refund", order_id="o-1", amount=5)
    answer = await bot.decide(refund["approval_id"], action="approve", remember=True)
    assert answer.status_code == 422 and "does not remember" in answer.json()["error"]
    mail = await bot.ask("send_email", to="ana@example.com", body="x")
    denied = await bot.decide(mail["approval_id"], action="deny", remember=True)
    assert denied.status_code == 422 and "only an approve" in denied.json()["error"]
    events = await bot.events(mail["approval_id"])
    assert [e["kind"] for e in events] == ["created"]  # nothing recorded


async def test_a_changed_rule_forgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    path = write(tmp_path)
    async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
        await remembered(Bot(client, path))
    write(tmp_path, description="mail leaves the company, and is logged")
    async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
        bot = Bot(client, path)
        bot.calls = 10
        again = await bot.ask("send_email", to="ana@example.com", body="hello")
        assert again["status"] == "pending", json.dumps(again)


AGENT_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: starter, token: token-of-the-starter-00000000000, scopes: [runs:write]}}
    - {{name: lead@example.com, token: token-of-the-lead-00000000000,
        scopes: [approvals:read, approvals:decide]}}
agents:
  ledger: tests.bot.ledger_agent:agent
rules:
  - tool: refund
    reviewers: [lead@example.com]
    remember: 1h
"""


async def test_the_bots_own_runs_are_approved_by_a_remembered_approval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NODBOT_TEST_LEDGER", str(tmp_path / "ledger.txt"))
    path = tmp_path / "nodbot.yml"
    path.write_text(AGENT_CONFIG.format(db=tmp_path / "nodbot.db"))
    starter = {"Authorization": "Bearer token-of-the-starter-00000000000"}
    async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
        body = {"agent": "ledger", "input": "refund o-7 20"}
        first = (await client.post("/runs", json=body, headers=starter)).json()
        [pending] = first["pending"]
        decide = {"action": "approve", "remember": True}
        url = f"/approvals/{pending['approval_id']}/decide"
        assert (await client.post(url, json=decide, headers=LEAD)).status_code == 200
        second = (await client.post("/runs", json=body, headers=starter)).json()
        run = await client.get(f"/runs/{second['run_id']}?wait=10", headers=LEAD)
        assert run.json()["status"] == "finished", run.text
        [approval] = (
            await client.get(f"/approvals?run_id={second['run_id']}", headers=LEAD)
        ).json()
        assert approval["decision"]["decided_by"] == "lead@example.com"
        assert approval["consumed"] is True
    assert (tmp_path / "ledger.txt").read_text().splitlines() == ["o-7 20.0", "o-7 20.0"]
