"""The email channel, outbound: the `email:` section, reply tokens, and review emails sent to
a real SMTP server (aiosmtpd on a loopback port 0) by a bot served in-process: one email per
email reviewer, headers free of anything an argument holds, the HTML escaped, a threaded
follow-up once decided, 4xx retried with the same Message-ID, 5xx given up.

The bot's agent is this module's `agent`: each run asks for one `send_note` call whose
arguments are the run's input (a JSON object), so each test chooses what reviewers read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from nodbot.bot.config import ConfigError, load_config
from nodbot.bot.config.models import TOKEN_ROOM
from nodbot.bot.email.tokens import TOKEN_LENGTH, InvalidToken, ReplyTokens
from nodbot.bot.serve import Served, serving
from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    ToolCall,
    ToolRegistry,
    ToolSpec,
)

ROOT = Path(__file__).resolve().parents[2]
WEB_SECRET = "web-secret-for-email-tests-0001"
STARTER = {"Authorization": "Bearer token-of-starter-000"}
ANA = {"Authorization": "Bearer token-of-ana-000000"}
APPROVAL = "apr_0193a1b2c3d4e5f60718293a4b5c"
DIGEST = "ab" * 32

# --- the agent the bot runs -----------------------------------------------------------------

tools = ToolRegistry()


@tools.tool(effects="write")
def send_note(title: str, body: str) -> str:
    """Send a note to a customer."""
    return f"sent {title!r}"


@tools.tool(effects="write")
def send_urgent_note(title: str) -> str:
    """Send a note that escalates when nobody decides."""
    return f"sent {title!r}"


class NoteChat:
    """Asks for one call with the run's input as its arguments (`_tool` names the tool,
    `send_note` by default), then says it is done."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        [asked] = [m for m in messages if isinstance(m, HumanMessage)]
        arguments = json.loads(asked.content)
        tool = arguments.pop("_tool", "send_note")
        call = ToolCall(id="call_1", name=tool, arguments=arguments)
        return ChatResponse(tool_calls=[call])


agent = Agent(NoteChat(), tools)

# --- a real SMTP server ---------------------------------------------------------------------


@dataclass
class Received:
    """One DATA the server was sent, and how it answered."""

    recipients: list[str]
    message: EmailMessage
    answer: str


@dataclass
class MailServer:
    """aiosmtpd in this event loop; answers DATA with `answers` in turn, then 250."""

    port: int = 0
    answers: list[str] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        answer = self.answers.pop(0) if self.answers else "250 OK"
        assert isinstance(envelope.content, bytes)
        parsed = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(parsed, EmailMessage)
        async with self.changed:
            self.received.append(Received(list(envelope.rcpt_tos), parsed, answer))
            self.changed.notify_all()
        return answer

    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.answer.startswith("250")]

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Until `done` says so, for 15 s at most."""
        async with asyncio.timeout(15), self.changed:
            await self.changed.wait_for(done)


@contextlib.asynccontextmanager
async def mail_server() -> AsyncIterator[MailServer]:
    mail = MailServer()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(mail, hostname="localhost"), "127.0.0.1", 0)
    mail.port = server.sockets[0].getsockname()[1]
    try:
        yield mail
    finally:
        server.close()
        await server.wait_closed()


# --- a bot emailing it ----------------------------------------------------------------------

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: {web_secret}}}
api:
  tokens:
    - {{name: starter, token: token-of-starter-000, scopes: [runs:write, approvals:read]}}
    - name: ana@example.com
      token: token-of-ana-000000
      scopes: [approvals:read, approvals:decide]
agents:
  notes: tests.bot.test_email_outbound:agent
reviewer_groups:
  leads: [Bo@Example.com, U0123ABCDE]
rules:
  - tool: send_note
    description: Notes leave the company
    reviewers: [ana@example.com, group:leads]
  - tool: send_urgent_note
    reviewers: [ana@example.com]
    escalate_after: 1s
    escalate_to: [carl@example.com, ana@example.com]
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
"""


@dataclass
class Bot:
    served: Served
    client: httpx.AsyncClient
    mail: MailServer

    async def pending(self, **arguments: Any) -> str:
        """A new run's note, waiting for review: its approval id."""
        run = await self.client.post(
            "/runs", json={"agent": "notes", "input": json.dumps(arguments)}, headers=STARTER
        )
        assert run.status_code == 201, run.text
        [pending] = run.json()["pending"]
        approval_id: str = pending["approval_id"]
        return approval_id

    async def deliveries(self, approval_id: str, done: Callable[[list[Any]], bool]) -> list[Any]:
        """The review's email deliveries, once `done` says so (a 15 s deadline)."""
        store: Any = self.served.service.store
        async with asyncio.timeout(15):
            while True:
                found = [d for d in await store.deliveries(approval_id) if d.channel == "email"]
                if done(found):
                    return found
                await asyncio.sleep(0.05)  # polling the store, for an outcome with a deadline


@contextlib.asynccontextmanager
async def emailing(
    tmp_path: Path, config: Callable[[int], str]
) -> AsyncIterator[tuple[Served, httpx.AsyncClient, MailServer]]:
    """A bot served in-process from the file `config(port of the SMTP server)` writes,
    emailing a real SMTP server, and a client of its API."""
    async with mail_server() as mail:
        path = tmp_path / "nodbot.yml"
        path.write_text(config(mail.port))
        async with (
            serving(str(path)) as served,
            httpx.AsyncClient(base_url=served.url, timeout=30) as client,
        ):
            yield served, client, mail


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)

    def config(port: int) -> str:
        return CONFIG.format(db=tmp_path / "nodbot.db", web_secret=WEB_SECRET, port=port)

    async with emailing(tmp_path, config) as (served, client, mail):
        yield Bot(served, client, mail)


def parts(message: EmailMessage) -> tuple[str, str]:
    """The text and the HTML of a multipart/alternative message."""
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    return str(text.get_content()), str(html.get_content())


def raw_headers(message: EmailMessage) -> str:
    return "".join(f"{name}: {value}\n" for name, value in message.items())


# --- reviews emailed ------------------------------------------------------------------------


async def test_each_email_reviewer_gets_one_request_with_every_argument(bot: Bot) -> None:
    approval_id = await bot.pending(
        title="Q3\r\nBcc: mallory@evil.example", body="<script>alert('x')</script> & more"
    )
    await bot.mail.wait_for(lambda: len(bot.mail.received) >= 2)
    by_to = {tuple(r.recipients): r.message for r in bot.mail.received}
    # The Slack user of the group is not emailed; the group's address is, lowercased.
    assert sorted(by_to) == [("ana@example.com",), ("bo@example.com",)]
    record = await bot.served.service.store.get(approval_id)
    tokens = ReplyTokens(WEB_SECRET)
    for (to,), message in by_to.items():
        assert message["To"] == to and message["From"] == "nodbot@example.com"
        subject = str(message["Subject"])
        assert "send_note" in subject and "Notes leave the company" in subject
        assert "\r" not in subject and "\n" not in subject
        assert message["Auto-Submitted"] == "auto-generated"
        assert message["Bcc"] is None and "mallory" not in raw_headers(message)
        local, _, domain = str(message["Reply-To"]).partition("@")
        assert domain == "example.com" and local.startswith("approvals+")
        token = local.removeprefix("approvals+")
        claims = tokens.verify(token, reviewer=to, digest=record.request.digest)
        assert claims.approval_id == approval_id
        assert token in str(message["Message-ID"])
        text, html = parts(message)
        for value in ("Q3", "Bcc: mallory@evil.example", "<script>alert('x')</script> & more"):
            assert value in text
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more" in html
        assert "<script>" not in html
        for said in ("starter", "approve", "deny <reason>", "edit", "name: value"):
            assert said in text
        assert record.request.run_id in text and "Notes leave the company" in html
    assert len(bot.mail.received) == 2  # and nobody twice


async def test_a_decision_is_followed_up_in_each_thread(bot: Bot) -> None:
    approval_id = await bot.pending(title="Hello", body="Thanks for your order")
    await bot.mail.wait_for(lambda: len(bot.mail.received) >= 2)
    requests = {r.recipients[0]: r.message for r in bot.mail.received}
    decided = await bot.client.post(
        f"/approvals/{approval_id}/decide",
        json={"action": "edit", "arguments": {"title": "Hello again"}},
        headers=ANA,
    )
    assert decided.status_code == 200, decided.text
    await bot.mail.wait_for(lambda: len(bot.mail.received) >= 4)
    follow_ups = bot.mail.received[2:]
    assert sorted(r.recipients[0] for r in follow_ups) == ["ana@example.com", "bo@example.com"]
    for received in follow_ups:
        message, request = received.message, requests[received.recipients[0]]
        assert message["In-Reply-To"] == request["Message-ID"]
        assert message["References"] == request["Message-ID"]
        assert message["Message-ID"] != request["Message-ID"]
        assert message["Auto-Submitted"] == "auto-generated"
        text, html = parts(message)
        assert "approved with edits by ana@example.com" in text
        assert "title: Hello again" in text and "Hello again" in html


async def test_a_4xx_answer_is_retried_with_the_same_message_id(bot: Bot) -> None:
    bot.mail.answers = ["451 4.3.0 try again later"]
    await bot.pending(title="Hello", body="Retried")
    await bot.mail.wait_for(lambda: len(bot.mail.accepted()) >= 2)
    [refused] = [r for r in bot.mail.received if r.answer.startswith("451")]
    later = [r for r in bot.mail.accepted() if r.recipients == refused.recipients]
    assert [r.message["Message-ID"] for r in later] == [refused.message["Message-ID"]]


async def test_a_5xx_answer_gives_the_delivery_up(bot: Bot) -> None:
    bot.mail.answers = ["550 5.1.1 no such user", "550 5.1.1 no such user"]
    approval_id = await bot.pending(title="Hello", body="Never arrives")
    given_up = await bot.deliveries(
        approval_id, lambda found: len(found) == 2 and all(d.status == "failed" for d in found)
    )
    assert all("550" in (d.error or "") for d in given_up)
    events = await bot.served.service.store.events(approval_id)
    assert [e.kind for e in events].count("undelivered") == 2
    assert len(bot.mail.received) == 2  # one attempt each: no retry of a 5xx


async def test_long_and_non_ascii_arguments_never_reach_a_header(bot: Bot) -> None:
    long = "Zoë ✓ " + "x" * 5000 + " tail-of-the-long-value"
    await bot.pending(title="Grüße\nSubject: forged", body=long)
    await bot.mail.wait_for(lambda: len(bot.mail.received) >= 2)
    for received in bot.mail.received:
        headers = raw_headers(received.message)
        assert "Grüße" not in headers and "forged" not in headers and "xxxxx" not in headers
        assert "Zo" not in str(received.message["Subject"])
        text, html = parts(received.message)
        assert long in text and "Grüße" in text and "tail-of-the-long-value" in html


async def test_escalate_to_is_emailed_at_escalate_after_and_followed_up(bot: Bot) -> None:
    approval_id = await bot.pending(_tool="send_urgent_note", title="Urgent")
    await bot.mail.wait_for(lambda: len(bot.mail.received) >= 2)
    first, escalated = bot.mail.received
    assert (first.recipients, escalated.recipients) == (["ana@example.com"], ["carl@example.com"])
    assert str(escalated.message["Subject"]).startswith("Escalated: ")
    assert "escalated to you" in parts(escalated.message)[0]
    decided = await bot.client.post(
        f"/approvals/{approval_id}/decide",
        json={"action": "deny", "reason": "not today"},
        headers=ANA,
    )
    assert decided.status_code == 200, decided.text
    await bot.mail.wait_for(lambda: len(bot.mail.received) >= 4)
    follow_ups = {r.recipients[0]: r.message for r in bot.mail.received[2:]}
    assert follow_ups["carl@example.com"]["In-Reply-To"] == escalated.message["Message-ID"]
    assert "denied by ana@example.com" in parts(follow_ups["ana@example.com"])[0]
    assert "Reason: not today" in parts(follow_ups["carl@example.com"])[0]


# --- reply tokens ---------------------------------------------------------------------------


def a_token(expires_in: timedelta = timedelta(hours=1)) -> str:
    return ReplyTokens(WEB_SECRET).issue(
        APPROVAL, "Ana@Example.com", DIGEST, datetime.now(UTC) + expires_in
    )


def test_a_token_fits_a_plus_address_and_survives_case_changes() -> None:
    token = a_token()
    assert len(token) == TOKEN_LENGTH and len(f"approvals+{token}") <= 64
    assert TOKEN_ROOM == TOKEN_LENGTH + 1  # the room `reply_to` is checked to leave, with "+"
    assert token == token.lower() and token.isalnum()
    tokens = ReplyTokens(WEB_SECRET)
    claims = tokens.verify(token.upper(), reviewer="ANA@example.com", digest=DIGEST)
    assert (claims.approval_id, claims.reviewer, claims.digest) == (
        APPROVAL,
        "ana@example.com",
        DIGEST,
    )
    assert tokens.approval_of(token) == APPROVAL


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"reviewer": "bo@example.com"}, "not issued for this reviewer"),
        ({"digest": "cd" * 32}, "not issued for this reviewer"),
        ({"secret": "another-secret-of-16-chars"}, "not issued for this reviewer"),
    ],
)
def test_a_token_for_someone_or_something_else_is_refused(change: dict[str, str], why: str) -> None:
    tokens = ReplyTokens(change.get("secret", WEB_SECRET))
    with pytest.raises(InvalidToken, match=why):
        tokens.verify(
            a_token(),
            reviewer=change.get("reviewer", "ana@example.com"),
            digest=change.get("digest", DIGEST),
        )


def test_a_tampered_token_is_refused() -> None:
    token = a_token()
    tokens = ReplyTokens(WEB_SECRET)
    for at in range(TOKEN_LENGTH - 1):  # the last character holds one unused bit too
        flipped = "a" if token[at] != "a" else "b"
        tampered = token[:at] + flipped + token[at + 1 :]
        with pytest.raises(InvalidToken):
            tokens.verify(tampered, reviewer="ana@example.com", digest=DIGEST)
    for wrong in ("", token[:-1], token + "a", token.replace(token[0], "1", 1), "-" * 45):
        with pytest.raises(InvalidToken, match="not a reply token"):
            tokens.verify(wrong, reviewer="ana@example.com", digest=DIGEST)


def test_an_expired_token_is_refused() -> None:
    token = a_token(timedelta(minutes=5))
    tokens = ReplyTokens(WEB_SECRET)
    later = datetime.now(UTC) + timedelta(minutes=6)
    with pytest.raises(InvalidToken, match="expired"):
        tokens.verify(token, reviewer="ana@example.com", digest=DIGEST, now=later)


def test_tokens_need_a_secret_and_an_approval_id_of_the_stores() -> None:
    with pytest.raises(ValueError, match="signing secret"):
        ReplyTokens("")
    with pytest.raises(ValueError, match="approval id"):
        ReplyTokens(WEB_SECRET).issue("run-1", "a@b.c", DIGEST, datetime.now(UTC))


# --- the email: section ---------------------------------------------------------------------

EMAIL = """
web: {secret: a-web-secret-of-16+}
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp:
    host: smtp.example.com
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "nodbot.yml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    return refused.value.problems


def test_the_email_section_has_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(EMAIL)
    email = load_config(path).email
    assert email is not None
    assert (email.smtp.tls, email.smtp.port_or_default, email.smtp.timeout) == ("starttls", 587, 30)
    assert email.require_authenticated_sender is True and email.inbound is None
    assert email.reply_ttl == 7 * 86400


@pytest.mark.parametrize(
    ("replace", "by", "expected"),
    [
        ("from: nodbot@example.com", "from: a@b.c, c@d.e", "email.from: expected one email"),
        ("from: nodbot@example.com", 'from: "a@b.c\\r\\nBcc: x@y.z"', "email.from: expected one"),
        ("from: nodbot@example.com", "from: Bot <a@b.c>", "email.from: expected one email"),
        ("reply_to: approvals@example.com", "reply_to: a+b@c.d", "email.reply_to: expected the"),
        (
            "reply_to: approvals@example.com",
            f"reply_to: {'a' * 19}@c.d",
            "email.reply_to: at most 18 characters",
        ),
        ("host: smtp.example.com", "host: smtp.example.com\n    tls: ssl", "email.smtp.tls:"),
        (
            "host: smtp.example.com",
            "host: smtp.example.com\n    username: bot",
            "email.smtp.password: username and password go together",
        ),
        ("web: {secret: a-web-secret-of-16+}", "", "email: the email channel needs web.secret"),
    ],
)
def test_the_email_section_is_checked(tmp_path: Path, replace: str, by: str, expected: str) -> None:
    found = problems(tmp_path, EMAIL.replace(replace, by))
    assert len(found) == 1 and expected in found[0], found


def test_the_inbound_keys_are_checked(tmp_path: Path) -> None:
    inbound = (
        "\n  inbound:\n    listen: 127.0.0.1:2525\n    protocol: lmtp\n"
        "    imap: {host: imap.example.com, tls: tls, username: bot, password: pw}\n"
        "  trusted_authserv_id: mx.example.com\n"
    )
    path = tmp_path / "nodbot.yml"
    path.write_text(EMAIL + inbound)
    email = load_config(path).email
    assert email is not None and email.inbound is not None and email.inbound.imap is not None
    assert (email.inbound.protocol, email.inbound.imap.mailbox) == ("lmtp", "INBOX")
    assert (email.inbound.imap.port, email.inbound.imap.poll) == (None, 30)
    found = problems(tmp_path, EMAIL + inbound.replace("127.0.0.1:2525", "localhost"))
    assert len(found) == 1 and "email.inbound.listen: expected host:port" in found[0]
    found = problems(tmp_path, EMAIL + inbound.replace("tls: tls", "tls: starttls"))
    assert len(found) == 1 and "email.inbound.imap.tls: IMAP is read over tls" in found[0]
