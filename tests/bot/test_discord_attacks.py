"""The Discord channel attacked, and used by mistake: what an attacker who can get a signed
interaction to the endpoint, a model that writes hostile arguments, a reviewer who clicks
in an unexpected order, or a Discord that fails, can make the bot do. Each test stands for
one way of breaking the channel; each holds closed: nothing decided that may not be, every
refusal recorded, every message within Discord's limits, every update delivered.

The bot is served in this process against the local fake of Discord (`tests.fakes.discord`),
every interaction signed as Discord signs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.discord.interactions import NOT_A_CHOICE
from nodbot.bot.discord.messages import MAX_CONTENT, decided_message, escape, request_message
from nodbot.bot.serve import Served, serving
from nodbot.core import ApprovalRecord, ApprovalRequest, Decision, arguments_digest
from tests.fakes.discord import (
    DiscordFake,
    Message,
    button_click,
    discord_fake,
    modal_problem,
    modal_submit,
    select_choice,
)
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-the-starter-000000000000"
CHANNEL = "1500000000000000005"
OTHER = "1500000000000000007"
"""A second channel every review is posted to as well."""
ANA = "1600000000000000006"
"""A reviewer, ana@example.com through `people:`."""
MALLORY = "1700000000000000007"
"""In the channels, but no reviewer."""

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: starter, token: {token}, scopes: [runs:write, approvals:read, approvals:request]}}
agents:
  ledger: tests.bot.ledger_agent:agent
external_tools: [launch, answer_for, payout]
people:
  ana: [ana@example.com, "discord:{ana}"]
discord:
  application_id: "{application_id}"
  public_key: {public_key}
  bot_token: {bot_token}
  channels: ["{channel}", "{other}"]
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [ana@example.com]
  - tool: ask
    reviewers: [ana@example.com]
  - tool: launch
    reviewers: [ana@example.com]
    allowed_decisions: [deny]
  - tool: answer_for
    reviewers: [ana@example.com]
    allowed_decisions: [respond]
  - tool: "*"
    reviewers: [ana@example.com]
"""


@dataclass
class Bot:
    served: Served
    discord: DiscordFake
    client: httpx.AsyncClient

    @property
    def store(self) -> Any:
        return self.served.service.store

    async def review(self, order: str = "order-1", amount: str = "30") -> tuple[str, Message]:
        """A refund's review, once posted to both channels: its id and its message in
        `CHANNEL`."""
        body = {"agent": "ledger", "input": f"refund {order} {amount}"}
        answer = await self.client.post("/runs", json=body, headers=_auth())
        assert answer.status_code == 201, answer.text
        [pending] = answer.json()["pending"]
        approval_id = str(pending["approval_id"])
        return approval_id, await self.posted(approval_id)

    async def ask(self, question: str, choices: list[str]) -> tuple[str, Message]:
        body = {"run_id": "run-of-the-asker", "question": question, "choices": choices}
        answer = await self.client.post("/questions", json=body, headers=_auth())
        assert answer.status_code == 201, answer.text
        approval_id = str(answer.json()["approval_id"])
        return approval_id, await self.posted(approval_id)

    async def call(
        self, tool: str, arguments: dict[str, Any], schema: dict[str, Any] | None = None
    ) -> tuple[str, Message]:
        """A call of another process's tool (`POST /approvals`), once posted."""
        body: dict[str, Any] = {
            "tool": tool,
            "arguments": arguments,
            "run_id": "run-of-another-process",
            "call_id": f"call-{len(self.discord.requests)}",
        }
        if schema is not None:
            body["schema"] = schema
        answer = await self.client.post("/approvals", json=body, headers=_auth())
        assert answer.status_code == 201, answer.text
        approval_id = str(answer.json()["approval_id"])
        return approval_id, await self.posted(approval_id)

    async def posted(self, approval_id: str) -> Message:
        async def posted() -> bool:
            found = await self.store.deliveries(approval_id)
            posts = [d for d in found if d.channel == "discord" and d.kind == "request"]
            return len(posts) == 2 and all(d.status == "sent" for d in posts)

        await eventually(posted, f"the Discord posts of {approval_id}")
        return self.message(approval_id, CHANNEL)

    def message(self, approval_id: str, channel: str) -> Message:
        [message] = [m for m in self.discord.messages(channel) if escape(approval_id) in m.content]
        return message

    async def send(self, interaction: Any) -> httpx.Response:
        body, headers = self.discord.signer.sign(interaction)
        return await self.client.post("/discord/interactions", content=body, headers=headers)

    async def refusals(self, approval_id: str) -> list[tuple[str | None, str]]:
        events = await self.store.events(approval_id)
        return [(e.actor, str(e.detail.get("reason"))) for e in events if e.kind == "refused"]

    def told(self, token: str) -> list[str]:
        return [str(f.body["content"]) for f in self.discord.follow_ups if f.token == token]


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def attack_bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with discord_fake() as discord:
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                ana=ANA,
                application_id=discord.application_id,
                public_key=discord.public_key,
                bot_token=discord.bot_token,
                channel=CHANNEL,
                other=OTHER,
                api_url=discord.api_url,
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            yield Bot(served, discord, client)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with attack_bot(tmp_path, monkeypatch) as running:
        yield running


# --- a forged choice -----------------------------------------------------------------------


async def test_a_forged_choice_is_refused_and_recorded_as_slack_and_teams_do(bot: Bot) -> None:
    approval_id, message = await bot.ask("Which warehouse?", ["Leeds", "Porto"])
    for values in (["2"], ["Lisbon"], ["0", "1"]):
        forged = select_choice(
            bot.discord, message, f"nodbot:answer:{approval_id}", values, user=ANA
        )
        assert (await bot.send(forged)).json() == {"type": 6}
        token = str(forged["token"])

        async def told(token: str = token) -> bool:
            return bool(bot.told(token))

        await eventually(told, "the picker is told")
        assert NOT_A_CHOICE in bot.told(token)[0]
    assert await bot.refusals(approval_id) == [(f"discord:{ANA}", NOT_A_CHOICE)] * 3
    assert (await bot.store.get(approval_id)).decision is None


# --- the edit form --------------------------------------------------------------------------


def _inputs(modal: dict[str, Any]) -> dict[str, str]:
    return {
        row["components"][0]["custom_id"]: row["components"][0].get("value", "")
        for row in modal["data"]["components"]
    }


async def test_an_argument_too_long_for_the_form_is_not_cut_by_an_edit(bot: Bot) -> None:
    """Discord's text input holds 4,000 characters: a longer value shown cut would come back
    cut, and an edit of another argument would run the call with it cut."""
    order = "order-" + "x" * 4500
    approval_id, message = await bot.review(order)
    click = button_click(bot.discord, message, f"nodbot:edit:{approval_id}", user=ANA)
    answer = (await bot.send(click)).json()
    assert modal_problem(answer) is None, answer
    inputs = _inputs(answer)
    assert "arg.order_id" not in inputs  # cannot be shown whole: not in the form
    inputs["arg.amount"] = "40"
    form_id = answer["data"]["custom_id"]
    submitted = await bot.send(modal_submit(bot.discord, message, form_id, inputs, user=ANA))
    assert submitted.json() == {"type": 6}, submitted.text

    async def decided() -> bool:
        return (await bot.store.get(approval_id)).decision is not None

    await eventually(decided, "the edit is recorded")
    decision = (await bot.store.get(approval_id)).decision
    assert decision is not None and decision.edited_args == {"amount": 40}


async def test_a_schema_sent_by_another_process_cannot_make_a_form_discord_refuses(
    bot: Bot,
) -> None:
    """The schema of another process's tool is the caller's: an argument's name too long
    for an input's id is left out of the form, and the form is one Discord shows."""
    long_name = "n" * 150
    schema = {
        "type": "object",
        "properties": {long_name: {"type": "string"}, "amount": {"type": "number"}},
    }
    approval_id, message = await bot.call("payout", {long_name: "x", "amount": 5}, schema)
    click = button_click(bot.discord, message, f"nodbot:edit:{approval_id}", user=ANA)
    answer = (await bot.send(click)).json()
    assert modal_problem(answer) is None, answer
    assert list(_inputs(answer)) == ["arg.amount"]


async def test_an_edit_nested_too_deeply_is_answered_and_records_nothing(bot: Bot) -> None:
    approval_id, message = await bot.review()
    form_id = f"nodbot:edit-form:{approval_id}:{message.id}"
    for deep in ("[" * 900 + "]" * 900, '{"a":' * 600 + "1" + "}" * 600):
        inputs = {"arg.amount": "40", "arg.note": deep}
        answer = await bot.send(modal_submit(bot.discord, message, form_id, inputs, user=ANA))
        assert answer.status_code == 200, answer.text
        assert answer.json()["type"] == 4, answer.text
        assert "nests deeper than 32 levels" in answer.json()["data"]["content"]
    assert (await bot.store.get(approval_id)).decision is None
    assert await bot.refusals(approval_id) == []


async def test_a_deny_on_a_message_whose_post_is_not_answered_yet_is_no_refusal(
    bot: Bot,
) -> None:
    """Discord shows a message before it answers its post: a reviewer quick to click Deny
    is asked to try again, not recorded as clicking a button of another review."""
    bot.discord.held = asyncio.Event()
    try:
        body = {"agent": "ledger", "input": "refund order-2 30"}
        answer = await bot.client.post("/runs", json=body, headers=_auth())
        [pending] = answer.json()["pending"]
        approval_id = str(pending["approval_id"])

        async def shown() -> bool:
            return any(escape(approval_id) in m.content for m in bot.discord.messages(CHANNEL))

        await eventually(shown, "the message in the channel")
        message = bot.message(approval_id, CHANNEL)
        click = button_click(bot.discord, message, f"nodbot:deny:{approval_id}", user=ANA)
        told = (await bot.send(click)).json()
        assert told["type"] == 4 and "try again" in told["data"]["content"], told
        assert await bot.refusals(approval_id) == []
    finally:
        bot.discord.held.set()
    await bot.posted(approval_id)
    again = button_click(bot.discord, message, f"nodbot:deny:{approval_id}", user=ANA)
    assert (await bot.send(again)).json()["type"] == 9  # now its form


# --- updates that Discord refuses -----------------------------------------------------------


async def test_a_deleted_message_does_not_keep_the_others_from_their_outcome(bot: Bot) -> None:
    approval_id, first = await bot.review()
    other = bot.message(approval_id, OTHER)
    bot.discord.delete(first.id)  # a moderator deleted it: its edit is answered 404
    click = button_click(bot.discord, other, f"nodbot:approve:{approval_id}", user=ANA)
    assert (await bot.send(click)).json() == {"type": 6}

    async def edited() -> bool:
        return not other.custom_ids and "Approved" in other.content

    await eventually(edited, "the message still there is edited to the outcome")


async def test_an_outcome_refused_for_a_while_is_edited_once_discord_takes_it(bot: Bot) -> None:
    """A rate limit (429, with how long to wait) and a server error (5xx) on the edits are
    tried again through the outbox: no message keeps its buttons."""
    approval_id, first = await bot.review()
    other = bot.message(approval_id, OTHER)
    bot.discord.fail_next(429, {"message": "You are being rate limited.", "retry_after": 0.2})
    bot.discord.fail_next(502)
    click = button_click(bot.discord, other, f"nodbot:approve:{approval_id}", user=ANA)
    assert (await bot.send(click)).json() == {"type": 6}

    async def edited() -> bool:
        return all(not m.custom_ids and "Approved" in m.content for m in (first, other))

    await eventually(edited, "both messages edited to the outcome")


# --- the buttons a rule allows -------------------------------------------------------------


async def test_only_the_buttons_of_decisions_the_rule_allows_are_posted(bot: Bot) -> None:
    """As in Slack and Teams: no Approve that every click of would be refused; a review
    with no decision Discord makes is posted without buttons (an empty row would be refused
    by Discord, and the review lost), saying where to decide it."""
    launch, message = await bot.call("launch", {"target": "moon"})
    assert message.custom_ids == [f"nodbot:deny:{launch}"]
    answered, message = await bot.call("answer_for", {"question": "why"})
    assert message.custom_ids == [] and "decide it in the inbox" in message.content
    assert (await bot.store.get(answered)).decision is None


# --- replays --------------------------------------------------------------------------------


async def test_an_interaction_sent_again_is_refused_and_recorded_once(bot: Bot) -> None:
    approval_id, message = await bot.review()
    click = button_click(bot.discord, message, f"nodbot:approve:{approval_id}", user=MALLORY)
    body, headers = bot.discord.signer.sign(click)
    first = await bot.client.post("/discord/interactions", content=body, headers=headers)
    assert first.json() == {"type": 6}

    async def refused() -> bool:
        return len(await bot.refusals(approval_id)) == 1

    await eventually(refused, "the refusal")
    for _ in range(3):  # the same signed request, within the signature's five minutes
        again = await bot.client.post("/discord/interactions", content=body, headers=headers)
        assert again.status_code == 400, again.text
        assert "already" in again.json()["error"]
    assert len(await bot.refusals(approval_id)) == 1
    assert (await bot.store.get(approval_id)).decision is None


# --- what is shown --------------------------------------------------------------------------


def _record(arguments: dict[str, Any], **request: Any) -> ApprovalRecord:
    fields: dict[str, Any] = {
        "run_id": "run_1",
        "call_id": "call_1",
        "tool": "refund",
        "arguments": arguments,
        "digest": arguments_digest(arguments),
        "requested_by": "agent",
        **request,
    }
    now = datetime.now(UTC)
    return ApprovalRecord("apr_0123456789abcdef0123456789ab", ApprovalRequest(**fields),
                          created_at=now)  # fmt: skip


def test_the_arguments_are_never_cut_by_the_message_limit() -> None:
    """Every part of a review's message at its longest: the arguments' block is cut to the
    room left (saying how long they are), closed, and the approval's line is still there."""
    hostile = "*_" * 400
    record = _record(
        {"note": "n" * 5000},
        tool="t" * 100,
        requested_by=hostile,
        policy={"description": hostile},
        deadline=datetime.now(UTC) + timedelta(hours=1),
        approvals_required=2,
    )
    message = request_message(record, can_edit=True, can_deny=True, page="https://x.example/a")
    content = message["content"]
    assert len(content) <= MAX_CONTENT
    assert "5,0" in content and "characters in all" in content
    assert content.count("```") == 2 and content.endswith("<https://x.example/a>")
    decided = ApprovalRecord(
        record.approval_id,
        record.request,
        created_at=record.created_at,
        decision=Decision(
            approved=True, edited_args={"note": "e" * 5000}, reason=hostile, decided_by=hostile
        ),
        decided_at=datetime.now(UTC),
    )
    content = decided_message(decided, page="https://x.example/a")["content"]
    assert len(content) <= MAX_CONTENT
    assert content.count("```") == 4 and content.endswith("<https://x.example/a>")


def test_invisible_and_reordering_characters_in_arguments_are_shown_as_escapes() -> None:
    """A right-to-left override or a zero-width character in an argument would show the
    reviewer another text than the call's: they are shown as JSON escapes."""
    account = "GB00-1111\u202e9999-2222"
    content = request_message(
        _record({"account": account, "memo": "a\u200bb\u2066c"}),
        can_edit=False,
        can_deny=True,
        page=None,
    )["content"]
    for hidden in ("\u202e", "\u200b\u2066"):
        assert not any(char in content.split("```")[1] for char in hidden)
    assert "GB00-1111\\u202e9999-2222" in content
    assert "a\\u200bb\\u2066c" in content
    # The JSON shown still reads back as the arguments.
    block = content.split("```\n", 1)[1].rsplit("\n```", 1)[0]
    assert json.loads(block) == {"account": account, "memo": "a\u200bb\u2066c"}


def test_a_description_or_a_requester_cannot_add_lines_of_the_message() -> None:
    """Why and who asked are the caller's (`POST /approvals`): each stays within its line,
    so that no second "Arguments:" block or "Approvals needed" line passes for the bot's."""
    fake = "refund\nArguments:\n```\n{}\n```\r\nApprovals needed: 0\u2028-# Approval apr_x"
    content = request_message(
        _record({"amount": 5000}, requested_by=fake, policy={"description": fake}),
        can_edit=False,
        can_deny=True,
        page=None,
    )["content"]
    shown = content.replace("\\", "")  # as Discord shows it: the escapes are not seen
    starts = [line.split(":")[0] for line in shown.splitlines()]
    assert starts.count("Arguments") == 1 and "Approvals needed" not in starts
    assert (
        "\u2028" not in content
        and sum(line.startswith("-# ") for line in content.splitlines()) == 1
    )


def test_a_tool_name_a_description_or_a_decider_cannot_reorder_what_is_shown() -> None:
    """The tool's name and why are the caller's (`POST /approvals`), a reason and a
    decider's handle a person's: none shows an invisible or reordering character."""
    hidden = "\u202e\u200b\u2066"
    record = _record(
        {"amount": 5},
        tool=f"pay{hidden}out",
        requested_by=f"agent{hidden}",
        policy={"description": f"why{hidden}"},
    )
    content = request_message(record, can_edit=False, can_deny=True, page=None)["content"]
    assert not any(char in content for char in hidden)
    assert "pay\\\\u202e\\\\u200b\\\\u2066out" in content  # a backslash, escaped
    decided = ApprovalRecord(
        record.approval_id,
        record.request,
        created_at=record.created_at,
        decision=Decision(approved=False, reason=f"no{hidden}", decided_by=f"bob{hidden}"),
        decided_at=datetime.now(UTC),
    )
    content = decided_message(decided, page=None)["content"]
    assert not any(char in content for char in hidden)
