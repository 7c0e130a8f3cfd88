"""A `post_to` channel the bot has not been invited to: Slack answers `not_in_channel` (or
`channel_not_found` for a private channel, which it hides). The operator is told what to do,
the review is not lost, and it is posted once, by the outbox's retries, after the bot is
invited; a review decided meanwhile is given up there instead of retried for ever."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from nodbot.bot.cli.approvals import run_approvals_command
from tests.bot.test_slack import Bot, slack_bot
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
