"""The SMTP / LMTP door of inbound email (`email.inbound.listen`): a mail server hands the bot
a reply over SMTP (aiosmtplib, as an MTA relaying it) or LMTP (the standard library's
`smtplib.LMTP`), the bot answers once the reply is processed, and the run goes on. Mail for
any other address is refused at RCPT: the listener is no relay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiosmtplib
import pytest

from nodbot.bot.http.limits import EMAIL_BODY
from tests.bot.test_email_inbound import STARTER, Bot, email_bot, reply

ROOT = Path(__file__).resolve().parents[2]


def listening(protocol: str) -> str:
    return f"  inbound: {{listen: 127.0.0.1:0, protocol: {protocol}}}\n"


@pytest.fixture
async def smtp_bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with email_bot(tmp_path, listening("smtp")) as running:
        yield running


@pytest.fixture
async def lmtp_bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with email_bot(tmp_path, listening("lmtp")) as running:
        yield running


async def relay(bot: Bot, raw: bytes, sender: str, to: str) -> tuple[int, str]:
    """Hand `raw` to the bot's listener as an MTA would; the server's answer to DATA."""
    port = bot.served.mail_port
    assert port is not None
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=15) as smtp:
        await smtp.mail(sender)
        await smtp.rcpt(to)
        answer = await smtp.data(raw)
    return answer.code, answer.message


async def test_a_reply_over_smtp_approves_and_the_run_finishes(smtp_bot: Bot) -> None:
    approval_id, emailed = await smtp_bot.pending()
    request = emailed["ana@example.com"]
    raw = reply(request, sender="ana@example.com")
    code, message = await relay(smtp_bot, raw, "ana@example.com", str(request["Reply-To"]))
    # Answered only once processed: the decision is already in the store.
    assert (code, message) == (250, "2.0.0 decided")
    approval = await smtp_bot.approval(approval_id)
    assert approval["status"] == "approved"
    assert approval["decision"]["decided_by"] == "ana@example.com"
    run_id = approval["run_id"]
    run = (await smtp_bot.client.get(f"/runs/{run_id}?wait=10", headers=STARTER)).json()
    assert run["status"] == "finished" and run["tool_results"][0]["status"] == "ok"


async def test_the_envelope_names_the_review_when_the_headers_do_not(smtp_bot: Bot) -> None:
    approval_id, emailed = await smtp_bot.pending()
    request = emailed["bo@example.com"]
    raw = reply(request, sender="bo@example.com", text="deny wrong customer")
    plus = str(request["Reply-To"])
    # No plus address in To, no thread: only RCPT TO carries the token.
    raw = raw.replace(plus.encode(), b"approvals@example.com")
    raw = raw.replace(str(request["Message-ID"]).encode(), b"<elsewhere@mail.example.com>")
    code, message = await relay(smtp_bot, raw, "bo@example.com", plus)
    assert (code, message) == (250, "2.0.0 decided")
    approval = await smtp_bot.approval(approval_id)
    assert approval["status"] == "denied" and approval["decision"]["reason"] == "wrong customer"


async def test_mail_for_other_addresses_is_refused_at_rcpt(smtp_bot: Bot) -> None:
    port = smtp_bot.served.mail_port
    assert port is not None
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=15) as smtp:
        await smtp.mail("mallory@evil.example")
        for elsewhere in ("victim@example.org", "approvals@example.org", "ops@example.com"):
            with pytest.raises(aiosmtplib.SMTPRecipientRefused) as refused:
                await smtp.rcpt(elsewhere)
            assert refused.value.code == 550
        # The mailbox itself, with or without a tag and in any case, is taken.
        for ours in ("approvals@example.com", "Approvals+anything@EXAMPLE.com"):
            answer = await smtp.rcpt(ours)
            assert answer.code == 250


async def test_a_forged_reply_is_taken_and_decides_nothing(smtp_bot: Bot) -> None:
    approval_id, emailed = await smtp_bot.pending()
    request = emailed["ana@example.com"]
    raw = reply(request, sender="mallory@evil.example")
    code, message = await relay(smtp_bot, raw, "mallory@evil.example", str(request["Reply-To"]))
    # 250: refusing it would only make the mail server try again; the refusal is recorded.
    assert (code, message) == (250, "2.0.0 refused")
    approval = await smtp_bot.approval(approval_id)
    assert approval["status"] == "pending"
    assert [e["kind"] for e in approval["events"]].count("refused") == 1


async def test_a_message_over_the_limit_is_refused(smtp_bot: Bot) -> None:
    port = smtp_bot.served.mail_port
    assert port is not None
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=15) as smtp:
        await smtp.mail("ana@example.com")
        await smtp.rcpt("approvals@example.com")
        with pytest.raises(aiosmtplib.SMTPDataError) as refused:
            await smtp.data(b"Subject: big\r\n\r\n" + (b"x" * 76 + b"\r\n") * (EMAIL_BODY // 70))
    assert refused.value.code == 552


async def lmtp(port: int, raw: bytes, sender: str, recipients: list[str]) -> list[str]:
    """One LMTP transaction spoken by hand (the standard library's client reads one answer to
    DATA, where LMTP gives one per accepted recipient): each answer line, in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def answer() -> str:
        lines = [await reader.readline()]
        while lines[-1][3:4] == b"-":
            lines.append(await reader.readline())
        return lines[-1].decode().rstrip()

    async def say(line: str) -> str:
        writer.write(line.encode() + b"\r\n")
        return await answer()

    try:
        said = [
            await answer(),
            await say("LHLO mta.example.com"),
            await say(f"MAIL FROM:<{sender}>"),
        ]
        said += [await say(f"RCPT TO:<{r}>") for r in recipients]
        said.append(await say("DATA"))
        body = raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n").replace(b"\r\n.", b"\r\n..")
        writer.write(body + b"\r\n.\r\n")
        accepted = sum(1 for line in said[3:-1] if line.startswith("250"))
        said += [await answer() for _ in range(accepted)]
        said.append(await say("QUIT"))
        return said
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_reply_over_lmtp_decides_with_a_status_per_recipient(lmtp_bot: Bot) -> None:
    approval_id, emailed = await lmtp_bot.pending()
    request = emailed["ana@example.com"]
    raw = reply(request, sender="ana@example.com", text="deny over budget")
    port = lmtp_bot.served.mail_port
    assert port is not None
    # Two recipients of the mailbox and one other: the other is refused at RCPT, and DATA is
    # answered once for each accepted one (RFC 2033).
    recipients = [str(request["Reply-To"]), "approvals@example.com", "root@example.com"]
    said = await lmtp(port, raw, "ana@example.com", recipients)
    codes = [line[:3] for line in said]
    assert codes == ["220", "250", "250", "250", "250", "550", "354", "250", "250", "221"]
    assert said[7:9] == ["250 2.0.0 decided", "250 2.0.0 decided"]
    approval = await lmtp_bot.approval(approval_id)
    assert approval["status"] == "denied" and approval["decision"]["reason"] == "over budget"
    assert [e["kind"] for e in approval["events"]].count("decided") == 1


async def test_lmtp_refuses_smtp_greetings(lmtp_bot: Bot) -> None:
    port = lmtp_bot.served.mail_port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert (await reader.readline()).startswith(b"220")
        for greeting in (b"HELO mta.example.com", b"EHLO mta.example.com"):
            writer.write(greeting + b"\r\n")
            assert (await reader.readline()).startswith(b"500")
    finally:
        writer.close()
        await writer.wait_closed()
