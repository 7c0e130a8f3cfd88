"""Remembered approvals and typed edits in Slack, for calls of external tools asked through
`POST /approvals`: the "Approve & remember" button (with its confirm dialog) approves and
remembers, a forged click of it on a review whose rule remembers nothing decides nothing,
and the edit modal of a tool whose caller sent a schema has typed fields, checked against
that schema."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.policy.remember import remembered_of
from nodbot.bot.serve import Served, serving
from nodbot.bot.slack.messages import for_how_long
from nodbot.core import ApprovalRecord
from tests.fakes.slack import (
    Message,
    SlackFake,
    User,
    block_actions_payload,
    interactive_request,
    slack_fake,
)
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
AGENT = {"Authorization": "Bearer token-of-the-agent-0000000000000"}
READER = {"Authorization": "Bearer token-of-the-reader-000000000000"}
REMEMBER = "nodbot.approve_remember"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "description": "the recipient"},
        "body": {"type": "string"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["to", "body"],
}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: token-of-the-agent-0000000000000, scopes: [approvals:request]}}
    - {{name: reader, token: token-of-the-reader-000000000000, scopes: [approvals:read]}}
external_tools: [send_email, refund]
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: send_email
    description: Mail leaves the company.
    reviewers: [{lead}]
    remember: 1d
    remember_by: [to]
  - tool: refund
    reviewers: [{lead}]
"""


@dataclass
class Bot:
    served: Served
    slack: SlackFake
    client: httpx.AsyncClient
    lead: User
    calls: int = 0

    async def ask(
        self, tool: str, schema: dict[str, Any] | None = None, **arguments: Any
    ) -> dict[str, Any]:
        """Ask for a call of an external tool, as another framework's agent does."""
        self.calls += 1
        body: dict[str, Any] = {
            "tool": tool,
            "arguments": arguments,
            "run_id": "t-1",
            "call_id": f"c{self.calls}",
        }
        if schema is not None:
            body["schema"] = schema
        answer = await self.client.post("/approvals", json=body, headers=AGENT)
        assert answer.status_code == 201, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def posted(self, count: int = 1) -> Message:
        """The latest review message in the lead's DM, once `count` are there."""

        def top() -> list[Message]:
            return [m for m in self.slack.messages(self.lead) if m.thread_ts is None]

        await self.slack.wait_until(lambda: len(top()) >= count, 10, f"{count} message(s)")
        return top()[-1]

    async def send(self, payload: dict[str, Any]) -> httpx.Response:
        body, headers = interactive_request(payload, self.slack.signing_secret)
        return await self.client.post("/slack/events", content=body, headers=headers)

    async def click(self, message: Message, action: str) -> None:
        answer = await self.send(self.slack.click(message, action, self.lead))
        assert answer.status_code == 200, answer.text

    async def record(self, approval_id: str) -> ApprovalRecord:
        return await self.served.service.store.get(approval_id)

    async def decided(self, approval_id: str) -> ApprovalRecord:
        async def check() -> bool:
            return (await self.record(approval_id)).decision is not None

        await eventually(check, f"the decision of {approval_id}")
        return await self.record(approval_id)


@contextlib.asynccontextmanager
async def slack_bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                lead=lead.id,
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            yield Bot(served, slack, client, lead)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with slack_bot(tmp_path, monkeypatch) as running:
        yield running


def buttons(message: Message) -> dict[str, dict[str, Any]]:
    return {
        e["action_id"]: e for b in message.blocks if b["type"] == "actions" for e in b["elements"]
    }


def all_text(message: Message) -> str:
    return json.dumps(message.blocks, ensure_ascii=False)


async def test_approve_and_remember_approves_the_same_call_at_once_later(bot: Bot) -> None:
    first = await bot.ask("send_email", SCHEMA, to="ana@example.com", body="hello")
    assert first["status"] == "pending"
    message = await bot.posted()
    found = buttons(message)
    assert list(found) == ["nodbot.approve", REMEMBER, "nodbot.edit", "nodbot.deny"]
    remember = found[REMEMBER]
    assert remember["text"]["text"] == "Approve & remember"
    assert remember["value"] == first["approval_id"]
    confirm = remember["confirm"]["text"]["text"]
    assert confirm.endswith(
        "Approve this call, and for the next 1 day approve at once, as your decision, every "
        "call of *send_email* with the same `to`."
    )

    await bot.click(message, REMEMBER)
    record = await bot.decided(first["approval_id"])
    assert record.decision is not None and record.decision.approved
    assert record.decision.decided_by == bot.lead.id
    events = await bot.served.service.store.events(first["approval_id"])
    assert [(e.kind, e.actor, e.channel) for e in events if e.kind == "decided"] == [
        ("decided", bot.lead.id, "slack")
    ]
    # The message loses its buttons and says until when the approval is remembered.
    await bot.slack.wait_until(lambda: "Remembered until" in all_text(message), 10, "the update")
    assert buttons(message) == {}
    assert f"*Approved* by <@{bot.lead.id}>" in all_text(message)

    # remember_by: [to]: another body to the same recipient is the same call for the rule.
    again = await bot.ask("send_email", SCHEMA, to="ana@example.com", body="second mail")
    assert again["status"] == "approved"
    assert again["decision"]["decided_by"] == bot.lead.id
    shown = await bot.client.get(f"/approvals/{again['approval_id']}", headers=READER)
    [decided] = [e for e in shown.json()["events"] if e["kind"] == "decided"]
    assert decided["channel"] == "remembered"
    assert decided["detail"]["evidence"]["from_review"] == first["approval_id"]
    other = await bot.ask("send_email", SCHEMA, to="bo@example.com", body="hello")
    assert other["status"] == "pending"


async def test_a_forged_remember_click_on_a_rule_without_remember_decides_nothing(
    bot: Bot,
) -> None:
    refund = await bot.ask("refund", order_id="o-1", amount=5)
    message = await bot.posted()
    assert REMEMBER not in buttons(message)
    block_id, _ = message.action("nodbot.approve")
    forged = block_actions_payload(
        action_id=REMEMBER,
        block_id=block_id,
        value=refund["approval_id"],
        user_id=bot.lead.id,
        user_name=bot.lead.name,
        team_id=bot.slack.team_id,
        channel_id=message.channel,
        message_ts=message.ts,
        message=message.to_api(),
    )
    answer = await bot.send(forged)
    assert answer.status_code == 200, answer.text
    await bot.slack.wait_until(lambda: bool(bot.slack.ephemerals), 10, "an ephemeral message")
    [told] = bot.slack.ephemerals
    assert told.user == bot.lead.id and "does not remember" in told.text
    assert (await bot.record(refund["approval_id"])).decision is None
    kept = remembered_of(bot.served.service.store)
    assert kept is not None and not await kept.list()
    # The review is still open to an ordinary approve.
    await bot.click(message, "nodbot.approve")
    record = await bot.decided(refund["approval_id"])
    assert record.decision is not None and record.decision.decided_by == bot.lead.id


async def test_the_edit_modal_of_an_external_tool_is_typed_by_its_schema(bot: Bot) -> None:
    asked = await bot.ask("send_email", SCHEMA, to="ana@example.com", body="hello", priority=2)
    message = await bot.posted()
    await bot.click(message, "nodbot.edit")
    await bot.slack.wait_until(lambda: bool(bot.slack.views), 10, "views.open")
    view = bot.slack.views[-1]
    inputs = {b["block_id"]: b for b in view.blocks if b["type"] == "input"}
    assert sorted(inputs) == ["arg.body", "arg.priority", "arg.to"]
    assert inputs["arg.to"]["hint"]["text"] == "the recipient"
    priority = inputs["arg.priority"]["element"]
    assert priority["type"] == "number_input" and priority["is_decimal_allowed"] is False
    assert priority["initial_value"] == "2"

    def submit(value: str) -> dict[str, Any]:
        # Slack sends every input: the unchanged ones with the values they were opened with.
        kept = {"arg.to": {"value": "ana@example.com"}, "arg.body": {"value": "hello"}}
        return bot.slack.submit(view, bot.lead, {**kept, "arg.priority": {"value": value}})

    wrong_type = await bot.send(submit("urgent"))
    assert wrong_type.json() == {
        "response_action": "errors",
        "errors": {"arg.priority": "expected a whole number, not 'urgent'"},
    }
    # A whole number, but not one the caller's schema allows: Executor.decide says so.
    out_of_range = await bot.send(submit("9"))
    assert out_of_range.json() == {
        "response_action": "errors",
        "errors": {"arg.priority": "at most 5"},
    }
    assert (await bot.record(asked["approval_id"])).decision is None

    answer = await bot.send(submit("4"))
    assert answer.status_code == 200 and not answer.content
    record = await bot.record(asked["approval_id"])
    assert record.decision is not None and record.decision.edited_args == {"priority": 4}
    assert record.decision.decided_by == bot.lead.id


async def test_an_argument_too_long_for_the_modal_is_left_out_not_cut(bot: Bot) -> None:
    """A text input holds 3,000 characters. Shown cut, a longer body would come back cut when
    the reviewer changed only the priority, and the mail would go out cut: it is left out of
    the modal, named, and keeps its value."""
    body = "Dear customer,\n" + "x" * 4_000
    asked = await bot.ask("send_email", SCHEMA, to="ana@example.com", body=body, priority=2)
    message = await bot.posted()
    await bot.click(message, "nodbot.edit")
    await bot.slack.wait_until(lambda: bool(bot.slack.views), 10, "views.open")
    view = bot.slack.views[-1]
    # The reviewer changes the priority; the other inputs go as they were opened.
    answer = await bot.send(bot.slack.submit(view, bot.lead, {"arg.priority": {"value": "4"}}))
    assert answer.status_code == 200 and not answer.content
    record = await bot.record(asked["approval_id"])
    assert record.decision is not None and record.decision.edited_args == {"priority": 4}
    inputs = [b["block_id"] for b in view.blocks if b["type"] == "input"]
    assert sorted(inputs) == ["arg.priority", "arg.to"]
    assert "kept as they are: `body`" in json.dumps(view.blocks)


async def test_an_external_tool_without_a_schema_offers_no_edit(bot: Bot) -> None:
    await bot.ask("send_email", to="ana@example.com", body="hello")
    message = await bot.posted()
    assert list(buttons(message)) == ["nodbot.approve", REMEMBER, "nodbot.deny"]


def test_the_remember_duration_is_said_in_words() -> None:
    assert for_how_long(86_400) == "1 day"
    assert for_how_long(5_400) == "1 hour 30 minutes"
    assert for_how_long(2 * 86_400 + 45) == "2 days 45 seconds"
