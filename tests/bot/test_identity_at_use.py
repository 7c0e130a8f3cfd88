"""Decisions made without a fresh click keep the identity rules, checked when they decide: a
remembered approval is not used for a call its reviewer started (under any of their `people:`
handles) nor once they left the rule's group; the API token that asked for an external call
counts as its requester (it may not approve it through another handle of the same person);
and only the token that asked for a call (or one of the same person) takes its decision."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.policy.rules import SELF_APPROVAL_REASON
from nodbot.bot.serve import Served, serving
from tests.bot import ledger_agent

ROOT = Path(__file__).resolve().parents[2]


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer token-of-{name}-".ljust(40, "0")}


TOKENS = {
    "starter": "[runs:write]",
    "lead-runner": "[runs:write]",
    "agent": "[approvals:request]",
    "agent-backup": "[approvals:request]",
    "other-agent": "[approvals:request]",
    "lead-agent": "[approvals:request]",
    "lead@example.com": "[approvals:read, approvals:decide]",
    "sam@example.com": "[approvals:read, approvals:decide]",
}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
{tokens}
people:
  lead: [lead@example.com, lead-runner, lead-agent]
  shop-agent: [agent, agent-backup]
reviewer_groups:
  ops: [{ops}]
agents:
  ledger: tests.bot.ledger_agent:agent
external_tools: [payout]
rules:
  - tool: refund
    reviewers: [group:ops]
    remember: 1h
  - tool: payout
    reviewers: [group:ops]
    remember: 1h
"""


def write(tmp_path: Path, ops: str = "lead@example.com, sam@example.com") -> Path:
    tokens = "\n".join(
        f'    - {{name: "{name}", token: "{bearer(name)["Authorization"][7:]}", scopes: {scopes}}}'
        for name, scopes in TOKENS.items()
    )
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db", tokens=tokens, ops=ops))
    return path


@dataclass
class Bot:
    http: httpx.AsyncClient
    served: Served
    calls: int = 0

    async def run(self, who: str, text: str) -> dict[str, Any]:
        """A run of the ledger agent started by `who`, once it has settled."""
        started = await self.http.post(
            "/runs", json={"agent": "ledger", "input": text}, headers=bearer(who)
        )
        assert started.status_code == 201, started.text
        found: dict[str, Any] = started.json()
        return found

    async def ask(self, who: str, **body: Any) -> dict[str, Any]:
        self.calls += 1
        request = {
            "tool": "payout",
            "arguments": {"order_id": "M-1", "amount": 10},
            "run_id": "thread-1",
            "call_id": f"call_{self.calls}",
            **body,
        }
        answer = await self.http.post("/approvals", json=request, headers=bearer(who))
        assert answer.status_code == 201, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def decide(self, who: str, approval_id: str, **body: Any) -> httpx.Response:
        body.setdefault("action", "approve")
        return await self.http.post(
            f"/approvals/{approval_id}/decide", json=body, headers=bearer(who)
        )

    async def consume(self, who: str, approval_id: str) -> httpx.Response:
        return await self.http.post(f"/approvals/{approval_id}/consume", headers=bearer(who))


@pytest.fixture(autouse=True)
def _ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    ledger_agent.RUNS.clear()


@contextlib.asynccontextmanager
async def running(path: Path) -> AsyncIterator[Bot]:
    """The bot of the file at `path`, served in-process, and a client of its API."""
    async with (
        serving(str(path)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        yield Bot(http, served)


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    async with running(write(tmp_path)) as bot:
        yield bot


async def remembered_run(bot: Bot) -> None:
    """Lead approves the starter's refund of M-1 and remembers it."""
    first = await bot.run("starter", "refund M-1 10")
    [pending] = first["pending"]
    decided = await bot.decide("lead@example.com", pending["approval_id"], remember=True)
    assert decided.status_code == 200, decided.text


async def test_a_remembered_approval_is_not_used_for_a_run_its_reviewer_starts(bot: Bot) -> None:
    await remembered_run(bot)
    again = await bot.run("starter", "refund M-1 10")  # remembered: approved at once
    assert again["pending"] == []
    own = await bot.run("lead-runner", "refund M-1 10")  # lead's own run: a review
    assert own["status"] == "waiting", own
    [pending] = own["pending"]
    assert pending["status"] == "pending"
    assert ledger_agent.RUNS.count(("M-1", 10.0)) == 2  # the first run and the starter's


async def test_a_remembered_approval_is_not_used_for_a_call_its_reviewer_asks(bot: Bot) -> None:
    first = await bot.ask("agent")
    decided = await bot.decide("lead@example.com", first["approval_id"], remember=True)
    assert decided.status_code == 200, decided.text
    assert (await bot.ask("agent"))["status"] == "approved"  # remembered
    own = await bot.ask("lead-agent")
    assert own["status"] == "pending"
    record = await bot.served.service.store.get(own["approval_id"])
    assert record.request.policy["remembered_unused"]["reason"] == SELF_APPROVAL_REASON


async def test_a_remembered_approval_is_not_used_once_its_reviewer_left_the_group(
    tmp_path: Path,
) -> None:
    async with running(write(tmp_path)) as bot:
        await remembered_run(bot)
    # The rule's text is unchanged, so its remembered approvals stand: lead is not in it now.
    async with running(write(tmp_path, ops="sam@example.com")) as bot:
        again = await bot.run("starter", "refund M-1 10")
    assert again["status"] == "waiting", again
    [pending] = again["pending"]
    assert pending["status"] == "pending"
    assert ledger_agent.RUNS.count(("M-1", 10.0)) == 1


async def test_the_token_that_asks_is_a_requester_whoever_it_asks_for(bot: Bot) -> None:
    asked = await bot.ask("lead-agent", requested_by="customer-9")
    assert asked["requested_by"] == "customer-9"
    refused = await bot.decide("lead@example.com", asked["approval_id"])
    assert refused.status_code == 403, refused.text
    assert "started this run" in refused.json()["error"]
    denied = await bot.decide("lead@example.com", asked["approval_id"], action="deny")
    assert denied.status_code == 200, denied.text  # a requester may still deny


async def test_another_reviewer_approves_what_a_reviewers_agent_asked(bot: Bot) -> None:
    asked = await bot.ask("lead-agent", requested_by="customer-9")
    approved = await bot.decide("sam@example.com", asked["approval_id"])
    assert approved.status_code == 200, approved.text


async def test_only_the_asking_agent_takes_its_decision(bot: Bot) -> None:
    asked = await bot.ask("agent")
    assert (await bot.decide("sam@example.com", asked["approval_id"])).status_code == 200
    stolen = await bot.consume("other-agent", asked["approval_id"])
    assert stolen.status_code == 403, stolen.text
    assert "only the token that asked" in stolen.json()["error"]
    taken = await bot.consume("agent-backup", asked["approval_id"])  # the same agent's
    assert taken.status_code == 200, taken.text
    assert taken.json()["approved"] is True


async def test_a_run_of_the_bots_own_is_not_taken_over_the_api(bot: Bot) -> None:
    run = await bot.run("starter", "refund M-2 10")
    [pending] = run["pending"]
    assert (await bot.decide("sam@example.com", pending["approval_id"])).status_code == 200
    taken = await bot.consume("agent", pending["approval_id"])
    assert taken.status_code == 403, taken.text
