"""Reminders and escalations in Microsoft Teams: a rule's `remind_every` makes a reply under
each card posted for the review, naming the reviewers who have not voted (by their handles,
escaped), at most `remind_limit` times, never after the decision; its `escalate_to` makes one
reply at `escalate_at` saying who may now decide too. Each is outbox work: one delivery,
claimed, sent once across restarts and replicas; a reply kept as soon as the connector
answers is not posted again when another conversation's fails.

The review opens through the rules of a real configuration; the outbox runs against the local
fake of the Bot Framework over HTTP (tests/fakes/botframework.py), on SQLite and PostgreSQL,
with the store's and the outbox's clock moved by hand."""

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
from nodbot.bot.outbox import Dispatcher
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.teams.cards import MAX_NAMED, escalation_card, reminder_card
from nodbot.bot.teams.channel import TeamsChannel
from nodbot.core import (
    ApprovalRecord,
    ApprovalRequest,
    Decision,
    SqlApprovalStore,
    ToolCall,
    ToolRegistry,
    arguments_digest,
)
from nodbot.core.questions import make_question, question_request
from tests.core.store.conftest import database_url
from tests.fakes.botframework import BotFrameworkFake, Posted, botframework_fake

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
APP_ID = "00000000-0000-4000-8000-00000000b07a"
PASSWORD = "password-of-the-teams-reminder-bot-1"
OPS, LEADS = "19:ops@thread.tacv2", "19:leads@thread.tacv2"
OPENED = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

tools = ToolRegistry()


@tools.tool(confirm=True, effects="write")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


CONFIG = """
store: {{url: "{url}"}}
teams:
  app_id: {app_id}
  app_password: {password}
  openid_url: {openid_url}
  token_url: {token_url}
  post_to:
    - {{name: ops, conversation: "{ops}", service_url: "{ops_url}"}}
    - {{name: leads, conversation: "{leads}", service_url: "{leads_url}"}}
rules:
  - tool: refund
    reviewers: [ana@example.com, bo@example.com, carl_ops@example.com]
    approvals_required: 2
    timeout: 10h
    remind_every: 1h
    remind_limit: 3
    escalate_after: 150m
    escalate_to: [lead*s@example.com]
"""


class Clock:
    """The bot's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = OPENED

    def __call__(self) -> datetime:
        return self.now


@dataclass
class World:
    """The Bot Framework fake, one database, the configuration and the clock."""

    bf: BotFrameworkFake
    url: str
    config: Config
    clock: Clock
    tmp_path: Path

    def reconfigured(self, name: str, *, ops_url: str) -> Config:
        """The configuration with conversation `ops` served from `ops_url`."""
        return _config(self.tmp_path, name, self.url, self.bf, ops_url=ops_url)


def _config(tmp_path: Path, name: str, url: str, bf: BotFrameworkFake, *, ops_url: str) -> Config:
    path = tmp_path / f"{name}.yml"
    path.write_text(
        CONFIG.format(
            url=url,
            app_id=APP_ID,
            password=PASSWORD,
            openid_url=bf.openid_url,
            token_url=bf.token_url,
            ops=OPS,
            leads=LEADS,
            ops_url=ops_url,
            leads_url=bf.service_url,
        )
    )
    return load_config(str(path))


@dataclass
class Replica:
    """One bot process's outbox: its store and its dispatcher (Teams only)."""

    store: SqlApprovalStore
    dispatcher: Dispatcher

    async def step(self) -> None:
        await self.dispatcher.step()


@contextlib.asynccontextmanager
async def world(backend: str, tmp_path: Path) -> AsyncIterator[World]:
    async with (
        database_url(backend, tmp_path) as url,
        botframework_fake(app_id=APP_ID, password=PASSWORD) as bf,
    ):
        config = _config(tmp_path, "nodbot", url, bf, ops_url=bf.service_url)
        yield World(bf, url, config, Clock(), tmp_path)


@contextlib.asynccontextmanager
async def replica(w: World, worker: str, config: Config | None = None) -> AsyncIterator[Replica]:
    found = config or w.config
    assert found.teams is not None
    async with (
        SqlApprovalStore(w.url, clock=w.clock) as store,
        aiohttp.ClientSession() as session,
    ):
        channel = TeamsChannel(found.teams, store, tools, session=session, clock=w.clock)
        dispatcher = Dispatcher(store, [channel], worker=worker, clock=w.clock)
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
    """Move the clock to `hours` after the review opened, and step every replica."""
    w.clock.now = OPENED + timedelta(hours=hours)
    await asyncio.gather(*(bot.step() for bot in bots))


def card(w: World, conversation: str) -> Posted:
    """The review's one card in `conversation`."""
    [posted] = w.bf.cards(conversation)
    return posted


def said(posted: Posted) -> str:
    """What a reply's card says, its text blocks joined."""
    body = posted.card["body"]
    return " ".join(str(block["text"]) for block in body if block.get("type") == "TextBlock")


def reminders(w: World, conversation: str) -> list[str]:
    return [said(r) for r in w.bf.replies_to(card(w, conversation)) if "Reminder" in said(r)]


def escalations(w: World, conversation: str) -> list[str]:
    return [said(r) for r in w.bf.replies_to(card(w, conversation)) if "Escalated" in said(r)]


def counts(w: World) -> tuple[int, int, int, int]:
    """Reminders and escalations under the cards of ops and of leads."""
    return (
        len(reminders(w, OPS)),
        len(escalations(w, OPS)),
        len(reminders(w, LEADS)),
        len(escalations(w, LEADS)),
    )


async def approve(bot: Replica, approval_id: str, address: str) -> None:
    await bot.store.vote(
        approval_id,
        Decision(approved=True, decided_by=address),
        channel="teams",
        person=f"email:{address}",
    )


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_each_step_replies_under_every_card_naming_who_has_not_voted(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 0, bot)
        ops, leads = card(w, OPS), card(w, LEADS)
        assert counts(w) == (0, 0, 0, 0)
        await at(w, 0.99, bot)
        assert counts(w) == (0, 0, 0, 0)  # not yet

        await at(w, 1, bot)
        assert counts(w) == (1, 0, 1, 0)
        for posted in (ops, leads):
            [reply] = w.bf.replies_to(posted)
            # A reply under the card, as Teams threads it, with no action of its own.
            assert reply.activity["replyToId"] == posted.id
            assert reply.activity["type"] == "message"
            assert reply.card["actions"] == [] and "refresh" not in reply.card
        first = reminders(w, OPS)[0]
        assert "Reminder 1 of 3" in first and "review of refund" in first
        assert "2 more approvals are needed" in first
        assert "Decide by 2026-11-30 19:00 UTC (then: deny)" in first
        # Named by their handles, escaped as card text: no @mention, no formatting.
        assert "Not voted yet: ana@example.com, bo@example.com, carl\\_ops@example.com." in first
        assert "<at>" not in first and "lead" not in first  # not escalated yet

        await approve(bot, approval_id, "bo@example.com")
        await at(w, 2, bot)
        assert counts(w) == (2, 0, 2, 0)
        second = reminders(w, LEADS)[1]
        assert "Reminder 2 of 3" in second and "1 more approval is needed" in second
        assert "Not voted yet: ana@example.com, carl\\_ops@example.com." in second

        await at(w, 2.5, bot)
        assert counts(w) == (2, 1, 2, 1)
        [escalated] = escalations(w, OPS)
        assert "Now lead\\*s@example.com may decide it too." in escalated
        assert "1 more approval is needed" in escalated

        await at(w, 3, bot)
        assert counts(w) == (3, 1, 3, 1)
        third = reminders(w, OPS)[2]
        assert "Reminder 3 of 3" in third
        assert "ana@example.com, carl\\_ops@example.com, lead\\*s@example.com." in third
        await at(w, 9.5, bot)
        assert counts(w) == (3, 1, 3, 1)  # the limit

        made = {d.target: d for d in await bot.store.deliveries(approval_id)}
        later = [f"teams:reminder:{k}" for k in (1, 2, 3)]
        assert all(made[target].status == "sent" for target in [*later, "teams:cards"])
        assert made["teams:cards"].kind == "escalation"
        for target in later:
            replies = (made[target].ref or {})["replies"]
            assert {(r["conversation"], r["card"]) for r in replies} == {
                (OPS, ops.id),
                (LEADS, leads.id),
            }
        events = [
            (e.detail["kind"], e.detail["target"])
            for e in await bot.store.events(approval_id)
            if e.kind == "delivered" and e.detail.get("kind") in ("reminder", "escalation")
        ]
        assert sorted(events) == sorted(
            [("escalation", "teams:cards"), *(("reminder", target) for target in later)]
        )
        # Still one card per conversation: every reminder is a reply, not a card.
        assert len(w.bf.cards(OPS)) == len(w.bf.cards(LEADS)) == 1


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_nothing_is_posted_after_the_decision(backend: str, tmp_path: Path) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 1, bot)
        assert counts(w) == (1, 0, 1, 0)
        await bot.store.vote(
            approval_id,
            Decision(approved=False, decided_by="carl_ops@example.com", reason="no"),
            channel="teams",
            person="email:carl_ops@example.com",
        )
        for hours in (1.5, 2, 2.5, 3, 4):
            await at(w, hours, bot)
        assert counts(w) == (1, 0, 1, 0)
        later = [
            d
            for d in await bot.store.deliveries(approval_id)
            if d.kind in ("reminder", "escalation") and not d.target.endswith(":1")
        ]
        assert sorted(d.target for d in later) == [
            "teams:cards",
            "teams:reminder:2",
            "teams:reminder:3",
        ]
        assert {d.status for d in later} == {"sent"}  # settled, nothing posted
        assert all(str((d.ref or {}).get("skipped", "")).startswith("decided") for d in later)
        # The cards themselves say the outcome.
        assert card(w, OPS).card["actions"] == [] and card(w, LEADS).card["actions"] == []


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_escalation_and_reminders_are_posted_once_across_restarts(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w:
        async with replica(w, "before") as bot:
            await open_review(w, bot)
            await at(w, 0, bot)
        # Stopped through reminders 1 and 2 and the escalation: the next process sends the
        # escalation and the later reminder, once each.
        async with replica(w, "after") as bot:
            await at(w, 2.75, bot)
            assert counts(w) == (1, 1, 1, 1)
            assert "Reminder 2 of 3" in reminders(w, OPS)[0]
            await at(w, 2.8, bot)
            assert counts(w) == (1, 1, 1, 1)
        async with replica(w, "again") as bot:
            await at(w, 2.9, bot)
            assert counts(w) == (1, 1, 1, 1)
            await at(w, 3, bot)
            assert counts(w) == (2, 1, 2, 1)
            await at(w, 9, bot)
            assert counts(w) == (2, 1, 2, 1)


@pytest.mark.postgres
async def test_two_replicas_post_each_step_and_the_escalation_once(tmp_path: Path) -> None:
    async with (
        world("postgresql", tmp_path) as w,
        replica(w, "one") as first,
        replica(w, "two") as second,
    ):
        await open_review(w, first)
        for hours in (0, 0.5, 1, 1.5, 2, 2.5, 3, 4, 6):
            await at(w, hours, first, second)
            await at(w, hours, second, first)
        assert counts(w) == (3, 1, 3, 1)
        assert len(w.bf.cards(OPS)) == len(w.bf.cards(LEADS)) == 1


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_reply_kept_is_not_posted_again_when_another_fails(
    backend: str, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w, replica(w, "w1") as bot:
        approval_id = await open_review(w, bot)
        await at(w, 0, bot)
        # The first reply of reminder 1 is throttled; the other goes through and is kept.
        w.bf.failures.append((429, {"Retry-After": "2"}))
        await at(w, 1, bot)
        assert counts(w) in ((1, 0, 0, 0), (0, 0, 1, 0))
        [reminder] = [
            d for d in await bot.store.deliveries(approval_id) if d.target == "teams:reminder:1"
        ]
        assert reminder.status == "due" and reminder.attempts == 1
        assert len((reminder.ref or {})["replies"]) == 1  # kept as soon as Teams answered
        # Tried again after its Retry-After: the throttled one only.
        await at(w, 1 + 5 / 3600, bot)
        assert counts(w) == (1, 0, 1, 0)
        await at(w, 1.5, bot)
        assert counts(w) == (1, 0, 1, 0)
        [reminder] = [
            d for d in await bot.store.deliveries(approval_id) if d.target == "teams:reminder:1"
        ]
        assert reminder.status == "sent" and len((reminder.ref or {})["replies"]) == 2


async def test_a_reply_goes_through_the_connector_its_card_was_posted_through(
    tmp_path: Path,
) -> None:
    async with (
        world("sqlite", tmp_path) as w,
        botframework_fake(app_id=APP_ID, password=PASSWORD) as other,
    ):
        async with replica(w, "before") as bot:
            await open_review(w, bot)
            await at(w, 0, bot)
        # The conversation's service URL changed since its card was posted: the reply under
        # that card still goes to the connector that holds it, not to the new one.
        moved = w.reconfigured("moved", ops_url=other.service_url)
        async with replica(w, "after", moved) as bot:
            await at(w, 1, bot)
        assert counts(w) == (1, 0, 1, 0)
        assert other.replies == [] and other.attempts == 0


# --- the cards -------------------------------------------------------------------------------


def _texts(found: dict[str, object]) -> str:
    body = found["body"]
    assert isinstance(body, list)
    return " ".join(str(block["text"]) for block in body if block.get("type") == "TextBlock")


def test_a_questions_reminder_and_escalation_ask_for_its_answer() -> None:
    question = make_question("Ship today?", choices=["yes", "no"], asked_by="ship")
    request = question_request(question, run_id="run-1", call_id="call_1", requested_by="ship")
    record = ApprovalRecord(approval_id="apr-q1", request=request, created_at=OPENED)
    reminder = _texts(reminder_card(record, step=1, limit=2, waiting=["ana@x.io"], needed=1))
    assert "Reminder 1 of 2: this question is still waiting for an answer." in reminder
    assert "Not answered yet: ana@x.io." in reminder and "approval" not in reminder
    escalated = _texts(escalation_card(record, escalated_to=["lead@x.io"], needed=1))
    assert "Now lead@x.io may answer it too." in escalated and "approval" not in escalated


def test_what_a_reminder_names_is_escaped_and_bounded() -> None:
    arguments = {"order_id": "o-1"}
    request = ApprovalRequest("run_1", "call_1", "re*fund", arguments, arguments_digest(arguments))
    record = ApprovalRecord(approval_id="apr-1", request=request, created_at=OPENED)
    handles = ["[x](https://evil.example)@x.io", *(f"r{n}@x.io" for n in range(MAX_NAMED + 5))]
    shown = _texts(reminder_card(record, step=1, limit=1, waiting=handles, needed=3))
    assert "\\[x\\]\\(https://evil.example\\)@x.io" in shown and "](" not in shown
    assert "review of re\\*fund" in shown and "3 more approvals are needed" in shown
    assert f"r{MAX_NAMED - 2}@x.io, 6 more." in shown and f"r{MAX_NAMED - 1}@x.io" not in shown
