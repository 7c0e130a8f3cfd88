"""Each Slack post of a review happens once, however its delivery fails or the bot dies, and
every message that exists for a review is updated once it is decided.

The bot runs for real (in this process, or as `nodbot serve` killed with SIGKILL) against the
local fake of Slack's Web API, which fails, or holds back its answer, where a test says."""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

from nodbot.bot.policy.rules import rules_executor
from nodbot.core import Delivery, ToolCall
from tests.bot.processes import nodbot_serve
from tests.bot.test_slack import API, TOKEN, Bot, actions_of, slack_bot
from tests.fakes.slack import Message, User, slack_fake
from tests.support import eventually

LEAD_API = {"Authorization": "Bearer token-of-lead-000000"}


def top(bot: Bot, user: User) -> list[Message]:
    """The messages in the DM of `user` that are not in a thread."""
    return [m for m in bot.slack.messages(user) if m.thread_ts is None]


def thread(bot: Bot, user: User, message: Message) -> list[Message]:
    return [m for m in bot.slack.messages(user) if m.thread_ts == message.ts]


async def pause_with_long_arguments(bot: Bot) -> str:
    """A refund whose order id does not fit a message: the whole arguments go to the thread."""
    service = bot.served.service
    executor = rules_executor(service.agents["support"].tools, service.config, service.store)
    call = ToolCall(
        name="refund", arguments={"order_id": "A-" + "7" * 5000, "amount": 500}, id="c1"
    )
    paused = await executor.run_call(call, executor.context("run_long"))
    assert paused.error is not None
    service.decided()  # wake the workers, as a run of this bot would
    approval_id: str = paused.error.details["approval_id"]
    return approval_id


async def decide(bot: Bot, approval_id: str, action: str = "approve") -> None:
    answer = await bot.client.post(
        f"/approvals/{approval_id}/decide", json={"action": action}, headers=LEAD_API
    )
    assert answer.status_code == 200, answer.text


async def all_updated(bot: Bot, approval_id: str) -> list[Delivery]:
    """Once the review's outcome was announced and its deliveries are settled: every message
    in each reviewer's DM has lost its buttons."""
    store = bot.served.service.store

    async def outcome_settled() -> bool:
        found = await store.deliveries(approval_id)
        outcome = any(d.kind == "outcome" for d in found)
        return outcome and all(d.status != "due" for d in found)

    await eventually(outcome_settled, f"the outcome deliveries of {approval_id}")
    deliveries = await bot.settled(approval_id)
    for user in (bot.lead, bot.second):
        for message in top(bot, user):
            assert message.updates and actions_of(message) == [], (user.name, message.ts)
    return deliveries


async def answered(bot: Bot, approval_id: str) -> list[Delivery]:
    """The review's answer delivery, once it was made (the run finished) and is settled."""
    store = bot.served.service.store

    async def answers() -> list[Delivery]:
        return [d for d in await store.deliveries(approval_id) if d.kind == "answer"]

    async def check() -> bool:
        found = await answers()
        return bool(found) and all(d.status != "due" for d in found)

    await eventually(check, f"the answer of {approval_id}", within=20)
    return await answers()


def thread_posts(params: dict[str, object]) -> bool:
    return "thread_ts" in params


async def test_a_failing_thread_post_does_not_post_the_review_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch) as bot:
        # Two attempts fail at the thread post, after the review message was posted.
        bot.slack.fail("chat.postMessage", "internal_error", "internal_error", where=thread_posts)
        approval_id = await pause_with_long_arguments(bot)
        deliveries = await bot.settled(approval_id)
        assert {d.status for d in deliveries} == {"sent"}
        assert len(bot.slack.faults) == 2
        for user in (bot.lead, bot.second):
            [message] = top(bot, user)
            assert len(thread(bot, user, message)) == 1
        await decide(bot, approval_id)
        await all_updated(bot, approval_id)
        for user in (bot.lead, bot.second):
            assert len(top(bot, user)) == 1


async def test_a_message_whose_delivery_was_given_up_is_updated_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch) as bot:
        # The thread post fails for good (an answer trying again will not change).
        bot.slack.fail("chat.postMessage", "msg_too_long", where=thread_posts)
        approval_id = await pause_with_long_arguments(bot)
        deliveries = await bot.settled(approval_id)
        assert sorted(d.status for d in deliveries) == ["failed", "sent"]
        await decide(bot, approval_id)
        # The message of the failed delivery exists: it loses its buttons like the other.
        await all_updated(bot, approval_id)
        for user in (bot.lead, bot.second):
            assert len(top(bot, user)) == 1


async def test_a_failing_answer_reply_is_not_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch) as bot:
        approval_id = await bot.start()
        [first] = await bot.posted(bot.lead)
        [second] = await bot.posted(bot.second)
        # The answer goes to the lead's thread, then fails twice in the second reviewer's.
        bot.slack.fail(
            "chat.postMessage",
            "internal_error",
            "internal_error",
            where=lambda params: params.get("thread_ts") == second.ts,
        )
        await decide(bot, approval_id)
        [answer] = await answered(bot, approval_id)
        assert (answer.status, answer.attempts) == ("sent", 3)
        assert len(bot.slack.faults) == 2
        for user, message in ((bot.lead, first), (bot.second, second)):
            [reply] = thread(bot, user, message)
            assert reply.text.startswith("The run finished.")
        await all_updated(bot, approval_id)


async def test_a_thread_that_cannot_be_read_is_posted_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with slack_bot(tmp_path, monkeypatch) as bot:
        caplog.set_level(logging.WARNING, logger="nodbot.bot.slack.channel")
        bot.slack.fail("chat.postMessage", "internal_error", where=thread_posts)
        bot.slack.fail("conversations.replies", "missing_scope")  # no im:history granted
        approval_id = await pause_with_long_arguments(bot)
        deliveries = await bot.settled(approval_id)
        assert {d.status for d in deliveries} == {"sent"}
        assert bot.slack.calls_to("conversations.replies", ok=False)
        warned = [r.getMessage() for r in caplog.records if "missing_scope" in r.getMessage()]
        assert len(warned) == 1 and "im:history" in warned[0], warned
        for user in (bot.lead, bot.second):
            [message] = top(bot, user)  # the review is not posted again either way
            assert len(thread(bot, user, message)) == 1


CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1, lease: 1s}}
api:
  tokens:
    - {{name: api, token: {token}, scopes: [runs:write, runs:write-as, approvals:read]}}
    - {{name: {lead}, token: token-of-lead-000000, scopes: [approvals:read, approvals:decide]}}
agents:
  support: examples.support_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [{lead}]
"""


def lease_runs_out(db: Path) -> None:
    """What a minute does to the dead bot's claim of its deliveries: the dispatcher of
    `nodbot serve` holds them for 60 s, and no setting shortens that."""
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE deliveries SET lease_until = '2000-01-01 00:00:00.000000' "
            "WHERE status = 'due' AND claimed_by IS NOT NULL"
        )


async def test_a_post_slack_made_for_a_bot_killed_before_the_answer_is_not_made_again(
    tmp_path: Path,
) -> None:
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        path = tmp_path / "nodbot.yml"
        db = tmp_path / "nodbot.db"
        path.write_text(
            CONFIG.format(
                db=db,
                token=TOKEN,
                lead=lead.id,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
            )
        )
        # Slack posts the review, and the bot is killed before it hears the answer.
        slack.hold("chat.postMessage")
        async with nodbot_serve(path) as first:
            async with httpx.AsyncClient(base_url=first.url, headers=API) as client:
                body = {"agent": "support", "input": "Refund order A-1001"}
                run = (await client.post("/runs", json=body)).json()
            assert run["status"] == "waiting", run
            approval_id = run["pending"][0]["approval_id"]
            await slack.wait_until(lambda: bool(slack.held), 20, "the review's post")
            first.process.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(first.process.wait, 10) == -signal.SIGKILL
        slack.release()
        [posted] = slack.messages(lead)
        lease_runs_out(db)

        async with nodbot_serve(path) as second:
            async with httpx.AsyncClient(base_url=second.url, headers=LEAD_API) as client:
                answer = await client.post(
                    f"/approvals/{approval_id}/decide", json={"action": "approve"}
                )
                assert answer.status_code == 200, answer.text
            # The outcome waits for the review to be posted; then it updates its messages.
            await slack.wait_until(lambda: bool(posted.updates), 30, "the update")
        # The review is in the DM once: the message Slack made for the dead bot, updated.
        [message] = [m for m in slack.messages(lead) if m.thread_ts is None]
        assert message is posted and actions_of(message) == []
        assert slack.calls_to("conversations.history", ok=True)
