"""Reminders and escalations in Discord: a rule's `remind_every` replies to the review's
message in each channel it was posted to, saying it still waits and mentioning the reviewers
known by a Discord id (`people:`) who have not voted, pinging them alone; its `escalate_to`
gets a reply at `escalate_after` saying who may now decide too. Each is outbox work: one
delivery, claimed, sent once across retries, restarts and replicas, never after the decision.

The review opens through the rules of a real configuration; the outbox runs against the local
fake of Discord's REST API over HTTP (`tests.fakes.discord`), on SQLite and PostgreSQL, with
the store's and the outbox's clock moved by hand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from nodbot.bot.config import Config, load_config
from nodbot.bot.discord.channel import DiscordChannel
from nodbot.bot.outbox import Dispatcher
from nodbot.bot.policy.people import People
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.serve import serving
from nodbot.core import Decision, SqlApprovalStore, ToolCall, ToolRegistry
from tests.core.store.conftest import database_url
from tests.fakes.discord import DiscordFake, Message, discord_fake

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
OPS = "1500000000000000005"
REFUNDS = "1500000000000000006"
ANA = "1600000000000000006"
BO = "1600000000000000007"
LEAD = "1600000000000000009"
OPENED = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

tools = ToolRegistry()


@tools.tool(confirm=True, effects="write")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


CONFIG = """
store: {{url: "{url}"}}
people:
  ana: [ana@example.com, "discord:{ana}"]
  bo: [bo@example.com, "discord:{bo}"]
  lead: [lead@example.com, "discord:{lead}"]
discord:
  application_id: "{application_id}"
  public_key: {public_key}
  bot_token: {bot_token}
  channels: ["{ops}"]
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [ana@example.com, bo@example.com, carl@example.com]
    post_to: ["discord:{ops}", "discord:{refunds}"]
    approvals_required: 2
    timeout: 10h
    remind_every: 1h
    remind_limit: 3
    escalate_after: 2h30m
    escalate_to: [lead@example.com, boss@example.com]
"""


class Clock:
    """The bot's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = OPENED

    def __call__(self) -> datetime:
        return self.now


@dataclass
class World:
    """A fake Discord (ana, bo and lead known by their ids; carl and boss by address only),
    one database, the configuration."""

    discord: DiscordFake
    url: str
    config: Config
    clock: Clock
    session: aiohttp.ClientSession


@dataclass
class Replica:
    """One bot process's outbox: its store, its Discord channel, its dispatcher."""

    store: SqlApprovalStore
    dispatcher: Dispatcher

    async def step(self) -> None:
        await self.dispatcher.step()


@contextlib.asynccontextmanager
async def world(backend: str, tmp_path: Path) -> AsyncIterator[World]:
    async with (
        database_url(backend, tmp_path) as url,
        discord_fake() as discord,
        aiohttp.ClientSession() as session,
    ):
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                url=url,
                ana=ANA,
                bo=BO,
                lead=LEAD,
                application_id=discord.application_id,
                public_key=discord.public_key,
                bot_token=discord.bot_token,
                ops=OPS,
                refunds=REFUNDS,
                api_url=discord.api_url,
            )
        )
        yield World(discord, url, load_config(str(path)), Clock(), session)


@contextlib.asynccontextmanager
async def replica(w: World, worker: str, *, people: bool = True) -> AsyncIterator[Replica]:
    """A bot process's outbox; `people`: whether it knows the `people:` entries (without
    them, no reviewer is known by a Discord id)."""
    config, clock = w.config, w.clock
    assert config.discord is not None
    async with SqlApprovalStore(w.url, clock=clock) as store:
        channel = DiscordChannel(
            config.discord,
            store,
            tools,
            session=w.session,
            people=People(config.people) if people else None,
            clock=clock,
        )
        dispatcher = Dispatcher(store, [channel], worker=worker, clock=clock)
        try:
            yield Replica(store, dispatcher)
        finally:
            await dispatcher.close()


async def open_review(w: World, bot: Replica) -> str:
    executor = rules_executor(tools, w.config, bot.store, clock=w.clock)
    call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": 250.0}, id="call_1")
    paused = await executor.run_call(call, executor.context("run_1", requested_by="dan"))
    assert paused.error is not None and paused.error.kind == "approval-pending"
    approval_id: str = paused.error.details["approval_id"]
    return approval_id


async def at(w: World, hours: float, *bots: Replica) -> None:
    """Move the clock to `hours` after the review opened (09:00), and step every replica."""
    w.clock.now = OPENED + timedelta(hours=hours)
    await asyncio.gather(*(bot.step() for bot in bots))


def review(w: World, channel: str) -> Message:
    """The review's message in `channel`."""
    [found] = [m for m in w.discord.messages(channel) if m.replies_to is None]
    return found


def replies(w: World, channel: str) -> list[Message]:
    """The replies to the review's message in `channel`, oldest first."""
    posted = review(w, channel)
    return [m for m in w.discord.messages(channel) if m.replies_to == posted.id]


def reminders(w: World, channel: str) -> list[Message]:
    return [m for m in replies(w, channel) if "Reminder" in m.content]


def escalations(w: World, channel: str) -> list[Message]:
    return [m for m in replies(w, channel) if "Escalated" in m.content]


def counts(w: World) -> tuple[int, int]:
    """How many reminders each channel (ops, refunds) has had."""
    return len(reminders(w, OPS)), len(reminders(w, REFUNDS))


def assert_pings_only(message: Message, users: list[str]) -> None:
    """`message` mentions `users` and may ping them alone: no role, no @everyone."""
    assert message.pings == {"users": users}
    for user in users:
        assert f"<@{user}>" in message.content
    assert "@everyone" not in message.content and "@here" not in message.content
    assert "<@&" not in message.content


async def vote(bot: Replica, approval_id: str, user: str, person: str, *, approved: bool) -> None:
    decision = Decision(approved=approved, decided_by=f"discord:{user}", reason=None)
    await bot.store.vote(approval_id, decision, channel="discord", person=person)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_each_step_replies_in_each_channel_mentioning_who_has_not_voted(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 0, bot)
        ops, refunds = review(w, OPS), review(w, REFUNDS)
        assert counts(w) == (0, 0)

        await at(w, 0.99, bot)
        assert counts(w) == (0, 0)  # not yet

        await at(w, 1, bot)
        assert counts(w) == (1, 1)
        [first] = reminders(w, OPS)
        assert first.replies_to == ops.id and reminders(w, REFUNDS)[0].replies_to == refunds.id
        assert "Reminder 1 of 3" in first.content and "**refund**" in first.content
        assert "2 approvals are still needed" in first.content
        assert "<t:" in first.content  # the deadline, in each reader's time
        assert_pings_only(first, [ANA, BO])  # carl has no Discord id: not named
        assert "carl" not in first.content

        # bo approves (two approvals are needed): he is not mentioned again.
        await vote(bot, approval_id, BO, "person:bo", approved=True)
        await at(w, 2, bot)
        assert counts(w) == (2, 2)
        second = reminders(w, OPS)[-1]
        assert "Reminder 2 of 3" in second.content
        assert "1 approval is still needed" in second.content
        assert_pings_only(second, [ANA])
        assert f"<@{BO}>" not in second.content

        # ana denies: the review is decided, and no reminder follows.
        await vote(bot, approval_id, ANA, "person:ana", approved=False)
        for hours in (2.5, 3, 4, 9.5):
            await at(w, hours, bot)
        assert counts(w) == (2, 2)
        assert escalations(w, OPS) == escalations(w, REFUNDS) == []

        found = {
            d.target: d
            for d in await bot.store.deliveries(approval_id)
            if d.kind in ("reminder", "escalation")
        }
        assert set(found) == {f"discord:reminder:{k}" for k in (1, 2, 3)} | {"discord:escalation"}
        assert {d.status for d in found.values()} == {"sent"}
        assert (found["discord:reminder:3"].ref or {})["skipped"].startswith("decided")
        assert (found["discord:escalation"].ref or {})["skipped"].startswith("decided")
        assert (found["discord:reminder:1"].ref or {})["mentioned"] == [ANA, BO]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_the_escalation_is_posted_once_and_names_who_may_now_decide(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        for hours in (0, 1, 2, 2.4):
            await at(w, hours, bot)
        assert escalations(w, OPS) == []

        await at(w, 2.5, bot)
        [escalated] = escalations(w, OPS)
        assert len(escalations(w, REFUNDS)) == 1
        assert escalated.replies_to == review(w, OPS).id
        assert "may now decide it too" in escalated.content
        # boss has no Discord id: named (escaped, as Discord shows it), not pinged.
        assert "boss\\@example.com" in escalated.content
        assert_pings_only(escalated, [LEAD])
        for hours in (2.6, 2.7):
            await at(w, hours, bot)
        assert len(escalations(w, OPS)) == len(escalations(w, REFUNDS)) == 1

        # Once escalated, the reminders mention whom it escalated to as well.
        await at(w, 3, bot)
        last = reminders(w, OPS)[-1]
        assert "Reminder 3 of 3" in last.content
        assert_pings_only(last, [ANA, BO, LEAD])

        events = [
            e
            for e in await bot.store.events(approval_id)
            if e.kind == "delivered" and e.detail.get("kind") == "escalation"
        ]
        assert len(events) == 1


async def test_without_known_discord_ids_a_reminder_names_no_one_and_still_says_it_waits(
    tmp_path: Path,
) -> None:
    async with world("sqlite", tmp_path) as w, replica(w, "w1", people=False) as bot:
        await open_review(w, bot)
        await at(w, 0, bot)
        await at(w, 1, bot)
        [reminder] = reminders(w, OPS)
        assert reminder.content.startswith("Reminder 1 of 3: the review of **refund** is still")
        assert_pings_only(reminder, [])
        assert "<@" not in reminder.content
        await at(w, 2.5, bot)
        [escalated] = escalations(w, OPS)
        assert "lead\\@example.com" in escalated.content
        assert "boss\\@example.com" in escalated.content
        assert_pings_only(escalated, [])


async def test_a_step_whose_answer_was_lost_is_not_posted_again(tmp_path: Path) -> None:
    async with world("sqlite", tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 0, bot)
        # Reminder 1: posted in ops, the answer lost (the attempt fails there); the retry
        # finds the reply by its nonce (the channel cannot be read this time), and posts in
        # refunds.
        w.discord.lose_next_answers(1)
        await at(w, 1, bot)
        assert counts(w) == (1, 0)
        w.discord.fail_next(500)  # the read of the channel's latest messages
        await at(w, 1.01, bot)
        assert counts(w) == (1, 1)

        # Reminder 2: the answers lost, and the nonces forgotten (minutes went by, as
        # after a restart): the retry finds the replies among the channels' latest messages.
        w.discord.lose_next_answers(1)
        await at(w, 2, bot)
        assert counts(w) == (2, 1)
        w.discord.forget_nonces()
        await at(w, 2.01, bot)
        assert counts(w) == (2, 2)

        # The escalation too.
        w.discord.lose_next_answers(1)
        await at(w, 2.5, bot)
        w.discord.forget_nonces()
        await at(w, 2.51, bot)
        assert len(escalations(w, OPS)) == len(escalations(w, REFUNDS)) == 1

        steps = {
            d.target: d for d in await bot.store.deliveries(approval_id) if d.kind != "request"
        }
        for target in ("discord:reminder:1", "discord:reminder:2", "discord:escalation"):
            delivery = steps[target]
            assert delivery.status == "sent" and delivery.attempts >= 1, target
            kept = {(r["channel"], r["id"]) for r in (delivery.ref or {})["replies"]}
            assert {channel for channel, _ in kept} == {OPS, REFUNDS}
            for channel, reply in kept:
                assert reply in {m.id for m in replies(w, channel)}


async def test_a_reply_to_a_deleted_review_message_is_skipped_there_only(tmp_path: Path) -> None:
    async with world("sqlite", tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 0, bot)
        w.discord.delete(review(w, REFUNDS).id)
        await at(w, 1, bot)
        assert len(reminders(w, OPS)) == 1
        assert w.discord.messages(REFUNDS) == []
        [step] = [
            d for d in await bot.store.deliveries(approval_id) if d.target == "discord:reminder:1"
        ]
        assert step.status == "sent"
        assert [g["channel"] for g in (step.ref or {})["gone"]] == [REFUNDS]


async def test_a_reminder_due_while_the_bot_is_stopped_is_sent_once_after_the_restart(
    tmp_path: Path,
) -> None:
    async with world("sqlite", tmp_path) as w:
        async with replica(w, "before") as bot:
            await open_review(w, bot)
            await at(w, 0, bot)
        # Stopped through reminders 1 and 2: only the later one is sent, not two at once.
        async with replica(w, "after") as bot:
            await at(w, 2.2, bot)
            assert counts(w) == (1, 1)
            assert "Reminder 2 of 3" in reminders(w, OPS)[0].content
            await at(w, 2.3, bot)
            assert counts(w) == (1, 1)


@pytest.mark.postgres
async def test_two_replicas_send_each_step_once(tmp_path: Path) -> None:
    async with (
        world("postgresql", tmp_path) as w,
        replica(w, "one") as first,
        replica(w, "two") as second,
    ):
        await open_review(w, first)
        for hours in (0, 0.5, 1, 1.5, 2, 2.5, 3, 4, 6):
            # Both step side by side at each moment, twice: each step is sent by one of them.
            await at(w, hours, first, second)
            await at(w, hours, second, first)
        assert counts(w) == (3, 3)
        assert len(escalations(w, OPS)) == len(escalations(w, REFUNDS)) == 1
        assert len([m for m in w.discord.messages(OPS) if m.replies_to is None]) == 1


async def test_the_served_bot_s_discord_channel_knows_who_the_reviewers_are(
    tmp_path: Path,
) -> None:
    """`nodbot serve` gives its Discord channel the `people:` its authorizer resolves, so
    that its reminders mention reviewers by their Discord ids (without it, none is known and
    every reminder names no one)."""
    async with world("sqlite", tmp_path):
        path = tmp_path / "served.yml"
        path.write_text(
            (tmp_path / "nodbot.yml").read_text()
            + "server: {host: 127.0.0.1, port: 0}\nexternal_tools: [refund]\n"
        )
        async with serving(str(path)) as served:
            channel = served.service.dispatcher.channels["discord"]
            assert isinstance(channel, DiscordChannel) and channel.people is not None
            person = await channel.people.person("ana@example.com")
            assert f"discord:{ANA}" in person.handles
