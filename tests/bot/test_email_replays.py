"""A reply is processed once, whatever review it is aimed at: a bot served in-process (on
SQLite, and on PostgreSQL when the tests have one) takes replies over its SMTP listener as a
mail server hands them on. A signed reply that decided one review, handed over again for
another review of the same reviewer (its headers untouched, so its signature still holds:
only the envelope names the other review), decides nothing there and leaves a `refused`
event on it naming the Message-ID; copies of one reply handed over at the same moment decide
once; and a reply whose Message-ID cannot be told (none, or two) decides nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_email_inbound import CONFIG, TRUSTED, WEB_SECRET, Bot, reply
from tests.bot.test_email_listener import listening, relay
from tests.bot.test_email_outbound import emailing
from tests.core.store.conftest import database_url

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@contextlib.asynccontextmanager
async def listening_bot(tmp_path: Path, store_url: str) -> AsyncIterator[Bot]:
    """The bot of `test_email_inbound.CONFIG` on the store `store_url`, with an SMTP
    listener."""
    sqlite = f'"sqlite:///{tmp_path / "nodbot.db"}"'

    def config(port: int) -> str:
        text = CONFIG.format(
            db=tmp_path / "nodbot.db", web_secret=WEB_SECRET, port=port, trusted=TRUSTED
        )
        assert sqlite in text
        return text.replace(sqlite, f'"{store_url}"') + listening("smtp")

    async with emailing(tmp_path, config) as (served, client, mail):
        yield Bot(served, client, mail)


@pytest.fixture(params=BACKENDS)
async def bot(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with (
        database_url(request.param, tmp_path) as url,
        listening_bot(tmp_path, url) as running,
    ):
        yield running


async def review(bot: Bot) -> tuple[str, EmailMessage]:
    """A new review, and the request Ana was emailed for it (not another review's outcome,
    which may arrive meanwhile)."""
    approval_id, _ = await bot.pending()

    def request() -> EmailMessage | None:
        for received in bot.mail.received:
            message = received.message
            body = message.get_body(("plain",))
            if (
                received.recipients == ["ana@example.com"]
                and message["In-Reply-To"] is None
                and body is not None
                and approval_id in str(body.get_content())
            ):
                return message
        return None

    await bot.mail.wait_for(lambda: request() is not None)
    found = request()
    assert found is not None
    return approval_id, found


def message_id_of(raw: bytes) -> str:
    return str(message_from_bytes(raw, policy=policy.default)["Message-ID"]).strip()


def refused(approval: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in approval["events"] if e["kind"] == "refused"]


async def test_a_reply_that_decided_one_review_decides_no_other(bot: Bot) -> None:
    first, request = await review(bot)
    raw = reply(request, sender="ana@example.com")
    answer = await relay(bot, raw, "ana@example.com", str(request["Reply-To"]))
    assert answer == (250, "2.0.0 decided")
    assert (await bot.approval(first))["status"] == "approved"

    second, other = await review(bot)
    # The very message, re-injected: only the envelope names the new review.
    elsewhere = str(other["Reply-To"])
    assert await relay(bot, raw, "ana@example.com", elsewhere) == (250, "2.0.0 refused")

    approval = await bot.approval(second)
    assert approval["status"] == "pending" and approval["decision"] is None
    [event] = refused(approval)
    assert event["channel"] == "email" and event["actor"] == "ana@example.com"
    assert event["detail"]["evidence"] == {"message_id": message_id_of(raw)}
    assert event["detail"]["reason"] == (
        f"the message {message_id_of(raw)} was processed already, on review {first}"
    )


async def test_copies_of_one_reply_at_the_same_moment_decide_once(bot: Bot) -> None:
    reviews = [await review(bot) for _ in range(3)]
    raw = reply(reviews[0][1], sender="ana@example.com")
    targets = [str(request["Reply-To"]) for _, request in reviews]
    answers = await asyncio.gather(
        *(relay(bot, raw, "ana@example.com", target) for target in targets * 2)
    )
    assert sorted(message for _, message in answers) == ["2.0.0 decided"] + ["2.0.0 refused"] * 5
    approvals = [await bot.approval(approval_id) for approval_id, _ in reviews]
    assert [a["status"] for a in approvals].count("approved") == 1
    assert sum(len(refused(a)) for a in approvals) == 5
    assert all(
        "was processed already" in event["detail"]["reason"]
        for approval in approvals
        for event in refused(approval)
    )


async def test_a_reply_with_two_message_ids_decides_nothing(bot: Bot) -> None:
    """A signature covers the Message-ID it signed (the last one): one added above it would
    make a copy look new."""
    approval_id, request = await review(bot)
    raw = b"Message-ID: <fresh-looking@mail.example.com>\r\n" + reply(
        request, sender="ana@example.com"
    )
    assert await relay(bot, raw, "ana@example.com", str(request["Reply-To"])) == (
        250,
        "2.0.0 refused",
    )
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending"
    [event] = refused(approval)
    assert (
        event["detail"]["reason"] == "the message has 2 Message-ID headers; exactly one is needed"
    )


async def test_a_reply_without_a_message_id_decides_nothing(bot: Bot) -> None:
    approval_id, request = await review(bot)
    message = message_from_bytes(reply(request, sender="ana@example.com"), policy=policy.SMTP)
    del message["Message-ID"]
    answer = await relay(bot, message.as_bytes(), "ana@example.com", str(request["Reply-To"]))
    assert answer == (250, "2.0.0 refused")
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending"
    [event] = refused(approval)
    assert "no Message-ID" in event["detail"]["reason"]
