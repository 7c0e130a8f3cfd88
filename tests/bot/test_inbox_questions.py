"""Questions to a person (`ctx.ask`, `core.questions`) in the web inbox, over real HTTP
(uvicorn on a loopback port, httpx as the browser with its signed session cookie), on
SQLite and PostgreSQL: the list shows a question as one, with no box to tick; its page
offers its choices (or a text) and Decline, never Approve or Edit; an answer is a respond
recorded as the inbox's other decisions are, and the call that asked gets it; a bad answer,
a forged form, a non-reviewer, a missing form token and a second answer record nothing.

The questions are asked by the tools of `tests.bot.asking_agent` (`ship` asks which
warehouse, Leeds or Porto; `note` asks for free text), run by the bot's own rules executor:
a rule `tool: ask` names who answers."""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from nodbot.bot.config import load_config
from nodbot.bot.http import create_app
from nodbot.bot.policy.authorize import authorizer_for
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.web import WebInbox
from nodbot.bot.web.history import event_view
from nodbot.core import ApprovalEvent, SqlApprovalStore, ToolCall, ToolContext, ToolRegistry
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.store import TIMEOUT_DECIDER
from tests.bot import asking_agent
from tests.bot.test_web_inbox import CAROL, LEAD, OTHER, SECRET, Clock, Inbox, csrf_of, text_of
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
DAVE = "dave@example.com"
"""A second reviewer of questions."""

CONFIG = f"""
web:
  secret: {SECRET}
  link_ttl: 1h
  session_ttl: 2h
rules:
  - tool: ask
    description: Shipping questions.
    reviewers: [{LEAD}, {DAVE}]
    timeout: 30m
  - tool: refund
    reviewers: [{LEAD}]
"""


def registry_of(ran: list[str]) -> ToolRegistry:
    """The asking agent's tools (`ship`, `note`), and a refund that a rule reviews."""
    others = ToolRegistry()

    @others.tool
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append(f"refund {order_id}")
        return "refunded"

    return ToolRegistry.merged([asking_agent.tools, others])


def write_config(folder: Path) -> Path:
    """The configuration above, written in `folder` (made when missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nodbot.yml"
    path.write_text(CONFIG)
    return path


@contextlib.asynccontextmanager
async def served_questions(tmp_path: Path, backend: str = "sqlite") -> AsyncIterator[Inbox]:
    """A bot's inbox whose rules send questions to lead@ and dave@, over the store of
    `backend` (its clock the inbox's, so that a test may let a question time out)."""
    config = load_config(write_config(tmp_path))
    ran: list[str] = []
    registry = registry_of(ran)
    clock = Clock()
    async with (
        database_url(backend, tmp_path) as url,
        SqlApprovalStore(url, clock=lambda: datetime.fromtimestamp(clock.now, UTC)) as store,
    ):
        authorizer = authorizer_for(config)
        inbox = WebInbox(
            store=store, registry=registry, web=config.web, authorize=authorizer, clock=clock
        )
        app = create_app(
            store=store, registry=registry, tokens=[], authorize_decision=authorizer, inbox=inbox
        )
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        task = asyncio.create_task(server.serve())
        harness: Inbox | None = None
        try:
            for _ in range(500):  # bounded: at most 5 s
                if server.started or task.done():
                    break
                await asyncio.sleep(0.01)
            assert server.started, "uvicorn did not start"
            port = server.servers[0].sockets[0].getsockname()[1]
            executor = rules_executor(registry, config, store)
            harness = Inbox(f"http://127.0.0.1:{port}", config, store, executor, clock, ran)
            yield harness
        finally:
            for client in harness.clients if harness else []:
                await client.aclose()
            server.should_exit = True
            await task


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_questions(tmp_path) as harness:
        yield harness


@pytest.fixture(params=SQL_BACKENDS)
async def sql_web(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_questions(tmp_path, request.param) as harness:
        yield harness


@pytest.fixture(autouse=True)
def _shipped() -> None:
    asking_agent.SHIPPED.clear()


async def asked(
    web: Inbox, tool: str = "ship", order_id: str = "A1", run_id: str = "run_q"
) -> tuple[ToolCall, ToolContext, str]:
    """A run's call of `tool` that asked a person and waits: the call, its context, and the
    question's approval id."""
    call = ToolCall(name=tool, arguments={"order_id": order_id}, id="call_1")
    ctx = web.executor.context(run_id=run_id, requested_by=CAROL)
    result = await web.executor.run_call(call, ctx)
    assert result.status == "pending" and result.error is not None, result
    assert result.error.kind == "question-pending", result.error
    return call, ctx, result.error.details["approval_id"]


async def post(
    client: httpx.AsyncClient, approval_id: str, **fields: str
) -> tuple[httpx.Response, httpx.Response]:
    """The question's page, then its form posted as a browser does after loading it."""
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200, page.text
    sent = await client.post(
        f"/inbox/approvals/{approval_id}/decide", data={"csrf": csrf_of(page), **fields}
    )
    return page, sent


def listed(page: httpx.Response) -> dict[str, str]:
    """Each row of the list by approval id: the row's HTML."""
    assert page.status_code == 200, page.text
    return dict(re.findall(r'<tr data-id="([^"]+)"[^>]*>(.*?)</tr>', page.text, re.S))


def shown(page: httpx.Response) -> str:
    """The text of the page's main part (not its styles and scripts)."""
    main = page.text.split("<main>", 1)[1].split("</main>", 1)[0]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", main)).split())


def radios(page: httpx.Response) -> list[str]:
    return re.findall(r'<input type="radio" name="response" value="([^"]*)"', page.text)


# --- the list -------------------------------------------------------------------------------


async def test_the_list_shows_a_question_as_one_with_no_box_to_tick(web: Inbox) -> None:
    _, _, ship = await asked(web, "ship", order_id="<b>A1</b>", run_id="run_1")
    _, _, note = await asked(web, "note", order_id="A2", run_id="run_2")
    _, _, refund = await web.pending("refund", run_id="run_3", order_id="o-7", amount=5.0)
    lead = await web.signed_in(LEAD)
    page = await lead.get("/inbox")
    rows = listed(page)
    assert set(rows) == {ship, note, refund}
    for question in (ship, note):
        assert ">Question</a>" in rows[question]
        assert 'type="checkbox"' not in rows[question]  # selected reviews are approved or denied
    assert 'type="checkbox"' in rows[refund] and ">refund</a>" in rows[refund]
    # The question's text, escaped, in place of arguments; its choices; who asked.
    assert "Which warehouse ships order &lt;b&gt;A1&lt;/b&gt;?" in rows[ship]
    assert "<b>A1</b>" not in page.text
    assert "Leeds / Porto" in rows[ship] and "asked by <code>ship</code>" in rows[ship]
    assert "What should the parcel of order A2 say?" in rows[note]
    assert "a free answer" in rows[note]
    # The tool filter's `ask` lists the questions alone; a search finds a question's words.
    assert set(listed(await lead.get("/inbox?tool=ask"))) == {ship, note}
    assert set(listed(await lead.get("/inbox?q=parcel"))) == {note}
    assert set(listed(await lead.get("/inbox?tool=refund"))) == {refund}


async def test_a_decided_question_is_listed_as_answered_declined_or_timed_out(web: Inbox) -> None:
    _, _, answered = await asked(web, "note", run_id="run_1")
    _, _, declined = await asked(web, "ship", run_id="run_2")
    _, _, waits = await asked(web, "ship", run_id="run_3")
    lead = await web.signed_in(LEAD)
    answering = await post(lead, answered, action="respond", response="Handle with care")
    assert answering[1].status_code == 303
    declining = await post(lead, declined, action="deny", reason="order on hold")
    assert declining[1].status_code == 303
    web.clock.now += 31 * 60  # past the question's 30 minutes
    assert [r.approval_id for r in await web.store.expire_due()] == [waits]
    timed_out = await web.store.get(waits)
    assert timed_out.decision is not None and timed_out.decision.decided_by == TIMEOUT_DECIDER
    page = await lead.get("/inbox?status=decided")
    rows = listed(page)
    assert '<span class="status answered">answered</span>' in rows[answered]
    assert 'answer: <span class="answer">Handle with care</span>' in rows[answered]
    assert '<span class="status declined">declined</span>' in rows[declined]
    assert '<span class="status timed-out">timed out</span>' in rows[waits]
    assert "denied" not in shown(page)  # a question is never said to be denied
    # The store has them as denials, as its status filter does.
    assert {(await web.store.get(i)).status for i in rows} == {"denied"}
    assert set(listed(await lead.get("/inbox?q=care"))) == {answered}  # its answer is searched


async def test_a_question_selected_in_the_list_is_left_as_it_is(web: Inbox) -> None:
    _, _, question = await asked(web)
    _, _, refund = await web.pending("refund", run_id="run_r", order_id="o-7", amount=5.0)
    lead = await web.signed_in(LEAD)
    page = await lead.get("/inbox")
    form = {"csrf": csrf_of(page), "action": "deny", "id": [question, refund]}
    sent = await lead.post("/inbox/decide", data=form)
    assert sent.status_code == 303, sent.text
    done = await lead.get(sent.headers["location"])
    said = text_of(done)
    assert "1 of 2 denied" in said
    assert "this is a question, answered or declined on its own page" in said
    assert (await web.store.get(question)).status == "pending"
    assert await web.events(question) == [("created", CAROL, None)]
    assert (await web.store.get(refund)).status == "denied"


# --- the question's page --------------------------------------------------------------------


async def test_the_page_offers_the_choices_and_decline_and_never_approve(web: Inbox) -> None:
    _, _, question = await asked(web)
    lead = await web.signed_in(LEAD)
    page = await lead.get(f"/inbox/approvals/{question}")
    assert page.status_code == 200, page.text
    said = shown(page)
    assert "<title>Question (waiting)" in page.text
    assert "Which warehouse ships order A1?" in said
    assert "Asked by the tool ship" in said and f"Requester {CAROL}" in said
    assert "Run run_q , call call_1.ask_" in said
    assert "Deadline in 30 min , then it times out unanswered" in said
    assert f"Who may answer {LEAD}, {DAVE}" in said
    assert radios(page) == ["Leeds", "Porto"]
    assert 'id="decide-answer"' in page.text and 'id="decide-decline"' in page.text
    assert '<input type="hidden" name="action" value="respond">' in page.text
    main = page.text.split("<main>", 1)[1].split("</main>", 1)[0]
    for never in ("decide-approve", "decide-edit", "decide-respond", "<h2>Arguments</h2>"):
        assert never not in main
    assert "Approve" not in said and "Respond" not in said and "Edit" not in said


async def test_answering_with_a_choice_records_it_and_the_call_that_asked_gets_it(
    sql_web: Inbox,
) -> None:
    web = sql_web
    call, ctx, question = await asked(web)
    lead = await web.signed_in(LEAD)
    _, sent = await post(lead, question, action="respond", response="Porto")
    assert (sent.status_code, sent.headers["location"]) == (303, f"/inbox/approvals/{question}")
    record = await web.store.get(question)
    assert record.decision is not None
    assert (record.decision.response, record.decision.decided_by) == ("Porto", LEAD)
    [decided] = [e for e in await web.store.events(question) if e.kind == "decided"]
    assert (decided.actor, decided.channel, decided.detail["action"]) == (LEAD, "web", "respond")
    assert decided.detail["response"] == "Porto" and "session" in decided.detail["evidence"]
    # The call that asked runs again from the top, and `ask` returns the answer.
    result = await web.executor.run_call(call, ctx)
    assert (result.status, result.value) == ("ok", "A1 ships from Porto")
    assert asking_agent.SHIPPED == [("A1", "Porto")]
    page = await lead.get(f"/inbox/approvals/{question}")
    said = shown(page)
    assert f"Answered by {LEAD} : Porto" in said
    assert '<span class="status answered">answered</span>' in page.text
    assert 'id="decide-answer"' not in page.text and 'id="decide-decline"' not in page.text
    assert "denied" not in said and "approved" not in said
    # The history says it was answered, with the answer.
    history = page.text.split("<h2>History</h2>", 1)[1]
    assert re.search(r"<td data-label=\"What\">answered</td>", history)
    assert '<span class="muted">answer</span> Porto' in history


async def test_a_choice_may_be_given_in_any_case_and_is_kept_as_the_question_spells_it(
    web: Inbox,
) -> None:
    _, _, question = await asked(web)
    lead = await web.signed_in(LEAD)
    assert (await post(lead, question, action="respond", response=" leeds "))[1].status_code == 303
    record = await web.store.get(question)
    assert record.decision is not None and record.decision.response == "Leeds"


async def test_a_free_text_answer_is_bounded_escaped_and_given_to_the_call(web: Inbox) -> None:
    call, ctx, question = await asked(web, "note")
    lead = await web.signed_in(LEAD)
    page = await lead.get(f"/inbox/approvals/{question}")
    assert radios(page) == []
    assert re.search(
        rf'<textarea id="answer-text" name="response" rows="4" maxlength="{MAX_RESPONSE}" '
        r"required>",
        page.text,
    )
    assert MAX_RESPONSE == 2000
    for wrong, why in (("  ", "An answer is needed"), ("x" * 2001, "at most 2000")):
        _, refused = await post(lead, question, action="respond", response=wrong)
        assert refused.status_code == 422, refused.text
        assert why in refused.text and "nothing was recorded" in refused.text
        assert 'id="decide-answer"' in refused.text  # the form again
    assert await web.events(question) == [("created", CAROL, None)]
    text = "Fragile <script>alert(1)</script>\nthis side up"
    _, sent = await post(lead, question, action="respond", response=text)
    assert sent.status_code == 303, sent.text
    result = await web.executor.run_call(call, ctx)
    assert (result.status, result.value) == ("ok", f"A1: {text}")
    after = await lead.get(f"/inbox/approvals/{question}")
    assert "<script>alert(1)</script>" not in after.text
    assert "Fragile &lt;script&gt;alert(1)&lt;/script&gt;\nthis side up" in after.text


async def test_declining_tells_the_call_and_the_page_says_declined(web: Inbox) -> None:
    call, ctx, question = await asked(web)
    dave = await web.signed_in(DAVE)
    _, sent = await post(dave, question, action="deny", reason="this order is on hold")
    assert sent.status_code == 303, sent.text
    record = await web.store.get(question)
    assert record.decision is not None and record.decision.response is None
    assert record.decision.reason == "this order is on hold"
    result = await web.executor.run_call(call, ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "question-unanswered"
    assert "this order is on hold" in result.error.message
    assert asking_agent.SHIPPED == []
    page = await dave.get(f"/inbox/approvals/{question}")
    said = shown(page)
    assert f"Declined by {DAVE} . Reason: this order is on hold" in said
    assert '<span class="status declined">declined</span>' in page.text
    assert "denied" not in said
    history = page.text.split("<h2>History</h2>", 1)[1]
    assert '<td data-label="What">declined</td>' in history


async def test_who_may_not_answer_is_refused_and_who_may_not_see_finds_nothing(
    web: Inbox,
) -> None:
    _, _, question = await asked(web)
    # The requester sees the question (the run is theirs) but is no reviewer of it.
    carol = await web.signed_in(CAROL)
    page = await carol.get(f"/inbox/approvals/{question}")
    assert page.status_code == 200 and "You may not answer this question" in text_of(page)
    assert 'id="decide-answer"' not in page.text and radios(page) == []
    sent = await carol.post(
        f"/inbox/approvals/{question}/decide",
        data={"csrf": csrf_of(page), "action": "respond", "response": "Porto"},
    )
    assert sent.status_code == 403, sent.text
    assert "Nothing was recorded" in sent.text
    assert (await web.store.get(question)).status == "pending"
    kinds = [kind for kind, _, _ in await web.events(question)]
    assert kinds == ["created", "refused"]  # the attempt is in the audit trail
    # Anyone else: as an unknown id, in the list and on the page.
    mallory = await web.signed_in(OTHER)
    assert question not in (await mallory.get("/inbox")).text
    assert (await mallory.get(f"/inbox/approvals/{question}")).status_code == 404
    home = await mallory.get("/inbox")
    forged = await mallory.post(
        f"/inbox/approvals/{question}/decide",
        data={"csrf": csrf_of(home), "action": "respond", "response": "Porto"},
    )
    assert forged.status_code == 404
    assert [kind for kind, _, _ in await web.events(question)] == ["created", "refused"]


@pytest.mark.parametrize(
    ("fields", "status", "said"),
    [
        ({"action": "respond", "response": "Madrid"}, 422, "Answer with one of: Leeds, Porto"),
        ({"action": "respond"}, 422, "An answer is needed"),
        ({"action": "approve"}, 422, "a question is answered or declined"),
        ({"action": "edit", "arg.order_id": "B2"}, 422, "a question is answered or declined"),
        ({"action": "approve", "remember": "yes"}, 422, "a question is answered or declined"),
    ],
)
async def test_a_forged_answer_is_refused_and_records_nothing(
    web: Inbox, fields: dict[str, str], status: int, said: str
) -> None:
    _, _, question = await asked(web)
    lead = await web.signed_in(LEAD)
    _, sent = await post(lead, question, **fields)
    assert sent.status_code == status, sent.text
    assert said in sent.text
    assert (await web.store.get(question)).status == "pending"
    assert await web.events(question) == [("created", CAROL, None)]


async def test_an_answer_without_the_pages_form_token_is_refused(web: Inbox) -> None:
    _, _, question = await asked(web)
    lead = await web.signed_in(LEAD)
    answer = {"action": "respond", "response": "Porto"}
    missing = await lead.post(f"/inbox/approvals/{question}/decide", data=answer)
    assert missing.status_code == 403 and "Form not accepted" in missing.text
    dave = await web.signed_in(DAVE)
    others = csrf_of(await dave.get(f"/inbox/approvals/{question}"))
    foreign = await lead.post(
        f"/inbox/approvals/{question}/decide", data={**answer, "csrf": others}
    )
    assert foreign.status_code == 403 and "Form not accepted" in foreign.text
    assert await web.events(question) == [("created", CAROL, None)]


async def test_the_first_answer_wins_and_the_second_is_told_who_answered(
    sql_web: Inbox,
) -> None:
    web = sql_web
    _, _, question = await asked(web)
    lead = await web.signed_in(LEAD)
    dave = await web.signed_in(DAVE)
    seen_by_dave = await dave.get(f"/inbox/approvals/{question}")  # both have the form open
    _, first = await post(lead, question, action="respond", response="Porto")
    assert first.status_code == 303, first.text
    second = await dave.post(
        f"/inbox/approvals/{question}/decide",
        data={"csrf": csrf_of(seen_by_dave), "action": "respond", "response": "Leeds"},
    )
    assert second.status_code == 409, second.text
    assert f"already answered by {LEAD}" in text_of(second)
    assert "yours was not recorded" in second.text
    declined = await dave.post(
        f"/inbox/approvals/{question}/decide",
        data={"csrf": csrf_of(seen_by_dave), "action": "deny", "reason": "late"},
    )
    assert declined.status_code == 409 and f"already answered by {LEAD}" in text_of(declined)
    record = await web.store.get(question)
    assert record.decision is not None and record.decision.response == "Porto"
    assert [e.kind for e in await web.store.events(question)].count("decided") == 1


async def test_a_questions_page_after_its_deadline_says_it_timed_out(web: Inbox) -> None:
    call, ctx, question = await asked(web)
    web.clock.now += 31 * 60
    assert len(await web.store.expire_due()) == 1
    lead = await web.signed_in(LEAD)
    page = await lead.get(f"/inbox/approvals/{question}")
    said = shown(page)
    assert "Nobody answered before the deadline" in said
    assert '<span class="status timed-out">timed out</span>' in page.text
    assert "denied" not in said and 'id="decide-answer"' not in page.text
    history = page.text.split("<h2>History</h2>", 1)[1]
    assert '<td data-label="What">timed out</td>' in history
    late = await lead.post(
        f"/inbox/approvals/{question}/decide",
        data={"csrf": csrf_of(page), "action": "respond", "response": "Porto"},
    )
    assert late.status_code == 409 and "already timed out" in text_of(late)
    result = await web.executor.run_call(call, ctx)
    assert result.error is not None and result.error.kind == "question-unanswered"


# --- the history, line by line ---------------------------------------------------------------


def decided(detail: dict[str, Any], actor: str = LEAD) -> ApprovalEvent:
    return ApprovalEvent(
        seq=3,
        approval_id="apr_1",
        kind="decided",
        at=datetime.now(UTC) - timedelta(minutes=1),
        actor=actor,
        channel="web",
        detail=detail,
    )


@pytest.mark.parametrize(
    ("detail", "actor", "kind", "summary"),
    [
        (
            {"action": "respond", "status": "denied", "response": "Porto", "digest": "ab" * 32},
            LEAD,
            "answered",
            [("response", "Porto")],
        ),
        (
            {"action": "deny", "status": "denied", "reason": "on hold"},
            LEAD,
            "declined",
            [("reason", "on hold")],
        ),
        (
            {"action": "deny", "status": "denied", "reason": "nobody decided before the deadline"},
            TIMEOUT_DECIDER,
            "timed out",
            [("reason", "nobody decided before the deadline")],
        ),
    ],
)
def test_a_questions_decision_is_told_as_answered_declined_or_timed_out(
    detail: dict[str, Any], actor: str, kind: str, summary: list[tuple[str, str]]
) -> None:
    shown = event_view(decided(detail, actor), question=kind)
    assert (shown.kind, list(shown.summary)) == (kind, summary)
    assert all("denied" not in text for _, text in shown.details)
    assert ("action", detail["action"]) in shown.details  # the store's verb, under "more"
    as_a_call = event_view(decided(detail, actor))
    assert as_a_call.kind == "decided" and ("status", "denied") in as_a_call.summary


# --- keys -----------------------------------------------------------------------------------


async def test_on_a_question_a_and_d_focus_the_answer_and_the_decline_reason(
    web: Inbox, tmp_path: Path
) -> None:
    from tests.bot.test_inbox_live import press
    from tests.fakes.browser import chromium, chromium_missing

    missing = chromium_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {missing}")
        pytest.skip(missing)
    _, _, choices = await asked(web, run_id="run_1")
    _, _, free = await asked(web, "note", run_id="run_2")
    focused = "[document.activeElement.closest('form')?.id, document.activeElement.id, " \
        "document.activeElement.value ?? null]"  # fmt: skip
    async with chromium(tmp_path) as browser:
        page = await browser.page(width=390, height=844)
        await page.goto(web.link(LEAD))
        await page.goto(f"{web.url}/inbox/approvals/{choices}")
        errors = "window.__errors = []; addEventListener('error', e => __errors.push(e.message))"
        await page.evaluate(errors)
        await press(page, "a")
        assert await page.evaluate(focused) == ["decide-answer", "", "Leeds"]
        await press(page, "d")
        assert await page.evaluate(focused) == ["decide-decline", "decline-reason", ""]
        await press(page, "d")  # typed into the reason now
        assert await page.evaluate("document.getElementById('decline-reason').value") == "d"
        await page.goto(f"{web.url}/inbox/approvals/{free}")
        await page.evaluate(errors)
        await press(page, "a")
        assert await page.evaluate(focused) == ["decide-answer", "answer-text", ""]
        await press(page, "a")  # typed into the answer
        assert await page.evaluate("document.getElementById('answer-text').value") == "a"
        assert await page.evaluate("window.__errors") == []
    for question in (choices, free):
        assert await web.events(question) == [("created", CAROL, None)]
