"""The inbox's "approve selected" and "deny selected": reviews ticked in the list and decided
in one form, each authorized, recorded and answered on its own (`bot.bulk.Decider`), on
SQLite and PostgreSQL, over real HTTP (uvicorn on a loopback port, httpx as the browser),
with reviews made pending by the configuration's rules and the bot's own authorizer."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
import uvicorn

from nodbot.bot.bulk import MAX_ITEMS
from nodbot.bot.config import load_config
from nodbot.bot.http import create_app
from nodbot.bot.policy.authorize import authorizer_for
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rules_executor
from nodbot.bot.web import WebInbox
from nodbot.bot.web.signing import Signer
from nodbot.core import SqlApprovalStore
from nodbot.core.sqlstore.audit import verify
from tests.bot.test_web_inbox import (
    CAROL,
    LEAD,
    SECRET,
    SLACK_LEAD,
    Clock,
    Inbox,
    csrf_of,
    registry_of,
    text_of,
    write_config,
)
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
KEY = "the audit key of the inbox's bulk tests"


@contextlib.asynccontextmanager
async def served_on(url: str, tmp_path: Path) -> AsyncIterator[Inbox]:
    """The inbox of tests/bot/test_web_inbox.py (its rules and tools), over the store at
    `url` with an audit key, served by uvicorn on a loopback port."""
    config = load_config(write_config(tmp_path))
    ran: list[str] = []
    registry = registry_of(ran)
    clock = Clock()
    async with SqlApprovalStore(url, audit_key=KEY) as store:
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


@contextlib.asynccontextmanager
async def inbox_on(backend: str, tmp_path: Path) -> AsyncIterator[tuple[Inbox, str]]:
    async with database_url(backend, tmp_path) as url, served_on(url, tmp_path) as web:
        yield web, url


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_on(f"sqlite:///{tmp_path / 'nodbot.db'}", tmp_path) as harness:
        yield harness


async def select(
    client: httpx.AsyncClient, ids: Sequence[str], action: str, **fields: str
) -> httpx.Response:
    """Tick `ids` in the list and press Approve selected (or Deny selected), as a browser
    does after loading the list."""
    page = await client.get("/inbox")
    assert page.status_code == 200, page.text
    form = [("csrf", csrf_of(page)), ("action", action), *fields.items()]
    form += [("id", approval_id) for approval_id in ids]
    return await client.post("/inbox/decide", data=dict_of(form))


def dict_of(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Form fields as httpx sends repeated names: a list of values each."""
    found: dict[str, list[str]] = {}
    for name, value in pairs:
        found.setdefault(name, []).append(value)
    return found


def outcomes(page: httpx.Response) -> dict[str, str]:
    """The results page's rows: approval id -> what it says happened."""
    rows = re.findall(r'<tr data-id="([^"]+)" class="outcome-[a-z_]+">(.*?)</tr>', page.text, re.S)
    return {approval_id: " ".join(text_of_html(row).split()) for approval_id, row in rows}


def text_of_html(html: str) -> str:
    return text_of(httpx.Response(200, text=html))


def act_of(answer: httpx.Response) -> str:
    """The act id of a selection's answer (its redirect to the results)."""
    query = dict(parse_qsl(urlsplit(answer.headers["location"]).query))
    return query["act"]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_mix_is_decided_item_by_item_each_with_its_own_event_and_audit_record(
    backend: str, tmp_path: Path
) -> None:
    async with inbox_on(backend, tmp_path) as (web, url):
        _, _, allowed = await web.pending("refund", run_id="run_1")
        _, _, second = await web.pending("refund", run_id="run_2", order_id="o-8", amount=9.0)
        _, _, own = await web.pending("refund", run_id="run_3", requested_by=SLACK_LEAD)
        _, _, hidden = await web.pending(
            "send_email", run_id="run_4", to="x@example.org", subject="s", body="b"
        )  # its rule names lead@example.com only: U0123LEADS may not see it
        _, _, earlier = await web.pending("refund", run_id="run_5")
        _, _, quorum = await web.pending("pay", run_id="run_6", to="acme", amount=5.0)
        lead = await web.signed_in(LEAD)
        page = await lead.get(f"/inbox/approvals/{earlier}")
        denied = await lead.post(
            f"/inbox/approvals/{earlier}/decide",
            data={"action": "deny", "csrf": csrf_of(page), "reason": "no"},
        )
        assert denied.status_code == 303
        unknown = "apr_0000000000000000000000000000"
        ids = [allowed, own, hidden, earlier, unknown, quorum, second]

        reviewer = await web.signed_in(SLACK_LEAD)
        answer = await select(reviewer, ids, "approve", reason="checked the orders")
        assert answer.status_code == 303, answer.text
        location = answer.headers["location"]
        assert location.startswith("/inbox/done?act=")
        act = act_of(answer)

        for approval_id in (allowed, second):
            record = await web.store.get(approval_id)
            assert record.status == "approved"
            assert record.decision is not None
            assert (record.decision.decided_by, record.decision.reason) == (
                SLACK_LEAD,
                "checked the orders",
            )
            events = await web.store.events(approval_id)
            assert [(e.kind, e.actor, e.channel) for e in events] == [
                ("created", CAROL, None),
                ("voted", SLACK_LEAD, "web"),
                ("decided", SLACK_LEAD, "web"),
            ]
            evidence = events[-1].detail["evidence"]
            assert evidence["act"] == act and len(evidence["session"]) == 16
        # The requester's own run: refused, and the refusal recorded with the act.
        refused = await web.store.events(own)
        assert [(e.kind, e.actor, e.channel) for e in refused] == [
            ("created", SLACK_LEAD, None),
            ("refused", SLACK_LEAD, "web"),
        ]
        assert refused[-1].detail["reason"] == SELF_APPROVAL_REASON
        assert refused[-1].detail["evidence"]["act"] == act
        assert (await web.store.get(own)).status == "pending"
        # Not theirs to see: nothing recorded, nothing told.
        assert await web.events(hidden) == [("created", CAROL, None)]
        # Decided before: the first decision stands, nothing more recorded.
        assert (await web.store.get(earlier)).status == "denied"
        assert [kind for kind, _, _ in await web.events(earlier)] == ["created", "voted", "decided"]
        # Two approvals needed: this one is counted, the review waits.
        assert (await web.store.get(quorum)).status == "pending"
        assert await web.events(quorum) == [("created", CAROL, None), ("voted", SLACK_LEAD, "web")]

        shown = await reviewer.get(location)
        assert shown.status_code == 200
        said = outcomes(shown)
        assert list(said) == ids  # item by item, in the order selected
        assert said[allowed].endswith("approved") and said[second].endswith("approved")
        assert f"Not allowed: {SELF_APPROVAL_REASON}." in said[own]
        assert said[earlier].endswith(
            f"denied already, by {LEAD}: the first decision counts, and yours was not recorded."
        )
        assert "your approval is counted it waits for 2 approvals in all" in said[quorum]
        for unseen in (hidden, unknown):
            assert said[unseen] == (
                f"{unseen} Unknown: no approval you may see has this id; nothing was recorded."
            )
        assert "3 of 7 approved" in text_of(shown)
        # The page tells nothing of the hidden review but its id, as of an unknown one.
        assert "send_email" not in shown.text and "x@example.org" not in shown.text

        metrics = (await reviewer.get(f"{web.url}/metrics")).text.splitlines()
        assert "nodbot_decisions_total 4" in metrics  # the lead's deny, and these three
        report = await verify(url, KEY)
        assert report.summary() == f"ok: {report.events} events in 6 reviews", report.problems


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_deny_selected_records_one_reason_for_each(backend: str, tmp_path: Path) -> None:
    async with inbox_on(backend, tmp_path) as (web, url):
        ids = [(await web.pending("refund", run_id=f"run_{n}"))[2] for n in range(3)]
        lead = await web.signed_in(LEAD)
        answer = await select(lead, ids, "deny", reason="  not this week  ")
        assert answer.status_code == 303
        for approval_id in ids:
            record = await web.store.get(approval_id)
            assert record.status == "denied" and record.decision is not None
            assert (record.decision.decided_by, record.decision.reason) == (LEAD, "not this week")
        said = outcomes(await lead.get(answer.headers["location"]))
        assert list(said.values()) == [f"refund apr_…{i[-8:]} denied" for i in ids]
        assert (await verify(url, KEY)).problems == ()


async def test_the_results_page_is_read_back_from_the_store_for_its_act_only(
    web: Inbox,
) -> None:
    _, _, approval_id = await web.pending()
    lead = await web.signed_in(LEAD)
    answer = await select(lead, [approval_id], "approve")
    location = answer.headers["location"]
    assert "approved" in outcomes(await lead.get(location))[approval_id]
    # Another act's id: the review was decided, but not by that act.
    other = location.replace(act_of(answer), "0" * 16)
    said = outcomes(await lead.get(other))[approval_id]
    assert f"approved already, by {LEAD}" in said
    # An address that names no act is not a page of results.
    for broken in ("/inbox/done", "/inbox/done?act=xyz&action=approve&id=a", "/inbox/done?act="):
        assert (await lead.get(broken)).status_code == 404
    # Someone else opening the address learns nothing of the review.
    outsider = await web.signed_in("mallory@example.com")
    assert "Unknown" in outcomes(await outsider.get(location))[approval_id]


async def test_approving_a_destructive_tool_among_the_selected_asks_to_confirm_first(
    web: Inbox,
) -> None:
    _, _, drop = await web.pending("drop_table", run_id="run_d", name="orders")
    _, _, refund = await web.pending("refund", run_id="run_r")
    lead = await web.signed_in(LEAD)
    step = await select(lead, [refund, drop], "approve", reason="planned")
    assert step.status_code == 200  # a step, not a result: nothing was recorded
    assert "drop_table" in text_of(step) and "may not be undone" in text_of(step)
    assert "Nothing is recorded until you say yes." in text_of(step)
    for approval_id in (refund, drop):
        assert await web.events(approval_id) == [("created", CAROL, None)]
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', step.text)
    assert ("confirm", "yes") in fields and ("reason", "planned") in fields
    assert [value for name, value in fields if name == "id"] == [refund, drop]

    forged = [(name, "x" if name == "csrf" else value) for name, value in fields]
    assert (await lead.post("/inbox/decide", data=dict_of(forged))).status_code == 403
    assert await web.events(drop) == [("created", CAROL, None)]

    confirmed = await lead.post("/inbox/decide", data=dict_of(fields))
    assert confirmed.status_code == 303
    for approval_id in (refund, drop):
        record = await web.store.get(approval_id)
        assert record.status == "approved" and record.decision is not None
        assert record.decision.reason == "planned"


async def test_a_deny_of_a_destructive_tool_needs_no_confirmation(web: Inbox) -> None:
    _, _, drop = await web.pending("drop_table", name="orders")
    lead = await web.signed_in(LEAD)
    answer = await select(lead, [drop], "deny")
    assert answer.status_code == 303
    assert (await web.store.get(drop)).status == "denied"


@pytest.mark.parametrize("csrf", [None, "forged", "other-session"])
async def test_a_selection_without_the_forms_token_is_403_and_records_nothing(
    web: Inbox, csrf: str | None
) -> None:
    _, _, approval_id = await web.pending()
    lead = await web.signed_in(LEAD)
    form: dict[str, str] = {"action": "approve", "id": approval_id}
    if csrf == "other-session":
        form["csrf"] = csrf_of(await (await web.signed_in(LEAD)).get("/inbox"))
    elif csrf is not None:
        form["csrf"] = csrf
    answer = await lead.post("/inbox/decide", data=form)
    assert answer.status_code == 403
    assert "nothing was recorded" in answer.text
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_too_many_or_no_reviews_or_an_edit_are_refused_whole_and_record_nothing(
    web: Inbox,
) -> None:
    _, _, approval_id = await web.pending()
    lead = await web.signed_in(LEAD)
    fakes = [f"apr_{n:028d}" for n in range(MAX_ITEMS)]
    too_many = await select(lead, [approval_id, *fakes], "approve")
    assert too_many.status_code == 422
    assert f"{MAX_ITEMS + 1} reviews are listed; at most {MAX_ITEMS}" in text_of(too_many)
    none = await select(lead, [], "approve")
    assert none.status_code == 422 and "No review was selected" in text_of(none)
    twice = await select(lead, [approval_id, approval_id], "deny")
    assert twice.status_code == 422 and "is listed twice" in text_of(twice)
    edit = await select(lead, [approval_id], "edit")
    assert edit.status_code == 422 and "an edit is made on the review" in text_of(edit)
    long_id = await select(lead, ["apr_" + "x" * 100], "deny")
    assert long_id.status_code == 422 and "is not an approval id" in text_of(long_id)
    long_reason = await select(lead, [approval_id], "deny", reason="r" * 2001)
    assert long_reason.status_code == 422
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_a_session_opened_by_a_review_link_may_not_decide_from_the_list(
    web: Inbox,
) -> None:
    _, _, approval_id = await web.pending()
    signer = Signer(SECRET, clock=web.clock)
    token = signer.review_token(LEAD, approval_id, "approve", expires=int(web.clock.now) + 600)
    client = web.browser()
    opened = await client.get(f"/inbox/review?token={token}")
    assert opened.status_code == 303
    page = await client.get(f"/inbox/approvals/{approval_id}")
    form = {"action": "approve", "id": approval_id, "csrf": csrf_of(page)}
    answer = await client.post("/inbox/decide", data=form)
    assert answer.status_code == 403
    assert "This link is for one review" in answer.text
    assert (await client.get(f"/inbox/done?act={'0' * 16}&action=approve&id=x")).status_code == 403
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_the_list_offers_a_box_only_where_the_reviewer_may_approve_or_deny(
    web: Inbox,
) -> None:
    _, _, refund = await web.pending("refund", run_id="run_r")
    _, _, quorum = await web.pending("pay", run_id="run_p", to="acme", amount=1.0)
    lead = await web.signed_in(LEAD)
    page = await lead.get(f"/inbox/approvals/{quorum}")
    voted = await lead.post(
        f"/inbox/approvals/{quorum}/decide", data={"action": "approve", "csrf": csrf_of(page)}
    )
    assert voted.status_code == 303
    listed = await lead.get("/inbox")
    boxes = re.findall(r'<input type="checkbox" name="id" value="([^"]+)" form="bulk"', listed.text)
    assert boxes == [refund]  # voted already on the other
    assert 'action="/inbox/decide"' in listed.text
    assert "Approve selected" in listed.text and "Deny selected" in listed.text
