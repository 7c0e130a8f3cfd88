"""The inbox shows an approval only to those who may see it: its reviewers, its requester, and
whoever voted on it or decided it. Anyone else gets the page of an unknown id. Over real
HTTP, with the harness of tests/bot/test_web_inbox.py (uvicorn, httpx, SQLite)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from nodbot.bot.policy.people import People
from nodbot.core import Decision
from tests.bot.test_web_inbox import (
    CAROL,
    LEAD,
    OTHER,
    SLACK_LEAD,
    Inbox,
    csrf_of,
    decide,
    served_inbox,
    text_of,
)


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_inbox(tmp_path) as harness:
        yield harness


async def unknown_page(client: httpx.AsyncClient, approval_id: str) -> str:
    """The text of the page of an unknown id, written as `approval_id` would be."""
    page = await client.get("/inbox/approvals/apr_unknown")
    assert page.status_code == 404
    return text_of(page).replace("apr_unknown", approval_id)


async def test_an_outsider_gets_the_unknown_page_and_records_nothing(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(OTHER)
    inbox = await client.get("/inbox")
    assert approval_id not in inbox.text
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 404
    # The very page of an id that does not exist: nothing says that this one does.
    assert text_of(page) == await unknown_page(client, approval_id)
    assert "o-7" not in page.text and "Refunds need a support lead." not in page.text
    for action, extra in (
        ("approve", {}),
        ("deny", {"reason": "no"}),
        ("edit", {"arg.amount": "1"}),
    ):
        form = {"action": action, "csrf": csrf_of(inbox), **extra}
        answer = await client.post(f"/inbox/approvals/{approval_id}/decide", data=form)
        assert answer.status_code == 404
        assert text_of(answer) == await unknown_page(client, approval_id)
    assert (await web.store.get(approval_id)).status == "pending"
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_its_reviewers_and_its_requester_see_it(web: Inbox) -> None:
    _, _, approval_id = await web.pending(requested_by=CAROL)
    for reviewer in (LEAD, SLACK_LEAD):
        client = await web.signed_in(reviewer)
        page = await client.get(f"/inbox/approvals/{approval_id}")
        assert page.status_code == 200, reviewer
        assert 'value="approve"' in page.text
    requester = await web.signed_in(CAROL.upper())  # an address, whatever its case
    page = await requester.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200
    assert "o-7" in page.text and 'value="approve"' not in page.text
    # Seeing is not deciding: the rule does not name the requester.
    form = {"action": "deny", "csrf": csrf_of(page)}
    answer = await requester.post(f"/inbox/approvals/{approval_id}/decide", data=form)
    assert answer.status_code == 403
    assert "you are not one of the reviewers of this call" in answer.text


async def test_whoever_decided_or_voted_sees_it_afterwards(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    lead = await web.signed_in(LEAD)
    assert (await decide(lead, approval_id, "approve")).status_code == 303
    page = await lead.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200 and f"approved by {LEAD}" in text_of(page)
    _, _, paid = await web.pending("pay", run_id="run_p", to="acme", amount=10.0)
    assert (await decide(lead, paid, "approve")).status_code == 303  # one vote of two
    assert (await lead.get(f"/inbox/approvals/{paid}")).status_code == 200


async def test_someone_the_rule_does_not_name_sees_what_they_decided(web: Inbox) -> None:
    # A decision the rule had no say in, recorded by another channel: whoever made it still
    # sees the approval, the others outside the rule do not.
    _, _, approval_id = await web.pending()
    person = (await People().person(OTHER)).key
    decision = Decision(approved=False, reason="out of stock", decided_by=OTHER)
    await web.store.decide(approval_id, decision, channel="cli", person=person)
    client = await web.signed_in(OTHER)
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200 and "out of stock" in page.text
    stranger = await web.signed_in("eve@example.com")
    assert (await stranger.get(f"/inbox/approvals/{approval_id}")).status_code == 404
