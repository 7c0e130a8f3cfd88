"""The corpus of `email_corpus/` through the whole inbound door: for each file a live review
of `send_payment` is opened, the file's placeholder token (`t8Kq2mZx`) is replaced by the
token the bot emailed its reviewer, and the message is POSTed to `/email/inbound` of a bot
served in-process. Each genuine reply decides exactly as its reviewer wrote (edits typed as
the tool says); each forged, automatic or ambiguous one decides nothing, and those that name
the review leave a `refused` event saying why (automatic ones too, dropped unread). Then
the cases that need a live review: a replayed Message-ID, a reply after the decision,
another reviewer's token, an expired token and an edit with a value of the wrong type."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.core import Agent, ToolRegistry
from tests.bot.test_email_outbound import MailServer, NoteChat, emailing
from tests.bot.test_email_reading import EXPECTED

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "email_corpus"
PLACEHOLDER = b"t8Kq2mZx"
STARTER = {"Authorization": "Bearer token-of-starter-000"}
INGEST = {"Authorization": "Bearer token-of-mailhook-00"}
ARGUMENTS = {"recipient": "ACME Corp <billing@acme.example>", "amount": 1200, "memo": "Invoice"}

tools = ToolRegistry()


@tools.tool(effects="write")
def send_payment(recipient: str, amount: int, memo: str) -> str:
    """Pay an invoice."""
    return f"paid {amount} to {recipient}"


agent = Agent(NoteChat(), tools)

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: web-secret-for-email-corpus-01}}
api:
  tokens:
    - {{name: starter, token: token-of-starter-000, scopes: [runs:write, approvals:read]}}
    - {{name: mailhook, token: token-of-mailhook-00, scopes: [email:ingest]}}
agents:
  payments: tests.bot.test_email_corpus:agent
rules:
  - tool: send_payment
    reviewers: [alice@example.com, bob@example.com]
    editable: [amount, memo]
    timeout: {timeout}
email:
  from: nodbot@nodbot.example.org
  reply_to: approvals@nodbot.example.org
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
  trusted_authserv_id: mx.nodbot.example.org
"""


@dataclass
class Bot:
    client: httpx.AsyncClient
    mail: MailServer

    async def pending(self) -> tuple[str, dict[str, EmailMessage]]:
        """A new payment waiting for review, and the request each reviewer was emailed."""
        before = len(self.mail.received)
        started = await self.client.post(
            "/runs",
            json={"agent": "payments", "input": json.dumps({**ARGUMENTS, "_tool": "send_payment"})},
            headers=STARTER,
        )
        assert started.status_code == 201, started.text
        [pending] = started.json()["pending"]
        await self.mail.wait_for(lambda: len(self.mail.received) >= before + 2)
        emailed = {r.recipients[0]: r.message for r in self.mail.received[before:]}
        return str(pending["approval_id"]), emailed

    async def ingest(self, raw: bytes) -> dict[str, Any]:
        answer = await self.client.post(
            "/email/inbound", content=raw, headers={**INGEST, "Content-Type": "message/rfc822"}
        )
        assert answer.status_code == 202, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def approval(self, approval_id: str) -> dict[str, Any]:
        answer = await self.client.get(f"/approvals/{approval_id}", headers=STARTER)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found


@contextlib.asynccontextmanager
async def corpus_bot(tmp_path: Path, review_timeout: str = "1h") -> AsyncIterator[Bot]:

    def config(port: int) -> str:
        return CONFIG.format(db=tmp_path / "nodbot.db", port=port, timeout=review_timeout)

    async with emailing(tmp_path, config) as (_served, client, mail):
        yield Bot(client, mail)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with corpus_bot(tmp_path) as running:
        yield running


def token_of(request: EmailMessage) -> bytes:
    """The token of the reply address the bot gave a request."""
    reply_to = str(request["Reply-To"])
    return reply_to.partition("+")[2].partition("@")[0].encode()


def addressed(name: str, token: bytes) -> bytes:
    """The corpus file `name` answering the review of `token`."""
    return (CORPUS / name).read_bytes().replace(PLACEHOLDER, token)


def decision_of(expected: Any) -> dict[str, Any] | None:
    """The stored decision a genuine reply of the corpus must make."""
    kind = type(expected).__name__
    if kind == "Approve":
        return {"approved": True, "reason": None, "edited_args": None}
    if kind == "Deny":
        return {"approved": False, "reason": expected.reason, "edited_args": None}
    if kind == "Edit":
        edited = {**expected.arguments}
        if "amount" in edited:
            edited["amount"] = int(edited["amount"])  # typed as the tool says
        return {"approved": True, "reason": None, "edited_args": edited}
    return None


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_the_corpus_through_the_door(bot: Bot, name: str) -> None:
    approval_id, emailed = await bot.pending()
    raw = addressed(name, token_of(emailed["alice@example.com"]))
    outcome = await bot.ingest(raw)
    approval = await bot.approval(approval_id)
    expected = decision_of(EXPECTED[name])
    refused = [e for e in approval["events"] if e["kind"] == "refused"]
    if expected is not None:
        assert outcome["status"] == "decided", outcome
        decision = approval["decision"]
        assert decision["decided_by"] == "alice@example.com"
        got = {key: decision[key] for key in ("approved", "reason", "edited_args")}
        assert got == expected
        assert refused == []
        return
    assert approval["status"] == "pending" and approval["decision"] is None
    stage = EXPECTED[name][0]  # type: ignore[index]
    [event] = refused
    assert event["channel"] == "email"
    if stage == "screened":
        # Automatic: dropped unread and never answered, but recorded on the review it names.
        assert outcome["status"] == "dropped" and outcome["answered"] is False
        assert (
            event["detail"]["reason"]
            == f"an automatic message decides nothing: {outcome['reason']}"
        )
        return
    assert outcome["status"] == "refused", outcome
    assert event["detail"]["reason"] == outcome["reason"]
    message_id = str(message_from_bytes(raw, policy=policy.default)["Message-ID"]).strip()
    assert event["detail"]["evidence"] == {"message_id": message_id}
    # Forged senders get no answer; the reviewer's own unclear reply is told why.
    assert outcome["answered"] is (stage == "unclear")


async def test_a_replayed_message_decides_once(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = addressed("gmail_android.eml", token_of(emailed["alice@example.com"]))
    first, again = await bot.ingest(raw), await bot.ingest(raw)
    assert first["status"] == "decided"
    assert again["status"] == "refused" and "processed already" in again["reason"]
    approval = await bot.approval(approval_id)
    assert [e["kind"] for e in approval["events"]].count("decided") == 1


async def test_a_reply_after_the_decision_decides_nothing(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    await bot.ingest(addressed("gmail_web.eml", token_of(emailed["alice@example.com"])))
    late = addressed("apple_mail.eml", token_of(emailed["alice@example.com"]))
    outcome = await bot.ingest(late)
    assert outcome["status"] == "refused"
    assert outcome["reason"] == "the review was already decided by alice@example.com"
    approval = await bot.approval(approval_id)
    assert approval["status"] == "approved"


async def test_another_reviewers_token_decides_nothing(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    # Alice's reply, sent to the address the bot gave Bob.
    raw = addressed("outlook_web.eml", token_of(emailed["bob@example.com"]))
    outcome = await bot.ingest(raw)
    assert outcome["status"] == "refused" and outcome["answered"] is False
    assert "does not hold for alice@example.com" in outcome["reason"]
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_an_edit_of_the_wrong_type_decides_nothing(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = addressed("gmail_android.eml", token_of(emailed["alice@example.com"]))
    raw = raw.replace(b"amount: 1150", b"amount: a lot")
    outcome = await bot.ingest(raw)
    assert outcome["status"] == "refused" and outcome["reason"].startswith("amount:")
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending"
    [event] = [e for e in approval["events"] if e["kind"] == "refused"]
    assert event["detail"]["reason"] == outcome["reason"]


async def test_an_expired_token_decides_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    # The token ends with the review: one of a 1 s timeout is expired once the review is.
    async with corpus_bot(tmp_path, review_timeout="1s") as bot:
        approval_id, emailed = await bot.pending()
        for _ in range(400):  # until the workers expire the review (20 s at most)
            if (await bot.approval(approval_id))["status"] != "pending":
                break
            await asyncio.sleep(0.05)
        assert (await bot.approval(approval_id))["decision"]["decided_by"] == "nodbot:timeout"
        raw = addressed("gmail_web.eml", token_of(emailed["alice@example.com"]))
        outcome = await bot.ingest(raw)
        assert outcome["status"] == "refused"
        assert "the token expired" in outcome["reason"]
