"""The IMAP door of inbound email (`email.inbound.imap`) against a real Dovecot on loopback
(`tests/fakes/imap.py`; skipped without Dovecot, failed under CI): a reply delivered to the
mailbox decides its review and is moved to the processed mailbox (or flagged seen), an
automatic message is marked without deciding anything, and a mailbox the bot cannot sign in
to is reported by /healthz."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.bot.test_email_inbound import STARTER, Bot, email_bot, reply
from tests.fakes.imap import ImapServer, dovecot, dovecot_binary

ROOT = Path(__file__).resolve().parents[2]


def reading(imap: ImapServer, *, processed: bool = True, password: str | None = None) -> str:
    """The `inbound:` lines of the `email:` section reading `imap`'s INBOX."""
    moved = "processed_mailbox: Processed, " if processed else ""
    return (
        f"  inbound:\n"
        f"    imap: {{host: {imap.host}, port: {imap.port}, tls: none, "
        f"username: {imap.username}, password: '{password or imap.password}', "
        f"{moved}poll: 1}}\n"
    )


@contextlib.asynccontextmanager
async def imap_bot(
    tmp_path: Path, *, processed: bool = True, password: str | None = None
) -> AsyncIterator[tuple[Bot, ImapServer]]:
    dovecot_binary()
    async with (
        dovecot(tmp_path / "imap") as imap,
        email_bot(tmp_path, reading(imap, processed=processed, password=password)) as bot,
    ):
        yield bot, imap


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


async def test_a_reply_in_the_mailbox_decides_and_is_moved(tmp_path: Path) -> None:
    async with imap_bot(tmp_path) as (bot, imap):
        approval_id, emailed = await bot.pending()
        raw = reply(emailed["ana@example.com"], sender="ana@example.com", text="deny not today")
        await imap.append(raw)
        [moved] = await imap.wait_until("Processed", lambda stored: len(stored) == 1)
        assert moved.raw.replace(b"\r\n", b"\n") == raw.replace(b"\r\n", b"\n")
        assert await imap.messages("INBOX") == []
        approval = await bot.approval(approval_id)
        assert approval["status"] == "denied" and approval["decision"]["reason"] == "not today"
        [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
        assert decided["channel"] == "email"
        run = await bot.client.get(f"/runs/{approval['run_id']}?wait=10", headers=STARTER)
        assert run.json()["status"] == "finished"


async def test_without_a_processed_mailbox_replies_are_flagged_seen(tmp_path: Path) -> None:
    async with imap_bot(tmp_path, processed=False) as (bot, imap):
        approval_id, emailed = await bot.pending()
        # One already seen before the bot looked (read by a person): left alone.
        seen = reply(emailed["bo@example.com"], sender="bo@example.com", text="deny seen")
        await imap.append(seen, flags=[r"\Seen"])
        raw = reply(emailed["ana@example.com"], sender="ana@example.com")
        await imap.append(raw)
        stored = await imap.wait_until(
            "INBOX", lambda stored: len(stored) == 2 and all(r"\Seen" in m.flags for m in stored)
        )
        assert len(stored) == 2
        approval = await bot.approval(approval_id)
        assert approval["status"] == "approved"
        assert approval["decision"]["decided_by"] == "ana@example.com"


async def test_an_automatic_message_is_marked_and_decides_nothing(tmp_path: Path) -> None:
    async with imap_bot(tmp_path) as (bot, imap):
        approval_id, emailed = await bot.pending()
        away = reply(emailed["ana@example.com"], sender="ana@example.com", subject="Out of office")
        await imap.append(away)
        await imap.wait_until("Processed", lambda stored: len(stored) == 1)
        # Then a genuine reply: read after it, in order, and deciding.
        await imap.append(reply(emailed["ana@example.com"], sender="ana@example.com"))
        await imap.wait_until("Processed", lambda stored: len(stored) == 2)
        approval = await bot.approval(approval_id)
        assert approval["status"] == "approved"
        [refused] = [e for e in approval["events"] if e["kind"] == "refused"]
        assert refused["detail"]["reason"].startswith("an automatic message decides nothing")


async def test_a_mailbox_that_refuses_the_bot_is_reported(tmp_path: Path) -> None:
    async with imap_bot(tmp_path, password="not-the-password") as (bot, _imap):
        for _ in range(400):  # until the reader has tried and said so (20 s at most)
            health = await bot.client.get("/healthz")
            if health.status_code == 503:
                break
            await asyncio.sleep(0.05)
        assert health.status_code == 503, health.text
        problems = health.json()["problems"]
        assert any("the replies' mailbox cannot be read" in p for p in problems), problems
        assert any("LOGIN was refused" in p for p in problems), problems
        assert "not-the-password" not in health.text
