"""Questions in Microsoft Teams: their cards (`bot.teams.questions`), and the questions asked,
answered and declined end to end, through `nodbot serve` in a process of its own, against the
local fake of the Bot Framework (tests/fakes/botframework.py), actions sent as Teams sends
them (`adaptiveCard/action` invokes, signed as the Bot Framework signs them).

A question with choices is posted once, a button per choice; a reviewer's click answers it
(the asker reads the answer over the API) and the card is replaced for everyone; a late click
is told it was already answered. Someone who is not asked, a forged choice, and an approve on
a question's card are refused, recorded, and decide nothing. A free-text question asked by an
agent's tool is answered through its answer box, and the run goes on with the answer. A
decline, and an answer given over the HTTP API, replace the card too.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from nodbot.bot.teams.cards import MAX_VALUE, plain
from nodbot.bot.teams.questions import (
    MAX_BUTTONS,
    UNREADABLE,
    chosen,
    question_card,
    question_decided_card,
)
from nodbot.core import ApprovalRecord, Decision
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.questions import (
    MAX_CHOICE,
    MAX_CHOICES,
    MAX_QUESTION,
    make_question,
    question_of,
    question_request,
)
from nodbot.core.store import TIMEOUT_DECIDER
from tests.bot.processes import Running, nodbot_serve
from tests.bot.test_email_end_to_end import ledger, until
from tests.bot.test_teams_end_to_end import _errors, _verbs
from tests.fakes.botframework import BotFrameworkFake, Posted, botframework_fake

APP_ID = "00000000-0000-4000-8000-00000000b07b"
PASSWORD = "password-of-the-teams-question-bot"
CONVERSATION = "19:warehouse@thread.tacv2"
TOKEN = "token-of-the-question-asker-000000"
CAROL_TOKEN = "token-of-carol-the-warehouse-lead0"
ASKER = {"Authorization": f"Bearer {TOKEN}"}
ANA, BOB = "29:ana", "29:bob"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: asker, token: {token}, scopes: [runs:write, approvals:read, approvals:request]}}
    - {{name: carol@example.com, token: {carol}, scopes: [approvals:read, approvals:decide]}}
agents:
  asker: tests.bot.asking_agent:agent
external_tools: [refund]
teams:
  app_id: {app_id}
  app_password: ${{TEAMS_APP_PASSWORD}}
  openid_url: {openid_url}
  token_url: {token_url}
  post_to:
    - {{conversation: "{conversation}", service_url: {service_url}}}
rules:
  - tool: ask
    description: Shipping questions go to the warehouse leads.
    reviewers: [ana@example.com, carol@example.com]
  - tool: refund
    reviewers: [ana@example.com]
"""

# Every character Adaptive Card markdown gives a meaning to, somewhere in a text.
_MARKDOWN = re.compile(r"(?<!\\)[`*_\[\]()#>~|<]")


# --- the cards -------------------------------------------------------------------------------


def _record(text: str, choices: list[str] | None, **fields: Any) -> ApprovalRecord:
    question = make_question(text, choices=choices, asked_by="ship")
    request = question_request(question, run_id="run-1", call_id="call_1", requested_by="asker")
    return ApprovalRecord(
        approval_id="apr-q1", request=request, created_at=datetime.now(UTC), **fields
    )


def _texts(card: dict[str, Any]) -> list[str]:
    return [block["text"] for block in card["body"] if block.get("type") == "TextBlock"]


def _unescaped(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


questions = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=MAX_QUESTION
).filter(lambda text: text.strip() != "")
choice_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"]),
    min_size=1,
    max_size=MAX_CHOICE,
).filter(lambda text: text.strip() != "")
choice_lists = st.lists(
    choice_text, min_size=2, max_size=MAX_CHOICES, unique_by=lambda c: c.strip().casefold()
)


@settings(max_examples=60, deadline=None)
@given(text=questions, choices=st.none() | choice_lists)
def test_a_question_card_shows_the_question_escaped_and_offers_each_choice(
    text: str, choices: list[str] | None
) -> None:
    record = _record(text, choices)
    question = question_of(record.request)
    assert question is not None
    card = question_card(record, allowed=["respond", "deny"])
    assert json.loads(json.dumps(card)) == card and card["version"] == "1.5"
    # The question is one TextBlock, whole, its markdown escaped: nothing in it formats.
    shown = plain(text, MAX_QUESTION)
    assert shown in _texts(card)
    assert _MARKDOWN.search(re.sub(r"\\\\", "", shown)) is None
    assert _unescaped(shown) == text
    verbs = [action["verb"] for action in card["actions"]]
    assert len(card["actions"]) <= MAX_BUTTONS + 1 and verbs[-1] == "decline"
    inputs = {e["id"]: e for e in card["body"] if e["type"].startswith("Input.")}
    if question.choices is None:
        assert verbs == ["answer", "decline"] and inputs["answer"]["maxLength"] == MAX_RESPONSE
        return
    # Each choice is offered once, its title bounded; what comes back names it by index.
    if len(question.choices) <= MAX_BUTTONS:
        offered = [a for a in card["actions"] if a["verb"] == "answer"]
        titles = [a["title"] for a in offered]
        values = [a["data"]["choice"] for a in offered]
    else:
        assert verbs == ["answer", "decline"] and inputs["choice"]["type"] == "Input.ChoiceSet"
        titles = [c["title"] for c in inputs["choice"]["choices"]]
        values = [c["value"] for c in inputs["choice"]["choices"]]
    assert titles == list(question.choices)
    assert all(len(title) <= MAX_CHOICE for title in titles)
    assert [chosen(question, value) for value in values] == list(question.choices)


@given(value=st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats())
def test_only_the_index_of_an_offered_choice_names_it(value: object) -> None:
    question = question_of(_record("Which warehouse?", ["Leeds", "Porto"]).request)
    found = chosen(question, value)
    named = value if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        named = str(value)
    assert found == {"0": "Leeds", "1": "Porto"}.get(named or "")
    assert chosen(question_of(_record("Say?", None).request), 0) is None
    assert chosen(None, "0") is None


def test_a_question_card_offers_only_what_the_rule_allows() -> None:
    record = _record("Which warehouse?", ["Leeds", "Porto"])
    card = question_card(record, allowed=["deny"])
    assert [a["verb"] for a in card["actions"]] == ["decline"]
    card = question_card(record, allowed=["respond"], error="you are *not* asked")
    assert [a["title"] for a in card["actions"]] == ["Leeds", "Porto"]
    assert "Not done: you are \\*not\\* asked" in _texts(card)
    assert not any(e["type"] == "Input.Text" for e in card["body"])
    # A question stored in a shape this bot does not know: declined only.
    broken = _record("Which warehouse?", ["Leeds", "Porto"])
    broken.request.arguments["choices"] = "Leeds"
    card = question_card(broken, allowed=["respond", "deny"])
    assert UNREADABLE in _texts(card) and [a["verb"] for a in card["actions"]] == ["decline"]


@settings(max_examples=40, deadline=None)
@given(
    answer=st.text(min_size=1, max_size=MAX_RESPONSE).filter(str.strip),
    by=st.text(min_size=1, max_size=400),
)
def test_a_decided_question_card_shows_the_answer_escaped_and_no_action(
    answer: str, by: str
) -> None:
    record = _record(
        "What should the parcel say?",
        None,
        decision=Decision(approved=False, response=answer, decided_by=by),
        decided_at=datetime.now(UTC),
    )
    card = question_decided_card(record)
    assert card["actions"] == []
    texts = _texts(card)
    assert f"Answered: {plain(answer, MAX_RESPONSE)}" in texts
    assert all(_MARKDOWN.search(re.sub(r"\\\\", "", t)) is None for t in texts[1:3])
    assert any(t.startswith(f"By {plain(by, 200)}, ") for t in texts)
    assert len(plain(by, 200)) <= 2 * 200 and len(plain("x" * 5000)) == MAX_VALUE


def test_a_decided_question_card_says_declined_or_timed_out() -> None:
    now = datetime.now(UTC)
    declined = _record(
        "Which warehouse?",
        ["Leeds", "Porto"],
        decision=Decision(approved=False, reason="not *mine*", decided_by="ana@example.com"),
        decided_at=now,
    )
    card = question_decided_card(declined, note="this question was already declined by ana")
    texts = _texts(card)
    assert "Declined" in texts and "Reason: not \\*mine\\*" in texts
    assert "Not done: this question was already declined by ana" in texts
    timed_out = _record(
        "Which warehouse?",
        ["Leeds", "Porto"],
        decision=Decision(approved=False, decided_by=TIMEOUT_DECIDER),
        decided_at=now,
    )
    texts = _texts(question_decided_card(timed_out))
    assert any(t.startswith("Timed out") for t in texts)


# --- end to end ------------------------------------------------------------------------------


@dataclass
class Desk:
    """The bot serving, the Bot Framework fake, and an HTTP client of the bot."""

    bot: Running
    client: httpx.AsyncClient
    bf: BotFrameworkFake
    tmp_path: Path

    async def ask(self, run_id: str, question: str, choices: list[str] | None = None) -> str:
        """A question asked over `POST /questions`: its review's id."""
        body: dict[str, Any] = {"run_id": run_id, "question": question}
        if choices is not None:
            body["choices"] = choices
        answer = await self.client.post("/questions", json=body, headers=ASKER)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["approval_id"])

    async def approval(self, approval_id: str) -> dict[str, Any]:
        found = await self.client.get(f"/approvals/{approval_id}", headers=ASKER)
        assert found.status_code == 200, found.text
        approval: dict[str, Any] = found.json()
        return approval

    async def card(self, approval_id: str) -> Posted:
        """The question's card in the conversation, once posted."""

        def found() -> Posted | None:
            for posted in self.bf.cards(CONVERSATION):
                if approval_id in json.dumps(posted.versions[0]):
                    return posted
            return None

        posted: Posted = await until(f"the card of {approval_id}", found)
        return posted

    async def act(
        self,
        posted: Posted,
        user: str,
        verb: str,
        inputs: dict[str, Any] | None = None,
        *,
        title: str | None = None,
        forged: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`user` takes action `verb` (the one titled `title`) on the card, its data changed
        by `forged`: the card Teams is answered to show."""
        activity = self.bf.invoke(posted, user, verb, inputs=inputs, title=title)
        activity["value"]["action"]["data"] |= forged or {}
        token = self.bf.sign(activity)
        answer = await self.client.post(
            "/teams/messages", json=activity, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        card: dict[str, Any] = answer.json()["value"]
        return card

    async def replaced(self, posted: Posted, outcome: str) -> dict[str, Any]:
        """The card, once the outbox has replaced it with the decided one saying `outcome`."""

        def done() -> dict[str, Any] | None:
            card = posted.card
            return card if not card["actions"] and outcome in _texts(card) else None

        try:
            card: dict[str, Any] = await until(f"the card says {outcome}", done)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it says {json.dumps(posted.card)}") from None
        return card


@contextlib.asynccontextmanager
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    async with botframework_fake(app_id=APP_ID, password=PASSWORD) as bf:
        bf.add_member(ANA, "ana@example.com")
        bf.add_member(BOB, "bob@example.com")
        config = tmp_path / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                carol=CAROL_TOKEN,
                app_id=APP_ID,
                openid_url=bf.openid_url,
                token_url=bf.token_url,
                conversation=CONVERSATION,
                service_url=bf.service_url,
            )
        )
        environment = {
            "TEAMS_APP_PASSWORD": PASSWORD,
            "NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt"),
        }
        async with (
            nodbot_serve(config, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            yield Desk(bot, client, bf, tmp_path)


def _refusals(approval: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (e["actor"], e["detail"]["reason"]) for e in approval["events"] if e["kind"] == "refused"
    ]


async def test_a_question_with_choices_is_answered_by_a_click_in_teams(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        approval_id = await d.ask(
            "run-q1", "Which **warehouse** ships [order 7](https://x.example)?", ["Leeds", "Porto"]
        )
        posted = await d.card(approval_id)
        card = posted.card
        assert [(a["verb"], a["title"]) for a in card["actions"]] == [
            ("answer", "Leeds"),
            ("answer", "Porto"),
            ("decline", "Decline"),
        ]
        texts = _texts(card)
        assert "Which \\*\\*warehouse\\*\\* ships \\[order 7\\]\\(https://x.example\\)?" in texts
        assert "Shipping questions go to the warehouse leads." in texts

        # Bob is not asked: refused, recorded, nothing decided; the card says why.
        answer = await d.act(posted, BOB, "answer", title="Leeds")
        assert any("not one of the reviewers of this question" in t for t in _errors(answer))
        # A forged choice (an index not offered, a choice's text): refused, recorded.
        for forged in ({"choice": "7"}, {"choice": "Leeds"}, {"choice": 0.0}):
            answer = await d.act(posted, ANA, "answer", forged=forged)
            assert _errors(answer) == ["Not done: this is not one of the question's answers"]
        # No choice at all (the list's Answer with nothing picked): said, nothing recorded.
        answer = await d.act(posted, ANA, "answer", forged={"choice": None})
        assert _errors(answer) == ["Not done: pick one of the answers first"]
        # An approve on a question's card: refused, recorded.
        answer = await d.act(posted, ANA, "approve", forged={"approval_id": approval_id})
        assert any("this is a question" in t for t in _errors(answer))
        approval = await d.approval(approval_id)
        assert approval["status"] == "pending" and approval["decision"] is None
        assert approval["answer"] is None and approval["question"]["state"] == "waiting"
        refusals = _refusals(approval)
        assert refusals[0] == (
            "bob@example.com",
            "you are not one of the reviewers of this question",
        )
        assert [actor for actor, _ in refusals[1:]] == ["ana@example.com"] * 4
        assert [e["kind"] for e in approval["events"]].count("decided") == 0

        # Ana picks Porto: recorded as the question spells it, the card replaced for everyone.
        answer = await d.act(posted, ANA, "answer", title="Porto")
        assert _verbs(answer) == [] and "Answered: Porto" in _texts(answer)
        approval = await d.approval(approval_id)
        assert approval["question"]["state"] == "answered" and approval["answer"] == "Porto"
        [decided] = [e for e in approval["events"] if e["kind"] == "decided"]
        assert (decided["actor"], decided["channel"]) == ("ana@example.com", "teams")
        assert decided["detail"]["action"] == "respond"
        assert decided["detail"]["evidence"]["card"] == posted.id
        await d.replaced(posted, "Answered: Porto")

        # A click from the card as it was: told it was answered; nothing changes.
        late = await d.act(
            posted, ANA, "answer", forged={"approval_id": approval_id, "choice": "0"}
        )
        assert _errors(late)[0] == "Not done: this question was already answered by ana@example.com"
        assert (await d.approval(approval_id))["answer"] == "Porto"
        assert len(d.bf.cards(CONVERSATION)) == 1

        # Declined, with the reason typed on the card.
        declined = await d.ask("run-q2", "Which warehouse ships order 8?", ["Leeds", "Porto"])
        posted = await d.card(declined)
        answer = await d.act(posted, ANA, "decline", {"reason": "order 8 is cancelled"})
        assert "Declined" in _texts(answer)
        approval = await d.approval(declined)
        assert approval["question"]["state"] == "declined" and approval["answer"] is None
        assert approval["decision"]["reason"] == "order 8 is cancelled"
        await d.replaced(posted, "Reason: order 8 is cancelled")

        # Answered elsewhere (the HTTP API): the card is replaced all the same.
        elsewhere = await d.ask("run-q3", "Which warehouse ships order 9?", ["Leeds", "Porto"])
        posted = await d.card(elsewhere)
        by_carol = await d.client.post(
            f"/approvals/{elsewhere}/decide",
            json={"action": "respond", "message": "leeds"},
            headers={"Authorization": f"Bearer {CAROL_TOKEN}"},
        )
        assert by_carol.status_code == 200, by_carol.text
        card = await d.replaced(posted, "Answered: Leeds")
        assert "By carol@example.com" in " ".join(_texts(card))
        late = await d.act(posted, ANA, "decline", forged={"approval_id": elsewhere})
        assert "already answered by carol@example.com" in _errors(late)[0]
        assert (await d.approval(elsewhere))["question"]["state"] == "answered"
        assert len(d.bf.cards(CONVERSATION)) == 3


async def test_a_free_text_question_of_a_run_is_answered_through_its_form(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        started = await d.client.post(
            "/runs", json={"agent": "asker", "input": "note A-7"}, headers=ASKER
        )
        assert started.status_code == 201, started.text
        run = started.json()
        [pending] = run["pending"]
        run_id, approval_id = run["run_id"], pending["approval_id"]
        posted = await d.card(approval_id)
        card = posted.card
        assert _verbs(card) == ["answer", "decline"]
        inputs = {e["id"]: e for e in card["body"] if e["type"] == "Input.Text"}
        assert inputs["answer"]["maxLength"] == MAX_RESPONSE
        assert "What should the parcel of order A-7 say?" in _texts(card)

        # A blank answer, or one too long: said on the card, nothing recorded.
        answer = await d.act(posted, ANA, "answer", {"answer": "   "})
        assert _errors(answer) == ["Not done: an answer is needed"]
        answer = await d.act(posted, ANA, "answer", {"answer": "x" * (MAX_RESPONSE + 1)})
        assert "at most 2000 are allowed" in _errors(answer)[0]
        approval = await d.approval(approval_id)
        assert approval["status"] == "pending" and _refusals(approval) == []

        text = "Fragile: keep *upright*"
        answer = await d.act(posted, ANA, "answer", {"answer": text})
        assert "Answered: Fragile: keep \\*upright\\*" in _texts(answer)

        async def finished() -> dict[str, Any] | None:
            found = (await d.client.get(f"/runs/{run_id}", headers=ASKER)).json()
            return found if found["status"] in {"finished", "failed"} else None

        run = await until(f"run {run_id} finishes", finished)
        assert run["status"] == "finished", run
        assert ledger(tmp_path) == [f"A-7 {text}"]
        approval = await d.approval(approval_id)
        assert approval["answer"] == text and approval["question"]["state"] == "answered"
        await d.replaced(posted, "Answered: Fragile: keep \\*upright\\*")


async def test_answers_are_taken_only_on_a_question_s_own_card(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        question = await d.ask("run-q4", "Which warehouse ships order 10?", ["Leeds", "Porto"])
        call = {
            "tool": "refund",
            "arguments": {"order_id": "o-1", "amount": 120},
            "run_id": "run-q4",
            "call_id": "call_1",
        }
        asked = await d.client.post("/approvals", json=call, headers=ASKER)
        assert asked.status_code == 201, asked.text
        review = str(asked.json()["approval_id"])
        card_of_question, card_of_review = await d.card(question), await d.card(review)
        # An answer or a decline on a call's card: refused, recorded, nothing decided.
        for verb in ("answer", "decline"):
            forged = {"approval_id": review, "answer": "yes", "choice": "0"}
            answer = await d.act(card_of_review, ANA, verb, forged=forged)
            assert any("not a question" in text for text in _errors(answer))
        # The question's id put on the call's card: refused on the question.
        forged = {"approval_id": question, "choice": "0"}
        answer = await d.act(card_of_review, ANA, "answer", forged=forged)
        assert "does not belong" in json.dumps(answer)
        approval = await d.approval(review)
        assert approval["status"] == "pending"
        assert [reason for _, reason in _refusals(approval)] == [
            "this review is not a question: decide it with the actions of its card"
        ] * 2
        approval = await d.approval(question)
        assert approval["question"]["state"] == "waiting"
        assert _refusals(approval) == [("teams:29:ana", "this card does not belong to this review")]
        # On its own card, the question is answered.
        answer = await d.act(card_of_question, ANA, "answer", title="Leeds")
        assert "Answered: Leeds" in _texts(answer)
        assert (await d.approval(question))["answer"] == "Leeds"

        # More choices than buttons fit: a list of them, and one Answer.
        bays = [f"Bay {n}" for n in range(1, 8)]
        listed = await d.ask("run-q5", "Which bay loads order 10?", bays)
        posted = await d.card(listed)
        assert _verbs(posted.card) == ["answer", "decline"]
        answer = await d.act(posted, ANA, "answer", {"choice": "6"}, title="Answer")
        assert "Answered: Bay 7" in _texts(answer)
        assert (await d.approval(listed))["answer"] == "Bay 7"
