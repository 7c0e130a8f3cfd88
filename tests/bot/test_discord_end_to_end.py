"""The Discord channel end to end, through `nodbot serve` in a process of its own against the
local fake of Discord's REST API (`tests.fakes.discord`), with every interaction signed with
the application's test key as Discord signs it.

A run asks for a refund; the review is posted once to the configured channel, with Approve /
Edit / Deny buttons; a reviewer's click (a Discord user joined to a reviewer's address by a
`people:` entry) approves it, an edit through the modal runs the refund with the edited
amount, a denial through the modal stops it, and each time the message is edited to the
outcome. An unsigned or forged interaction is refused (401) and records nothing; a click by
someone who is no reviewer, or by the run's own requester, is refused, recorded as a refusal,
and decides nothing; a review decided over the HTTP API has its Discord message edited too.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_email_end_to_end import ledger, until
from tests.fakes.discord import DiscordFake, Message, button_click, discord_fake, modal_submit

STARTER = "token-of-the-starter-000000000000"
BOB_TOKEN = "token-of-bob-the-reviewer-0000000"
CHANNEL = "1500000000000000005"
ANA = "1600000000000000006"
"""A reviewer in Discord: ana@example.com, through `people:`."""
MALLORY = "1700000000000000007"
"""In the channel, but no reviewer."""
STEVE = "1800000000000000008"
"""The run's requester (`starter`), in Discord, and listed as a reviewer."""

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: starter, token: {starter}, scopes: [runs:write, approvals:read]}}
    - {{name: bob@example.com, token: {bob}, scopes: [approvals:read, approvals:decide]}}
agents:
  ledger: tests.bot.ledger_agent:agent
people:
  ana: [ana@example.com, "discord:{ana}"]
  steve: [starter, steve@example.com, "discord:{steve}"]
discord:
  application_id: "{application_id}"
  public_key: {public_key}
  bot_token: {bot_token}
  channels: ["{channel}"]
  api_url: {api_url}
rules:
  - tool: refund
    description: Refunds need a person.
    reviewers: [ana@example.com, bob@example.com, steve@example.com]
"""


@dataclass
class Desk:
    bot: Running
    client: httpx.AsyncClient
    discord: DiscordFake
    tmp_path: Path

    async def start(self, order: str, amount: str) -> tuple[str, str]:
        body = {"agent": "ledger", "input": f"refund {order} {amount}"}
        answer = await self.client.post("/runs", json=body, headers=_auth(STARTER))
        assert answer.status_code == 201, answer.text
        run = answer.json()
        [pending] = run["pending"]
        return str(run["run_id"]), str(pending["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=_auth(STARTER))
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def posted(self, approval_id: str) -> Message:
        """The review's message in the channel, once posted (and recorded as posted)."""

        async def found() -> Message | None:
            mine = [
                m
                for m in self.discord.messages(CHANNEL)
                if f"nodbot:approve:{approval_id}" in m.custom_ids
            ]
            if not mine:
                return None
            deliveries = await self._deliveries(approval_id)
            return mine[0] if deliveries else None

        message: Message = await until(f"the Discord message of {approval_id}", found)
        return message

    async def _deliveries(self, approval_id: str) -> bool:
        events = (await self.approval(approval_id))["events"]
        return any(e["kind"] == "delivered" and e["channel"] == "discord" for e in events)

    async def send(self, interaction: dict[str, Any], **sign: Any) -> httpx.Response:
        body, headers = self.discord.signer.sign(interaction, **sign)
        return await self.client.post("/discord/interactions", content=body, headers=headers)

    async def click(self, message: Message, custom_id: str, user: str) -> httpx.Response:
        return await self.send(button_click(self.discord, message, custom_id, user=user))

    async def decided(self, approval_id: str) -> dict[str, Any]:
        async def found() -> dict[str, Any] | None:
            approval = await self.approval(approval_id)
            return approval if approval["decision"] is not None else None

        approval: dict[str, Any] = await until(f"{approval_id} is decided", found)
        return approval

    async def edited(self, message: Message, text: str) -> None:
        """The message, once edited to its outcome (no buttons, `text` in it)."""
        await until(
            f"message {message.id} says {text!r}",
            lambda: not message.custom_ids and text in message.content,
        )

    async def refusals(self, approval_id: str) -> list[dict[str, Any]]:
        events = (await self.approval(approval_id))["events"]
        return [e for e in events if e["kind"] == "refused" and e["channel"] == "discord"]

    def told(self, token: str) -> list[str]:
        return [f.body["content"] for f in self.discord.follow_ups if f.token == token]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    async with discord_fake() as discord:
        config = tmp_path / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                starter=STARTER,
                bob=BOB_TOKEN,
                ana=ANA,
                steve=STEVE,
                application_id=discord.application_id,
                public_key=discord.public_key,
                bot_token=discord.bot_token,
                channel=CHANNEL,
                api_url=discord.api_url,
            )
        )
        environment = {"NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt")}
        async with (
            nodbot_serve(config, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            yield Desk(bot, client, discord, tmp_path)


async def test_a_review_is_posted_once_and_approved_by_a_click(desk: Desk) -> None:
    _, approval_id = await desk.start("order-1", "40")
    message = await desk.posted(approval_id)
    assert message.custom_ids == [
        f"nodbot:approve:{approval_id}",
        f"nodbot:edit:{approval_id}",
        f"nodbot:deny:{approval_id}",
    ]
    assert "Refunds need a person" in message.content
    assert message.body["allowed_mentions"] == {"parse": []}

    answer = await desk.click(message, f"nodbot:approve:{approval_id}", ANA)
    assert answer.status_code == 200 and answer.json() == {"type": 6}  # a deferred update
    approval = await desk.decided(approval_id)
    assert approval["status"] == "approved"
    assert approval["decision"]["decided_by"] == f"discord:{ANA}"
    [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
    assert decided["channel"] == "discord" and decided["person"] == "person:ana"
    assert decided["detail"]["evidence"]["message"] == message.id
    await until("the refund runs", lambda: ledger(desk.tmp_path) == ["order-1 40.0"])
    await desk.edited(message, "Approved")
    assert f"<@{ANA}>" in message.content
    assert len(desk.discord.messages(CHANNEL)) == 1  # posted once


async def test_an_edit_through_the_modal_runs_the_edited_call(desk: Desk) -> None:
    _, approval_id = await desk.start("order-2", "90")
    message = await desk.posted(approval_id)
    opened = await desk.click(message, f"nodbot:edit:{approval_id}", ANA)
    assert opened.status_code == 200, opened.text
    modal = opened.json()
    assert modal["type"] == 9
    form_id = modal["data"]["custom_id"]
    inputs = {c["custom_id"]: c for row in modal["data"]["components"] for c in row["components"]}
    assert inputs["arg.amount"]["value"] == "90.0"

    # An amount that is not a number: the form is refused, nothing recorded.
    bad = modal_submit(desk.discord, message, form_id, {"arg.amount": "lots"}, user=ANA)
    refused = await desk.send(bad)
    assert refused.json()["type"] == 4 and "amount" in refused.json()["data"]["content"]
    assert (await desk.approval(approval_id))["decision"] is None

    good = modal_submit(desk.discord, message, form_id, {"arg.amount": "25"}, user=ANA)
    answer = await desk.send(good)
    assert answer.json() == {"type": 6}
    approval = await desk.decided(approval_id)
    assert approval["decision"]["edited_args"] == {"amount": 25.0}
    await until("the edited refund runs", lambda: ledger(desk.tmp_path) == ["order-2 25.0"])
    await desk.edited(message, "Edited and approved")


async def test_a_denial_through_the_modal_stops_the_call(desk: Desk) -> None:
    run_id, approval_id = await desk.start("order-3", "70")
    message = await desk.posted(approval_id)
    opened = await desk.click(message, f"nodbot:deny:{approval_id}", ANA)
    form_id = opened.json()["data"]["custom_id"]
    submit = modal_submit(desk.discord, message, form_id, {"reason": "not this one"}, user=ANA)
    assert (await desk.send(submit)).json() == {"type": 6}
    approval = await desk.decided(approval_id)
    assert approval["status"] == "denied"
    assert approval["decision"]["reason"] == "not this one"
    await desk.edited(message, "Denied")

    async def finished() -> bool:
        run = (await desk.client.get(f"/runs/{run_id}", headers=_auth(STARTER))).json()
        return bool(run["status"] == "finished")

    await until("the run finishes", finished)
    assert ledger(desk.tmp_path) == []


async def test_unsigned_forged_and_stale_interactions_are_refused(desk: Desk) -> None:
    _, approval_id = await desk.start("order-4", "10")
    message = await desk.posted(approval_id)
    click = button_click(desk.discord, message, f"nodbot:approve:{approval_id}", user=ANA)
    body, headers = desk.discord.signer.sign(click)

    unsigned = await desk.client.post(
        "/discord/interactions", content=body, headers={"Content-Type": "application/json"}
    )
    assert unsigned.status_code == 401
    forged = dict(headers, **{"X-Signature-Ed25519": "00" * 64})
    answer = await desk.client.post("/discord/interactions", content=body, headers=forged)
    assert answer.status_code == 401
    tampered = body.replace(ANA.encode(), MALLORY.encode())
    answer = await desk.client.post("/discord/interactions", content=tampered, headers=headers)
    assert answer.status_code == 401
    stale = await desk.send(click, timestamp=int(time.time()) - 3600)
    assert stale.status_code == 401

    ping = await desk.send({"id": "1", "application_id": desk.discord.application_id, "type": 1})
    assert ping.json() == {"type": 1}  # the signed ones are answered
    approval = await desk.approval(approval_id)
    assert approval["decision"] is None and not await desk.refusals(approval_id)


async def test_a_non_reviewer_and_the_requester_are_refused(desk: Desk) -> None:
    _, approval_id = await desk.start("order-5", "20")
    message = await desk.posted(approval_id)
    click = button_click(desk.discord, message, f"nodbot:approve:{approval_id}", user=MALLORY)
    assert (await desk.send(click)).status_code == 200
    await until("Mallory is told", lambda: desk.told(click["token"]))
    assert "not one of the reviewers" in desk.told(click["token"])[0]

    own = button_click(desk.discord, message, f"nodbot:approve:{approval_id}", user=STEVE)
    await desk.send(own)
    await until("Steve is told", lambda: desk.told(own["token"]))

    refusals = await desk.refusals(approval_id)
    assert [r["actor"] for r in refusals] == [f"discord:{MALLORY}", f"discord:{STEVE}"]
    assert refusals[1]["person"] == "person:steve"
    assert "approve" in refusals[1]["detail"]["reason"]  # their own call
    # A Deny click by a non-reviewer gets no form either.
    denied = await desk.click(message, f"nodbot:deny:{approval_id}", MALLORY)
    assert denied.json()["type"] == 4 and "not one of the reviewers" in json.dumps(denied.json())
    approval = await desk.approval(approval_id)
    assert approval["decision"] is None and message.custom_ids  # still waiting, buttons kept


async def test_a_decision_made_over_the_api_edits_the_discord_message(desk: Desk) -> None:
    _, approval_id = await desk.start("order-6", "15")
    message = await desk.posted(approval_id)
    answer = await desk.client.post(
        f"/approvals/{approval_id}/decide",
        json={"action": "deny", "message": "handled elsewhere"},
        headers=_auth(BOB_TOKEN),
    )
    assert answer.status_code == 200, answer.text
    await desk.edited(message, "Denied")
    assert "bob@example.com" in message.content.replace("\\", "")

    # A click on the message after that decides nothing more.
    click = button_click(desk.discord, message, f"nodbot:approve:{approval_id}", user=ANA)
    await desk.send(click)
    await until("Ana is told", lambda: desk.told(click["token"]))
    assert "already decided" in desk.told(click["token"])[0]
