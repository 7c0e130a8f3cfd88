"""Escalation and reminders go to the delegate while a delegation lasts: by email, the delegate
of a reviewer who is reminded (or escalated to) gets the review's request, named "for" the
delegator, with a reply address of their own, so that their reply decides ("bob for ana").
Who the delegates are is read when the reminder or the escalation is sent, not when the review
opened; each delegate's message is sent once across retries and restarts (the delivery's
progress keeps each address); a delegation store that cannot be read reminds the reviewers as
before.

The review opens through the rules of a real configuration; the outbox runs against a real
SMTP server (aiosmtpd) on SQLite, with the store's and the outbox's clock moved by hand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodbot.bot.config import Config, load_config
from nodbot.bot.email.channel import EmailChannel
from nodbot.bot.email.inbound import Inbound
from nodbot.bot.outbox import Dispatcher
from nodbot.bot.policy.authorize import Authorizer
from nodbot.bot.policy.delegation import Delegations
from nodbot.bot.policy.people import People
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.slack.channel import SlackChannel
from nodbot.core import Decision, SqlApprovalStore, StoreError, ToolCall
from nodbot.core.delegations import Delegation
from tests.bot import test_reminders as reminding
from tests.bot.test_email_inbound import TRUSTED, reply
from tests.bot.test_email_outbound import MailServer, Received, mail_server
from tests.core.store.conftest import database_url

WEB_SECRET = "web-secret-for-delegation-tests-1"
OPENED = datetime.now(UTC).replace(microsecond=0)
"""When the review opens: now, since the inbound side checks reply tokens against the real
time."""

tools = reminding.tools  # the refund of the reminders' tests


CONFIG = """
store: {{url: "{url}"}}
web: {{secret: {secret}}}
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
  trusted_authserv_id: {trusted}
rules:
  - tool: refund
    reviewers: [ana@example.com]
    timeout: 10h
    remind_every: 1h
    remind_limit: 3
    escalate_after: 5h
    escalate_to: [carl@example.com]
"""


class Clock:
    def __init__(self) -> None:
        self.now = OPENED

    def __call__(self) -> datetime:
        return self.now


class Unreadable:
    """A fault injector, not a fake: a delegation store whose database cannot be read."""

    async def live(self, at: datetime) -> Sequence[Delegation]:
        raise StoreError("the database is down", url="sqlite:///gone.db")


@dataclass
class Bot:
    store: SqlApprovalStore
    dispatcher: Dispatcher
    delegations: Delegations
    mail: MailServer
    config: Config
    clock: Clock

    async def at(self, hours: float) -> None:
        """Move the clock to `hours` after the review opened, and step the outbox."""
        self.clock.now = OPENED + timedelta(hours=hours)
        await self.dispatcher.step()

    async def delegate(self, frm: str, to: str, *, hours: float = 48) -> Delegation:
        return await self.store.delegations.add(
            delegator=frm, delegate=to, since=self.clock.now, until=OPENED + timedelta(hours=hours)
        )

    def to(self, address: str) -> list[Received]:
        return [r for r in self.mail.received if r.recipients == [address]]


@contextlib.asynccontextmanager
async def bots(tmp_path: Path) -> AsyncIterator[tuple[str, Config, MailServer]]:
    async with database_url("sqlite", tmp_path) as url, mail_server() as mail:
        path = tmp_path / "nodbot.yml"
        path.write_text(CONFIG.format(url=url, secret=WEB_SECRET, port=mail.port, trusted=TRUSTED))
        yield url, load_config(str(path)), mail


@contextlib.asynccontextmanager
async def bot(
    url: str, config: Config, mail: MailServer, clock: Clock, *, unreadable: bool = False
) -> AsyncIterator[Bot]:
    assert config.email is not None
    async with SqlApprovalStore(url, clock=clock) as store:
        people = People(config.people)
        stored = Unreadable() if unreadable else store.delegations
        delegations = Delegations(people, stored=stored, clock=clock)  # type: ignore[arg-type]
        channel = EmailChannel(
            config.email, store, secret=WEB_SECRET, clock=clock, delegations=delegations
        )
        dispatcher = Dispatcher(store, [channel], worker="w1", clock=clock)
        try:
            yield Bot(store, dispatcher, delegations, mail, config, clock)
        finally:
            await dispatcher.close()


async def open_review(b: Bot) -> str:
    executor = rules_executor(tools, b.config, b.store, clock=b.clock)
    call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": 250.0}, id="call_1")
    paused = await executor.run_call(call, executor.context("run_1", requested_by="dan"))
    assert paused.error is not None and paused.error.kind == "approval-pending"
    approval_id: str = paused.error.details["approval_id"]
    return approval_id


def for_ana(received: Received) -> bool:
    text = str(received.message.get_body(("plain",)).get_content())  # type: ignore[union-attr]
    return "for ana@example.com" in text and "for ana@example.com" in str(
        received.message["Subject"]
    )


async def test_a_reminder_reaches_the_delegate_once_and_their_reply_decides_for_ana(
    tmp_path: Path,
) -> None:
    clock = Clock()
    async with bots(tmp_path) as (url, config, mail):
        async with bot(url, config, mail, clock) as b:
            approval_id = await open_review(b)
            await b.at(0)
            assert len(b.to("ana@example.com")) == 1
            # Delegated after the review opened: the next reminder counts it.
            await b.at(0.5)
            await b.delegate("ana@example.com", "bob@example.com")
            assert b.to("bob@example.com") == []
            await b.at(1)
            assert len(b.to("ana@example.com")) == 2  # her request, her reminder
            [to_bob] = b.to("bob@example.com")
            assert for_ana(to_bob)
            assert to_bob.message["Reply-To"] != b.to("ana@example.com")[0].message["Reply-To"]
            await b.at(1.2)
            assert len(b.to("bob@example.com")) == 1  # once
        # A restart through the same step sends nothing again.
        async with bot(url, config, mail, clock) as b:
            await b.at(1.5)
            assert len(b.to("bob@example.com")) == 1
            # bob decides by replying to what he got.
            authorizer = Authorizer(
                People(config.people),
                delegations=b.delegations,
                events=b.store.events,
                clock=clock,
            )
            assert config.email is not None
            inbound = Inbound(config.email, b.store, tools, secret=WEB_SECRET, authorize=authorizer)
            outcome = await inbound.ingest(
                reply(b.to("bob@example.com")[0].message, sender="bob@example.com")
            )
            assert outcome.status == "decided", outcome
            record = await b.store.get(approval_id)
            assert record.decision is not None and record.decision.approved
            [decided] = [e for e in await b.store.events(approval_id) if e.kind == "decided"]
            assert decided.actor == "bob@example.com"
            assert decided.detail["evidence"]["for"] == "ana@example.com"  # "bob for ana"


async def test_an_ended_delegation_gets_nothing_more(tmp_path: Path) -> None:
    clock = Clock()
    async with bots(tmp_path) as (url, config, mail), bot(url, config, mail, clock) as b:
        await open_review(b)
        await b.at(0)
        handed = await b.delegate("ana@example.com", "bob@example.com")
        await b.at(1)
        assert len(b.to("bob@example.com")) == 1
        await b.store.delegations.end(handed.delegation_id)
        await b.at(2)
        await b.at(3)
        assert len(b.to("ana@example.com")) == 4  # request and three reminders
        assert len(b.to("bob@example.com")) == 1


async def test_an_escalation_reaches_the_delegate_of_whom_it_escalates_to(
    tmp_path: Path,
) -> None:
    clock = Clock()
    async with bots(tmp_path) as (url, config, mail), bot(url, config, mail, clock) as b:
        await open_review(b)
        await b.at(4)
        await b.delegate("carl@example.com", "dora@example.com")
        await b.at(5)
        [escalated] = b.to("carl@example.com")
        assert str(escalated.message["Subject"]).startswith("Escalated")
        [to_dora] = b.to("dora@example.com")
        assert str(to_dora.message["Subject"]).startswith("Escalated")
        text = str(to_dora.message.get_body(("plain",)).get_content())  # type: ignore[union-attr]
        assert "for carl@example.com" in text
        await b.at(5.2)
        assert len(b.to("dora@example.com")) == 1


async def test_an_unreadable_delegation_store_still_reminds_ana(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with bots(tmp_path) as (url, config, mail):
        async with bot(url, config, mail, clock) as b:
            await open_review(b)
            await b.at(0)
            await b.delegate("ana@example.com", "bob@example.com")
        async with bot(url, config, mail, clock, unreadable=True) as b:
            await b.at(1)
            assert len(b.to("ana@example.com")) == 2  # her request, her reminder
            assert b.to("bob@example.com") == []
            assert "delegat" in caplog.text and "could not" in caplog.text


# --- Slack ----------------------------------------------------------------------------------
#
# The world of tests/bot/test_reminders.py (ana and bo on Slack, carl by email; two approvals
# needed), with bob, to whom ana hands her reviews.


@contextlib.asynccontextmanager
async def slack_replica(w: reminding.World, worker: str) -> AsyncIterator[reminding.Replica]:
    config, clock = w.config, w.clock
    assert config.slack is not None and config.email is not None
    async with SqlApprovalStore(w.url, clock=clock) as store:
        slack = SlackChannel(config.slack, store, reminding.tools, clock=clock)
        people = People(config.people, directory=slack.directory)
        delegations = Delegations(people, stored=store.delegations, clock=clock)
        slack.delegations = delegations
        email = EmailChannel(
            config.email, store, secret=reminding.WEB_SECRET, clock=clock, delegations=delegations
        )
        channels = [slack, email]
        dispatcher = Dispatcher(store, channels, worker=worker, clock=clock)
        try:
            yield reminding.Replica(store, dispatcher)
        finally:
            await dispatcher.close()


async def test_on_slack_a_reminder_reaches_the_delegate_by_dm_once_until_it_ends(
    tmp_path: Path,
) -> None:
    async with reminding.world("sqlite", tmp_path) as w:
        bob = w.slack.add_user("bob", email="bob@example.com")
        async with slack_replica(w, "one") as b:
            approval_id = await reminding.open_review(w, b)
            await reminding.at(w, 0, b)
            assert w.slack.messages(bob) == []
            # Delegated after the review opened: the next reminder counts it.
            handed = await b.store.delegations.add(
                delegator="ana@example.com",
                delegate="bob@example.com",
                since=w.clock.now,
                until=w.clock.now + timedelta(days=2),
            )
            await reminding.at(w, 1, b)
            [to_bob] = w.slack.messages(bob)
            assert f"For <@{w.ana.id}>" in to_bob.text
            assert any(block.get("type") == "actions" for block in to_bob.blocks)  # buttons
            assert reminding.counts(w) == (1, 1, 1)  # ana and bo still reminded
            await reminding.at(w, 1.5, b)
        async with slack_replica(w, "two") as b:  # a restart sends nothing again
            await reminding.at(w, 1.6, b)
            assert len(w.slack.messages(bob)) == 1
            await b.store.delegations.end(handed.delegation_id)
            await reminding.at(w, 2, b)
            assert len(w.slack.messages(bob)) == 1  # ended: nothing more
            assert reminding.counts(w) == (2, 2, 2)
            # Decided: bob's message is updated with the others (its buttons gone).
            for voter, person in ((w.ana.id, "email:ana@example.com"), ("carl@example.com", None)):
                await b.store.vote(
                    approval_id,
                    Decision(approved=True, decided_by=voter),
                    channel="slack",
                    person=person or f"email:{voter}",
                )
            await reminding.at(w, 2.1, b)
            [updated] = w.slack.messages(bob)
            assert not any(block.get("type") == "actions" for block in updated.blocks)


async def test_on_slack_an_escalation_reaches_the_delegate_of_whom_it_escalates_to(
    tmp_path: Path,
) -> None:
    escalation = "    escalate_after: 4h\n    escalate_to: [cy@example.com]\n"
    async with reminding.world("sqlite", tmp_path, escalation) as w:
        cy = w.slack.add_user("cy", email="cy@example.com")
        bob = w.slack.add_user("bob", email="bob@example.com")
        async with slack_replica(w, "one") as b:
            await reminding.open_review(w, b)
            await reminding.at(w, 3.5, b)
            assert w.slack.messages(bob) == []
            await b.store.delegations.add(
                delegator="cy@example.com",
                delegate="bob@example.com",
                since=w.clock.now,
                until=w.clock.now + timedelta(days=2),
            )
            await reminding.at(w, 4, b)  # the escalation to cy: bob, who decides for cy, too
            assert len(w.slack.messages(cy)) == 1
            [to_bob] = w.slack.messages(bob)
            assert f"For <@{cy.id}>" in to_bob.text
            assert any(block.get("type") == "actions" for block in to_bob.blocks)
        async with slack_replica(w, "two") as b:  # a restart sends it not again
            await reminding.at(w, 4.2, b)
            assert len(w.slack.messages(bob)) == 1


@pytest.mark.postgres
async def test_two_replicas_send_each_delegate_one_message_per_step(tmp_path: Path) -> None:
    async with reminding.world("postgresql", tmp_path) as w:
        bob = w.slack.add_user("bob", email="bob@example.com")
        async with slack_replica(w, "one") as first, slack_replica(w, "two") as second:
            await reminding.open_review(w, first)
            for frm, to in (
                ("ana@example.com", "bob@example.com"),
                ("carl@example.com", "dora@example.com"),
            ):
                await first.store.delegations.add(
                    delegator=frm,
                    delegate=to,
                    since=w.clock.now,
                    until=w.clock.now + timedelta(days=2),
                )
            for hours in (0, 0.5, 1, 1.5, 2, 2.5, 3, 4, 6):
                # Both step side by side at each moment, twice: each step is sent by one.
                await reminding.at(w, hours, first, second)
                await reminding.at(w, hours, second, first)
            assert reminding.counts(w) == (3, 3, 3)
            assert len(w.slack.messages(bob)) == 3  # one per step
            to_dora = [r for r in w.mail.received if r.recipients == ["dora@example.com"]]
            assert len(to_dora) == 3
            assert all("for carl@example.com" in str(r.message["Subject"]) for r in to_dora)
