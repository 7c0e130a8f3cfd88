"""`respond` end to end, through `nodbot serve` in a process of its own: a reviewer answers in
the tool's place from Slack (the local fake: a Respond button, a modal, signed payloads),
from email (a `respond <answer>` reply handed to the bot's SMTP listener by aiosmtpd) and
from the web inbox (the "Respond instead" form). Each time the run goes on with the
reviewer's text as the refund's result (a normal result, without arguments), and the refund
never runs. Under a rule that does not list `respond`, nothing offers it, and a respond sent
anyway (a forged click, a reply, a posted form) is refused, recorded, and decides nothing.

Then the parts on their own: the rule's check (`rule_refusal`: only a rule that lists
`respond` allows it, and a review made without a rule refuses it), the configuration's
default (no `respond`), and the reply grammar's `respond <answer>`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiosmtplib
import httpx
import pytest

from nodbot.bot.config import load_config
from nodbot.bot.email.reading import Respond, Unclear, command
from nodbot.bot.policy.rules import rule_refusal
from nodbot.bot.web import sign_in_link
from nodbot.core import ApprovalRecord, ApprovalRequest, Decision, arguments_digest
from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_email_end_to_end import ledger, until
from tests.bot.test_email_inbound import TRUSTED, reply
from tests.bot.test_email_outbound import MailServer, mail_server
from tests.fakes.slack import Message, SlackFake, User, interactive_request, slack_fake
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-the-starter-000000000000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
REVIEWER = "ana@example.com"
WEB_SECRET = "web-secret-of-the-respond-test-0001"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
web: {{secret: {web_secret}}}
api:
  tokens:
    - {{name: starter, token: {token}, scopes: [runs:write, approvals:read]}}
agents:
  ledger: tests.bot.ledger_agent:agent
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
  - tool: refund
    when: {{le: {{amount: 100}}}}
    description: A small refund may be answered instead.
    reviewers: [{reviewer}]
    allowed_decisions: [approve, deny, respond]
  - tool: refund
    reviewers: [{reviewer}]
"""

SMALL = "50"
"""An amount under the rule that lists `respond`."""
LARGE = "500"
"""An amount under the rule that does not."""


@dataclass
class Desk:
    """The bot serving, the Slack fake, the mail server, and the reviewer in Slack."""

    bot: Running
    client: httpx.AsyncClient
    slack: SlackFake
    mail: MailServer
    ana: User
    config: Path
    listen_port: int
    tmp_path: Path

    async def start(self, order: str, amount: str) -> tuple[str, str]:
        """A run asking for a refund of `amount` on `order`: its run id and its review."""
        body = {"agent": "ledger", "input": f"refund {order} {amount}"}
        answer = await self.client.post("/runs", json=body, headers=HEADERS)
        assert answer.status_code == 201, answer.text
        run = answer.json()
        [pending] = run["pending"]
        return str(run["run_id"]), str(pending["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=HEADERS)
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def finished(self, run_id: str) -> dict[str, Any]:
        """The run, once it has finished."""

        async def done() -> dict[str, Any] | None:
            found = (await self.client.get(f"/runs/{run_id}", headers=HEADERS)).json()
            return found if found["status"] == "finished" else None

        run: dict[str, Any] = await until(f"run {run_id} finishes", done)
        return run

    async def answered_with(self, run_id: str, approval_id: str, text: str) -> None:
        """The run went on with `text` as the refund's result, and the refund never ran."""
        run = await self.finished(run_id)
        [result] = run["tool_results"]
        assert (result["tool"], result["status"]) == ("refund", "ok")
        assert json.loads(result["content"]) == {"result": text}
        assert result["arguments"] is None  # the tool did not run
        approval = await self.approval(approval_id)
        assert approval["status"] == "denied" and approval["outcome"] == "denied"
        assert approval["decision"]["response"] == text
        [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
        assert decided["detail"]["action"] == "respond"
        assert decided["detail"]["response"] == text

    async def refused(self, approval_id: str, channel: str) -> dict[str, Any]:
        """The review's refused event of `channel`, once there is one; the review waits on."""

        async def found() -> dict[str, Any] | None:
            events = (await self.approval(approval_id))["events"]
            refusals = [e for e in events if e["kind"] == "refused" and e["channel"] == channel]
            return refusals[-1] if refusals else None

        event: dict[str, Any] = await until(f"a {channel} refusal on {approval_id}", found)
        assert "may not be decided with 'respond'" in event["detail"]["reason"]
        approval = await self.approval(approval_id)
        assert approval["status"] == "pending" and approval["decision"] is None
        return event

    # --- Slack ---------------------------------------------------------------------------------

    async def posted(self, approval_id: str) -> Message:
        """The review's message in Ana's direct messages."""

        def found() -> Message | None:
            for message in self.slack.messages(self.ana):
                if message.thread_ts is None and approval_id in json.dumps(message.blocks):
                    return message
            return None

        message: Message = await until(f"the Slack message of {approval_id}", found)
        return message

    async def send(self, payload: dict[str, Any]) -> httpx.Response:
        """An interactive payload, posted to the bot as Slack does (signed)."""
        body, headers = interactive_request(payload, self.slack.signing_secret)
        return await self.client.post("/slack/events", content=body, headers=headers)

    # --- email ---------------------------------------------------------------------------------

    async def emailed(self, approval_id: str) -> EmailMessage:
        """The review request Ana was emailed."""

        def found() -> EmailMessage | None:
            for received in self.mail.received:
                body = str(received.message.get_body(("plain",)))
                # "How to decide": the request, not a follow-up.
                if received.recipients == [REVIEWER] and approval_id in body and "How to" in body:
                    return received.message
            return None

        message: EmailMessage = await until(f"the request email of {approval_id}", found)
        return message

    async def reply(self, request: EmailMessage, text: str) -> None:
        """Ana's reply to `request`, handed to the bot's SMTP listener."""
        await aiosmtplib.send(
            reply(request, sender=REVIEWER, text=text),
            sender=REVIEWER,
            recipients=[str(request["Reply-To"])],
            hostname="127.0.0.1",
            port=self.listen_port,
        )

    def answers(self, approval_id: str) -> list[str]:
        """The texts of the bot's answers to Ana's replies on the review."""
        texts = [
            str(r.message.get_content())
            for r in self.mail.received
            if r.message["Auto-Submitted"] == "auto-replied"
        ]
        return [text for text in texts if approval_id in text]

    # --- the inbox -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def browser(self) -> AsyncIterator[httpx.AsyncClient]:
        """A browser signed in to the inbox as Ana."""
        link = sign_in_link(load_config(self.config), REVIEWER, base=self.bot.url)
        async with httpx.AsyncClient(base_url=self.bot.url) as browser:
            answer = await browser.get(link)
            assert answer.status_code == 303, answer.text
            yield browser


@pytest.fixture
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    async with slack_fake() as slack, mail_server() as mail:
        ana = slack.add_user("ana", email=REVIEWER)
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
            )
        )
        environment = {"NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt")}
        async with (
            nodbot_serve(config, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            yield Desk(bot, client, slack, mail, ana, config, listen_port, tmp_path)


def actions_of(message: Message) -> list[str]:
    return [e["action_id"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]]


SLACK_ANSWER = "Refunds are paused until Monday: tell the customer it is queued <!channel>."
MAIL_ANSWER = "The order ships tomorrow; no refund is needed.\nSay sorry for the delay."
WEB_ANSWER = "Offer a voucher of 20 instead; we do not refund this product."


async def test_a_respond_from_slack_email_and_the_inbox_answers_in_the_tools_place(
    desk: Desk,
) -> None:
    # 1. Slack: Respond opens a modal; its answer is the refund's result.
    run_id, approval_id = await desk.start("slack-1", SMALL)
    message = await desk.posted(approval_id)
    assert actions_of(message) == ["nodbot.approve", "nodbot.deny", "nodbot.respond"]
    clicked = await desk.send(desk.slack.click(message, "nodbot.respond", desk.ana))
    assert clicked.status_code == 200, clicked.text
    await desk.slack.wait_until(lambda: bool(desk.slack.views), 10, "the respond modal")
    view = desk.slack.views[-1]
    assert view.callback_id == "nodbot.respond"
    empty = await desk.send(desk.slack.submit(view, desk.ana, {"response": {"value": "  "}}))
    assert empty.json()["response_action"] == "errors"  # the modal stays open
    assert (await desk.approval(approval_id))["decision"] is None
    submitted = await desk.send(
        desk.slack.submit(view, desk.ana, {"response": {"value": SLACK_ANSWER}})
    )
    assert submitted.status_code == 200, submitted.text
    await desk.answered_with(run_id, approval_id, SLACK_ANSWER)
    await desk.slack.wait_until(lambda: bool(message.updates), 10, "the message's update")
    shown = json.dumps(message.blocks, ensure_ascii=False)
    assert f"*Answered* by <@{desk.ana.id}>" in shown and actions_of(message) == []
    assert "&lt;!channel&gt;" in shown and "<!channel>" not in shown  # escaped for Slack

    # 2. Email: a "respond" reply; its lines are the answer.
    run_id, approval_id = await desk.start("mail-1", SMALL)
    request = await desk.emailed(approval_id)
    assert "respond <answer>" in str(request.get_body(("plain",)))
    await desk.reply(request, f"respond {MAIL_ANSWER}")
    await desk.answered_with(run_id, approval_id, MAIL_ANSWER)
    [answer] = await until("the answer to the reply", lambda: desk.answers(approval_id))
    assert "Your reply answered, in the tool's place, the call of refund" in answer

    # 3. The inbox: the "Respond instead" form.
    run_id, approval_id = await desk.start("web-1", SMALL)
    async with desk.browser() as browser:
        page = await browser.get(f"/inbox/approvals/{approval_id}")
        assert page.status_code == 200, page.text
        assert 'id="decide-respond"' in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        form = {"csrf": csrf.group(1), "action": "respond"}
        blank = await browser.post(
            f"/inbox/approvals/{approval_id}/decide", data={**form, "response": " "}
        )
        assert blank.status_code == 422 and "nothing was recorded" in blank.text
        sent = await browser.post(
            f"/inbox/approvals/{approval_id}/decide", data={**form, "response": WEB_ANSWER}
        )
        assert sent.status_code == 303, sent.text
        await desk.answered_with(run_id, approval_id, WEB_ANSWER)
        after = await browser.get(f"/inbox/approvals/{approval_id}")
        assert "answered" in after.text and WEB_ANSWER in after.text
        assert 'id="decide-respond"' not in after.text

    assert ledger(desk.tmp_path) == []  # no refund ever ran


async def test_a_rule_without_respond_offers_none_and_refuses_one_on_every_channel(
    desk: Desk,
) -> None:
    # Slack: no Respond button; a forged click of one is refused and recorded.
    _, by_slack = await desk.start("slack-2", LARGE)
    message = await desk.posted(by_slack)
    assert actions_of(message) == ["nodbot.approve", "nodbot.edit", "nodbot.deny"]
    forged = desk.slack.click(message, "nodbot.deny", desk.ana)
    forged["actions"][0]["action_id"] = "nodbot.respond"
    answer = await desk.send(forged)
    assert answer.status_code == 200, answer.text
    await desk.refused(by_slack, "slack")
    told = await until("Ana is told", lambda: desk.slack.ephemerals)
    assert "may not be decided with 'respond'" in told[-1].text
    assert not desk.slack.views  # no modal was opened

    # Email: no respond line in the request; a respond reply is refused and answered so.
    _, by_mail = await desk.start("mail-2", LARGE)
    request = await desk.emailed(by_mail)
    assert "respond <answer>" not in str(request.get_body(("plain",)))
    await desk.reply(request, "respond It is fine, tell them later.")
    await desk.refused(by_mail, "email")
    [said] = await until("the answer to the reply", lambda: desk.answers(by_mail))
    assert "decided nothing" in said and "respond <answer>" not in said

    # The inbox: no form; one posted anyway is refused (403) and recorded.
    _, by_web = await desk.start("web-2", LARGE)
    async with desk.browser() as browser:
        page = await browser.get(f"/inbox/approvals/{by_web}")
        assert page.status_code == 200 and 'id="decide-respond"' not in page.text
        assert "Respond" not in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        posted = await browser.post(
            f"/inbox/approvals/{by_web}/decide",
            data={"csrf": csrf.group(1), "action": "respond", "response": WEB_ANSWER},
        )
        assert posted.status_code == 403, posted.text
    await desk.refused(by_web, "web")

    assert ledger(desk.tmp_path) == []


# --- the parts: the rule's say, the configuration, the reply grammar ------------------------


def review(allowed: list[str] | None) -> ApprovalRecord:
    """A pending review whose rule allows `allowed` (None: a review made without a rule)."""
    arguments = {"order_id": "o-1", "amount": 50}
    policy = {} if allowed is None else {"allowed_decisions": allowed}
    asked = ApprovalRequest(
        "run", "c1", "refund", arguments, arguments_digest(arguments), policy=policy
    )
    return ApprovalRecord("apr_1", asked, datetime.now(UTC))


ANSWERING = Decision(approved=False, response="queued", decided_by="ana")


@pytest.mark.parametrize(
    ("allowed", "refusal"),
    [
        (["approve", "deny", "respond"], None),
        (["respond"], None),
        (["approve", "edit", "deny"], "allowed: approve, edit, deny"),
        (None, "allowed: approve, edit, deny"),  # no rule: not allowed (fail closed)
    ],
)
def test_only_a_rule_that_lists_respond_allows_it(
    allowed: list[str] | None, refusal: str | None
) -> None:
    found = rule_refusal(review(allowed), ANSWERING)
    if refusal is None:
        assert found is None
    else:
        assert found is not None and "may not be decided with 'respond'" in found
        assert refusal in found
    # A deny is as it always was: allowed unless the rule leaves it out.
    denied = Decision(approved=False, decided_by="ana")
    assert (rule_refusal(review(allowed), denied) is None) == (allowed != ["respond"])


def test_respond_is_listed_by_choice_and_never_by_default(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "rules:\n"
        "  - {tool: a, reviewers: [U0123ABCDE]}\n"
        "  - {tool: b, reviewers: [U0123ABCDE], allowed_decisions: [approve, respond]}\n"
    )
    first, second = load_config(path).rules
    assert first.allowed_decisions == ["approve", "edit", "deny"]
    assert second.allowed_decisions == ["approve", "respond"]


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("respond It ships tomorrow.", "It ships tomorrow."),
        ("Respond: it ships tomorrow", "it ships tomorrow"),
        (
            "respond\nIt ships tomorrow.\nApprove the next one.",
            "It ships tomorrow.\nApprove the next one.",
        ),
        ("RESPOND - deny nothing, just wait", "deny nothing, just wait"),
    ],
)
def test_a_respond_reply_gives_its_line_and_the_lines_below(text: str, answer: str) -> None:
    said = command(text, editable=[])
    assert isinstance(said, Respond) and said.text == answer


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("respond", "respond_empty"),
        ("respond  \n\n", "respond_empty"),
        ("respond x\napprove", "two_commands"),
    ],
)
def test_a_respond_reply_without_an_answer_or_with_another_decision_decides_nothing(
    text: str, problem: str
) -> None:
    said = command(text, editable=[])
    assert isinstance(said, Unclear) and said.problem == problem
