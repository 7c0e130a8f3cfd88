"""Reminders: a rule's `remind_every` nudges the reviewers who have not voted, on the channel
that reached them (a Slack thread reply that mentions them, an email in the request's thread),
at most `remind_limit` times, never after the decision or the deadline. Each step is outbox
work: one delivery, claimed, sent once across restarts and replicas, recorded as an event.

The review opens through the rules of a real configuration; the outbox runs against the local
fake of Slack's Web API and a real SMTP server (aiosmtpd), on SQLite and PostgreSQL, with the
store's and the outbox's clock moved by hand."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodbot.bot.config import Config, ConfigError, load_config
from nodbot.bot.email.channel import EmailChannel
from nodbot.bot.outbox import Dispatcher
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.slack.channel import SlackChannel
from nodbot.core import Decision, SqlApprovalStore, ToolCall, ToolRegistry
from tests.bot.test_email_outbound import MailServer, Received, mail_server
from tests.core.store.conftest import database_url
from tests.fakes.slack import Message, SlackFake, User, slack_fake

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
WEB_SECRET = "web-secret-for-reminder-tests-01"
HOUR = 3600.0

tools = ToolRegistry()


@tools.tool(confirm=True, effects="write")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


CONFIG = """
store: {{url: "{url}"}}
web: {{secret: {secret}}}
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
rules:
  - tool: refund
    reviewers: [{ana}, {bo}, carl@example.com]
    post_to: [dm]
    approvals_required: 2
    timeout: 10h
    remind_every: 1h
    remind_limit: 3
{extra}"""


class Clock:
    """The bot's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class World:
    """A fake Slack workspace (ana and bo; carl has email only), a mail server, one database."""

    slack: SlackFake
    mail: MailServer
    ana: User
    bo: User
    url: str
    config: Config
    clock: Clock


@dataclass
class Replica:
    """One bot process's outbox: its store, its channels, its dispatcher."""

    store: SqlApprovalStore
    dispatcher: Dispatcher

    async def step(self) -> None:
        await self.dispatcher.step()


@contextlib.asynccontextmanager
async def world(backend: str, tmp_path: Path, extra: str = "") -> AsyncIterator[World]:
    """The world; `extra`: more keys of the rule (YAML lines), `{ana}` and `{bo}` in them
    standing for their Slack ids."""
    async with database_url(backend, tmp_path) as url, slack_fake() as slack, mail_server() as mail:
        ana = slack.add_user("ana", email="ana@example.com")
        bo = slack.add_user("bo", email="bo@example.com")
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                url=url,
                secret=WEB_SECRET,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                port=mail.port,
                ana=ana.id,
                bo=bo.id,
                extra=extra.format(ana=ana.id, bo=bo.id),
            )
        )
        yield World(slack, mail, ana, bo, url, load_config(str(path)), Clock())


@contextlib.asynccontextmanager
async def replica(world: World, worker: str) -> AsyncIterator[Replica]:
    config, clock = world.config, world.clock
    assert config.slack is not None and config.email is not None
    async with SqlApprovalStore(world.url, clock=clock) as store:
        channels = [
            SlackChannel(config.slack, store, tools, clock=clock),
            EmailChannel(config.email, store, secret=WEB_SECRET, clock=clock),
        ]
        dispatcher = Dispatcher(store, channels, worker=worker, clock=clock)
        try:
            yield Replica(store, dispatcher)
        finally:
            await dispatcher.close()


async def open_review(world: World, bot: Replica) -> str:
    executor = rules_executor(tools, world.config, bot.store, clock=world.clock)
    call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": 250.0}, id="call_1")
    paused = await executor.run_call(call, executor.context("run_1", requested_by="dan"))
    assert paused.error is not None and paused.error.kind == "approval-pending"
    approval_id: str = paused.error.details["approval_id"]
    return approval_id


def posts(world: World, user: User) -> list[Message]:
    """The review messages in `user`'s DM (not in a thread)."""
    return [m for m in world.slack.messages(user) if m.thread_ts is None]


def reminders(world: World, user: User) -> list[Message]:
    """The replies in the thread of the review's message in `user`'s DM."""
    [post] = posts(world, user)
    return [m for m in world.slack.messages(user) if m.thread_ts == post.ts]


def emails_to(world: World, address: str) -> list[Received]:
    return [r for r in world.mail.received if r.recipients == [address]]


def counts(world: World) -> tuple[int, int, int]:
    """How many reminders ana (Slack), bo (Slack) and carl (email) have had."""
    return (
        len(reminders(world, world.ana)),
        len(reminders(world, world.bo)),
        len(email_reminders(world, "carl@example.com")),
    )


def email_reminders(world: World, address: str) -> list[Received]:
    return [
        r for r in emails_to(world, address) if str(r.message["Subject"]).startswith("Reminder")
    ]


async def at(world: World, hours: float, *bots: Replica) -> None:
    """Move the clock to `hours` after the review opened (09:00), and step every replica."""
    world.clock.now = datetime(2026, 11, 30, 9, 0, tzinfo=UTC) + timedelta(hours=hours)
    await asyncio.gather(*(bot.step() for bot in bots))


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_reviewers_who_have_not_voted_are_reminded_each_step_up_to_the_limit(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 0, bot)
        assert len(posts(w, w.ana)) == len(posts(w, w.bo)) == 1
        [request] = emails_to(w, "carl@example.com")
        assert counts(w) == (0, 0, 0)

        await at(w, 0.99, bot)
        assert counts(w) == (0, 0, 0)  # not yet

        await at(w, 1, bot)
        assert counts(w) == (1, 1, 1)
        [to_ana] = reminders(w, w.ana)
        assert f"<@{w.ana.id}>" in to_ana.text and "Reminder 1 of 3" in to_ana.text
        assert f"<@{w.bo.id}>" in reminders(w, w.bo)[0].text
        [reminder_email] = email_reminders(w, "carl@example.com")
        reminder = reminder_email.message
        assert reminder["In-Reply-To"] == request.message["Message-ID"]
        assert reminder["References"] == request.message["Message-ID"]
        assert reminder["Reply-To"] == request.message["Reply-To"]  # replying still decides
        assert reminder["Message-ID"] != request.message["Message-ID"]
        assert str(reminder["Subject"]).startswith("Reminder: ")
        assert "Reminder 1 of 3" in str(reminder.get_content())

        # bo approves (two approvals are needed): he is not reminded again.
        await bot.store.vote(
            approval_id,
            Decision(approved=True, decided_by=w.bo.id),
            channel="slack",
            person="email:bo@example.com",
        )
        await at(w, 2, bot)
        assert counts(w) == (2, 1, 2)
        await at(w, 3, bot)
        assert counts(w) == (3, 1, 3)
        assert "Reminder 3 of 3" in reminders(w, w.ana)[-1].text
        await at(w, 9.5, bot)
        assert counts(w) == (3, 1, 3)  # the limit

        sent = [
            (d.target, d.status)
            for d in await bot.store.deliveries(approval_id)
            if d.kind == "reminder"
        ]
        assert sorted(sent) == sorted(
            (f"{channel}:reminder:{k}", "sent") for channel in ("slack", "email") for k in (1, 2, 3)
        )
        events = [
            e.detail["target"]
            for e in await bot.store.events(approval_id)
            if e.kind == "delivered" and e.detail.get("kind") == "reminder"
        ]
        assert sorted(events) == sorted(target for target, _ in sent)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_no_reminder_follows_the_decision(backend: str, tmp_path: Path) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 1, bot)
        assert counts(w) == (1, 1, 1)
        # carl denies by email: a deny decides at once.
        await bot.store.vote(
            approval_id,
            Decision(approved=False, decided_by="carl@example.com", reason="no"),
            channel="email",
            person="email:carl@example.com",
        )
        for hours in (1.5, 2, 3, 4):
            await at(w, hours, bot)
        assert counts(w) == (1, 1, 1)
        later = [
            d
            for d in await bot.store.deliveries(approval_id)
            if d.kind == "reminder" and not d.target.endswith(":1")
        ]
        assert len(later) == 4
        assert {d.status for d in later} == {"sent"}  # settled, nothing posted
        assert all(str((d.ref or {}).get("skipped", "")).startswith("decided") for d in later)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_reminder_due_while_the_bot_is_stopped_is_sent_once_after_the_restart(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w:
        async with replica(w, "before") as bot:
            await open_review(w, bot)
            await at(w, 0, bot)
        # Stopped through reminder 1's time: the next process sends it, once.
        w.clock.advance(1.5 * HOUR)
        async with replica(w, "after") as bot:
            await at(w, 1.5, bot)
            assert counts(w) == (1, 1, 1)
            await at(w, 1.6, bot)
            assert counts(w) == (1, 1, 1)
        # Stopped through reminders 2 and 3: only the later one is sent, not two at once.
        async with replica(w, "again") as bot:
            await at(w, 3.5, bot)
            assert counts(w) == (2, 2, 2)
            assert "Reminder 3 of 3" in reminders(w, w.ana)[-1].text
            await at(w, 9, bot)
            assert counts(w) == (2, 2, 2)


@pytest.mark.postgres
async def test_two_replicas_send_each_reminder_once(tmp_path: Path) -> None:
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
        assert counts(w) == (3, 3, 3)
        assert len(posts(w, w.ana)) == len(posts(w, w.bo)) == 1


# --- the rule's keys ------------------------------------------------------------------------

RULE = """
rules:
  - tool: refund
    reviewers: [ana@example.com]
{keys}
"""


def load(tmp_path: Path, keys: str) -> Config:
    path = tmp_path / "nodbot.yml"
    path.write_text(RULE.format(keys=textwrap.indent(textwrap.dedent(keys), "    ")))
    return load_config(str(path))


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ("remind_every: 1m", "remind_every: must be at least 5m"),
        ("remind_every: often", "remind_every: expected a duration"),
        ("remind_every: 1h\nremind_limit: 0", "remind_limit"),
        ("remind_every: 1h\nremind_limit: 11", "remind_limit"),
        ("remind_every: 1h\nremind_limit: true", "remind_limit"),
        ("remind_limit: 2", "remind_limit: has no effect without remind_every"),
        ("remind_every: 2h\ntimeout: 2h", "remind_every: must be shorter than timeout"),
    ],
)
def test_reminder_keys_are_checked(tmp_path: Path, keys: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, keys)
    assert said in str(caught.value)


def test_a_rule_that_decides_by_itself_has_no_reminders(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text("rules:\n  - tool: refund\n    decision: approve\n    remind_every: 1h\n")
    with pytest.raises(ConfigError, match="remind_every: not allowed with decision"):
        load_config(str(path))


def test_remind_limit_defaults_to_three(tmp_path: Path) -> None:
    [rule] = load(tmp_path, "remind_every: 2h").rules
    assert (rule.remind_every, rule.remind_limit) == (7200, 3)
