"""Questions over HTTP, on SQLite and PostgreSQL, against a bot served in-process: `POST
/questions` asks for a run (the rule that covers `ask` names who answers; with none it is
declined at once), the same question again is the same one (and an `Idempotency-Key` holds
as for `POST /approvals`), a malformed one is a 422 naming the field and stores nothing;
`POST /approvals/{id}/decide` answers (a respond) or declines (a deny) it, a bad answer is a
422 naming `response` that records nothing, and `GET /approvals/{id}?wait=` reads the answer;
every view says `kind`, `question` and `answer`; the examples of docs/api.md's "Questions"
do what they say."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from nodbot.bot.serve import Served, serving
from nodbot.core import QuestionPending, SqlApprovalStore
from nodbot.core.client import ApprovalClient, QuestionUnanswered
from nodbot.core.sqlstore.engine import normalize_url
from tests.bot.test_http_approvals import auth as api_auth
from tests.bot.test_http_approvals import serve as serve_api
from tests.bot.test_idempotency import curl_requests
from tests.core.store.conftest import database_url
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
TOKENS = {
    "agent": "token-of-the-asking-agent-000000",
    "lead@example.com": "token-of-the-lead-000000000000",
    "both": "token-of-a-deciding-agent-000000",
}
ASK_RULE = """
  - tool: ask
    reviewers: [lead@example.com]
"""

CONFIG = """
store: {{url: "{url}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: {agent}, scopes: [approvals:request]}}
    - {{name: lead@example.com, token: {lead}, scopes: [approvals:read, approvals:decide]}}
    - {{name: both, token: {both}, scopes: [approvals:request, approvals:decide]}}
external_tools: [refund]
rules:
  - tool: refund
    reviewers: [lead@example.com]
{ask_rule}
"""

WAREHOUSE = {
    "run_id": "thread-7",
    "question": "Which warehouse ships order A-1001?",
    "choices": ["Leeds", "Porto"],
    "id": "warehouse",
}


def auth(name: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {TOKENS[name]}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return headers


@dataclass
class Bot:
    served: Served
    url: str
    http: httpx.AsyncClient

    async def ask(self, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
        return await self.http.post(
            "/questions", json=WAREHOUSE if body is None else body, headers=headers or auth("agent")
        )

    async def decide(self, approval_id: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            f"/approvals/{approval_id}/decide", json=body, headers=auth("lead@example.com")
        )

    async def view(self, approval_id: str, wait: float = 0) -> dict[str, Any]:
        answer = await self.http.get(
            f"/approvals/{approval_id}", params={"wait": wait}, headers=auth("agent")
        )
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def count(self, table: str) -> int:
        engine = create_async_engine(normalize_url(self.url))
        try:
            async with engine.connect() as connection:
                found = await connection.scalar(text(f"SELECT count(*) FROM {table}"))
        finally:
            await engine.dispose()
        return int(found or 0)


@contextlib.asynccontextmanager
async def bot_on(url: str, tmp_path: Path, ask_rule: str = ASK_RULE) -> AsyncIterator[Bot]:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        CONFIG.format(
            url=url,
            agent=TOKENS["agent"],
            lead=TOKENS["lead@example.com"],
            both=TOKENS["both"],
            ask_rule=ask_rule,
        )
    )
    async with (
        serving(str(path)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        yield Bot(served, url, http)


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.fixture(params=BACKENDS)
async def bot(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bot]:
    async with database_url(request.param, tmp_path) as url, bot_on(url, tmp_path) as served:
        yield served


# --- asking ------------------------------------------------------------------------------------


async def test_a_question_is_put_to_the_rule_for_ask_and_asked_again_is_the_same(
    bot: Bot,
) -> None:
    asked = await bot.ask()
    assert asked.status_code == 201, asked.text
    view = asked.json()
    assert (view["kind"], view["tool"], view["status"]) == ("question", "ask", "pending")
    assert (view["run_id"], view["call_id"], view["requested_by"]) == (
        "thread-7",
        "ask_warehouse",
        "agent",
    )
    assert view["question"] == {
        "text": "Which warehouse ships order A-1001?",
        "choices": ["Leeds", "Porto"],
        "key": "warehouse",
        "asked_by": None,
        "state": "waiting",
    }
    assert view["answer"] is None and view["decision"] is None
    stored = await bot.served.service.store.get(view["approval_id"])
    assert stored.request.policy["reviewers"] == ["lead@example.com"]
    assert stored.request.policy["allowed_decisions"] == ["respond", "deny"]

    again = await bot.ask()
    assert again.status_code == 200 and again.json()["approval_id"] == view["approval_id"]
    # Without an id, the question is named by its text and choices: the same twice is one.
    unnamed = {key: value for key, value in WAREHOUSE.items() if key != "id"}
    first, second = await bot.ask(unnamed), await bot.ask(unnamed)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["approval_id"] == second.json()["approval_id"] != view["approval_id"]
    assert first.json()["call_id"] == "ask_" + first.json()["question"]["key"]
    # The same id with another question is another question: refused, nothing stored.
    other = await bot.ask({**WAREHOUSE, "question": "Which courier?"})
    assert other.status_code == 409 and other.json()["details"]["call_id"] == "ask_warehouse"
    assert await bot.count("approvals") == 2


async def test_an_idempotency_key_makes_one_question(bot: Bot) -> None:
    body = {**WAREHOUSE, "id": "keyed"}
    first = await bot.ask(body, **auth("agent", "ask-1"))
    again = await bot.ask(body, **auth("agent", "ask-1"))
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["approval_id"] == again.json()["approval_id"]
    other = await bot.ask({**body, "question": "Which courier?"}, **auth("agent", "ask-1"))
    assert other.status_code == 409 and other.json()["details"]["header"] == "Idempotency-Key"
    assert await bot.count("approvals") == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"question": "   "}, "question"),
        ({"question": ""}, "question"),
        ({"question": "?" * 2_001}, "question"),
        ({"question": 7}, "question"),
        ({"choices": [f"choice {n}" for n in range(26)]}, "choices"),
        ({"choices": ["Leeds", "x" * 80]}, "choices.1"),
        ({"choices": ["Leeds"]}, "choices"),
        ({"choices": ["Leeds", "leeds"]}, "choices"),
        ({"choices": "Leeds, Porto"}, "choices"),
        ({"choices": ["Leeds", "Por\nto"]}, "choices.1"),
        ({"id": "a/b"}, "id"),
        ({"id": "x" * 41}, "id"),
        ({"run_id": ""}, "run_id"),
        ({"asked_by": "refund"}, "asked_by"),
    ],
)
async def test_a_malformed_question_is_a_422_naming_the_field_and_stores_nothing(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    async with bot_on(f"sqlite:///{tmp_path / 'nodbot.db'}", tmp_path) as bot:
        refused = await bot.ask({**WAREHOUSE, **change})
        assert refused.status_code == 422, refused.text
        assert [error["field"] for error in refused.json()["details"]["errors"]] == [field]
        assert await bot.count("approvals") == 0


async def test_scopes_and_who_a_question_is_asked_for(bot: Bot) -> None:
    assert (await bot.ask(**auth("lead@example.com"))).status_code == 403
    assert (await bot.http.post("/questions", json=WAREHOUSE)).status_code == 401
    for_someone = await bot.ask({**WAREHOUSE, "requested_by": "carol"}, **auth("both"))
    assert for_someone.status_code == 403 and "asks only as itself" in for_someone.json()["error"]
    for_carol = await bot.ask({**WAREHOUSE, "requested_by": "carol"})
    assert for_carol.status_code == 201 and for_carol.json()["requested_by"] == "carol"


async def test_with_nobody_to_ask_a_question_is_declined_at_once(tmp_path: Path) -> None:
    async with bot_on(f"sqlite:///{tmp_path / 'nodbot.db'}", tmp_path, ask_rule="") as bot:
        asked = await bot.ask()
        assert asked.status_code == 201, asked.text
        view = asked.json()
        assert view["status"] == "denied" and view["question"]["state"] == "declined"
        assert view["answer"] is None
        assert view["decision"]["decided_by"] == "nodbot:no-rule"
        assert view["decision"]["reason"].startswith("nobody can be asked")
        assert "tool: ask" in view["decision"]["reason"]


# --- answering -----------------------------------------------------------------------------------


async def test_an_answer_is_decided_over_the_api_and_read_back_by_wait(bot: Bot) -> None:
    approval_id = (await bot.ask()).json()["approval_id"]
    waiting = asyncio.create_task(bot.view(approval_id, wait=20))
    answered = await bot.decide(approval_id, {"action": "respond", "message": "porto"})
    assert answered.status_code == 200, answered.text
    seen = await waiting
    for view in (answered.json(), seen):
        assert view["status"] == "denied"  # nothing ran; `answer` tells it from a decline
        assert (view["kind"], view["answer"], view["question"]["state"]) == (
            "question",
            "Porto",  # spelled as the question has it
            "answered",
        )
        assert view["decision"]["response"] == "Porto"
        assert view["decision"]["decided_by"] == "lead@example.com"
    decided = [event for event in seen["events"] if event["kind"] == "decided"]
    assert [(e["actor"], e["channel"]) for e in decided] == [("lead@example.com", "api")]
    # The same question asked again answers with its answer; a second answer is refused.
    again = await bot.ask()
    assert again.status_code == 200 and again.json()["answer"] == "Porto"
    second = await bot.decide(approval_id, {"type": "respond", "message": "Leeds"})
    assert second.status_code == 409


async def test_a_bad_answer_is_a_422_naming_it_and_records_nothing(bot: Bot) -> None:
    approval_id = (await bot.ask()).json()["approval_id"]
    events = len((await bot.view(approval_id))["events"])
    for body, field in (
        ({"action": "respond", "message": "Lisbon"}, "response"),
        ({"action": "respond", "message": "3"}, "response"),
        ({"action": "approve"}, "action"),
        ({"action": "edit", "arguments": {"question": "Which courier?"}}, "action"),
    ):
        refused = await bot.decide(approval_id, body)
        assert refused.status_code == 422, refused.text
        assert [error["field"] for error in refused.json()["details"]["errors"]] == [field]
    refused = await bot.decide(approval_id, {"action": "respond", "message": "Lisbon"})
    assert (
        refused.json()["error"]
        == "not an answer to this question: answer with one of: Leeds, Porto"
    )
    after = await bot.view(approval_id)
    assert after["status"] == "pending" and len(after["events"]) == events
    # A free-text question takes any text, but not a blank one.
    note = {"run_id": "thread-7", "question": "What should the parcel say?"}
    free = (await bot.ask(note)).json()["approval_id"]
    blank = await bot.decide(free, {"action": "respond", "message": "   "})
    assert blank.status_code == 422
    written = await bot.decide(free, {"action": "respond", "message": "Fragile <b>glass</b>"})
    assert written.status_code == 200 and written.json()["answer"] == "Fragile <b>glass</b>"


async def test_a_declined_question_says_so_and_is_no_call_to_consume(bot: Bot) -> None:
    approval_id = (await bot.ask()).json()["approval_id"]
    declined = await bot.decide(approval_id, {"action": "deny", "reason": "ask the customer"})
    assert declined.status_code == 200, declined.text
    view = declined.json()
    assert (view["status"], view["question"]["state"], view["answer"]) == (
        "denied",
        "declined",
        None,
    )
    assert view["decision"]["reason"] == "ask the customer"
    taken = await bot.http.post(f"/approvals/{approval_id}/consume", headers=auth("agent"))
    assert taken.status_code == 409 and "read" in taken.json()["error"]


async def test_a_question_times_out_as_declined(tmp_path: Path) -> None:
    rule = ASK_RULE + "    timeout: 1s\n"
    async with bot_on(f"sqlite:///{tmp_path / 'nodbot.db'}", tmp_path, ask_rule=rule) as bot:
        view = (await bot.ask()).json()
        assert view["timeout_decision"] == "deny" and view["deadline"] is not None
        seen = await bot.view(view["approval_id"], wait=20)
        assert (seen["status"], seen["question"]["state"], seen["answer"]) == (
            "denied",
            "timed_out",
            None,
        )
        assert seen["decision"]["decided_by"] == "nodbot:timeout"


async def test_every_view_says_its_kind_and_the_openapi_document_has_questions(bot: Bot) -> None:
    await bot.ask()
    call = {
        "tool": "refund",
        "arguments": {"order_id": "o-1"},
        "run_id": "thread-7",
        "call_id": "call_1",
    }
    review = await bot.http.post("/approvals", json=call, headers=auth("agent"))
    assert review.status_code == 201, review.text
    assert (review.json()["kind"], review.json()["question"], review.json()["answer"]) == (
        "review",
        None,
        None,
    )
    listed = await bot.http.get("/approvals", headers=auth("lead@example.com"))
    assert sorted(view["kind"] for view in listed.json()) == ["question", "review"]
    document = (await bot.http.get("/openapi.json")).json()
    operation = document["paths"]["/questions"]["post"]
    assert operation["description"] == "Needs a token with the scope `approvals:request`."
    schemas = document["components"]["schemas"]
    assert set(schemas["QuestionBody"]["properties"]) == {
        "run_id",
        "question",
        "choices",
        "id",
        "requested_by",
    }
    for view in listed.json():
        assert set(view) == set(schemas["ApprovalView"]["properties"])
    assert set(schemas["QuestionView"]["properties"]) == {
        "text",
        "choices",
        "key",
        "asked_by",
        "state",
    }


# --- the docs ------------------------------------------------------------------------------------


def docs_section() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    return text.split("\n## Questions\n", 1)[1].split("\n## ", 1)[0]


async def test_the_docs_examples_ask_answer_and_read_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    section = docs_section()
    [shell] = re.findall(r"```sh\n(.*?)```", section, re.S)
    [python] = re.findall(r"```python\n(.*?)```", section, re.S)
    tokens = {
        "NODBOT_TOKEN_AGENT": TOKENS["agent"],
        "NODBOT_TOKEN_LEAD": TOKENS["lead@example.com"],
    }
    async with bot_on(f"sqlite:///{tmp_path / 'nodbot.db'}", tmp_path) as bot:
        asked, decided, read = curl_requests(shell, bot.served.url, tokens)
        created = await bot.http.request(**asked)
        assert created.status_code == 201, created.text
        approval_id = created.json()["approval_id"]
        for request in (decided, read):
            request["url"] = request["url"].replace("<approval_id>", approval_id)
        answered = await bot.http.request(**decided)
        assert answered.status_code == 200, answered.text
        seen = (await bot.http.request(**read)).json()
        assert (seen["answer"], seen["question"]["state"]) == ("Porto", "answered")

        monkeypatch.setenv("NODBOT_TOKEN", TOKENS["agent"])
        code = python.replace("http://127.0.0.1:8080", bot.served.url)
        namespace: dict[str, Any] = {
            "ApprovalClient": ApprovalClient,
            "QuestionUnanswered": QuestionUnanswered,
            "os": os,
        }
        exec(f"async def example():\n{textwrap.indent(code, '    ')}", namespace)
        example = asyncio.create_task(namespace["example"]())
        question = await bot.view(await pending_question(bot), wait=0)
        assert question["question"]["text"] == "Which warehouse ships A-1001?"
        await bot.decide(question["approval_id"], {"action": "deny", "reason": "ask the customer"})
        await example
    assert capsys.readouterr().out == "not answered: ask the customer\n"


async def pending_question(bot: Bot) -> str:
    """The id of the one pending question, once it is asked."""

    async def asked() -> bool:
        listed = await bot.http.get(
            "/approvals", params={"status": "pending"}, headers=auth("lead@example.com")
        )
        return len(listed.json()) == 1

    await eventually(asked, "the docs' question was asked")
    listed = await bot.http.get(
        "/approvals", params={"status": "pending"}, headers=auth("lead@example.com")
    )
    [question] = listed.json()
    return str(question["approval_id"])


async def test_without_the_bots_rules_a_question_is_answered_never_approved(
    tmp_path: Path,
) -> None:
    # The API on its own (`create_app`, its default authorizer), as a program embeds it: a
    # question asked with `ctx.ask` under a plain `DeferredApproval` has no rule's policy.
    async with (
        SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store,
        serve_api(store) as api,
    ):
        ctx = api.executor.context(run_id="run_a")
        with pytest.raises(QuestionPending) as pending:
            await ctx.ask("Which warehouse?", choices=["Leeds", "Porto"])
        approval_id = pending.value.approval_id
        assert approval_id is not None
        approved = await api.decide(approval_id, "ana", action="approve")
        assert approved.status_code == 422
        bulk = await api.client.post(
            "/approvals/decide",
            json={"approval_ids": [approval_id], "action": "approve"},
            headers=api_auth("ana"),
        )
        assert bulk.json()["results"][0]["status"] == "refused"
        answered = await api.decide(approval_id, "ana", action="respond", message="leeds")
        assert answered.status_code == 200, answered.text
        assert answered.json()["answer"] == "Leeds"
        assert await ctx.ask("Which warehouse?", choices=["Leeds", "Porto"]) == "Leeds"
