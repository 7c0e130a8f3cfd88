"""Questions to a person in Slack, end to end: the real bot (`serving`) hosting the asking
agent (`tests.bot.asking_agent`), the real slack_bolt and slack_sdk code, the local fake of
Slack over HTTP, and clicks, modal submissions, Home events and `/nodbot` commands sent to
`/slack/events` signed as Slack signs them.

A question's message has one button per choice (or Answer, for free text), Decline and Open in
inbox, never Approve, Edit or Respond; a click answers through `Executor.decide` with a click's
checks (the binding to its message, the rules' reviewers, a refusal recorded), the run goes on
with the answer, the first answer wins, and every message of the question says how it ended,
also when it ended elsewhere. Then the parts on their own: the rendering of the messages
within Block Kit's limits, and the reading of a choice button's click.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from nodbot.bot.config import SlackConfig
from nodbot.bot.outbox import OutboxStore
from nodbot.bot.policy.authorize import NOT_ASKED
from nodbot.bot.serve import serving
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.slack.commands import QUESTION_APPROVED
from nodbot.bot.slack.home import ACTION_HOME_APPROVE, ACTION_HOME_DENY
from nodbot.bot.slack.questions import (
    answer_modal,
    choice_action,
    choice_value,
    chosen,
    decline_modal,
    question_decided,
    question_message,
    question_summary,
)
from nodbot.bot.slack.reviews import A_QUESTION, NOT_A_CHOICE, NOT_ITS_MESSAGE
from nodbot.core import (
    ApprovalRecord,
    Decision,
    DeferredApproval,
    Delivery,
    Executor,
    MemoryApprovalStore,
    ToolRegistry,
)
from nodbot.core.questions import make_question, question_request
from nodbot.core.store import TIMEOUT_DECIDER, TIMEOUT_REASON
from tests.bot.test_slack import ROOT, TOKEN, Bot, actions_of, all_text
from tests.bot.test_slack_command import command
from tests.fakes.slack import Message, block_errors, slack_fake, view_errors
from tests.support import eventually

API = {"Authorization": f"Bearer {TOKEN}"}
PUBLIC = "https://nodbot.example.com"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
web: {{public_url: "{public}"}}
api:
  tokens:
    - {{name: api, token: {token}, scopes: [runs:write, runs:write-as, approvals:read]}}
agents:
  asker: tests.bot.asking_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: ask
    description: Orders wait for the warehouse's answer.
    reviewers: [{lead}, {second}]
    timeout: 4h
    {post_to}
"""

CHOICES = ["nodbot.answer.0", "nodbot.answer.1", "nodbot.decline", "nodbot.open"]
FREE_TEXT = ["nodbot.answer", "nodbot.decline", "nodbot.open"]
NEVER = {"nodbot.approve", "nodbot.approve_remember", "nodbot.edit", "nodbot.respond"}


@contextlib.asynccontextmanager
async def asking_bot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, room: bool = False
) -> AsyncIterator[Bot]:
    """The bot serving the asking agent against a fresh fake workspace: lead and second
    answer its questions (by direct message, or with `room` in a channel all four are in),
    carol starts its runs, other is nobody's reviewer."""
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        second = slack.add_user("second", email="second@example.com")
        carol = slack.add_user("carol", email="carol@example.com")
        other = slack.add_user("other", email="other@example.com")
        channel = slack.add_channel("warehouse", [lead, second, carol, other])
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                public=PUBLIC,
                token=TOKEN,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                lead=lead.id,
                second=second.id,
                post_to=f"post_to: [{channel.id}]" if room else "",
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            bot = Bot(
                served, slack, client, lead, second, carol, other, channel.id if room else None
            )
            slack.events_url = bot.events_url
            yield bot


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with asking_bot(tmp_path, monkeypatch) as running:
        yield running


async def ask(bot: Bot, text: str) -> tuple[str, str]:
    """A run of the asking agent (`ship A1`, `note A1`) started for carol: its run id and the
    question it waits on."""
    body = {"agent": "asker", "input": text, "requested_by": bot.carol.id}
    answer = await bot.client.post("/runs", json=body, headers=API)
    assert answer.status_code == 201, answer.text
    run = answer.json()
    assert run["status"] == "waiting", run
    [pending] = run["pending"]
    return str(run["run_id"]), str(pending["approval_id"])


async def question_posted(bot: Bot, approval_id: str, user: Any) -> Message:
    """The question's message in `user`'s direct messages."""
    found: list[Message] = []

    def posted() -> bool:
        found[:] = [
            m
            for m in bot.slack.messages(user)
            if m.thread_ts is None and approval_id in json.dumps(m.blocks)
        ]
        return bool(found)

    await bot.slack.wait_until(posted, 10, f"the message of {approval_id}")
    return found[0]


async def finished(bot: Bot, run_id: str) -> dict[str, Any]:
    """The run, once it has finished."""
    found: dict[str, Any] = {}

    async def done() -> bool:
        found.update((await bot.client.get(f"/runs/{run_id}", headers=API)).json())
        return found.get("status") == "finished"

    await eventually(done, f"run {run_id} finishes")
    return found


async def refusals(bot: Bot, approval_id: str) -> list[tuple[str | None, str]]:
    """The refused events of the question: (actor, reason)."""
    events = await bot.served.service.store.events(approval_id)
    return [(e.actor, str(e.detail.get("reason"))) for e in events if e.kind == "refused"]


async def refused(bot: Bot, approval_id: str, count: int) -> list[tuple[str | None, str]]:
    """The refused events of the question, once there are `count`."""

    async def there() -> bool:
        return len(await refusals(bot, approval_id)) >= count

    await eventually(there, f"{count} refusal(s) on {approval_id}")
    return await refusals(bot, approval_id)


def headers_of(message: Message) -> list[str]:
    return [b["text"]["text"] for b in message.blocks if b["type"] == "header"]


async def test_a_question_with_choices_shows_one_button_each_and_a_click_answers_it(
    bot: Bot,
) -> None:
    run_id, approval_id = await ask(bot, "ship A1")
    message = await question_posted(bot, approval_id, bot.lead)
    theirs = await question_posted(bot, approval_id, bot.second)
    assert headers_of(message) == ["Question"]
    assert actions_of(message) == CHOICES and not NEVER & set(actions_of(message))
    assert block_errors(message.blocks) == []
    shown = all_text(message)
    assert "Which warehouse ships order A1?" in shown
    assert "Orders wait for the warehouse's answer." in shown
    assert "the tool `ship`" in shown and f"<@{bot.carol.id}>" in shown  # asked by, for
    assert "*Answer by*" in shown
    labels = [
        e["text"]["text"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]
    ]
    assert labels == ["Leeds", "Porto", "Decline", "Open in inbox"]
    _, porto = message.action("nodbot.answer.1")
    assert porto["value"] == f"{approval_id}:1"

    # Both clicks are made on the messages as posted; the first answers, the second loses.
    first = bot.slack.click(message, "nodbot.answer.1", bot.lead)
    second = bot.slack.click(theirs, "nodbot.answer.0", bot.second)
    await bot.send(first)
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.response == "Porto"
    assert record.decision.decided_by == bot.lead.id
    [decided] = [
        e for e in await bot.served.service.store.events(approval_id) if e.kind == "decided"
    ]
    assert decided.actor == bot.lead.id and decided.channel == "slack"
    assert decided.detail["action"] == "respond"
    assert decided.detail["evidence"]["message_ts"] == message.ts

    run = await finished(bot, run_id)
    [result] = run["tool_results"]
    assert (result["tool"], result["status"]) == ("ship", "ok")
    assert "A1 ships from Porto" in result["content"]

    await bot.send(second)
    [told] = await bot.told(1)
    assert told.user == bot.second.id
    assert told.text == f"this question was already answered by {bot.lead.id}"
    assert (await bot.record(approval_id)).decision == record.decision

    for posted in (message, theirs):
        await bot.updated(posted)
        assert actions_of(posted) == [] and headers_of(posted) == ["Question answered"]
        assert f"*Answered* by <@{bot.lead.id}>" in all_text(posted)
        assert "*Porto*" in all_text(posted)
        assert "Denied" not in all_text(posted) and "Approved" not in all_text(posted)


async def test_a_free_text_question_is_answered_in_a_modal(bot: Bot) -> None:
    run_id, approval_id = await ask(bot, "note B2")
    message = await question_posted(bot, approval_id, bot.lead)
    assert actions_of(message) == FREE_TEXT
    await bot.click(message, "nodbot.answer", bot.lead)
    view = await bot.modal()
    assert view.callback_id == "nodbot.answer" and view_errors(view.view) == []
    assert "What should the parcel of order B2 say?" in json.dumps(view.blocks)

    blank = await bot.send(bot.slack.submit(view, bot.lead, {"answer": {"value": "   "}}))
    assert blank.json()["response_action"] == "errors"  # the modal stays open, saying why
    assert "answer" in blank.json()["errors"]
    assert (await bot.record(approval_id)).decision is None

    text = "Fragile <!channel>, handle with care"
    sent = await bot.send(bot.slack.submit(view, bot.lead, {"answer": {"value": text}}))
    assert sent.status_code == 200 and sent.text == ""
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.response == text
    run = await finished(bot, run_id)
    assert "Fragile" in run["tool_results"][0]["content"]
    await bot.updated(message)
    shown = all_text(message)
    assert f"*Answered* by <@{bot.lead.id}>" in shown and actions_of(message) == []
    assert "&lt;!channel&gt;" in shown and "<!channel>" not in shown  # escaped for Slack


async def test_decline_asks_for_a_reason_and_the_agent_is_told(bot: Bot) -> None:
    run_id, approval_id = await ask(bot, "ship C3")
    message = await question_posted(bot, approval_id, bot.lead)
    await bot.click(message, "nodbot.decline", bot.lead)
    view = await bot.modal()
    assert view.callback_id == "nodbot.decline" and view_errors(view.view) == []
    reason = "Neither: C3 is cancelled."
    await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": reason}}))
    record = await bot.decided(approval_id)
    assert record.decision is not None and not record.decision.approved
    assert record.decision.response is None and record.decision.reason == reason
    run = await finished(bot, run_id)
    [result] = run["tool_results"]
    assert result["status"] == "error" and "cancelled" in result["content"]
    await bot.updated(message)
    assert headers_of(message) == ["Question declined"]
    assert f"*Declined* by <@{bot.lead.id}>" in all_text(message) and reason in all_text(message)


async def test_a_click_by_someone_who_is_not_a_reviewer_is_refused_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with asking_bot(tmp_path, monkeypatch, room=True) as bot:
        assert bot.room is not None
        _, approval_id = await ask(bot, "ship D4")
        message = await question_posted(bot, approval_id, bot.room)
        for user in (bot.other, bot.carol):  # nobody's reviewer; the run's requester
            await bot.click(message, "nodbot.answer.0", user)
        # Each click is handled after Slack's ack: in either order.
        expected = sorted([(bot.other.id, NOT_ASKED), (bot.carol.id, NOT_ASKED)])
        assert sorted(await refused(bot, approval_id, 2)) == expected
        assert sorted((e.user, e.text) for e in await bot.told(2)) == expected
        assert (await bot.record(approval_id)).decision is None
        # A reviewer answers in the channel.
        await bot.click(message, "nodbot.answer.0", bot.second)
        record = await bot.decided(approval_id)
        assert record.decision is not None and record.decision.response == "Leeds"


async def test_a_forged_choice_approval_or_button_is_refused_and_decides_nothing(
    bot: Bot,
) -> None:
    _, approval_id = await ask(bot, "ship E5")
    _, another = await ask(bot, "ship E6")
    message = await question_posted(bot, approval_id, bot.lead)
    await question_posted(bot, another, bot.lead)

    def forged(action_id: str, value: str) -> dict[str, Any]:
        payload = bot.slack.click(message, "nodbot.answer.0", bot.lead)
        payload["actions"][0].update(action_id=action_id, value=value)
        return payload

    # A choice the question does not have: refused, and recorded on the question.
    await bot.send(forged(choice_action(7), choice_value(approval_id, 7)))
    # A value whose index is not its button's: it names no choice, so nothing to record.
    await bot.send(forged(choice_action(1), choice_value(approval_id, 0)))
    # Another question's choice, on this one's message: refused, recorded on the other.
    await bot.send(forged(choice_action(0), choice_value(another, 0)))
    # A button no question has.
    await bot.send(forged("nodbot.approve", approval_id))
    told = [e.text for e in await bot.told(4)]
    assert sorted(told) == sorted([NOT_A_CHOICE, NOT_A_CHOICE, NOT_ITS_MESSAGE, A_QUESTION])
    assert sorted(await refusals(bot, approval_id)) == sorted(
        [(bot.lead.id, NOT_A_CHOICE), (bot.lead.id, A_QUESTION)]
    )
    assert await refusals(bot, another) == [(bot.lead.id, NOT_ITS_MESSAGE)]
    for question in (approval_id, another):
        assert (await bot.record(question)).decision is None


async def test_an_answer_made_elsewhere_updates_the_message(bot: Bot) -> None:
    _, approval_id = await ask(bot, "ship F6")
    message = await question_posted(bot, approval_id, bot.lead)
    service = bot.served.service
    executor = Executor(service.agents["asker"].tools, approval=DeferredApproval(service.store))
    await executor.decide(
        approval_id,
        {"action": "respond", "message": "leeds"},
        decided_by="lead@example.com",
        channel="web",
    )
    service.decided()  # wake the workers, as the inbox does
    await bot.updated(message)
    assert actions_of(message) == [] and headers_of(message) == ["Question answered"]
    shown = all_text(message)
    assert "*Answered* by lead@example.com" in shown and "*Leeds*" in shown  # as asked


async def test_the_home_and_nodbot_list_questions_as_questions(bot: Bot) -> None:
    _, approval_id = await ask(bot, "ship G7")
    await question_posted(bot, approval_id, bot.lead)
    await bot.slack.open_home(bot.lead)
    home = await bot.slack.wait_for_home(bot.lead, 1, within=10)
    assert view_errors(home.view, "home") == []
    shown = json.dumps(home.blocks, ensure_ascii=False)
    assert "Which warehouse ships order G7?" in shown and "1. Leeds · 2. Porto" in shown
    buttons = [
        (e["action_id"], e["text"]["text"])
        for b in home.blocks
        if b["type"] == "actions"
        for e in b["elements"]
    ]
    assert (ACTION_HOME_DENY, "Decline") in buttons
    assert ACTION_HOME_APPROVE not in [action for action, _ in buttons]

    _, listed = await command(bot, bot.lead, "pending")
    assert "Which warehouse ships order G7?" in json.dumps(listed.blocks, ensure_ascii=False)
    assert "A question is answered with the buttons of its message" in json.dumps(listed.blocks)

    _, approve = await command(bot, bot.lead, f"approve {approval_id}")
    assert QUESTION_APPROVED in approve.text and "Nothing was decided" in approve.text
    assert await refusals(bot, approval_id) == [(bot.lead.id, QUESTION_APPROVED)]
    assert (await bot.record(approval_id)).decision is None

    _, declined = await command(bot, bot.lead, f"deny {approval_id} not ours")
    assert declined.text == f"Declined: the question `{approval_id}`. The agent is told."
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.reason == "not ours"

    # The Home's Decline opens the decline modal; its submission declines.
    _, from_home = await ask(bot, "note H8")
    await question_posted(bot, from_home, bot.lead)
    await bot.slack.open_home(bot.lead)

    def listed_on_home() -> bool:
        home = bot.slack.home_view(bot.lead)
        return home is not None and "parcel of order H8" in json.dumps(home.blocks)

    await bot.slack.wait_until(listed_on_home, 10, "the question on the Home")
    await bot.send(bot.slack.home_click(bot.lead, ACTION_HOME_DENY, value=from_home))
    view = await bot.modal()
    assert view.view["title"]["text"] == "Decline the question"
    await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": "ask later"}}))
    record = await bot.decided(from_home)
    assert record.decision is not None and record.decision.reason == "ask later"
    assert record.decision.decided_by == bot.lead.id


async def test_a_question_is_answered_on_the_home_by_its_choice_or_its_answer_form(
    bot: Bot,
) -> None:
    """Whoever may decline a question on their Home may answer it there: a button per choice
    (the answer is the question's own choice of the button's index), or Answer and its modal
    for free text; a button that names no choice, or a stranger's click, answers nothing."""
    run_id, approval_id = await ask(bot, "ship H1")
    message = await question_posted(bot, approval_id, bot.lead)
    await bot.slack.open_home(bot.lead)
    home = await bot.slack.wait_for_home(bot.lead, 1, within=10)
    assert view_errors(home.view, "home") == []
    buttons = [
        (e["action_id"], e["text"]["text"], e.get("value"))
        for b in home.blocks
        if b["type"] == "actions"
        for e in b["elements"]
    ]
    assert buttons[:3] == [
        ("nodbot.home.answer.0", "Leeds", f"{approval_id}:0"),
        ("nodbot.home.answer.1", "Porto", f"{approval_id}:1"),
        (ACTION_HOME_DENY, "Decline", approval_id),
    ]
    # A click whose value names another choice than its button: nothing is answered.
    forged = bot.slack.home_click(bot.lead, "nodbot.home.answer.0")
    forged["actions"][0]["value"] = f"{approval_id}:1"
    await bot.send(forged)
    await bot.slack.wait_until(
        lambda: "the button names no choice" in json.dumps(home.blocks), 10, "the Home saying so"
    )
    # A stranger's click (a payload naming a Home the stranger was never shown).
    stranger = bot.slack.home_click(bot.lead, "nodbot.home.answer.0")
    stranger["user"] = {**stranger["user"], "id": bot.other.id, "name": bot.other.name}
    await bot.send(stranger)
    assert await refused(bot, approval_id, 1) == [(bot.other.id, NOT_ASKED)]
    assert (await bot.record(approval_id)).decision is None

    await bot.send(bot.slack.home_click(bot.lead, "nodbot.home.answer.1"))
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.response == "Porto"
    assert record.decision.decided_by == bot.lead.id
    events = await bot.served.service.store.events(approval_id)
    [decided] = [e for e in events if e.kind == "decided"]
    assert decided.detail["evidence"]["via"] == "app home"
    assert (await finished(bot, run_id))["final_text"] is not None
    await bot.slack.wait_until(
        lambda: "with “Porto”" in json.dumps(home.blocks, ensure_ascii=False),
        10,
        "the Home saying it was answered",
    )
    await bot.updated(message)
    assert actions_of(message) == [] and headers_of(message) == ["Question answered"]

    # Free text: Answer opens the answer modal; a blank answer keeps it open, saying why.
    _, noted = await ask(bot, "note H2")
    await question_posted(bot, noted, bot.lead)
    await bot.slack.open_home(bot.lead)

    def answerable() -> bool:
        shown = bot.slack.home_view(bot.lead)
        return shown is not None and f'"value": "{noted}"' in json.dumps(shown.blocks)

    await bot.slack.wait_until(answerable, 10, "the free-text question on the Home")
    await bot.send(bot.slack.home_click(bot.lead, "nodbot.home.answer", value=noted))
    view = await bot.modal()
    assert view.callback_id == "nodbot.home.answer"
    blank = await bot.send(bot.slack.submit(view, bot.lead, {"answer": {"value": "   "}}))
    assert blank.json()["errors"] == {"answer": "an answer is needed"}
    assert (await bot.record(noted)).decision is None
    done = await bot.send(bot.slack.submit(view, bot.lead, {"answer": {"value": "Fragile"}}))
    assert done.status_code == 200
    record = await bot.decided(noted)
    assert record.decision is not None and record.decision.response == "Fragile"


# --- the parts -------------------------------------------------------------------------------

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def question(
    text: str = "Which warehouse?", choices: list[str] | None = None, **policy: Any
) -> ApprovalRecord:
    request = question_request(
        make_question(text, choices=choices, asked_by="ship"),
        run_id="run_1",
        call_id="call_1",
        requested_by="U0CAROL00",
    )
    request = replace(
        request, policy={**request.policy, **policy}, deadline=NOW + timedelta(hours=1)
    )
    return ApprovalRecord("apr_1", request, created_at=NOW)


def decided(record: ApprovalRecord, decision: Decision) -> ApprovalRecord:
    return ApprovalRecord(
        record.approval_id, record.request, record.created_at, decision=decision, decided_at=NOW
    )


def test_twenty_five_choices_and_a_long_question_keep_to_block_kits_limits() -> None:
    choices = [f"<!here> choice {i:02} " + "x" * 50 for i in range(25)]
    record = question("<@U0999> & " * 180, choices)  # 1,980 characters, far more escaped
    rendered = question_message(record, allowed=["respond", "deny"], page=PUBLIC)
    assert block_errors(rendered.blocks) == [] and rendered.cut
    assert "<@U0999>" not in json.dumps(rendered.blocks) and "<!here>" not in rendered.text
    [answers, decide] = [b for b in rendered.blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in answers["elements"]] == [choice_action(i) for i in range(25)]
    assert [e["action_id"] for e in decide["elements"]] == ["nodbot.decline", "nodbot.open"]
    for modal in (answer_modal(record), decline_modal(record)):
        assert view_errors(modal) == []
    assert len(question_summary(record, inbox=True)) <= 3000


def test_the_rule_decides_which_buttons_a_question_has() -> None:
    record = question(choices=["Leeds", "Porto"])
    only_decline = question_message(record, allowed=["deny"])
    assert [e["action_id"] for b in only_decline.blocks if b["type"] == "actions" for e in
            b["elements"]] == ["nodbot.decline"]  # fmt: skip
    stored = question()
    unknown = {**stored.request.arguments, "question": None}  # stored in a form not known
    unreadable = replace(stored, request=replace(stored.request, arguments=unknown))
    shown = question_message(unreadable, allowed=["respond", "deny"])
    assert "cannot be read" in json.dumps(shown.blocks)
    assert [e["action_id"] for b in shown.blocks if b["type"] == "actions" for e in
            b["elements"]] == ["nodbot.decline"]  # fmt: skip


@pytest.mark.parametrize(
    ("decision", "header", "said"),
    [
        (
            Decision(approved=False, response="a\n<!channel>", decided_by="U0LEAD000"),
            "Question answered",
            "*Answered* by <@U0LEAD000>",
        ),
        (
            Decision(approved=False, reason="no <b>", decided_by="ana@example.com"),
            "Question declined",
            "*Declined* by ana@example.com",
        ),
        (
            Decision(approved=False, reason=TIMEOUT_REASON, decided_by=TIMEOUT_DECIDER),
            "Question timed out",
            "*Nobody answered before the deadline*",
        ),
    ],
)
def test_a_decided_question_says_how_it_ended(decision: Decision, header: str, said: str) -> None:
    rendered = question_decided(decided(question(), decision), page=PUBLIC)
    assert block_errors(rendered.blocks) == []
    assert [b["text"]["text"] for b in rendered.blocks if b["type"] == "header"] == [header]
    shown = json.dumps(rendered.blocks)
    assert said in shown and "<!channel>" not in shown and "<b>" not in shown
    assert not [b for b in rendered.blocks if b["type"] == "actions"]


@pytest.mark.parametrize(
    ("action_id", "value", "found"),
    [
        ("nodbot.answer.0", "apr_1:0", ("apr_1", 0)),
        ("nodbot.answer.24", "apr_x:y:24", ("apr_x:y", 24)),
        ("nodbot.answer.1", "apr_1:0", None),  # the index is not its button's
        ("nodbot.answer.1", "apr_1", None),
        ("nodbot.answer.1", ":1", None),
        ("nodbot.answer.100", "apr_1:100", None),
        ("nodbot.answer", "apr_1:0", None),
        ("nodbot.answer.1\n", "apr_1:1", None),
        ("nodbot.answer.1", "a" * 300 + ":1", None),  # longer than any the bot makes
    ],
)
def test_a_choice_button_is_read_only_when_its_id_and_value_agree(
    action_id: str, value: str, found: tuple[str, int] | None
) -> None:
    assert chosen(action_id, value) == found


def test_a_reminder_of_a_question_asks_for_its_answer() -> None:
    config = SlackConfig.model_validate(
        {"bot_token": "xoxb-" + "1" * 20, "signing_secret": "s" * 32}
    )
    store = cast(OutboxStore, MemoryApprovalStore())
    channel = SlackChannel(config, store, ToolRegistry(), public_url=PUBLIC)
    record = question(choices=["Leeds", "Porto"])
    delivery = Delivery(1, record.approval_id, "reminder", "slack:reminder:1", "due", 0, NOW, NOW)
    text = channel._reminder_text(record, delivery, ["U0123ABCDE"])
    assert text.startswith("<@U0123ABCDE> Reminder 1 of 0: this question is still waiting for an")
    assert "(answer by <!date^" in text and "Answer with the buttons above, or on <" in text
    assert "review" not in text and "*ask*" not in text
