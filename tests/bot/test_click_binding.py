"""A click decides only the review of the message it is on: the real bot (`serving`), the local
fake of Slack's Web API, and payloads signed as Slack signs them, some of them changed the
way a modified client could change them (another review's id in a button's value, a modal's
metadata naming another review or message)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.slack.reviews import NOT_ITS_MESSAGE
from nodbot.core import ToolCall
from tests.bot.test_slack import Bot, slack_bot
from tests.fakes.slack import Message


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with slack_bot(tmp_path, monkeypatch) as running:
        yield running


def approval_of(message: Message) -> str:
    """The approval id a message's buttons carry."""
    _, element = message.action("nodbot.approve")
    return str(element["value"])


async def review(bot: Bot, order: str) -> str:
    """A refund made to wait for review as a run of the bot makes it (asked by carol)."""
    service = bot.served.service
    executor = rules_executor(service.agents["support"].tools, service.config, service.store)
    call = ToolCall(name="refund", arguments={"order_id": order, "amount": 500}, id="c1")
    paused = await executor.run_call(
        call, executor.context(f"run_{order}", requested_by=bot.carol.id)
    )
    assert paused.error is not None, paused
    service.decided()  # wake the workers, as a run of this bot would
    approval_id: str = paused.error.details["approval_id"]
    return approval_id


async def two_reviews(bot: Bot) -> tuple[str, Message, str, Message]:
    """Two pending reviews and their messages in the lead's direct messages: (A, A's message,
    B, B's message)."""
    first = await review(bot, "A-1001")
    second = await review(bot, "A-1002")
    by_approval = {approval_of(m): m for m in await bot.posted(bot.lead, 2)}
    assert set(by_approval) == {first, second}
    # Each message is recorded as its review's delivery before the tests click.
    for approval_id in (first, second):
        await bot.settled(approval_id)
    return first, by_approval[first], second, by_approval[second]


async def refusals(bot: Bot, approval_id: str) -> list[tuple[str | None, str]]:
    """The refused events of a review, once there is one: (actor, reason)."""
    await bot.logged(approval_id, 1, "refused", "decided", "voted")
    events = await bot.served.service.store.events(approval_id)
    return [(e.actor, str(e.detail.get("reason"))) for e in events if e.kind == "refused"]


def kinds(events: list[tuple[str, str | None, str | None]]) -> list[str]:
    return [kind for kind, _, _ in events if kind != "delivered"]


async def test_a_click_on_one_review_naming_another_decides_nothing(bot: Bot) -> None:
    first, on_first, second, on_second = await two_reviews(bot)
    forged = bot.slack.click(on_first, "nodbot.approve", bot.lead, value=second)
    assert (await bot.send(forged)).status_code == 200
    [told] = await bot.told(1)
    assert told.user == bot.lead.id and NOT_ITS_MESSAGE in told.text
    assert await refusals(bot, second) == [(bot.lead.id, NOT_ITS_MESSAGE)]
    assert (await bot.record(second)).decision is None
    assert (await bot.record(first)).decision is None
    assert kinds(await bot.events(first)) == ["created"]
    # The same reviewer's click on the second review's own message decides it.
    await bot.click(on_second, "nodbot.approve", bot.lead)
    record = await bot.decided(second)
    assert record.decision is not None and record.decision.decided_by == bot.lead.id
    assert (await bot.record(first)).decision is None


async def test_a_click_whose_payload_names_two_messages_is_refused(bot: Bot) -> None:
    _, on_first, second, on_second = await two_reviews(bot)
    payload = bot.slack.click(on_second, "nodbot.approve", bot.lead)
    payload["container"]["message_ts"] = on_first.ts  # the message object still says B's
    assert (await bot.send(payload)).status_code == 200
    [told] = await bot.told(1)
    assert NOT_ITS_MESSAGE in told.text
    assert await refusals(bot, second) == [(bot.lead.id, NOT_ITS_MESSAGE)]
    assert (await bot.record(second)).decision is None


async def test_a_deny_modal_whose_metadata_names_another_review_decides_nothing(
    bot: Bot,
) -> None:
    first, on_first, second, _ = await two_reviews(bot)
    await bot.click(on_first, "nodbot.deny", bot.lead)
    view = await bot.modal()
    metadata = json.loads(view.private_metadata)
    assert metadata == {"approval_id": first, "channel": on_first.channel, "ts": on_first.ts}
    payload = bot.slack.submit(view, bot.lead, {"reason": {"value": "no"}})
    payload["view"]["private_metadata"] = json.dumps({**metadata, "approval_id": second})
    assert (await bot.send(payload)).status_code == 200
    [told] = await bot.told(1)
    assert NOT_ITS_MESSAGE in told.text
    assert await refusals(bot, second) == [(bot.lead.id, NOT_ITS_MESSAGE)]
    assert (await bot.record(second)).decision is None
    assert (await bot.record(first)).decision is None
    # The modal as the bot opened it still denies the first review.
    answer = await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": "no"}}))
    assert answer.status_code == 200
    record = await bot.decided(first)
    assert record.decision is not None and not record.decision.approved


@pytest.mark.parametrize("metadata", ["another review", "no message"])
async def test_an_edit_modal_not_bound_to_its_review_message_is_refused(
    bot: Bot, metadata: str
) -> None:
    first, on_first, second, _ = await two_reviews(bot)
    await bot.click(on_first, "nodbot.edit", bot.lead)
    view = await bot.modal()
    payload = bot.slack.submit(view, bot.lead, {"arg.amount": {"value": "50"}})
    named = second if metadata == "another review" else first
    # "no message": a modal opened by a bot before messages were kept in its metadata.
    payload["view"]["private_metadata"] = (
        json.dumps({"approval_id": second, "channel": on_first.channel, "ts": on_first.ts})
        if metadata == "another review"
        else f"{first} {on_first.channel}"
    )
    answer = await bot.send(payload)
    assert answer.json() == {
        "response_action": "errors",
        "errors": {"arg.amount": NOT_ITS_MESSAGE},
    }
    # Acked once the refusal is recorded: read at once.
    events = await bot.served.service.store.events(named)
    refused = [(e.actor, e.detail.get("reason")) for e in events if e.kind == "refused"]
    assert refused == [(bot.lead.id, NOT_ITS_MESSAGE)]
    assert (await bot.record(first)).decision is None
    assert (await bot.record(second)).decision is None
