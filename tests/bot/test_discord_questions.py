"""Questions in the Discord channel: how a question's message is made (escaped, bounded), and
the channel end to end, through `nodbot serve` in a process of its own against the local fake
of Discord's REST API (`tests.fakes.discord`), every interaction signed as Discord signs it.

A program asks (`POST /questions`); the question is posted once to the configured channel,
its choices a select menu (or an Answer button and its form, for free text) beside Decline. A
reviewer's pick or form answers it (`GET /approvals/{id}` shows it answered, with the
answer), a Decline declines it, a deadline passed times it out, and the message is edited to
say how; an answer given over the HTTP API edits it too. Someone who is no reviewer is
refused, recorded as a refusal, and decides nothing; a pick that is none of the choices (a
forged one) is refused and recorded as a refusal, as in Slack and Teams, and a typed answer
that is none of them is refused and records nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodbot.bot.discord.interactions import NOT_A_CHOICE
from nodbot.bot.discord.messages import MAX_CONTENT, button_of, escape
from nodbot.bot.discord.questions import (
    MAX_TEXT,
    choice_of,
    question_decided,
    question_message,
    shown,
)
from nodbot.core import ApprovalRecord, Decision
from nodbot.core.questions import MAX_CHOICE, MAX_CHOICES, MAX_QUESTION, make_question
from nodbot.core.questions import question_request as stored_question
from nodbot.core.store import TIMEOUT_DECIDER
from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_discord_end_to_end import ANA, BOB_TOKEN, CHANNEL, MALLORY
from tests.bot.test_email_end_to_end import until
from tests.fakes.discord import (
    DiscordFake,
    Message,
    button_click,
    discord_fake,
    modal_submit,
    select_choice,
)

# --- the messages ---------------------------------------------------------------------------

APPROVAL = "apr_0123456789abcdef0123456789ab"


def record_of(text: str, choices: list[str] | None = None, **decided: Any) -> ApprovalRecord:
    question = make_question(text, choices=choices, asked_by="ship")
    request = stored_question(question, run_id="run_1", call_id="call_1", requested_by="agent")
    now = datetime.now(UTC)
    if not decided:
        return ApprovalRecord(APPROVAL, request, created_at=now)
    return ApprovalRecord(APPROVAL, request, created_at=now, decision=Decision(**decided),
                          decided_at=now)  # fmt: skip


def unescaped(text: str) -> str:
    """`text` as Discord shows it: every escaped character as itself. Fails on a markdown
    character left unescaped."""
    shown, rest = [], iter(text)
    for char in rest:
        if char == "\\":
            shown.append(next(rest))
        else:
            assert char not in "*_~`|<>@[]()#:-", text
            shown.append(char)
    return "".join(shown)


def components(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for row in message["components"] for c in row["components"]]


def test_a_question_with_choices_is_a_select_menu_and_decline() -> None:
    message = question_message(
        record_of("Which warehouse?", ["Leeds", "Porto"]), allowed=["respond", "deny"], page=None
    )
    select, decline = components(message)
    assert select["type"] == 3 and button_of(select["custom_id"]) == ("answer", APPROVAL)
    assert [(o["label"], o["value"]) for o in select["options"]] == [("Leeds", "0"), ("Porto", "1")]
    assert button_of(decline["custom_id"]) == ("decline", APPROVAL)
    assert [len(row["components"]) for row in message["components"]] == [1, 1]
    assert "Which warehouse?" in message["content"] and "1. Leeds" in message["content"]
    assert message["allowed_mentions"] == {"parse": []}
    # The rule's say: no respond, no menu; no deny, no Decline.
    only_decline = question_message(
        record_of("Which warehouse?", ["Leeds", "Porto"]), allowed=["deny"], page=None
    )
    assert [c["custom_id"] for c in components(only_decline)] == [f"nodbot:decline:{APPROVAL}"]


def test_a_free_text_question_has_an_answer_button() -> None:
    message = question_message(record_of("What to write?"), allowed=["respond", "deny"], page=None)
    assert [button_of(c["custom_id"]) for c in components(message)] == [
        ("answer", APPROVAL),
        ("decline", APPROVAL),
    ]


MARKS = st.sampled_from("ab *_~`|>#-[]()<@:!\\\n\u200b")
HOSTILE = st.text(
    alphabet=MARKS | st.characters(blacklist_categories=["Cs"]), max_size=MAX_QUESTION
).filter(str.strip)
CHOICE = st.text(
    alphabet=st.sampled_from("ab *_~`|>#-[]()<@:!\\")
    | st.characters(blacklist_categories=["Cs"], blacklist_characters="\n"),
    min_size=1,
    max_size=MAX_CHOICE,
).filter(lambda c: bool(c.strip()))


@settings(max_examples=60, deadline=None)
@given(
    text=HOSTILE,
    choices=st.none()
    | st.lists(CHOICE, min_size=2, max_size=MAX_CHOICES, unique_by=lambda c: c.strip().casefold()),
)
def test_untrusted_question_and_choices_are_escaped_and_bounded(
    text: str, choices: list[str] | None
) -> None:
    record = record_of(text, choices)
    message = question_message(record, allowed=["respond", "deny"], page="https://x.example/a")
    assert len(message["content"]) <= MAX_CONTENT
    # The question and its choices are shown escaped (`shown`: nothing formats, links or
    # pings), cut to their room.
    assert shown(text, MAX_TEXT) in message["content"]
    if choices is not None:
        numbered = " · ".join(f"{i}. {c.strip()}" for i, c in enumerate(choices, 1))
        assert "Choices: " + shown(numbered, 500) + "\n" in message["content"]
    for option in (o for c in components(message) for o in c.get("options", [])):
        assert 1 <= len(option["label"]) <= 100 and len(option["value"]) <= 2
    assert all(len(c["custom_id"]) <= 100 for c in components(message))
    for decided in (
        record_of(text, choices, approved=False, response=(choices or [text])[0], decided_by="a"),
        record_of(text, choices, approved=False, reason=text, decided_by="discord:123456789"),
        record_of(text, choices, approved=False, decided_by=TIMEOUT_DECIDER),
    ):
        body = question_decided(decided, page=None)
        assert len(body["content"]) <= MAX_CONTENT and body["components"] == []


@given(st.text(max_size=300), st.integers(min_value=2, max_value=400))
def test_shown_text_is_escaped_within_its_limit(text: str, limit: int) -> None:
    found = shown(text, limit)
    assert len(found) <= limit
    read = unescaped(found)
    assert read == text or (read.endswith("…") and text.startswith(read[:-1]))


@given(st.lists(st.text(max_size=5), max_size=3))
def test_only_a_choices_index_picks_it(values: list[str]) -> None:
    question = make_question("Which?", choices=["Leeds", "Porto"])
    picked = choice_of(question, values)
    expected: dict[tuple[str, ...], str] = {("0",): "Leeds", ("1",): "Porto"}
    assert picked == expected.get(tuple(values))


def test_the_outcome_says_how_the_question_ended() -> None:
    answered = record_of("Which?", ["Leeds", "Porto"], approved=False, response="Porto",
                         decided_by="discord:1600000000000000006")  # fmt: skip
    assert "Answered: Porto" in question_decided(answered, page=None)["content"]
    declined = record_of("Which?", approved=False, reason="**no**", decided_by="bob")
    assert "Declined: \\*\\*no\\*\\*" in question_decided(declined, page=None)["content"]
    timed_out = record_of("Which?", approved=False, decided_by=TIMEOUT_DECIDER)
    assert "Timed out" in question_decided(timed_out, page=None)["content"]


# --- end to end -----------------------------------------------------------------------------

ASKER = "token-of-the-asking-program-00000"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: asker, token: {asker}, scopes: [approvals:request, approvals:read]}}
    - {{name: bob@example.com, token: {bob}, scopes: [approvals:read, approvals:decide]}}
people:
  ana: [ana@example.com, "discord:{ana}"]
discord:
  application_id: "{application_id}"
  public_key: {public_key}
  bot_token: {bot_token}
  channels: ["{channel}"]
  api_url: {api_url}
rules:
  - tool: ask
    description: Shipping questions go to the warehouse leads.
    reviewers: [ana@example.com, bob@example.com]
{timeout}"""


@dataclass
class Desk:
    bot: Running
    client: httpx.AsyncClient
    discord: DiscordFake

    async def ask(self, question: str, choices: list[str] | None = None) -> str:
        body: dict[str, Any] = {"run_id": "run-of-the-shipper", "question": question}
        if choices is not None:
            body["choices"] = choices
        answer = await self.client.post("/questions", json=body, headers=_auth(ASKER))
        assert answer.status_code == 201, answer.text
        return str(answer.json()["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=_auth(ASKER))
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def posted(self, approval_id: str) -> Message:
        """The question's message in the channel, once posted and recorded as posted."""

        async def found() -> Message | None:
            mine = [
                m
                for m in self.discord.messages(CHANNEL)
                if f"nodbot:decline:{approval_id}" in m.custom_ids
            ]
            events = (await self.approval(approval_id))["events"]
            delivered = any(e["kind"] == "delivered" and e["channel"] == "discord" for e in events)
            return mine[0] if mine and delivered else None

        message: Message = await until(f"the Discord message of {approval_id}", found)
        return message

    async def send(self, interaction: dict[str, Any]) -> httpx.Response:
        body, headers = self.discord.signer.sign(interaction)
        return await self.client.post("/discord/interactions", content=body, headers=headers)

    async def decided(self, approval_id: str) -> dict[str, Any]:
        async def found() -> dict[str, Any] | None:
            approval = await self.approval(approval_id)
            return approval if approval["decision"] is not None else None

        approval: dict[str, Any] = await until(f"{approval_id} is decided", found)
        return approval

    async def edited(self, message: Message, text: str) -> None:
        """The message, once edited to its outcome (no components, `text` in it)."""
        await until(
            f"message {message.id} says {text!r}",
            lambda: not message.custom_ids and text in message.content,
        )

    def told(self, token: str) -> list[str]:
        return [f.body["content"] for f in self.discord.follow_ups if f.token == token]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def desk(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Desk]:
    """The bot and the fake; a test's indirect parameter is the rule's `timeout`."""
    timeout = getattr(request, "param", None)
    async with discord_fake() as discord:
        config = tmp_path / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                asker=ASKER,
                bob=BOB_TOKEN,
                ana=ANA,
                application_id=discord.application_id,
                public_key=discord.public_key,
                bot_token=discord.bot_token,
                channel=CHANNEL,
                api_url=discord.api_url,
                timeout=f"    timeout: {timeout}\n" if timeout else "",
            )
        )
        async with (
            nodbot_serve(config) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            yield Desk(bot, client, discord)


async def test_a_question_with_choices_is_posted_once_and_answered_by_a_pick(desk: Desk) -> None:
    approval_id = await desk.ask("Which warehouse ships order 7?", ["Leeds", "Porto"])
    message = await desk.posted(approval_id)
    assert message.custom_ids == [f"nodbot:answer:{approval_id}", f"nodbot:decline:{approval_id}"]
    assert [o["label"] for o in message.options] == ["Leeds", "Porto"]
    assert "Which warehouse ships order 7?" in message.content

    pick = select_choice(desk.discord, message, f"nodbot:answer:{approval_id}", ["1"], user=ANA)
    answer = await desk.send(pick)
    assert answer.status_code == 200 and answer.json() == {"type": 6}  # a deferred update
    approval = await desk.decided(approval_id)
    assert (approval["question"]["state"], approval["answer"]) == ("answered", "Porto")
    assert approval["decision"]["decided_by"] == f"discord:{ANA}"
    [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
    assert decided["channel"] == "discord" and decided["person"] == "person:ana"
    await desk.edited(message, "Answered: Porto")
    assert f"<@{ANA}>" in message.content
    assert len(desk.discord.messages(CHANNEL)) == 1  # posted once

    # A second pick decides nothing more: told it was answered.
    again = select_choice(desk.discord, message, f"nodbot:answer:{approval_id}", ["0"], user=ANA)
    await desk.send(again)
    await until("Ana is told", lambda: desk.told(again["token"]))
    assert "already answered" in desk.told(again["token"])[0]
    assert (await desk.approval(approval_id))["answer"] == "Porto"


async def test_a_free_text_question_is_answered_through_its_form(desk: Desk) -> None:
    approval_id = await desk.ask("What should the parcel say?")
    message = await desk.posted(approval_id)
    assert message.custom_ids == [f"nodbot:answer:{approval_id}", f"nodbot:decline:{approval_id}"]
    opened = await desk.send(
        button_click(desk.discord, message, f"nodbot:answer:{approval_id}", user=ANA)
    )
    modal = opened.json()
    assert modal["type"] == 9, modal
    form_id = modal["data"]["custom_id"]
    assert form_id == f"nodbot:answer-form:{approval_id}:{message.id}"

    blank = await desk.send(
        modal_submit(desk.discord, message, form_id, {"answer": "  "}, user=ANA)
    )
    assert blank.json()["type"] == 4 and "an answer is needed" in blank.json()["data"]["content"]
    assert (await desk.approval(approval_id))["decision"] is None

    text = "Handle with care"
    submit = modal_submit(desk.discord, message, form_id, {"answer": text}, user=ANA)
    assert (await desk.send(submit)).json() == {"type": 6}
    approval = await desk.decided(approval_id)
    assert (approval["question"]["state"], approval["answer"]) == ("answered", text)
    await desk.edited(message, f"Answered: {text}")


async def test_a_question_is_declined_through_its_form(desk: Desk) -> None:
    approval_id = await desk.ask("Which warehouse ships order 8?", ["Leeds", "Porto"])
    message = await desk.posted(approval_id)
    opened = await desk.send(
        button_click(desk.discord, message, f"nodbot:decline:{approval_id}", user=ANA)
    )
    form_id = opened.json()["data"]["custom_id"]
    assert form_id == f"nodbot:decline-form:{approval_id}:{message.id}"
    submit = modal_submit(desk.discord, message, form_id, {"reason": "ask sales"}, user=ANA)
    assert (await desk.send(submit)).json() == {"type": 6}
    approval = await desk.decided(approval_id)
    assert approval["question"]["state"] == "declined" and approval["answer"] is None
    assert approval["decision"]["reason"] == "ask sales"
    await desk.edited(message, "Declined: ask sales")


async def test_a_non_reviewer_and_a_forged_approve_are_refused(desk: Desk) -> None:
    approval_id = await desk.ask("Which warehouse ships order 9?", ["Leeds", "Porto"])
    message = await desk.posted(approval_id)
    pick = select_choice(desk.discord, message, f"nodbot:answer:{approval_id}", ["0"], user=MALLORY)
    assert (await desk.send(pick)).json() == {"type": 6}
    await until("Mallory is told", lambda: desk.told(pick["token"]))
    assert "not one of the reviewers" in desk.told(pick["token"])[0]
    # Her Decline click gets no form either.
    declined = await desk.send(
        button_click(desk.discord, message, f"nodbot:decline:{approval_id}", user=MALLORY)
    )
    assert declined.json()["type"] == 4
    assert "not one of the reviewers" in json.dumps(declined.json())

    # A reviewer's forged Approve on a question: no such button was posted; refused too.
    forged = button_click(desk.discord, message, f"nodbot:approve:{approval_id}", user=ANA)
    await desk.send(forged)
    await until("Ana is told", lambda: desk.told(forged["token"]))
    assert "this is a question" in desk.told(forged["token"])[0]

    approval = await desk.approval(approval_id)
    refusals = [e for e in approval["events"] if e["kind"] == "refused"]
    assert [(r["actor"], r["channel"]) for r in refusals] == [
        (f"discord:{MALLORY}", "discord"),
        (f"discord:{MALLORY}", "discord"),
        (f"discord:{ANA}", "discord"),
    ]
    assert approval["decision"] is None and message.custom_ids  # still waiting


async def test_an_answer_that_is_none_of_the_choices_decides_nothing(desk: Desk) -> None:
    approval_id = await desk.ask("Which warehouse ships order 10?", ["Leeds", "Porto"])
    message = await desk.posted(approval_id)
    before = (await desk.approval(approval_id))["events"]

    # A forged pick: an option the menu does not have.
    for values in (["2"], ["Lisbon"], ["0", "1"]):
        forged = select_choice(
            desk.discord, message, f"nodbot:answer:{approval_id}", values, user=ANA
        )
        assert (await desk.send(forged)).json() == {"type": 6}
        token = str(forged["token"])
        told = await until("Ana is told", lambda: desk.told(token))  # noqa: B023 (awaited here)
        assert "not one of the question's choices" in told[0]
    # A forged answer form on a question with choices: the text is none of them.
    form_id = f"nodbot:answer-form:{approval_id}:{message.id}"
    typed = await desk.send(
        modal_submit(desk.discord, message, form_id, {"answer": "Lisbon"}, user=ANA)
    )
    assert typed.json()["type"] == 4
    assert "answer with one of: Leeds, Porto" in typed.json()["data"]["content"]

    approval = await desk.approval(approval_id)
    assert approval["decision"] is None
    events = approval["events"]
    assert events[: len(before)] == before
    added = [(e["kind"], e["actor"], e["detail"].get("reason")) for e in events[len(before) :]]
    assert added == [("refused", f"discord:{ANA}", NOT_A_CHOICE)] * 3  # the picks, not the form
    assert message.custom_ids  # still waiting


async def test_an_answer_given_over_the_api_edits_the_message(desk: Desk) -> None:
    approval_id = await desk.ask("Which warehouse ships order 11?", ["Leeds", "Porto"])
    message = await desk.posted(approval_id)
    answer = await desk.client.post(
        f"/approvals/{approval_id}/decide",
        json={"action": "respond", "message": "leeds"},
        headers=_auth(BOB_TOKEN),
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["answer"] == "Leeds"
    await desk.edited(message, "Answered: Leeds")
    assert "bob@example.com" in message.content.replace("\\", "")
    assert escape("bob@example.com") in message.content


@pytest.mark.parametrize("desk", ["6s"], indirect=True)  # room to be posted first
async def test_a_question_nobody_answers_times_out_and_says_so(desk: Desk) -> None:
    approval_id = await desk.ask("Which warehouse ships order 12?", ["Leeds", "Porto"])
    message = await desk.posted(approval_id)
    approval = await desk.decided(approval_id)
    assert approval["decision"]["decided_by"] == "nodbot:timeout"
    assert approval["answer"] is None
    await desk.edited(message, "Timed out")
