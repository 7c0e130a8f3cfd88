"""By email, for a tool that runs outside the bot (asked about with `POST /approvals` and a
JSON schema): the request offers `approve and remember` under a rule with `remember:`, a reply
saying so approves and remembers (the next identical call is approved at once), and an edit
by reply is typed and checked by the caller's schema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_email_inbound import TRUSTED, Bot, reply
from tests.bot.test_email_outbound import emailing

ROOT = Path(__file__).resolve().parents[2]
AGENT = {"Authorization": "Bearer token-of-the-agent-0000000000000"}
INGEST = {"Authorization": "Bearer token-of-mailhook-00"}
SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "copies": {"type": "integer", "minimum": 1}},
    "required": ["to", "copies"],
}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: web-secret-for-email-memory-0001}}
api:
  tokens:
    - {{name: agent, token: token-of-the-agent-0000000000000, scopes: [approvals:request]}}
    - {{name: mailhook, token: token-of-mailhook-00, scopes: [email:ingest]}}
external_tools: [send_letter]
rules:
  - tool: send_letter
    reviewers: [ana@example.com]
    remember: 2h
    remember_by: [to]
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
  trusted_authserv_id: {trusted}
"""


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)

    def config(port: int) -> str:
        return CONFIG.format(db=tmp_path / "nodbot.db", port=port, trusted=TRUSTED)

    async with emailing(tmp_path, config) as (served, client, mail):
        yield Bot(served, client, mail)


async def ask(bot: Bot, call_id: str, **arguments: Any) -> dict[str, Any]:
    body = {
        "tool": "send_letter",
        "arguments": arguments,
        "schema": SCHEMA,
        "run_id": "letters",
        "call_id": call_id,
    }
    answer = await bot.client.post("/approvals", json=body, headers=AGENT)
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def emailed(bot: Bot, approval_id: str) -> EmailMessage:
    def found() -> list[EmailMessage]:
        return [
            r.message
            for r in bot.mail.received
            if approval_id in str(r.message.get_body(("plain",)))
            and r.message["Auto-Submitted"] == "auto-generated"
        ]

    await bot.mail.wait_for(lambda: bool(found()))
    return found()[0]


async def ingest(bot: Bot, raw: bytes) -> dict[str, Any]:
    answer = await bot.client.post(
        "/email/inbound", content=raw, headers={**INGEST, "Content-Type": "message/rfc822"}
    )
    assert answer.status_code == 202, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def test_approve_and_remember_by_reply(bot: Bot) -> None:
    first = await ask(bot, "c1", to="Acme Ltd", copies=2)
    request = await emailed(bot, first["approval_id"])
    text = str(request.get_body(("plain",)).get_content())  # type: ignore[union-attr]
    assert "approve and remember" in text and "to the same to for 2 hours" in text
    outcome = await ingest(
        bot, reply(request, sender="ana@example.com", text="Approve and remember.")
    )
    assert outcome["status"] == "decided", outcome
    again = await ask(bot, "c2", to="Acme Ltd", copies=5)
    assert again["status"] == "approved"
    assert again["decision"]["decided_by"] == "ana@example.com"
    assert (await ask(bot, "c3", to="Other Co", copies=1))["status"] == "pending"


async def test_an_edit_by_reply_is_checked_by_the_callers_schema(bot: Bot) -> None:
    asked = await ask(bot, "c1", to="Acme Ltd", copies=2)
    request = await emailed(bot, asked["approval_id"])
    wrong = reply(request, sender="ana@example.com", text="edit\ncopies: many")
    outcome = await ingest(bot, wrong)
    assert outcome["status"] == "refused" and outcome["reason"].startswith("copies:")
    right = reply(request, sender="ana@example.com", text="edit\ncopies: 3")
    outcome = await ingest(bot, right)
    assert outcome["status"] == "decided", outcome
    found = await bot.client.get(f"/approvals/{asked['approval_id']}/consume", headers=AGENT)
    assert found.status_code == 405  # consume is a POST
    taken = await bot.client.post(f"/approvals/{asked['approval_id']}/consume", headers=AGENT)
    assert taken.json()["arguments"] == {"to": "Acme Ltd", "copies": 3}


async def test_approve_with_other_words_decides_nothing(bot: Bot) -> None:
    asked = await ask(bot, "c1", to="Acme Ltd", copies=2)
    request = await emailed(bot, asked["approval_id"])
    outcome = await ingest(
        bot, reply(request, sender="ana@example.com", text="approve and remember forever")
    )
    assert outcome["status"] == "refused" and "approve" in outcome["reason"]
