"""The signed links of the review emails, against a bot served in-process (`bot.serve.serving`)
that emails a real SMTP server (aiosmtpd on a loopback port 0): each request carries an
approve / edit / deny link for what the rule allows; a link signs its reviewer in for that
one review only; opening it decides nothing (mail scanners open links), the page's form
does; a changed or expired link signs nobody in.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from nodbot.bot.email.channel import EmailChannel
from nodbot.bot.serve import Served
from nodbot.bot.web.app import COOKIE
from nodbot.bot.web.signing import Signer
from tests.bot.test_email_outbound import MailServer, emailing, parts
from tests.bot.test_web_inbox import csrf_of, text_of

ROOT = Path(__file__).resolve().parents[2]
WEB_SECRET = "web-secret-for-email-links-001"
STARTER = {"Authorization": "Bearer token-of-starter-000"}
ANA, BO = "ana@example.com", "bo@example.com"

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: {web_secret}}}
api:
  tokens:
    - {{name: starter, token: token-of-starter-000, scopes: [runs:write, approvals:read]}}
agents:
  notes: tests.bot.test_email_outbound:agent
rules:
  - tool: send_note
    reviewers: [ana@example.com, bo@example.com]
  - tool: send_urgent_note
    reviewers: [ana@example.com]
    allowed_decisions: [approve, deny]
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
"""

LINK = re.compile(r"^\s*(Approve|Edit|Deny):\s*\n\s*(\S+)\s*$", re.MULTILINE)
HTML_LINK = re.compile(r'<a href="([^"]+)">(Approve|Edit|Deny)')


@dataclass
class Bot:
    served: Served
    client: httpx.AsyncClient
    mail: MailServer

    async def pending(self, tool: str = "send_note") -> tuple[str, dict[str, EmailMessage]]:
        """A new run's call waiting for review, and the request each reviewer was emailed."""
        reviewers = 2 if tool == "send_note" else 1
        before = len(self.mail.received)
        arguments = {"_tool": tool, "title": "Hi"} | ({"body": "Thanks"} if reviewers == 2 else {})
        run = await self.client.post(
            "/runs", json={"agent": "notes", "input": json.dumps(arguments)}, headers=STARTER
        )
        assert run.status_code == 201, run.text
        [pending] = run.json()["pending"]
        await self.mail.wait_for(lambda: len(self.mail.received) >= before + reviewers)
        emailed = {r.recipients[0]: r.message for r in self.mail.received[before:]}
        return str(pending["approval_id"]), emailed

    async def approval(self, approval_id: str) -> dict[str, Any]:
        answer = await self.client.get(f"/approvals/{approval_id}", headers=STARTER)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def browser(self) -> httpx.AsyncClient:
        """A fresh browser: no cookie yet."""
        return httpx.AsyncClient(base_url=self.served.url, timeout=30)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)

    def config(port: int) -> str:
        return CONFIG.format(db=tmp_path / "nodbot.db", web_secret=WEB_SECRET, port=port)

    async with emailing(tmp_path, config) as (served, client, mail):
        yield Bot(served, client, mail)


def links_of(message: EmailMessage) -> dict[str, str]:
    """The request's links by action, from its text part, after checking the HTML part has
    the same ones."""
    text, page = parts(message)
    found = {label.lower(): url for label, url in LINK.findall(text)}
    in_html = {label.lower(): html.unescape(url) for url, label in HTML_LINK.findall(page)}
    assert found == in_html
    return found


def token_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


async def open_link(browser: httpx.AsyncClient, link: str) -> httpx.Response:
    """Open `link` as a browser does: follow the redirect, keep the cookie."""
    path = link.removeprefix(str(browser.base_url).rstrip("/"))
    return await browser.get(path, follow_redirects=True)


async def post_form(
    browser: httpx.AsyncClient, page: httpx.Response, approval_id: str, **fields: str
) -> httpx.Response:
    """Submit the form of `page` (its CSRF token) for `approval_id`."""
    form = {"csrf": csrf_of(page), **fields}
    return await browser.post(f"/inbox/approvals/{approval_id}/decide", data=form)


# --- the emails -----------------------------------------------------------------------------


async def test_each_request_links_the_decisions_the_rule_allows(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    base = bot.served.url
    for address in (ANA, BO):
        links = links_of(emailed[address])
        assert sorted(links) == ["approve", "deny", "edit"]
        for action, link in links.items():
            assert link.startswith(f"{base}/inbox/review?token=")
            claims = Signer(WEB_SECRET).review_of(token_of(link))
            assert (claims.principal, claims.approval_id, claims.action) == (
                address,
                approval_id,
                action,
            )
        # The link works as long as the reply token does, no longer.
        record = await bot.served.service.store.get(approval_id)
        expires = Signer(WEB_SECRET).review_of(token_of(links["approve"])).expires
        reply_ttl = 7 * 86400
        assert abs(expires - (record.created_at.timestamp() + reply_ttl)) <= 1
    # A rule that allows approve and deny only: no edit link.
    _, urgent = await bot.pending("send_urgent_note")
    assert sorted(links_of(urgent[ANA])) == ["approve", "deny"]


async def test_a_request_without_an_inbox_address_has_no_links(bot: Bot) -> None:
    approval_id, _ = await bot.pending("send_urgent_note")
    store: Any = bot.served.service.store
    record = await store.get(approval_id)
    [delivery] = [d for d in await store.deliveries(approval_id) if d.channel == "email"]
    config = bot.served.service.config.email
    assert config is not None
    channel = EmailChannel(config, store, secret=WEB_SECRET, links_base=None)
    before = len(bot.mail.received)
    await channel.deliver(delivery, record)
    await bot.mail.wait_for(lambda: len(bot.mail.received) > before)
    text, page = parts(bot.mail.received[-1].message)
    assert "/inbox/review" not in text and "/inbox/review" not in page
    assert "in your browser" not in text and "approve" in text


# --- opening a link -------------------------------------------------------------------------


async def test_opening_a_link_decides_nothing_the_pages_form_does(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    link = links_of(emailed[ANA])["approve"]
    async with bot.browser() as scanner, bot.browser() as person:
        scanned = await open_link(scanner, link)
        assert scanned.status_code == 200
        assert (await bot.approval(approval_id))["status"] == "pending"
        page = await open_link(person, link)
        assert page.status_code == 200 and str(page.url).endswith(
            f"/inbox/approvals/{approval_id}?action=approve"
        )
        assert "signed in as ana@example.com" in text_of(page)
        assert (await bot.approval(approval_id))["status"] == "pending"
        decided = await post_form(person, page, approval_id, action="approve")
        assert decided.status_code == 303, decided.text
    approval = await bot.approval(approval_id)
    assert approval["status"] == "approved"
    assert approval["decision"]["decided_by"] == ANA
    [event] = [e for e in approval["events"] if e["kind"] == "decided"]
    assert event["channel"] == "web" and event["actor"] == ANA
    assert event["detail"]["evidence"]["via"] == "email link"
    run = (await bot.client.get(f"/runs/{approval['run_id']}?wait=10", headers=STARTER)).json()
    assert run["status"] == "finished" and run["tool_results"][0]["status"] == "ok"


async def test_a_links_session_is_for_its_review_only(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    other_id, _ = await bot.pending()
    async with bot.browser() as browser:
        page = await open_link(browser, links_of(emailed[ANA])["approve"])
        assert page.status_code == 200
        for path in ("/inbox", f"/inbox/approvals/{other_id}", "/inbox/approvals/apr_unknown"):
            refused = await browser.get(path)
            assert refused.status_code == 403, path
            said = text_of(refused)
            assert f"signs you in for review {approval_id} only" in said
            assert "ask for a sign-in link for the inbox" in said
            assert "Thanks" not in said  # nothing of the other review is shown
        posted = await post_form(browser, page, other_id, action="approve")
        assert posted.status_code == 403
        # Its own review is still open to it.
        assert (await browser.get(f"/inbox/approvals/{approval_id}")).status_code == 200
    for found in (approval_id, other_id):
        approval = await bot.approval(found)
        assert approval["status"] == "pending"
        assert [e for e in approval["events"] if e["kind"] in ("decided", "refused")] == []


def changed(link: str) -> str:
    """`link` with one character of its token's payload changed."""
    token = token_of(link)
    at = len(token) // 3
    flipped = "A" if token[at] != "A" else "B"
    return link.replace(token, token[:at] + flipped + token[at + 1 :])


async def test_a_changed_or_expired_link_is_refused_and_signs_nobody_in(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    link = links_of(emailed[ANA])["approve"]
    base = link.partition("?")[0]
    signer = Signer(WEB_SECRET)
    expired = signer.review_token(ANA, approval_id, "approve", expires=int(time.time()) - 1)
    sign_in = signer.link_token(ANA, 3600)  # a sign-in link's token is not a review link's
    cases = {
        changed(link): "not valid",
        f"{base}?token={expired}": "has expired",
        f"{base}?token={sign_in}": "not valid",
        f"{base}?token=": "not valid",
        f"{base}": "not valid",
    }
    for bad, why in cases.items():
        async with bot.browser() as browser:
            refused = await open_link(browser, bad)
            assert refused.status_code == 403, bad
            assert why in text_of(refused) and "Review link not accepted" in text_of(refused)
            assert COOKIE not in refused.cookies and COOKIE not in browser.cookies
            assert (await browser.get(f"/inbox/approvals/{approval_id}")).status_code == 401
    # Nor does a review link's token sign anyone in to the whole inbox.
    async with bot.browser() as browser:
        login = await browser.get(f"/inbox/login?token={token_of(link)}")
        assert login.status_code == 401 and COOKIE not in browser.cookies
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_a_link_sent_before_its_reviewer_was_revoked_signs_nobody_in(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    link = links_of(emailed[ANA])["approve"]
    async with bot.browser() as browser:
        assert (await open_link(browser, link)).status_code == 200
        store: Any = bot.served.service.store
        await store.sessions.revoke_principal(ANA, until=datetime.now(UTC) + timedelta(days=8))
        # The session the link made is ended, and the link makes no new one.
        assert (await browser.get(f"/inbox/approvals/{approval_id}")).status_code == 401
        refused = await open_link(browser, link)
        assert refused.status_code == 403
        assert "were ended after this link was sent" in text_of(refused)
        assert COOKIE not in browser.cookies
    # Bo's links are not Ana's: they still work.
    async with bot.browser() as browser:
        assert (await open_link(browser, links_of(emailed[BO])["deny"])).status_code == 200
    assert (await bot.approval(approval_id))["status"] == "pending"


async def test_the_deny_link_opens_the_deny_form_and_records_the_reason(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    async with bot.browser() as browser:
        page = await open_link(browser, links_of(emailed[BO])["deny"])
        assert page.status_code == 200 and str(page.url).endswith("?action=deny")
        assert re.search(r'<input type="text" id="deny-reason"[^>]*\sautofocus', page.text)
        assert "nothing is recorded until you press" in text_of(page)
        assert (await bot.approval(approval_id))["status"] == "pending"
        denied = await post_form(browser, page, approval_id, action="deny", reason="not <b>now")
        assert denied.status_code == 303, denied.text
        shown = await browser.get(denied.headers["location"])
        assert "not &lt;b&gt;now" in shown.text and "not <b>now" not in shown.text
    approval = await bot.approval(approval_id)
    assert approval["status"] == "denied"
    assert approval["decision"]["reason"] == "not <b>now"
    assert approval["decision"]["decided_by"] == BO


async def test_a_link_decides_as_its_own_reviewer_only(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    ana_link = links_of(emailed[ANA])["approve"]
    # Bo's browser holds Bo's session; Ana's link signs it in as Ana, for this review only.
    async with bot.browser() as browser:
        signed_in = await open_link(browser, bot.served.sign_in_link(BO))
        assert signed_in.status_code == 200 and "signed in as bo@example.com" in text_of(signed_in)
        page = await open_link(browser, ana_link)
        assert "signed in as ana@example.com" in text_of(page)
        assert (await browser.get("/inbox")).status_code == 403
        decided = await post_form(browser, page, approval_id, action="approve")
        assert decided.status_code == 303, decided.text
    approval = await bot.approval(approval_id)
    assert approval["decision"]["decided_by"] == ANA
    # The principal is signed: Ana's signature under a payload that names Bo, or a token
    # that names Bo signed with another secret, is not accepted.
    claims = Signer(WEB_SECRET).review_of(token_of(ana_link))
    signature = token_of(ana_link).partition(".")[2]
    foreign = Signer("another-secret-0000000").review_token(
        BO, claims.approval_id, "approve", expires=claims.expires
    )
    for forged in (f"{foreign.partition('.')[0]}.{signature}", foreign):
        async with bot.browser() as browser:
            assert (await browser.get(f"/inbox/review?token={forged}")).status_code == 403
            assert COOKIE not in browser.cookies


async def test_a_full_session_of_the_same_reviewer_is_kept(bot: Bot) -> None:
    approval_id, emailed = await bot.pending()
    async with bot.browser() as browser:
        assert (await open_link(browser, bot.served.sign_in_link(ANA))).status_code == 200
        cookie = browser.cookies[COOKIE]
        page = await open_link(browser, links_of(emailed[ANA])["edit"])
        assert page.status_code == 200 and str(page.url).endswith("?action=edit")
        assert browser.cookies[COOKIE] == cookie
        assert (await browser.get("/inbox")).status_code == 200
    assert (await bot.approval(approval_id))["status"] == "pending"
