"""The email channel end to end, through `nodbot serve` in a process of its own: review emails
reach a real SMTP server (aiosmtpd, in this test's loop), one reply is handed to the bot's
SMTP listener and one is delivered to its IMAP mailbox (a real Dovecot), each decides, the
tool runs once for each, and every emailed reviewer gets the outcome in the request's thread.
Then the bot is frozen (SIGSTOP) while a reply arrives in the mailbox and killed (SIGKILL)
before it could read it: the bot started again decides it, once, and a copy of the same
message delivered again decides nothing more."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiosmtplib
import httpx

from tests.bot.processes import nodbot_serve
from tests.bot.test_email_inbound import TRUSTED, reply
from tests.bot.test_email_outbound import MailServer, mail_server
from tests.fakes.imap import ImapServer, dovecot, dovecot_binary
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-the-starter-000000000000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WAIT = 30.0

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2, lease: 2s}}
web: {{secret: "${{NODBOT_WEB_SECRET}}"}}
api:
  tokens:
    - {{name: starter, token: "${{NODBOT_TOKEN}}", scopes: [runs:write, approvals:read]}}
agents:
  ledger: tests.bot.ledger_agent:agent
rules:
  - tool: refund
    reviewers: [ana@example.com, bo@example.com]
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {smtp_port}, tls: none, timeout: 5}}
  trusted_authserv_id: {trusted}
  inbound:
    listen: 127.0.0.1:{listen_port}
    protocol: smtp
    imap:
      host: {imap.host}
      port: {imap.port}
      tls: none
      username: {imap.username}
      password: "${{NODBOT_IMAP_PASSWORD}}"
      processed_mailbox: Processed
      poll: 1
"""


async def until(what: str, done: Callable[[], Any], seconds: float = WAIT) -> Any:
    """Polls `done` (a function, or one returning an awaitable) until it gives a true value."""
    deadline = time.monotonic() + seconds
    while True:
        found = done()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


def ledger(tmp_path: Path) -> list[str]:
    path = tmp_path / "ledger.txt"
    return sorted(path.read_text().splitlines()) if path.exists() else []


class Harness:
    def __init__(self, tmp_path: Path, mail: MailServer, imap: ImapServer) -> None:
        self.tmp_path, self.mail, self.imap = tmp_path, mail, imap
        self.listen_port = free_port()
        self.config = tmp_path / "nodbot.yml"
        self.config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                smtp_port=mail.port,
                trusted=TRUSTED,
                listen_port=self.listen_port,
                imap=imap,
            )
        )
        self.environment = {
            "NODBOT_WEB_SECRET": "web-secret-of-the-end-to-end-test-0001",
            "NODBOT_TOKEN": TOKEN,
            "NODBOT_IMAP_PASSWORD": imap.password,
            "NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt"),
        }

    async def start(self, client: httpx.AsyncClient, order: str) -> tuple[str, EmailMessage]:
        """A refund waiting for review, and the request Ana was emailed."""
        answer = await client.post(
            "/runs", json={"agent": "ledger", "input": f"refund {order} 5"}, headers=HEADERS
        )
        assert answer.status_code == 201, answer.text
        [pending] = answer.json()["pending"]
        approval_id = str(pending["approval_id"])

        def request() -> EmailMessage | None:
            for received in self.mail.received:
                message = received.message
                if received.recipients == ["ana@example.com"] and approval_id in str(
                    message.get_body(("plain",))
                ):
                    return message
            return None

        found: EmailMessage = await until(f"the request of {approval_id} arrives", request)
        return approval_id, found

    async def finished(self, client: httpx.AsyncClient, approval_id: str) -> dict[str, Any]:
        async def done() -> dict[str, Any] | None:
            found = await client.get(f"/approvals/{approval_id}", headers=HEADERS)
            record: dict[str, Any] = found.json()
            return record if record["finished"] else None

        found: dict[str, Any] = await until(f"the tool of {approval_id} ran", done)
        return found

    def outcomes(self, approval_id: str) -> list[EmailMessage]:
        return [
            r.message
            for r in self.mail.received
            if "Re: " in str(r.message["Subject"])
            and r.message["In-Reply-To"] is not None
            and approval_id in str(r.message.get_body(("plain",)))
            and r.message["Auto-Submitted"] == "auto-generated"
        ]


async def test_email_end_to_end_through_nodbot_serve(tmp_path: Path) -> None:
    dovecot_binary()
    async with dovecot(tmp_path / "imap") as imap, mail_server() as mail:
        harness = Harness(tmp_path, mail, imap)
        async with nodbot_serve(harness.config, **harness.environment) as bot:
            async with httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
                # 1. A reply handed to the listener by the mail server.
                by_smtp, request = await harness.start(client, "smtp-1")
                raw = reply(request, sender="ana@example.com")
                await aiosmtplib.send(
                    raw,
                    sender="ana@example.com",
                    recipients=[str(request["Reply-To"])],
                    hostname="127.0.0.1",
                    port=harness.listen_port,
                )
                record = await harness.finished(client, by_smtp)
                assert record["decision"]["decided_by"] == "ana@example.com"

                # 2. A reply delivered to the mailbox.
                by_imap, request = await harness.start(client, "imap-1")
                await imap.append(reply(request, sender="ana@example.com", text="deny not now"))
                record = await harness.finished(client, by_imap)
                assert record["status"] == "denied"
                assert record["decision"]["reason"] == "not now"
                await imap.wait_until("Processed", lambda stored: len(stored) == 1)

                # The follow-ups: each reviewer emailed gets the outcome, in the thread.
                for approval_id in (by_smtp, by_imap):
                    await until(
                        f"both reviewers hear the outcome of {approval_id}",
                        lambda a=approval_id: len(harness.outcomes(a)) == 2,
                    )

                # 3. A reply arrives while the bot is frozen; the bot is killed unread.
                stopped, request = await harness.start(client, "killed-1")
                bot.process.send_signal(signal.SIGSTOP)
                pending_reply = reply(request, sender="ana@example.com")
                await imap.append(pending_reply)
                os.kill(bot.process.pid, signal.SIGKILL)
                assert await asyncio.to_thread(bot.process.wait, 10) == -signal.SIGKILL
            inbox = await imap.messages("INBOX")
            assert len(inbox) == 1, "the reply was read before the kill"
            assert ledger(tmp_path) == ["smtp-1 5.0"]  # the denied refund never ran

        async with (
            nodbot_serve(harness.config, **harness.environment) as again,
            httpx.AsyncClient(base_url=again.url, timeout=30) as client,
        ):
            record = await harness.finished(client, stopped)
            assert record["decision"]["decided_by"] == "ana@example.com"
            await imap.wait_until("Processed", lambda stored: len(stored) == 2)
            # The same message delivered once more (a mail server's retry): nothing twice.
            await imap.append(pending_reply)
            await imap.wait_until("Processed", lambda stored: len(stored) == 3)
            found = await client.get(f"/approvals/{stopped}", headers=HEADERS)
            events = found.json()["events"]
            assert [e["kind"] for e in events].count("decided") == 1
            [refused] = [e for e in events if e["kind"] == "refused"]
            assert "processed already" in refused["detail"]["reason"]
        assert ledger(tmp_path) == ["killed-1 5.0", "smtp-1 5.0"]
