"""Questions to a person end to end, through `nodbot serve` in a process of its own.

The bot hosts an agent whose tools ask before they act (`tests/bot/asking_agent.py`): `ship`
asks which warehouse (choices), `note` what to write on the parcel (free text). A run pauses
on the question; the question is posted in Slack (the local fake over HTTP, payloads signed
as Slack signs them), emailed (aiosmtpd) and listed in the inbox. The bot is stopped while
the question waits and started again: nothing is lost or posted twice, and the answer given
then (a Slack button; an email reply; the inbox form) resumes the run with the same run id
and call id, the tool getting past its question exactly once, with that answer. A decline
ends the call without the tool's work, and a person who is not asked is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiosmtplib
import httpx
import pytest

from nodbot.bot.config import load_config
from nodbot.bot.web import sign_in_link
from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_cli import nodbot
from tests.bot.test_email_end_to_end import ledger, until
from tests.bot.test_email_inbound import TRUSTED, reply
from tests.bot.test_email_outbound import MailServer, mail_server
from tests.fakes.slack import Message, SlackFake, User, interactive_request, slack_fake
from tests.support import free_port

TOKEN = "token-of-the-question-starter-0000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
REVIEWER = "ana@example.com"
STRANGER = "eve@example.com"
WEB_SECRET = "web-secret-of-the-question-test-01"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: {port}}}
workers: {{poll: 0.2}}
web: {{secret: {web_secret}, public_url: "http://127.0.0.1:{port}"}}
api:
  tokens:
    - {{name: starter, token: {token}, scopes: [runs:write, approvals:read]}}
agents:
  asker: tests.bot.asking_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {smtp_port}, tls: none, timeout: 5}}
  trusted_authserv_id: {trusted}
  inbound:
    listen: 127.0.0.1:{listen_port}
    protocol: smtp
rules:
  - tool: ask
    description: Shipping questions go to the warehouse lead.
    reviewers: [{reviewer}]
"""


@dataclass
class Desk:
    """The Slack fake, the mail server, the configuration; the bot while it runs."""

    slack: SlackFake
    mail: MailServer
    ana: User
    eve: User
    config: Path
    listen_port: int
    tmp_path: Path
    bot: Running | None = None
    client: httpx.AsyncClient | None = None
    starts: int = field(default=0)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[httpx.AsyncClient]:
        """`nodbot serve` in a process of its own, for the block's length."""
        environment = {"NODBOT_TEST_LEDGER": str(self.tmp_path / "ledger.txt")}
        self.starts += 1
        async with (
            nodbot_serve(self.config, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            self.bot, self.client = bot, client
            try:
                yield client
            finally:
                self.bot = self.client = None

    @property
    def api(self) -> httpx.AsyncClient:
        assert self.client is not None, "the bot is not serving"
        return self.client

    async def start(self, text: str) -> tuple[str, str]:
        """A run of the asking agent on `text`: its run id, and the question it waits on."""
        answer = await self.api.post(
            "/runs", json={"agent": "asker", "input": text}, headers=HEADERS
        )
        assert answer.status_code == 201, answer.text
        run = answer.json()
        assert run["status"] == "waiting", run
        [pending] = run["pending"]
        return str(run["run_id"]), str(pending["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.api.get(f"/approvals/{approval_id}", headers=HEADERS)
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def finished(self, run_id: str) -> dict[str, Any]:
        async def done() -> dict[str, Any] | None:
            found = (await self.api.get(f"/runs/{run_id}", headers=HEADERS)).json()
            return found if found["status"] in {"finished", "failed"} else None

        run: dict[str, Any] = await until(f"run {run_id} finishes", done)
        assert run["status"] == "finished", run
        return run

    async def answered_with(self, run_id: str, approval_id: str, answer: str, result: str) -> None:
        """The run went on once the question was answered `answer`, and the tool's result
        is `result`."""
        run = await self.finished(run_id)
        [tool] = run["tool_results"]
        assert tool["status"] == "ok", tool
        assert json.loads(tool["content"]) == {"result": result}
        approval = await self.approval(approval_id)
        assert approval["decision"]["response"] == answer
        [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
        assert decided["detail"]["action"] == "respond"
        assert decided["actor"] and decided["person"]

    # --- Slack ---------------------------------------------------------------------------------

    def posted(self, approval_id: str) -> list[Message]:
        return [
            message
            for message in self.slack.messages(self.ana)
            if message.thread_ts is None and approval_id in json.dumps(message.blocks)
        ]

    async def send(self, payload: dict[str, Any]) -> httpx.Response:
        body, headers = interactive_request(payload, self.slack.signing_secret)
        return await self.api.post("/slack/events", content=body, headers=headers)

    # --- email ---------------------------------------------------------------------------------

    def emailed(self, approval_id: str) -> list[EmailMessage]:
        """The question's request emails to Ana."""
        return [
            received.message
            for received in self.mail.received
            if received.recipients == [REVIEWER]
            and received.message["Auto-Submitted"] != "auto-replied"
            and approval_id in str(received.message.get_body(("plain",)))
            and str(received.message["Subject"]).startswith("Question")
        ]

    async def reply(self, request: EmailMessage, text: str, sender: str = REVIEWER) -> None:
        await aiosmtplib.send(
            reply(request, sender=sender, text=text),
            sender=sender,
            recipients=[str(request["Reply-To"])],
            hostname="127.0.0.1",
            port=self.listen_port,
        )

    # --- the inbox -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def browser(self, who: str = REVIEWER) -> AsyncIterator[httpx.AsyncClient]:
        assert self.bot is not None
        link = sign_in_link(load_config(self.config), who, base=self.bot.url)
        async with httpx.AsyncClient(base_url=self.bot.url) as browser:
            answer = await browser.get(link)
            assert answer.status_code == 303, answer.text
            yield browser


@pytest.fixture
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    async with slack_fake() as slack, mail_server() as mail:
        ana = slack.add_user("ana", email=REVIEWER)
        eve = slack.add_user("eve", email=STRANGER)
        listen_port = free_port()
        config = tmp_path / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                web_secret=WEB_SECRET,
                token=TOKEN,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                smtp_port=mail.port,
                trusted=TRUSTED,
                listen_port=listen_port,
                reviewer=REVIEWER,
                port=free_port(),
            )
        )
        yield Desk(slack, mail, ana, eve, config, listen_port, tmp_path)


def actions_of(message: Message) -> list[str]:
    return [e["action_id"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]]


async def test_a_question_waits_through_a_restart_and_is_answered_in_slack(desk: Desk) -> None:
    async with desk.serving():
        run_id, approval_id = await desk.start("ship A1")
        question = await desk.approval(approval_id)
        assert question["status"] == "pending"
        assert question["tool"] == "ask"
        assert question["arguments"]["question"] == "Which warehouse ships order A1?"
        [message] = await until("the question in Slack", lambda: desk.posted(approval_id))
        assert actions_of(message) == [
            "nodbot.answer.0",
            "nodbot.answer.1",
            "nodbot.decline",
            "nodbot.open",
        ]
        assert "Which warehouse ships order A1?" in json.dumps(message.blocks)
        await until("the question by email", lambda: desk.emailed(approval_id))

    # Stopped while the question waits: nothing ran past the question.
    assert ledger(desk.tmp_path) == []

    async with desk.serving():
        question = await desk.approval(approval_id)
        assert question["status"] == "pending"
        # Someone not asked clicks: refused, recorded, nothing decided.
        stranger = await desk.send(desk.slack.click(message, "nodbot.answer.0", desk.eve))
        assert stranger.status_code == 200, stranger.text

        async def refused() -> bool:
            events = (await desk.approval(approval_id))["events"]
            return any(e["kind"] == "refused" for e in events)

        await until("the stranger's click is refused", refused)
        assert (await desk.approval(approval_id))["decision"] is None

        clicked = await desk.send(desk.slack.click(message, "nodbot.answer.1", desk.ana))
        assert clicked.status_code == 200, clicked.text
        await desk.answered_with(run_id, approval_id, "Porto", "A1 ships from Porto")
        await desk.slack.wait_until(lambda: bool(message.updates), 10, "the message's update")
        assert actions_of(message) == []
        assert "Porto" in json.dumps(message.blocks)

        # Posted and emailed once, across the restart; the tool got past its question once.
        assert len(desk.posted(approval_id)) == 1
        assert len(desk.emailed(approval_id)) == 1
    assert ledger(desk.tmp_path) == ["A1 Porto"]
    assert desk.starts == 2
    # The question's events (created, the refusal, voted, decided, consumed) are chained
    # as a review's are, across the restart.
    audited = await asyncio.to_thread(
        subprocess.run,
        [nodbot(), "audit", "verify", "--config", str(desk.config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert audited.returncode == 0, audited.stderr
    assert audited.stdout.startswith("ok: ") and audited.stdout.endswith(" in 1 review\n")


def link_in(request: EmailMessage) -> str:
    """The signed link of a question's email (it opens the answer form)."""
    part = request.get_body(("plain",))
    assert part is not None
    body = str(part.get_content())
    found = re.search(r"(http://\S+/inbox/review\?token=[^\s]+)", body)
    assert found is not None, body
    return found.group(1)


async def test_a_free_text_question_is_answered_by_an_email_reply(desk: Desk) -> None:
    async with desk.serving():
        run_id, approval_id = await desk.start("note B2")
        [request] = await until("the question by email", lambda: desk.emailed(approval_id))
        body = str(request.get_body(("plain",)))
        assert "What should the parcel of order B2 say?" in body
        assert "approve" not in body.lower()

    async with desk.serving():  # restarted while the question waits
        # A reply from someone not asked, on Ana's reply address: refused, recorded.
        await desk.reply(request, "Handle with care", sender=STRANGER)

        async def refused() -> bool:
            events = (await desk.approval(approval_id))["events"]
            return any(e["kind"] == "refused" and e["channel"] == "email" for e in events)

        await until("the stranger's reply is refused", refused)
        assert (await desk.approval(approval_id))["decision"] is None

        await desk.reply(request, "Fragile: glass inside\n\nThanks")
        await desk.answered_with(
            run_id, approval_id, "Fragile: glass inside", "B2: Fragile: glass inside"
        )
        assert len(desk.emailed(approval_id)) == 1
    assert ledger(desk.tmp_path) == ["B2 Fragile: glass inside"]


async def test_a_question_is_answered_in_the_inbox_from_its_emails_link(desk: Desk) -> None:
    async with desk.serving():
        run_id, approval_id = await desk.start("ship C3")
        [request] = await until("the question by email", lambda: desk.emailed(approval_id))
        link = link_in(request)

    async with desk.serving():  # restarted while the question waits
        assert desk.bot is not None
        async with httpx.AsyncClient() as browser:
            signed_in = await browser.get(link, follow_redirects=True)
            assert signed_in.status_code == 200, signed_in.text
            page = signed_in.text
            assert "Which warehouse ships order C3?" in page
            assert 'id="decide-answer"' in page and 'id="decide-decline"' in page
            assert 'value="approve"' not in page
            csrf = re.search(r'name="csrf" value="([^"]+)"', page)
            assert csrf is not None
            url = f"{desk.bot.url}/inbox/approvals/{approval_id}/decide"
            form = {"csrf": csrf.group(1), "action": "respond"}
            wrong = await browser.post(url, data={**form, "response": "Paris"})
            assert wrong.status_code == 422
            assert (await desk.approval(approval_id))["decision"] is None
            sent = await browser.post(url, data={**form, "response": "Leeds"})
            assert sent.status_code == 303, sent.text
        await desk.answered_with(run_id, approval_id, "Leeds", "C3 ships from Leeds")
        # Slack's message of the question is updated too, and its buttons gone.
        [message] = desk.posted(approval_id)
        await desk.slack.wait_until(lambda: bool(message.updates), 10, "the message's update")
        assert actions_of(message) == []
    assert ledger(desk.tmp_path) == ["C3 Leeds"]


async def test_a_declined_question_ends_the_call_without_the_tools_work(desk: Desk) -> None:
    async with desk.serving():
        run_id, approval_id = await desk.start("ship D4")
        [message] = await until("the question in Slack", lambda: desk.posted(approval_id))
        clicked = await desk.send(desk.slack.click(message, "nodbot.decline", desk.ana))
        assert clicked.status_code == 200, clicked.text
        await desk.slack.wait_until(lambda: bool(desk.slack.views), 10, "the decline modal")
        view = desk.slack.views[-1]
        reason = {"reason": {"value": "ask the customer first"}}
        submitted = await desk.send(desk.slack.submit(view, desk.ana, reason))
        assert submitted.status_code == 200, submitted.text
        run = await desk.finished(run_id)
        [tool] = run["tool_results"]
        assert tool["status"] == "error"
        assert "ask the customer first" in tool["content"]
    assert ledger(desk.tmp_path) == []
