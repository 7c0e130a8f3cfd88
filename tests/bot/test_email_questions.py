"""Questions by email: a bot served in-process (`bot.serve.serving`) emails a question to the
people of the rule for `ask` through a real SMTP server (aiosmtpd on a loopback port 0), and
their replies, POSTed to `/email/inbound`, answer it: a choice by its number or its text, a
free-text answer by its first line, `decline <reason>`; anything else is refused with help
and records nothing. The run goes on with the answer, and everyone emailed hears the outcome
in the question's thread.

The agents: `tests.bot.asking_agent` (`ship A1`: Leeds or Porto; `note A1`: free text) and
this module's `agent`, whose run asks the question its input gives (a JSON object), so a
test chooses what people read.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.config import load_config
from nodbot.bot.email.channel import EmailChannel
from nodbot.bot.email.questions import answer_command, reply_answer
from nodbot.bot.email.reading import Deny, Respond, Unclear
from nodbot.bot.email.tokens import ReplyTokens
from nodbot.bot.outbox import Dispatcher
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.serve import Served
from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    SqlApprovalStore,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolSpec,
)
from tests.bot import asking_agent as asking
from tests.bot.test_email_hidden import both
from tests.bot.test_email_inbound import TRUSTED, reply
from tests.bot.test_email_outbound import MailServer, emailing, mail_server, raw_headers
from tests.bot.test_email_outbound import parts as raw_parts

ROOT = Path(__file__).resolve().parents[2]
WEB_SECRET = "web-secret-for-email-questions-1"
STARTER = {"Authorization": "Bearer token-of-starter-000"}
INGEST = {"Authorization": "Bearer token-of-mailhook-00"}
ANA, BO = "ana@example.com", "bo@example.com"
CHOICES = ("Leeds", "Porto")

# --- an agent that asks what its input says ---------------------------------------------------

tools = ToolRegistry()


@tools.tool()
async def consult(question: str, ctx: ToolContext, choices: list[str] | None = None) -> str:
    """Ask a person the question given, and return the answer."""
    return await ctx.ask(question, choices=choices)


class ConsultChat:
    """Calls `consult` with the run's input (a JSON object) as its arguments, then says what
    it was answered."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        [asked] = [m for m in messages if isinstance(m, HumanMessage)]
        call = ToolCall(id="call_1", name="consult", arguments=json.loads(asked.content))
        return ChatResponse(tool_calls=[call])


agent = Agent(ConsultChat(), tools)

# --- a bot that asks by email -------------------------------------------------------------------

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
  asker: tests.bot.asking_agent:agent
  consult: tests.bot.test_email_questions:agent
rules:
  - tool: ask
    description: The agent needs a person's word
    reviewers: [ana@example.com, bo@example.com]
    timeout: {deadline}
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

    async def ask(
        self, agent: str, given: str, *, to: int = 2
    ) -> tuple[str, str, dict[str, EmailMessage]]:
        """A new run of `agent` with the input `given`: its run id, the question's approval
        id, and the question each of the `to` people was emailed."""
        run = await self.client.post(
            "/runs", json={"agent": agent, "input": given}, headers=STARTER
        )
        assert run.status_code == 201, run.text
        [pending] = run.json()["pending"]
        approval_id = str(pending["approval_id"])

        def requests() -> dict[str, EmailMessage]:
            return {
                r.recipients[0]: r.message
                for r in self.mail.received
                if r.message["In-Reply-To"] is None and approval_id in text_of(r.message)
            }

        await self.mail.wait_for(lambda: len(requests()) >= to)
        return str(run.json()["run_id"]), approval_id, requests()

    async def post(self, raw: bytes) -> dict[str, Any]:
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

    async def run(self, run_id: str) -> dict[str, Any]:
        """The run once it has finished (10 s at most)."""
        answer = await self.client.get(f"/runs/{run_id}?wait=10", headers=STARTER)
        found: dict[str, Any] = answer.json()
        assert found["status"] == "finished", found
        return found

    async def to(self, address: str, done: Any) -> EmailMessage:
        """The first message to `address` that `done` accepts, once it has come."""

        def found() -> EmailMessage | None:
            for received in self.mail.received:
                if received.recipients == [address] and done(received.message):
                    return received.message
            return None

        await self.mail.wait_for(lambda: found() is not None)
        message = found()
        assert message is not None
        return message


@contextlib.asynccontextmanager
async def email_bot(tmp_path: Path, *, deadline: str = "1h") -> AsyncIterator[Bot]:
    def config(port: int) -> str:
        return CONFIG.format(
            db=tmp_path / "nodbot.db",
            web_secret=WEB_SECRET,
            port=port,
            trusted=TRUSTED,
            deadline=deadline,
        )

    async with emailing(tmp_path, config) as (served, client, mail):
        yield Bot(served, client, mail)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with email_bot(tmp_path) as running:
        yield running


def parts(message: EmailMessage) -> tuple[str, str]:
    """The text and the HTML of a message, with its lines ended by LF."""
    text, html = raw_parts(message)
    return text.replace("\r\n", "\n"), html.replace("\r\n", "\n")


def result_of(run: dict[str, Any]) -> Any:
    """What the run's one tool call returned."""
    [result] = run["tool_results"]
    assert result["status"] == "ok", result
    return json.loads(result["content"])["result"]


def text_of(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content()).replace("\r\n", "\n")


def is_answer(message: EmailMessage) -> bool:
    """The bot's answer to a reply (not a request or an outcome)."""
    return str(message["Auto-Submitted"]) == "auto-replied"


def is_outcome(message: EmailMessage) -> bool:
    return message["In-Reply-To"] is not None and str(message["Auto-Submitted"]) == "auto-generated"


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


# --- the question's email ---------------------------------------------------------------------


async def test_a_question_is_emailed_with_its_choices_numbered(bot: Bot) -> None:
    run_id, approval_id, emailed = await bot.ask("asker", "ship A1")
    assert sorted(emailed) == [ANA, BO]
    message = emailed[ANA]
    assert message["Subject"] == "Question: Which warehouse ships order A1?"
    assert message["To"] == ANA and str(message["Reply-To"]).startswith("approvals+")
    text, html = parts(message)
    assert "Which warehouse ships order A1?" in text
    assert "  1. Leeds\n  2. Porto\n" in text
    assert "<li>Leeds</li>" in html and "<li>Porto</li>" in html and "<ol>" in html
    assert "Reply with the number or the choice" in text
    assert "decline <reason>" in text and "decline &lt;reason&gt;" in html
    assert f"the tool ship, in run {run_id}, started by starter" in text
    assert f"Question: {approval_id}" in text
    assert "Answer by: 20" in text and "it is declined" in text  # the deadline, one hour on
    assert "/inbox/review?token=" in text and f"/inbox/approvals/{approval_id}" in text
    for part in (text, html):
        assert not words(part) & {"approve", "approved", "edit", "edited", "respond"}, part


async def test_a_free_text_question_asks_for_the_answer_on_the_first_line(bot: Bot) -> None:
    _, _, emailed = await bot.ask("asker", "note A1")
    text, html = parts(emailed[BO])
    assert emailed[BO]["Subject"] == "Question: What should the parcel of order A1 say?"
    assert "Reply with your answer on the first line" in text
    assert "Choices" not in text and "<ol>" not in html


async def test_a_question_reaches_no_header_and_no_html_unescaped(bot: Bot) -> None:
    question = (
        "Ship it?\r\nBcc: mallory@evil.example\nSubject: injected\n"
        "<script>alert('x')</script> & <b>bold</b>"
    )
    choices = ["<i>Leeds</i>", "Porto & co"]
    given = json.dumps({"question": question, "choices": choices})
    _, approval_id, emailed = await bot.ask("consult", given)
    for message in emailed.values():
        subject = str(message["Subject"])
        assert subject == "Question: Ship it?"
        headers = raw_headers(message)
        assert "mallory" not in headers and "injected" not in headers and "<script" not in headers
        assert message["Bcc"] is None and len(message.get_all("Subject") or []) == 1
        text, html = parts(message)
        assert "<script>alert('x')</script> & <b>bold</b>" in text
        assert "<script" not in html and "<b>bold" not in html and "<i>Leeds" not in html
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &lt;b&gt;bold" in html
        assert "<li>&lt;i&gt;Leeds&lt;/i&gt;</li>" in html and "Porto &amp; co" in html
    # A reply names a choice written with markup by its text, as the question spells it.
    raw = reply(emailed[ANA], sender=ANA, text="<i>leeds</i>")
    assert (await bot.post(raw))["status"] == "decided"
    assert (await bot.approval(approval_id))["decision"]["response"] == "<i>Leeds</i>"


# --- answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("said", ["2", "porto", "Porto.", "  PORTO  ", "2. Porto", "answer: 2"])
async def test_a_reply_naming_porto_answers_porto(bot: Bot, said: str) -> None:
    run_id, approval_id, emailed = await bot.ask("asker", "ship A1")
    outcome = await bot.post(reply(emailed[ANA], sender=ANA, text=f"{said}\n\nAna"))
    assert outcome["status"] == "decided", outcome
    approval = await bot.approval(approval_id)
    assert approval["status"] == "denied"  # in store terms: answered (a respond)
    assert approval["decision"]["response"] == "Porto"
    assert approval["decision"]["decided_by"] == ANA
    [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
    assert decided["channel"] == "email"
    run = await bot.run(run_id)
    assert result_of(run) == "A1 ships from Porto"


async def test_everyone_emailed_hears_the_answer_and_the_replier_is_told(bot: Bot) -> None:
    _, approval_id, emailed = await bot.ask("asker", "ship A1")
    await bot.post(reply(emailed[ANA], sender=ANA, text="1"))
    for address in (ANA, BO):
        outcome = await bot.to(address, is_outcome)
        assert outcome["Subject"] == "Re: Question: Which warehouse ships order A1? - answered"
        assert outcome["In-Reply-To"] == emailed[address]["Message-ID"]
        text, html = parts(outcome)
        assert f"Answered by {ANA}: Leeds\n" in text
        assert "Answered</strong> by ana@example.com" in html and ">Leeds</pre>" in html
        assert not words(text) & {"approved", "denied"}
    answer = text_of(await bot.to(ANA, is_answer))
    assert 'Your reply answered the question "Which warehouse ships order A1?"' in answer
    assert "\n  Leeds\n" in answer and approval_id in answer


async def test_a_free_text_reply_answers_with_its_first_line(bot: Bot) -> None:
    run_id, approval_id, emailed = await bot.ask("asker", "note A1")
    text = "Fragile: this side up\nThanks,\nBo"
    assert (await bot.post(reply(emailed[BO], sender=BO, text=text)))["status"] == "decided"
    approval = await bot.approval(approval_id)
    assert approval["decision"]["response"] == "Fragile: this side up"
    run = await bot.run(run_id)
    assert result_of(run) == "A1: Fragile: this side up"


async def test_decline_declines_with_its_reason(bot: Bot) -> None:
    run_id, approval_id, emailed = await bot.ask("asker", "ship A1")
    outcome = await bot.post(reply(emailed[ANA], sender=ANA, text="decline too late"))
    assert outcome["status"] == "decided"
    approval = await bot.approval(approval_id)
    assert approval["status"] == "denied"
    assert approval["decision"]["reason"] == "too late"
    assert approval["decision"]["response"] is None
    run = await bot.run(run_id)
    [result] = run["tool_results"]
    assert result["status"] == "error" and "was not answered: too late" in result["content"]
    for address in (ANA, BO):
        told = await bot.to(address, is_outcome)
        assert told["Subject"] == "Re: Question: Which warehouse ships order A1? - declined"
        assert f"Declined by {ANA}: too late\n" in text_of(told)
    assert "Your reply declined the question" in text_of(await bot.to(ANA, is_answer))


@pytest.mark.parametrize("said", ["7", "Paris", "0", "approve", "Leeds or Porto", "answer: Rome"])
async def test_a_reply_naming_no_choice_is_refused_with_help(bot: Bot, said: str) -> None:
    _, approval_id, emailed = await bot.ask("asker", "ship A1")
    outcome = await bot.post(reply(emailed[ANA], sender=ANA, text=said))
    assert outcome["status"] == "refused" and outcome["answered"] is True
    assert "names none of the choices" in outcome["reason"]
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending" and approval["decision"] is None
    [refused] = [e for e in approval["events"] if e["kind"] == "refused"]
    assert refused["actor"] == ANA and said[:20] in refused["detail"]["reason"]
    help_text = text_of(await bot.to(ANA, is_answer))
    assert "Your reply answered nothing on the question" in help_text
    how = help_text.partition("To answer, reply")[2]
    assert "  1. Leeds\n  2. Porto\n" in how and "decline <reason>" in how
    assert not words(how) & {"approve", "edit", "respond"}
    # Nothing was used up: a reply with a choice still answers.
    answered = await bot.post(reply(emailed[ANA], sender=ANA, text="Leeds"))
    assert answered["status"] == "decided"


async def test_a_free_text_answer_over_the_limit_is_refused(bot: Bot) -> None:
    _, approval_id, emailed = await bot.ask("asker", "note A1")
    outcome = await bot.post(reply(emailed[ANA], sender=ANA, text="x" * 2_001))
    assert outcome["status"] == "refused" and "at most 2000" in outcome["reason"]
    assert (await bot.approval(approval_id))["decision"] is None


async def test_a_sender_who_is_not_a_reviewer_is_refused_and_recorded(bot: Bot) -> None:
    _, approval_id, emailed = await bot.ask("asker", "ship A1")
    # Someone else with Ana's reply address: the token does not hold for them.
    forged = await bot.post(reply(emailed[ANA], sender="mallory@evil.example", text="2"))
    assert forged["status"] == "refused" and forged["answered"] is False
    # A genuine token of an address that is not among the question's people: authorization.
    record = await bot.served.service.store.get(approval_id)
    token = ReplyTokens(WEB_SECRET).issue(
        approval_id,
        "eve@example.com",
        record.request.digest,
        datetime.now(UTC) + timedelta(hours=1),
    )
    request = EmailMessage()
    for name in ("Subject", "Message-ID"):
        request[name] = emailed[ANA][name]
    request["Reply-To"] = f"approvals+{token}@example.com"
    request.set_content(text_of(emailed[ANA]))
    outsider = await bot.post(reply(request, sender="eve@example.com", text="2"))
    assert outsider["status"] == "refused", outsider
    approval = await bot.approval(approval_id)
    assert approval["status"] == "pending" and approval["decision"] is None
    refused = [e for e in approval["events"] if e["kind"] == "refused"]
    assert [e["actor"] for e in refused] == ["mallory@evil.example", "eve@example.com"]
    assert "does not hold for mallory@evil.example" in refused[0]["detail"]["reason"]
    assert "not one of the reviewers" in refused[1]["detail"]["reason"]


async def test_the_same_reply_twice_answers_once(bot: Bot) -> None:
    run_id, approval_id, emailed = await bot.ask("asker", "ship A1")
    raw = reply(emailed[ANA], sender=ANA, text="2")
    first, second = await bot.post(raw), await bot.post(raw)
    assert (first["status"], second["status"]) == ("decided", "refused")
    assert "processed already" in second["reason"] and second["answered"] is False
    # Bo's answer comes after Ana's: the first answer wins.
    late = await bot.post(reply(emailed[BO], sender=BO, text="1"))
    assert late["status"] == "refused" and f"already answered by {ANA}" in late["reason"]
    approval = await bot.approval(approval_id)
    assert [e["kind"] for e in approval["events"]].count("decided") == 1
    assert approval["decision"]["response"] == "Porto"
    assert result_of(await bot.run(run_id)) == "A1 ships from Porto"


async def test_a_question_nobody_answers_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    async with email_bot(tmp_path, deadline="1s") as bot:
        _, approval_id, emailed = await bot.ask("asker", "ship A1")
        for address in (ANA, BO):
            told = await bot.to(address, is_outcome)
            assert told["Subject"] == "Re: Question: Which warehouse ships order A1? - timed out"
            text, html = parts(told)
            assert "Nobody answered before the deadline" in text and "timed out" in html
            assert not words(text) & {"approved", "denied"}
        # A reply after the deadline answers nothing (and its token has expired).
        late = await bot.post(reply(emailed[ANA], sender=ANA, text="2"))
        assert late["status"] == "refused"
        assert (await bot.approval(approval_id))["decision"]["response"] is None


# --- reminders and escalation, with the outbox's clock moved by hand ----------------------------

STEPPED = """
store: {{url: "sqlite:///{db}"}}
web: {{secret: {secret}}}
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
rules:
  - tool: ask
    reviewers: [ana@example.com]
    timeout: 10h
    remind_every: 1h
    remind_limit: 1
    escalate_after: 5h
    escalate_to: [carl@example.com]
"""


async def test_a_question_is_reminded_and_escalated_as_a_question(tmp_path: Path) -> None:
    opened = datetime.now(UTC).replace(microsecond=0)
    now = [opened]
    async with mail_server() as mail:
        path = tmp_path / "nodbot.yml"
        path.write_text(
            STEPPED.format(db=tmp_path / "nodbot.db", secret=WEB_SECRET, port=mail.port)
        )
        config = load_config(str(path))
        assert config.email is not None
        async with SqlApprovalStore(config.store.url, clock=lambda: now[0]) as store:
            channel = EmailChannel(config.email, store, secret=WEB_SECRET, clock=lambda: now[0])
            dispatcher = Dispatcher(store, [channel], worker="w1", clock=lambda: now[0])
            try:
                executor = rules_executor(asking.tools, config, store, clock=lambda: now[0])
                call = ToolCall(name="ship", arguments={"order_id": "A1"}, id="call_1")
                paused = await executor.run_call(call, executor.context("run_1"))
                assert paused.error is not None and paused.error.kind == "question-pending"
                sent: list[str] = []
                for hours in (0, 1, 5):
                    now[0] = opened + timedelta(hours=hours)
                    await dispatcher.step()
                    sent = [f"{r.recipients[0]} {r.message['Subject']}" for r in mail.received]
            finally:
                await dispatcher.close()
    question = "Which warehouse ships order A1?"
    assert sent == [
        f"ana@example.com Question: {question}",
        f"ana@example.com Reminder: question: {question}",
        f"carl@example.com Escalated: Question: {question}",
    ]
    reminder = text_of(mail.received[1].message)
    assert "this question still waits for your answer" in reminder
    assert "  1. Leeds\n  2. Porto\n" in reminder and "the number or the choice" in reminder
    escalated = text_of(mail.received[2].message)
    assert "Nobody has answered this question yet: it is escalated to you." in escalated
    for message in (m.message for m in mail.received):
        assert not words(text_of(message)) & {"approve", "edit", "respond"}


# --- any reply: one of the choices, or nothing --------------------------------------------------

_SAID = st.sampled_from(
    [
        *("1", "2", "3", "0", "01", "-1", "1.5", "\u0662", "\uff12", "\u00b2", "porto", "LEEDS"),
        *("Leeds.", "Porto!", "2. Porto", "1. Porto", "2) Porto", "Paris", "Porto, Leeds"),
        *("decline", "decline: no", "Decline", "declined", "answer: 1", "answer:", "answer: x"),
        *("approve", "deny", "edit", "respond Porto", "> 2", "-- ", "Sent from my phone", ""),
    ]
)
_BODY = st.lists(st.one_of(_SAID, st.text(max_size=12)), min_size=0, max_size=4).map("\n".join)


@given(bodies=st.lists(_BODY, min_size=1, max_size=6))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_a_reply_answers_with_a_choice_or_records_nothing(
    bot: Bot, bodies: list[str]
) -> None:
    """Whatever a reply says, the question is answered with one of its choices, declined
    by a reply that says "decline", or left as it was."""
    _, approval_id, emailed = await bot.ask("asker", "ship A1")
    for body in bodies:
        before = await bot.approval(approval_id)
        outcome = await bot.post(reply(emailed[ANA], sender=ANA, text=body))
        after = await bot.approval(approval_id)
        if outcome["status"] != "decided":
            assert after["decision"] == before["decision"], body
            continue
        assert before["decision"] is None, body
        decision = after["decision"]
        first = next(line for line in body.split("\n") if line.strip())
        if decision["response"] is None:
            assert first.strip().lower().startswith("decline"), body
        else:
            assert decision["response"] in CHOICES, body
            assert names(first, decision["response"]), body
        _, approval_id, emailed = await bot.ask("asker", "ship A1")  # a question open again


def names(line: str, choice: str) -> bool:
    """Whether the first line of a reply names `choice` of `CHOICES` (as the question's
    email says: its number or its text)."""
    said = line.strip().lower().removeprefix("answer:").strip().rstrip(".!")
    number = str(CHOICES.index(choice) + 1)
    return (
        said in (choice.lower(), number, f"0{number}")
        or re.fullmatch(rf"{number}\s*[.)]\s*{choice.lower()}", said) is not None
    )


# --- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "choices", "expected"),
    [
        ("2", CHOICES, Respond("Porto")),
        ("\n\n  leeds  \nthanks", CHOICES, Respond("Leeds")),
        ("2. Leeds", CHOICES, None),  # the number and the text disagree
        ("Decline", ("Accept", "Decline"), Respond("Decline")),  # a choice first
        ("decline: no time", ("Accept", "Decline"), Deny("no time")),
        ("decline too late\nsorry", CHOICES, Deny("too late\nsorry")),
        ("decline", None, Deny(None)),
        ("Declined orders go back", None, Respond("Declined orders go back")),
        ("answer: decline the refund", None, Respond("decline the refund")),
        ("One line\nand another", None, Respond("One line")),
        ("", None, None),
        ("answer:", None, None),
    ],
)
def test_what_a_reply_says_to_a_question(
    text: str, choices: tuple[str, ...] | None, expected: Respond | Deny | None
) -> None:
    said = answer_command(text, choices=choices)
    if expected is None:
        assert isinstance(said, Unclear), said
    else:
        assert said == expected


@pytest.mark.parametrize(
    ("plain", "html", "expected"),
    [
        ("Porto", "<div>2</div>", Respond("Porto")),
        ("1", '<div style="display:none">2</div><div>1</div>', Respond("Leeds")),
        ("decline busy", "<p>decline</p><p>busy today</p>", Deny("busy")),
        ("1", "<div>2</div>", None),
        ("decline", "<div>Leeds</div>", None),
        ("", "<div>2</div>", None),
    ],
)
def test_the_text_and_the_html_of_a_reply_must_give_the_same_answer(
    plain: str, html: str, expected: Respond | Deny | None
) -> None:
    said = reply_answer(both(plain, html), choices=CHOICES)
    if expected is None:
        assert isinstance(said, Unclear) and said.problem == "parts_disagree", said
    else:
        assert said == expected
