"""Remembered approvals in the web inbox, against a bot served in-process: a reviewer approves
"and remember" from the approval page (through the confirm step of a tool that runs
elsewhere), a later identical call is approved at once, the reviewer's remembered approvals
are listed and forgotten there and nobody else's; and a call requested with its arguments'
JSON schema gets a typed edit form, its edits checked against that schema."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.serve import Served, serving
from tests.bot.test_web_inbox import csrf_of, text_of

ROOT = Path(__file__).resolve().parents[2]
AGENT = {"Authorization": "Bearer token-of-the-agent-0000000000000"}
ANA = "ana@example.com"
BO = "bo@example.com"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: token-of-the-agent-0000000000000, scopes: [approvals:request]}}
external_tools: [send_email, refund]
rules:
  - tool: send_email
    reviewers: [ana@example.com]
    remember: 1d
    remember_by: [to]
  - tool: refund
    reviewers: [ana@example.com, bo@example.com]
"""

EMAIL_SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "description": "Who receives it."},
        "body": {"type": "string"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["to", "body", "priority"],
}


class Bot:
    """The served bot, an agent asking it for approvals, and reviewers' browsers."""

    def __init__(self, served: Served, agent: httpx.AsyncClient) -> None:
        self.served, self.agent = served, agent
        self.calls = 0
        self.browsers: list[httpx.AsyncClient] = []

    async def ask(self, tool: str = "send_email", **arguments: Any) -> dict[str, Any]:
        """A new call of `tool`, asked with `POST /approvals` (and a schema of its arguments)."""
        self.calls += 1
        body: dict[str, Any] = {
            "tool": tool,
            "arguments": arguments or {"to": "cy@example.com", "body": "hello", "priority": 2},
            "run_id": "thread-1",
            "call_id": f"call_{self.calls}",
        }
        if tool == "send_email":
            body["schema"] = EMAIL_SCHEMA
        answer = await self.agent.post("/approvals", json=body, headers=AGENT)
        assert answer.status_code == 201, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def signed_in(self, principal: str) -> httpx.AsyncClient:
        browser = httpx.AsyncClient(base_url=self.served.url)
        self.browsers.append(browser)
        answer = await browser.get(self.served.sign_in_link(principal))
        assert answer.status_code == 303 and answer.headers["location"] == "/inbox"
        return browser

    async def events(self, approval_id: str) -> list[str]:
        return [e.kind for e in await self.served.service.store.events(approval_id)]

    async def live(self) -> list[str]:
        store: Any = self.served.service.store
        return [kept.remember_id for kept in await store.remembered.list(live=True)]


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db"))
    async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as agent:
        harness = Bot(served, agent)
        try:
            yield harness
        finally:
            for browser in harness.browsers:
                await browser.aclose()


async def post(
    browser: httpx.AsyncClient, page_url: str, action_url: str, **fields: str
) -> httpx.Response:
    """Submit a form of the page at `page_url`, as a browser does after loading it."""
    page = await browser.get(page_url)
    assert page.status_code == 200, page.text
    return await browser.post(action_url, data={"csrf": csrf_of(page), **fields})


async def approve_and_remember(bot: Bot, browser: httpx.AsyncClient) -> str:
    """An email to cy approved and remembered from its page; the review's id."""
    first = await bot.ask()
    assert first["status"] == "pending"
    approval_id = first["approval_id"]
    page_url = f"/inbox/approvals/{approval_id}"
    page = await browser.get(page_url)
    assert "Approve and remember for 1 day" in text_of(page)
    assert "calls with the same to" in text_of(page)
    decide = f"{page_url}/decide"
    answer = await post(browser, page_url, decide, action="approve", remember="yes")
    # A tool that runs elsewhere is confirmed first; the remember choice goes along.
    assert answer.status_code == 303, answer.text
    confirm_url = answer.headers["location"]
    assert "confirm=approve" in confirm_url and "remember=yes" in confirm_url
    assert await bot.events(approval_id) == ["created"]
    confirm = await browser.get(confirm_url)
    assert "and remember it for 1 day" in text_of(confirm)
    assert re.search(r'name="remember" value="yes"', confirm.text)
    answer = await post(
        browser, confirm_url, decide, action="approve", confirm="yes", remember="yes"
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == page_url
    decided = text_of(await browser.get(page_url))
    assert "approved by ana@example.com" in decided and "Remembered until" in decided
    return str(approval_id)


async def test_approve_and_remember_approves_the_next_identical_call_at_once(bot: Bot) -> None:
    ana = await bot.signed_in(ANA)
    origin = await approve_and_remember(bot, ana)
    again = await bot.ask(to="cy@example.com", body="another mail", priority=3)
    assert again["status"] == "approved", again
    assert again["decision"]["decided_by"] == ANA
    other = await bot.ask(to="dee@example.com", body="hello", priority=2)
    assert other["status"] == "pending"

    listing = await ana.get("/inbox/remembered")
    assert listing.status_code == 200
    text = text_of(listing)
    [remember_id] = await bot.live()
    assert remember_id in listing.text and "send_email" in text and "cy@example.com" in text
    assert f'href="/inbox/approvals/{origin}"' in listing.text
    assert "in 24 h" in text  # until when
    assert 'href="/inbox/remembered"' in (await ana.get("/inbox")).text

    forget = f"/inbox/remembered/{remember_id}/forget"
    answer = await post(ana, "/inbox/remembered", forget)
    assert answer.status_code == 303 and answer.headers["location"] == "/inbox/remembered"
    assert await bot.live() == []
    assert remember_id not in (await ana.get("/inbox/remembered")).text
    later = await bot.ask(to="cy@example.com", body="a third mail", priority=1)
    assert later["status"] == "pending"


async def test_another_reviewer_neither_sees_nor_forgets_it(bot: Bot) -> None:
    ana = await bot.signed_in(ANA)
    await approve_and_remember(bot, ana)
    [remember_id] = await bot.live()
    bo = await bot.signed_in(BO)
    listing = await bo.get("/inbox/remembered")
    assert listing.status_code == 200 and remember_id not in listing.text
    assert "You have no remembered approvals" in text_of(listing)
    forget = f"/inbox/remembered/{remember_id}/forget"
    answer = await post(bo, "/inbox/remembered", forget)
    assert answer.status_code == 404 and remember_id in text_of(answer)
    unknown = await post(bo, "/inbox/remembered", "/inbox/remembered/rem_nothing/forget")
    assert unknown.status_code == 404
    assert text_of(unknown).replace("rem_nothing", remember_id) == text_of(answer)
    assert await bot.live() == [remember_id]
    # Without the form's token nothing is forgotten, even by its reviewer.
    forged = await ana.post(forget, data={"csrf": "forged"})
    assert forged.status_code == 403 and await bot.live() == [remember_id]


async def test_a_session_for_one_review_may_not_open_the_remembered_page(bot: Bot) -> None:
    ana = await bot.signed_in(ANA)
    await approve_and_remember(bot, ana)
    [remember_id] = await bot.live()
    pending = await bot.ask(to="dee@example.com", body="x", priority=1)
    approval_id = pending["approval_id"]
    token = bot.served.inbox.signer.review_token(
        ANA, approval_id, "approve", expires=int(time.time()) + 3600
    )
    async with httpx.AsyncClient(base_url=bot.served.url) as linked:
        opened = await linked.get(f"/inbox/review?token={token}")
        assert opened.status_code == 303
        page = await linked.get(f"/inbox/approvals/{approval_id}")
        assert page.status_code == 200
        assert (await linked.get("/inbox/remembered")).status_code == 403
        forget = f"/inbox/remembered/{remember_id}/forget"
        refused = await linked.post(forget, data={"csrf": csrf_of(page)})
        assert refused.status_code == 403
    assert await bot.live() == [remember_id]


async def test_a_rule_without_remember_offers_none_and_a_forged_one_is_refused(bot: Bot) -> None:
    ana = await bot.signed_in(ANA)
    refund = await bot.ask("refund", order_id="o-1", amount=5)
    page_url = f"/inbox/approvals/{refund['approval_id']}"
    page = await ana.get(page_url)
    assert page.status_code == 200 and "Approve and remember" not in text_of(page)
    assert 'name="remember"' not in page.text
    decide = f"{page_url}/decide"
    for fields in ({}, {"confirm": "yes"}):
        answer = await post(ana, page_url, decide, action="approve", remember="yes", **fields)
        assert answer.status_code == 422, answer.text
        assert "does not remember approvals" in text_of(answer)
    assert await bot.events(refund["approval_id"]) == ["created"]
    # Only an approve is remembered, even where the rule remembers.
    mail = await bot.ask()
    mail_url = f"/inbox/approvals/{mail['approval_id']}"
    denied = await post(ana, mail_url, f"{mail_url}/decide", action="deny", remember="yes")
    assert denied.status_code == 422 and "Only an approve is remembered" in text_of(denied)
    assert await bot.events(mail["approval_id"]) == ["created"]
    assert await bot.live() == []


async def test_an_external_tools_schema_gives_a_typed_edit_form_checked_by_it(bot: Bot) -> None:
    ana = await bot.signed_in(ANA)
    mail = await bot.ask()
    page_url = f"/inbox/approvals/{mail['approval_id']}"
    page = await ana.get(page_url)
    assert re.search(r'<input type="number" id="f-priority"[^>]* name="arg\.priority"', page.text)
    assert re.search(r'<input type="text" id="f-to"[^>]* value="cy@example.com"', page.text)
    assert "Who receives it." in text_of(page)
    decide = f"{page_url}/decide"
    refused = await post(ana, page_url, decide, action="edit", **{"arg.priority": "9"})
    assert refused.status_code == 422
    assert re.search(r'id="error-priority">priority: at most 5<', refused.text)
    assert await bot.events(mail["approval_id"]) == ["created"]
    edited = await post(ana, page_url, decide, action="edit", **{"arg.priority": "4"})
    assert edited.status_code == 303, edited.text
    record = await bot.served.service.store.get(mail["approval_id"])
    assert record.decision is not None and record.decision.edited_args == {"priority": 4}
    assert record.decision.decided_by == ANA


async def test_a_malformed_schema_gives_only_the_fields_it_describes(bot: Bot) -> None:
    ana = await bot.signed_in(ANA)
    schema = {
        "type": "object",
        "properties": {
            "order_id": "string",
            "amount": {"type": "number", "anyOf": 3},
            "note": {"type": "string"},
        },
        "$defs": ["not", "an", "object"],
    }
    body = {
        "tool": "refund",
        "arguments": {"order_id": "o-2", "amount": 5, "note": "<b>hi</b>"},
        "run_id": "thread-1",
        "call_id": "call_odd",
        "schema": schema,
    }
    asked = await bot.agent.post("/approvals", json=body, headers=AGENT)
    assert asked.status_code == 201, asked.text
    page = await ana.get(f"/inbox/approvals/{asked.json()['approval_id']}")
    assert page.status_code == 200
    assert 'name="arg.note"' in page.text and "&lt;b&gt;hi&lt;/b&gt;" in page.text
    assert 'name="arg.order_id"' not in page.text and 'name="arg.amount"' not in page.text
