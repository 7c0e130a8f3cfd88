"""A `post_to` channel the bot has not been invited to: Slack answers `not_in_channel` (or
`channel_not_found` for a private channel, which it hides). The operator is told what to do,
the review is not lost, and it is posted once after the bot is invited: at once, when Slack
tells the bot it joined the channel (`member_joined_channel`), else by the outbox's retries;
a review decided meanwhile is given up there instead of retried for ever."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from nodbot.bot.cli.approvals import run_approvals_command
from nodbot.bot.serve import serving
from nodbot.core import Delivery
from nodbot.core.store import utc_now
from tests.bot.test_slack import CONFIG, ROOT, TOKEN, Bot, slack_bot
from tests.fakes.slack import slack_fake
from tests.support import eventually

FIXES = ("/invite @nodbot", "chat:write.public")


async def refused(bot: Bot, approval_id: str, error: str) -> str:
    """The error kept with the review's channel delivery once Slack refused its post."""
    store = bot.served.service.store
    await bot.slack.wait_until(
        lambda: any(c.error == error for c in bot.slack.calls_to("chat.postMessage")),
        10,
        f"a post refused with {error}",
    )

    async def kept() -> bool:
        found = await store.deliveries(approval_id)
        return any(d.error and error in d.error for d in found)

    await eventually(kept, f"the {error} kept with the delivery")
    [delivery] = [d for d in await store.deliveries(approval_id) if d.kind == "request"]
    assert delivery.status == "due" and delivery.error is not None  # to be tried again
    return delivery.error


@pytest.mark.parametrize(
    ("private", "error"), [(False, "not_in_channel"), (True, "channel_not_found")]
)
async def test_the_operator_is_told_and_the_review_is_posted_once_the_bot_is_invited(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    private: bool,
    error: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="nodbot.bot.slack.channel")
    async with slack_bot(tmp_path, monkeypatch, room=True, invited=False, private=private) as bot:
        assert bot.room is not None
        approval_id = await bot.start()
        kept = await refused(bot, approval_id, error)
        for text in (kept, *[r.getMessage() for r in caplog.records if error in r.getMessage()]):
            assert bot.room in text and all(fix in text for fix in FIXES), text
        assert any(r.levelno >= logging.WARNING and error in r.getMessage() for r in caplog.records)
        shown = await run_approvals_command(
            argparse.Namespace(
                config=str(tmp_path / "nodbot.yml"), action="show", approval_id=approval_id
            )
        )
        assert f"slack:channel:{bot.room}" in shown and "/invite @nodbot" in shown

        bot.slack.invite(bot.room)
        [message] = await bot.posted(bot.lead)  # by the next retry: within its backoff
        await bot.click(message, "nodbot.approve", bot.lead)
        decided = await bot.decided(approval_id)
        assert decided.status == "approved"
        await bot.updated(message)
        deliveries = await bot.settled(approval_id)
        assert {d.status for d in deliveries} == {"sent"}
        top = [m for m in bot.slack.messages(bot.room) if m.thread_ts is None]
        assert [m.ts for m in top] == [message.ts]  # posted once


async def test_a_review_decided_before_the_bot_is_invited_is_given_up_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch, room=True, invited=False) as bot:
        assert bot.room is not None
        approval_id = await bot.start()
        await refused(bot, approval_id, "not_in_channel")
        lead = {"Authorization": "Bearer token-of-lead-000000"}
        answer = await bot.client.post(
            f"/approvals/{approval_id}/decide", json={"action": "deny"}, headers=lead
        )
        assert answer.status_code == 200, answer.text
        deliveries = await bot.settled(approval_id)
        [request] = [d for d in deliveries if d.kind == "request"]
        assert request.status == "failed"
        assert request.error is not None and "decided before" in request.error
        assert bot.slack.messages(bot.room) == []


LONG_BACKOFF = 300.0
"""The outbox's first retry, in seconds (its most): no retry comes within a test."""


@contextlib.asynccontextmanager
async def uninvited_bot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, socket: bool, by_name: bool
) -> AsyncIterator[Bot]:
    """The bot posting reviews to a channel it is not in (`post_to` by id, or by #name),
    subscribed to Slack's events (over HTTP, or Socket Mode), its outbox retrying only after
    `LONG_BACKOFF`."""
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        second = slack.add_user("second", email="second@example.com")
        carol = slack.add_user("carol", email="carol@example.com")
        other = slack.add_user("other", email="other@example.com")
        room = slack.add_channel("refund-approvals", [lead, second, other], bot_member=False)
        path = tmp_path / "nodbot.yml"
        transport = f"signing_secret: {slack.signing_secret}"
        if socket:
            transport = f"mode: socket\n  app_token: {slack.app_token}"
        post_to = '"#refund-approvals"' if by_name else room.id
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                lead=lead.id,
                bot_token=slack.bot_token,
                transport=transport,
                api_url=slack.api_url,
                reviewers=f"{lead.id}, {second.id}",
                required=1,
                post_to=f"post_to: [{post_to}]",
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            served.service.dispatcher.min_backoff = LONG_BACKOFF
            bot = Bot(served, slack, client, lead, second, carol, other, room.id)
            if not socket:
                slack.events_url = bot.events_url
            yield bot


async def waiting_request(bot: Bot, approval_id: str) -> Delivery:
    """The review's request to the room, once refused (`not_in_channel`) and due again only
    minutes later."""
    await refused(bot, approval_id, "not_in_channel")
    [delivery] = [
        d for d in await bot.served.service.store.deliveries(approval_id) if d.kind == "request"
    ]
    assert delivery.due_at - utc_now() > timedelta(minutes=4)
    return delivery


async def handled(caplog: pytest.LogCaptureFixture, text: str) -> None:
    """Until the bot logged that it handled a `member_joined_channel` (Bolt answers Slack
    before its listener runs: the answer says nothing of what the listener did)."""

    async def seen() -> bool:
        return any(text in r.getMessage() for r in caplog.records)

    await eventually(seen, f"a log line with {text!r}")


@pytest.mark.parametrize(
    ("socket", "by_name"),
    [(False, False), (False, True), (True, False)],
    ids=["http-channel-id", "http-channel-name", "socket-mode"],
)
async def test_inviting_the_bot_posts_the_waiting_review_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    socket: bool,
    by_name: bool,
) -> None:
    """Slack's `member_joined_channel` of the bot makes the post waiting for that channel due
    now: it appears within seconds, not at the retry minutes later, and once. Another
    person joining the channel, or the bot joining another channel, changes nothing."""
    caplog.set_level(logging.DEBUG, logger="nodbot.bot.slack")
    async with uninvited_bot(tmp_path, monkeypatch, socket=socket, by_name=by_name) as bot:
        assert bot.room is not None
        approval_id = await bot.start()
        waiting = await waiting_request(bot, approval_id)

        elsewhere = bot.slack.add_channel("elsewhere", [bot.lead], bot_member=False)
        bot.slack.invite(elsewhere)  # the bot joins another channel
        await bot.slack.events_answered(1)
        await handled(caplog, f"joined {elsewhere.id}")
        # Someone else joins the room.
        await bot.slack.send_event(bot.slack.member_joined_event(bot.room, bot.carol))
        await handled(caplog, f"{bot.carol.id} joined {bot.room}")
        [still] = await bot.served.service.store.deliveries(approval_id)
        assert (still.status, still.attempts, still.due_at) == ("due", 1, waiting.due_at)
        assert bot.slack.messages(bot.room) == []

        bot.slack.invite(bot.room, inviter=bot.lead)
        [message] = await bot.posted(bot.lead)  # within seconds: `posted` waits 10 at most
        [sent] = await bot.served.service.store.deliveries(approval_id)
        assert (sent.status, sent.attempts) == ("sent", 2)
        click = bot.slack.click(message, "nodbot.approve", bot.lead)
        if socket:
            await bot.slack.socket_send("interactive", click)
        else:
            assert (await bot.send(click)).status_code == 200
        await bot.decided(approval_id)
        await bot.updated(message)
        assert {d.status for d in await bot.settled(approval_id)} == {"sent"}
        top = [m for m in bot.slack.messages(bot.room) if m.thread_ts is None]
        assert [m.ts for m in top] == [message.ts]  # posted once
        posts = bot.slack.calls_to("chat.postMessage")
        assert [c.ok for c in posts if "thread_ts" not in c.params] == [False, True]


async def test_a_review_decided_before_the_invite_is_given_up_when_the_bot_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The invite makes the waiting post due now, and the attempt finds its review decided:
    given up there, nothing posted, though the bot could post now."""
    caplog.set_level(logging.DEBUG, logger="nodbot.bot.slack")
    async with uninvited_bot(tmp_path, monkeypatch, socket=False, by_name=False) as bot:
        assert bot.room is not None
        approval_id = await bot.start()
        await waiting_request(bot, approval_id)
        lead = {"Authorization": "Bearer token-of-lead-000000"}
        answer = await bot.client.post(
            f"/approvals/{approval_id}/decide", json={"action": "deny"}, headers=lead
        )
        assert answer.status_code == 200, answer.text
        bot.slack.invite(bot.room)
        store = bot.served.service.store

        async def given_up() -> bool:
            found = await store.deliveries(approval_id)
            return any(d.kind == "request" and d.status == "failed" for d in found)

        await eventually(given_up, "the request given up")
        [request] = [d for d in await store.deliveries(approval_id) if d.kind == "request"]
        assert request.error is not None and "decided before" in request.error
        assert bot.slack.messages(bot.room) == []
        assert len(bot.slack.calls_to("chat.postMessage")) == 1  # the refused one
