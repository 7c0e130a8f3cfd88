"""Who asked for a run is who the token says: `POST /runs` over real HTTP, the bot served
in-process (`bot.serve.serving`) on a loopback port over SQLite."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.http.approvals import STARTS_FOR_OTHERS_REASON
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON
from nodbot.bot.serve import Served, serving

SECRETS = {
    "mallory@example.com": "token-of-mallory-000",
    "frontend@example.com": "token-of-frontend-00",
    "carol@example.com": "token-of-carol-00000",
    "Carol@Example.com": "token-of-carol-upper",
    "lead@example.com": "token-of-lead-000000",
}
SCOPES = {
    "mallory@example.com": "[runs:write, approvals:read, approvals:decide]",
    "frontend@example.com": "[runs:write, runs:write-as, approvals:read, approvals:decide]",
    "carol@example.com": "[runs:write, approvals:read]",
    "Carol@Example.com": "[approvals:read, approvals:decide]",
    "lead@example.com": "[approvals:read, approvals:decide]",
}


def config(tmp_path: Path) -> Path:
    tokens = "\n".join(
        f"    - {{name: '{name}', token: {secret}, scopes: {SCOPES[name]}}}"
        for name, secret in SECRETS.items()
    )
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
{tokens}
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    when: {{gt: {{amount: 100}}}}
    reviewers: [mallory@example.com, frontend@example.com, carol@example.com, lead@example.com]
"""
    )
    return path


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


@dataclass
class Bot:
    served: Served
    client: httpx.AsyncClient

    async def start(self, who: str, **body: Any) -> httpx.Response:
        run = {"agent": "support", "input": "Refund order A-1001", **body}
        return await self.client.post("/runs", json=run, headers=as_(who))

    async def decide(self, approval_id: str, who: str, action: str) -> httpx.Response:
        return await self.client.post(
            f"/approvals/{approval_id}/decide", json={"action": action}, headers=as_(who)
        )


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    async with (
        serving(str(config(tmp_path))) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        yield Bot(served, client)


async def test_naming_another_requester_without_the_scope_is_403_and_starts_nothing(
    bot: Bot,
) -> None:
    refused = await bot.start("mallory@example.com", requested_by="carol@example.com")
    assert refused.status_code == 403
    assert "runs:write-as" in refused.json()["error"]
    assert refused.json()["details"] == {"scope": "runs:write-as"}
    assert bot.served.service.counters["runs_started"] == 0
    assert (await bot.client.get("/approvals", headers=as_("lead@example.com"))).json() == []


async def test_the_requester_is_the_tokens_name_and_may_not_approve(bot: Bot) -> None:
    started = await bot.start("mallory@example.com")
    assert started.status_code == 201, started.text
    run = started.json()
    [pending] = run["pending"]
    assert run["requested_by"] == pending["requested_by"] == "mallory@example.com"
    own = await bot.decide(pending["approval_id"], "mallory@example.com", "approve")
    assert (own.status_code, own.json()["error"]) == (403, SELF_APPROVAL_REASON)
    # Naming oneself needs no other scope.
    again = await bot.start("mallory@example.com", requested_by="mallory@example.com")
    assert (again.status_code, again.json()["requested_by"]) == (201, "mallory@example.com")


async def test_a_run_started_for_someone_else_is_approved_by_neither(bot: Bot) -> None:
    started = await bot.start("frontend@example.com", requested_by="carol@example.com")
    assert started.status_code == 201, started.text
    [pending] = started.json()["pending"]
    assert pending["requested_by"] == "carol@example.com"
    approval_id = pending["approval_id"]
    requester = await bot.decide(approval_id, "Carol@Example.com", "approve")
    assert (requester.status_code, requester.json()["error"]) == (403, SELF_APPROVAL_REASON)
    starter = await bot.decide(approval_id, "frontend@example.com", "approve")
    assert (starter.status_code, starter.json()["error"]) == (403, SELF_APPROVAL_REASON)
    # A token that may start runs for others approves no run, even one it did not start.
    other = (await bot.start("mallory@example.com")).json()["pending"][0]["approval_id"]
    any_run = await bot.decide(other, "frontend@example.com", "approve")
    assert (any_run.status_code, any_run.json()["error"]) == (403, STARTS_FOR_OTHERS_REASON)
    detail = (
        await bot.client.get(f"/approvals/{approval_id}", headers=as_("lead@example.com"))
    ).json()
    assert detail["status"] == "pending"
    refused = [(e["actor"], e["channel"]) for e in detail["events"] if e["kind"] == "refused"]
    assert refused == [("Carol@Example.com", "api"), ("frontend@example.com", "api")]
    decided = await bot.decide(approval_id, "lead@example.com", "approve")
    assert decided.status_code == 200, decided.text
    assert decided.json()["decision"]["decided_by"] == "lead@example.com"


async def test_the_starter_for_someone_else_may_still_deny(bot: Bot) -> None:
    started = await bot.start("frontend@example.com", requested_by="U0999CAROL")
    [pending] = started.json()["pending"]
    denied = await bot.decide(pending["approval_id"], "frontend@example.com", "deny")
    assert denied.status_code == 200, denied.text
    assert denied.json()["status"] == "denied"


async def test_an_address_in_another_case_is_the_same_requester(bot: Bot) -> None:
    # Naming oneself in another case is not naming someone else: no runs:write-as needed.
    started = await bot.start("carol@example.com", requested_by="CAROL@example.COM")
    assert started.status_code == 201, started.text
    [pending] = started.json()["pending"]
    assert pending["requested_by"] == "carol@example.com"
    refused = await bot.decide(pending["approval_id"], "Carol@Example.com", "approve")
    assert (refused.status_code, refused.json()["error"]) == (403, SELF_APPROVAL_REASON)
    record = await bot.served.service.store.get(pending["approval_id"])
    assert record.decision is None


async def test_the_starter_for_someone_else_may_not_approve_in_the_inbox_either(
    bot: Bot,
) -> None:
    started = await bot.start("frontend@example.com", requested_by="carol@example.com")
    run = started.json()
    assert (run["requested_by"], run["started_by"]) == ("carol@example.com", "frontend@example.com")
    approval_id = run["pending"][0]["approval_id"]
    # The person behind the token signs in to the inbox (another channel, the same person).
    async with httpx.AsyncClient(base_url=bot.served.url) as browser:
        link = bot.served.sign_in_link("Frontend@Example.com")
        assert (await browser.get(link)).status_code == 303
        page = await browser.get(f"/inbox/approvals/{approval_id}")
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found, page.text
        form = {"csrf": found.group(1), "action": "approve"}
        refused = await browser.post(f"/inbox/approvals/{approval_id}/decide", data=form)
    assert refused.status_code == 403
    assert SELF_APPROVAL_REASON in html.unescape(refused.text)
    record = await bot.served.service.store.get(approval_id)
    assert record.decision is None
    events = await bot.served.service.store.events(approval_id)
    assert [(e.kind, e.actor, e.channel) for e in events][-1] == (
        "refused",
        "Frontend@Example.com",
        "web",
    )
