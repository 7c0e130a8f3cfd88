"""The email channel, inbound: replies POSTed to `/email/inbound` of a bot served in-process
(`bot.serve.serving`), built from the review emails a real SMTP server (aiosmtpd on a loopback
port 0) received. A genuine reply decides and the run goes on; another sender with the same
token, an out-of-office, a replayed Message-ID and a token without `email:ingest` decide
nothing."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.http.limits import EMAIL_BODY
from nodbot.bot.serve import Served
from tests.bot.test_email_outbound import MailServer, emailing

ROOT = Path(__file__).resolve().parents[2]
WEB_SECRET = "web-secret-for-email-tests-0001"
TRUSTED = "mx.example.com"
STARTER = {"Authorization": "Bearer token-of-starter-000"}
INGEST = {"Authorization": "Bearer token-of-mailhook-00"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: {web_secret}}}
api:
  tokens:
    - {{name: starter, token: token-of-starter-000, scopes: [runs:write, approvals:read]}}
    - {{name: mailhook, token: token-of-mailhook-00, scopes: [email:ingest]}}
agents:
  notes: tests.bot.test_email_outbound:agent
rules:
  - tool: send_note
    reviewers: [ana@example.com, bo@example.com]
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
  trusted_authserv_id: {trusted}
"""


@dataclass
class Bot:
    served: Served
    client: httpx.AsyncClient
    mail: MailServer

    async def pending(self) -> tuple[str, dict[str, EmailMessage]]:
        """A new run's note waiting for review, and the request each reviewer was emailed."""
        before = len(self.mail.received)
        run = await self.client.post(
            "/runs",
            json={"agent": "notes", "input": json.dumps({"title": "Hi", "body": "Thanks"})},
            headers=STARTER,
        )
        assert run.status_code == 201, run.text
        [pending] = run.json()["pending"]
        await self.mail.wait_for(lambda: len(self.mail.received) >= before + 2)
        emailed = {r.recipients[0]: r.message for r in self.mail.received[before:]}
        return str(pending["approval_id"]), emailed

    async def post(self, raw: bytes, headers: dict[str, str] = INGEST) -> httpx.Response:
        return await self.client.post(
            "/email/inbound",
            content=raw,
            headers={**headers, "Content-Type": "message/rfc822"},
        )

    async def approval(self, approval_id: str) -> dict[str, Any]:
        answer = await self.client.get(f"/approvals/{approval_id}", headers=STARTER)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found


@contextlib.asynccontextmanager
async def email_bot(tmp_path: Path, email_extra: str = "") -> AsyncIterator[Bot]:
    """The bot of `CONFIG` emailing a real SMTP server, with `email_extra` (YAML lines of
    the `email:` section, indented two spaces) added."""

    def config(port: int) -> str:
        text = CONFIG.format(
            db=tmp_path / "nodbot.db", web_secret=WEB_SECRET, port=port, trusted=TRUSTED
        )
        return text + email_extra

    async with emailing(tmp_path, config) as (served, client, mail):
        yield Bot(served, client, mail)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with email_bot(tmp_path) as running:
        yield running


def reply(
    request: EmailMessage,
    *,
    sender: str,
    text: str = "approve",
    subject: str | None = None,
    message_id: str | None = None,
) -> bytes:
    """A reply to `request` as a mail client writes it: `text` above the quoted request,
    authenticated by the trusted server for `sender`'s domain."""
    message = EmailMessage(policy=SMTP)
    message["Authentication-Results"] = (
        f"{TRUSTED}; dmarc=pass header.from={sender.rpartition('@')[2]}"
    )
    message["From"] = f"Someone <{sender}>"
    message["To"] = str(request["Reply-To"])
    message["Subject"] = subject or f"Re: {request['Subject']}"
    message["Message-ID"] = message_id or make_msgid(domain="mail.example.com")
    message["In-Reply-To"] = str(request["Message-ID"])
    message["References"] = str(request["Message-ID"])
    body = request.get_body(("plain",))
    assert body is not None
    quoted = "\n".join(f"> {line}" for line in str(body.get_content()).splitlines())
    message.set_content(f"{text}\n\nOn Tue, 1 Dec 2026 at 10:00, nodbot wrote:\n{quoted}\n")
    return message.as_bytes()


async def test_a_reply_approves_and_the_run_finishes(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    answer = await bot.post(reply(emailed["ana@example.com"], sender="ana@example.com"))
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "decided" and answer.json()["approval_id"] == approval_id
    approval = await bot.approval(approval_id)
    assert approval["status"] == "approved"
    assert approval["decision"]["decided_by"] == "ana@example.com"
    [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
    assert decided["channel"] == "email"
    run_id = approval["run_id"]
    run = (await bot.client.get(f"/runs/{run_id}?wait=10", headers=STARTER)).json()
    assert run["status"] == "finished" and run["tool_results"][0]["status"] == "ok"


async def test_a_reply_from_another_address_with_the_token_is_refused(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    # Bo is a reviewer too, but the token was Ana's: it does not hold for him.
    for sender in ("bo@example.com", "mallory@evil.example"):
        answer = await bot.post(reply(emailed["ana@example.com"], sender=sender))
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "refused"
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending" and approval["decision"] is None
    refused = [e for e in approval["events"] if e["kind"] == "refused"]
    assert len(refused) == 2 and all(e["channel"] == "email" for e in refused)
    assert "does not hold for bo@example.com" in refused[0]["detail"]["reason"]


async def test_an_out_of_office_is_dropped(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(
        emailed["ana@example.com"],
        sender="ana@example.com",
        subject="Out of office: back on Monday",
    )
    answer = await bot.post(raw)
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "dropped" and answer.json()["answered"] is False
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending"
    [refused] = [e for e in approval["events"] if e["kind"] == "refused"]
    assert refused["detail"]["reason"].startswith("an automatic message decides nothing")


async def test_the_same_message_twice_decides_once(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(emailed["ana@example.com"], sender="ana@example.com", text="deny not now")
    first, second = await bot.post(raw), await bot.post(raw)
    assert (first.json()["status"], second.json()["status"]) == ("decided", "refused")
    assert "processed already" in second.json()["reason"]
    approval = await bot.approval(approval_id)
    assert approval["status"] == "denied" and approval["decision"]["reason"] == "not now"
    assert [e["kind"] for e in approval["events"]].count("decided") == 1


async def test_a_token_without_the_scope_is_refused(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(emailed["ana@example.com"], sender="ana@example.com")
    answer = await bot.post(raw, headers=STARTER)
    assert answer.status_code == 403 and "email:ingest" in answer.json()["error"]
    assert (await bot.post(raw, headers={})).status_code == 401
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_a_reply_without_the_plus_address_is_matched_by_its_thread(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(emailed["bo@example.com"], sender="bo@example.com")
    raw = raw.replace(str(emailed["bo@example.com"]["Reply-To"]).encode(), b"approvals@example.com")
    answer = await bot.post(raw)
    assert answer.json()["status"] == "decided", answer.text
    approval = await bot.approval(approval_id)
    assert approval["decision"]["decided_by"] == "bo@example.com"


async def test_an_unauthenticated_reply_is_refused(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(emailed["ana@example.com"], sender="ana@example.com")
    raw = raw.replace(f"{TRUSTED};".encode(), b"mx.evil.example;")
    answer = await bot.post(raw)
    assert answer.json()["status"] == "refused" and TRUSTED in answer.json()["reason"]
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_a_body_over_one_megabyte_is_refused_unread(bot: Bot) -> None:
    answer = await bot.post(b"x" * (EMAIL_BODY + 1))
    assert answer.status_code == 413


async def test_the_openapi_document_describes_the_email_door(bot: Bot) -> None:
    document = (await bot.client.get("/openapi.json")).json()
    operation = document["paths"]["/email/inbound"]["post"]
    assert operation["description"] == "Needs a token with the scope `email:ingest`."
    assert list(operation["requestBody"]["content"]) == ["message/rfc822"]
    outcome = operation["responses"]["202"]["content"]["application/json"]["schema"]
    assert outcome["properties"]["status"] == {"enum": ["decided", "refused", "dropped"]}
    assert {"401", "403", "413", "415"} <= set(operation["responses"])


# --- the bot's answers ------------------------------------------------------------------------


async def answer_to(bot: Bot, raw: bytes, address: str) -> EmailMessage:
    """The bot's answer to the reply `raw`, once the mail server has it."""
    their_id = str(message_from_bytes(raw, policy=policy.default)["Message-ID"])

    def answers() -> list[EmailMessage]:
        return [
            r.message
            for r in bot.mail.received
            if r.recipients == [address] and r.message["In-Reply-To"] == their_id
        ]

    await bot.mail.wait_for(lambda: bool(answers()))
    [answer] = answers()
    return answer


async def test_a_deciding_reply_is_answered_in_its_thread(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    request = emailed["ana@example.com"]
    raw = reply(request, sender="ana@example.com", text="deny wrong recipient")
    answer = await bot.post(raw)
    assert answer.json()["status"] == "decided" and answer.json()["answered"] is True
    sent = await answer_to(bot, raw, "ana@example.com")
    assert sent["Auto-Submitted"] == "auto-replied"
    assert sent["Reply-To"] == request["Reply-To"]  # replying to the answer works too
    assert sent["Subject"] == f"Re: {request['Subject']}"
    their_id = str(message_from_bytes(raw, policy=policy.default)["Message-ID"])
    assert str(sent["References"]).split() == [str(request["Message-ID"]).strip(), their_id]
    body = sent.get_content()
    assert f"Your reply denied the call of send_note (review {approval_id})" in body


async def test_a_reply_that_decides_nothing_is_told_why_and_how(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(emailed["bo@example.com"], sender="bo@example.com", text="looks fine to me")
    answer = await bot.post(raw)
    assert answer.json()["status"] == "refused" and answer.json()["answered"] is True
    body = (await answer_to(bot, raw, "bo@example.com")).get_content()
    assert "Your reply decided nothing" in body and "not a decision" in body
    assert "  approve\r\n" in body and "  deny <reason>" in body
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_a_reply_after_the_decision_is_told_who_decided(bot: Bot) -> None:
    _approval_id, emailed = await bot.pending()
    await bot.post(reply(emailed["ana@example.com"], sender="ana@example.com"))
    late = reply(emailed["bo@example.com"], sender="bo@example.com", text="deny no")
    answer = await bot.post(late)
    assert answer.json()["status"] == "refused" and answer.json()["answered"] is True
    body = (await answer_to(bot, late, "bo@example.com")).get_content()
    assert "already decided by ana@example.com" in body and "Nothing more is needed" in body


async def test_strangers_and_automatic_messages_get_no_answer(bot: Bot) -> None:
    _approval_id, emailed = await bot.pending()
    request = emailed["ana@example.com"]
    unanswered = [
        reply(request, sender="mallory@evil.example"),  # not the token's reviewer
        reply(request, sender="bo@example.com"),  # a reviewer, with another's token
        reply(request, sender="ana@example.com", subject="Automatic reply: away"),
    ]
    unauthenticated = reply(request, sender="ana@example.com")
    unanswered.append(unauthenticated.replace(f"{TRUSTED};".encode(), b"mx.evil.example;"))
    for raw in unanswered:
        outcome = (await bot.post(raw)).json()
        assert outcome["answered"] is False, outcome
    # The same genuine message twice: answered once, the repeat is not.
    genuine = reply(request, sender="ana@example.com", text="hmm")
    assert (await bot.post(genuine)).json()["answered"] is True
    assert (await bot.post(genuine)).json()["answered"] is False
    await answer_to(bot, genuine, "ana@example.com")
    answered = [r for r in bot.mail.received if r.message["Auto-Submitted"] == "auto-replied"]
    assert len(answered) == 1


async def test_approve_and_remember_under_a_rule_without_remember_decides_nothing(
    bot: Bot,
) -> None:
    approval_id, emailed = await bot.pending()
    raw = reply(emailed["ana@example.com"], sender="ana@example.com", text="approve and remember")
    outcome = (await bot.post(raw)).json()
    assert outcome["status"] == "refused" and "does not remember" in outcome["reason"]
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_a_reply_is_cut_at_the_marker_the_request_carries(bot: Bot) -> None:
    """A client that pastes the whole request below the reply, unquoted and with no header
    of its own: only what is above the request's marker line counts."""
    approval_id, emailed = await bot.pending()
    request = emailed["ana@example.com"]
    raw = reply(request, sender="ana@example.com", text="deny no")
    body = str(request.get_body(("plain",)).get_content())  # type: ignore[union-attr]
    parsed = message_from_bytes(raw, policy=policy.default)
    assert isinstance(parsed, EmailMessage)
    parsed.set_content(f"deny not this week\n\n{body}")
    outcome = (await bot.post(parsed.as_bytes())).json()
    assert outcome["status"] == "decided", outcome
    decided = await bot.approval(approval_id)
    assert decided["decision"]["reason"] == "not this week"
