"""The web inbox over real HTTP: uvicorn on a loopback port, httpx as the browser (it keeps
the session cookie), a real SQLite store, and approvals made pending by the configuration's
rules, the way a run makes them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import uvicorn

from nodbot.bot.config import Config, load_config
from nodbot.bot.forms import edit_fields, parse_edit
from nodbot.bot.http import AuthorizeDecision, create_app
from nodbot.bot.policy.authorize import Verdict, authorizer_for
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rules_executor
from nodbot.bot.serve import serving
from nodbot.bot.web import WebInbox, sign_in_link
from nodbot.bot.web.signing import Signer
from nodbot.core import (
    ApprovalRecord,
    Decision,
    DeferredApproval,
    Executor,
    InterruptRule,
    SqlApprovalStore,
    ToolCall,
    ToolContext,
    ToolMessage,
    ToolRegistry,
)
from tests.bot.test_cli import nodbot
from tests.bot.test_serve import TOKENS, as_, until_finished

ROOT = Path(__file__).resolve().parents[2]
SECRET = "web-secret-for-tests-0000"
LEAD = "lead@example.com"
SLACK_LEAD = "U0123LEADS"
OTHER = "mallory@example.com"
CAROL = "carol@example.com"

CONFIG = f"""
web:
  secret: {SECRET}
  link_ttl: 1h
  session_ttl: 2h
  {{public_url}}
rules:
  - tool: refund
    description: Refunds need a support lead.
    reviewers: [{LEAD}, {SLACK_LEAD}]
    editable: [amount]
  - tool: send_email
    description: Mail is read first.
    reviewers: [{LEAD}]
  - tool: configure
    reviewers: [{LEAD}]
    allow_self_approval: true
  - tool: pay
    reviewers: [{LEAD}, {SLACK_LEAD}]
    approvals_required: 2
  - tool: ping
    reviewers: [{LEAD}]
    allowed_decisions: [approve, deny]
  - tool: drop_table
    reviewers: [{LEAD}]
    timeout: 30m
"""


class Clock:
    """The inbox's time, moved by the tests."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def registry_of(ran: list[str]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append(f"refund {order_id} {amount}")
        return f"refunded {amount} on {order_id}"

    @registry.tool
    def send_email(to: str, subject: str, body: str) -> str:
        """Send an email."""
        ran.append(f"email {to}")
        return "sent"

    @registry.tool
    def configure(
        level: int,
        enabled: bool,
        mode: Literal["fast", "safe"],
        name: str,
        tags: list[str],
        note: str | None = None,
    ) -> str:
        """Change a setting."""
        ran.append(f"configure {level}")
        return "configured"

    @registry.tool
    def pay(to: str, amount: float) -> str:
        """Pay someone."""
        ran.append(f"pay {to}")
        return "paid"

    @registry.tool
    def ping(host: str) -> str:
        """Ping a host."""
        return "pong"

    @registry.tool(effects="destructive")
    def drop_table(name: str) -> str:
        """Drop a table."""
        ran.append(f"drop {name}")
        return f"dropped {name}"

    return registry


@dataclass
class Inbox:
    """A served bot with its inbox, its store, and the executor its runs use."""

    url: str
    config: Config
    store: SqlApprovalStore
    executor: Executor
    clock: Clock
    ran: list[str]
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    def link(self, principal: str) -> str:
        """A sign-in link as `nodbot inbox-link` makes it, pointed at this server."""
        made = sign_in_link(self.config, principal, clock=self.clock)
        assert made.startswith("http://127.0.0.1:8080/inbox/login?token=")
        return f"{self.url}/inbox/login?{made.split('?', 1)[1]}"

    def browser(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(base_url=self.url)
        self.clients.append(client)
        return client

    async def signed_in(self, principal: str) -> httpx.AsyncClient:
        client = self.browser()
        answer = await client.get(self.link(principal))
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/inbox"
        return client

    async def pending(
        self,
        tool: str = "refund",
        *,
        run_id: str = "run_a",
        requested_by: str = CAROL,
        **arguments: Any,
    ) -> tuple[ToolCall, ToolContext, str]:
        """A call of a new run that the rules made wait for review, and its approval id."""
        arguments = arguments or {"order_id": "o-7", "amount": 500.0}
        call = ToolCall(name=tool, arguments=arguments, id="c1")
        ctx = self.executor.context(run_id=run_id, requested_by=requested_by)
        result = await self.executor.run_call(call, ctx)
        assert result.status == "pending" and result.error is not None, result
        return call, ctx, result.error.details["approval_id"]

    async def events(self, approval_id: str) -> list[tuple[str, str | None, str | None]]:
        return [(e.kind, e.actor, e.channel) for e in await self.store.events(approval_id)]


def write_config(tmp_path: Path, public_url: str = "") -> Path:
    path = tmp_path / "nodbot.yml"
    line = f"public_url: {public_url}" if public_url else ""
    path.write_text(CONFIG.replace("{public_url}", line))
    return path


@contextlib.asynccontextmanager
async def served_inbox(
    tmp_path: Path, public_url: str = "", authorize: AuthorizeDecision | None = None
) -> AsyncIterator[Inbox]:
    config = load_config(write_config(tmp_path, public_url))
    ran: list[str] = []
    registry = registry_of(ran)
    clock = Clock()
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        authorizer = authorizer_for(config)
        inbox = WebInbox(
            store=store,
            registry=registry,
            web=config.web,
            authorize=authorize or authorizer,
            clock=clock,
        )
        app = create_app(
            store=store,
            registry=registry,
            tokens=[],
            authorize_decision=authorizer,
            inbox=inbox,
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
    async with served_inbox(tmp_path) as harness:
        yield harness


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "the page has no form token"
    return found.group(1)


async def decide(
    client: httpx.AsyncClient, approval_id: str, action: str, **fields: str
) -> httpx.Response:
    """Submit the approval page's form, as a browser does after loading the page."""
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200, page.text
    form = {"csrf": csrf_of(page), "action": action, **fields}
    return await client.post(f"/inbox/approvals/{approval_id}/decide", data=form)


def text_of(page: httpx.Response) -> str:
    """The page's text without tags, entities decoded, white space collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.text)).split())


# --- signing in -----------------------------------------------------------------------------


async def test_a_sign_in_link_opens_the_inbox_listing_what_the_reviewer_may_decide(
    web: Inbox,
) -> None:
    _, _, refund = await web.pending("refund", run_id="run_r")
    _, _, email = await web.pending(
        "send_email", run_id="run_e", to="x@example.org", subject="Hi", body="Hello"
    )
    client = web.browser()
    answer = await client.get(web.link(SLACK_LEAD))
    assert (answer.status_code, answer.headers["location"]) == (303, "/inbox")
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/inbox" in cookie
    assert "max-age=7200" in cookie and "secure" not in cookie

    page = await client.get("/inbox")
    assert page.status_code == 200
    assert f"signed in as {SLACK_LEAD}" in text_of(page)
    assert f'href="/inbox/approvals/{refund}"' in page.text
    assert "Refunds need a support lead." in page.text
    assert email not in page.text  # the email's rule names only lead@example.com

    lead = await web.signed_in(LEAD)
    both = await lead.get("/inbox")
    assert refund in both.text and email in both.text


async def test_a_review_whose_policy_names_no_reviewer_is_open_to_anyone_signed_in(
    web: Inbox,
) -> None:
    # An executor without the rules: its reviews carry no policy, so no reviewers.
    plain = Executor(
        web.executor.registry,
        approval=DeferredApproval(web.store),
        rules=[InterruptRule(tool="ping")],
    )
    ctx = plain.context(run_id="run_p", requested_by=CAROL)
    result = await plain.run_call(ToolCall(name="ping", arguments={"host": "db"}, id="c1"), ctx)
    assert result.error is not None
    approval_id = result.error.details["approval_id"]
    client = await web.signed_in(OTHER)
    assert f'href="/inbox/approvals/{approval_id}"' in (await client.get("/inbox")).text
    assert (await decide(client, approval_id, "approve")).status_code == 303
    record = await web.store.get(approval_id)
    assert record.decision is not None and record.decision.decided_by == OTHER


def tampered(link: str) -> list[str]:
    """The link with its signature changed, with another principal in its payload, and
    signed with another secret."""
    token = parse_qs(urlsplit(link).query)["token"][0]
    payload, signature = token.split(".")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["p"] = "mallory@example.com"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    foreign = Signer("another-secret-0000000").link_token(LEAD, 3600)
    base = link.split("?", 1)[0]
    return [
        f"{base}?token={payload}.{flipped}",
        f"{base}?token={forged}.{signature}",
        f"{base}?token={foreign}",
        f"{base}?token={payload}",
        base,
    ]


async def test_a_tampered_link_is_401_and_signs_nobody_in(web: Inbox) -> None:
    for link in tampered(web.link(LEAD)):
        client = web.browser()
        answer = await client.get(link)
        assert answer.status_code == 401, link
        assert "set-cookie" not in answer.headers
        assert "This sign-in link is not valid" in answer.text
        assert "Ask whoever gave it to you for a new link." in answer.text
        assert (await client.get("/inbox")).status_code == 401


async def test_an_expired_link_is_401_asking_for_a_new_one(web: Inbox) -> None:
    link = web.link(LEAD)
    web.clock.now += 3600 + 1  # link_ttl: 1h
    client = web.browser()
    answer = await client.get(link)
    assert answer.status_code == 401
    assert "set-cookie" not in answer.headers
    assert "This sign-in link has expired. Ask whoever gave it to you for a new link." in (
        text_of(answer)
    )


async def test_pages_without_a_valid_session_are_401_saying_how_to_get_a_link(
    web: Inbox,
) -> None:
    _, _, approval_id = await web.pending()
    client = web.browser()
    forged = Signer("another-secret-0000000")
    _, foreign_cookie = forged.new_session(LEAD, 3600)
    answers = [
        await client.get("/inbox"),
        await client.get(f"/inbox/approvals/{approval_id}"),
        await client.post(
            f"/inbox/approvals/{approval_id}/decide", data={"action": "approve", "csrf": "x"}
        ),
        await client.get("/inbox", headers={"Cookie": f"nodbot_session={foreign_cookie}"}),
        await client.get("/inbox", headers={"Cookie": "nodbot_session=garbage"}),
    ]
    for answer in answers:
        assert answer.status_code == 401
        assert "nodbot inbox-link --config nodbot.yml --reviewer" in text_of(answer)
        assert approval_id not in answer.text
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_a_session_ends_after_session_ttl(web: Inbox) -> None:
    client = await web.signed_in(LEAD)
    assert (await client.get("/inbox")).status_code == 200
    web.clock.now += 2 * 3600 + 1  # session_ttl: 2h
    answer = await client.get("/inbox")
    assert answer.status_code == 401
    assert "Your session has ended." in answer.text


async def test_signing_out_ends_the_session(web: Inbox) -> None:
    client = await web.signed_in(LEAD)
    page = await client.get("/inbox")
    cookie = client.cookies["nodbot_session"]
    refused = await client.post("/inbox/logout", data={"csrf": "wrong"})
    assert refused.status_code == 403
    assert (await client.get("/inbox")).status_code == 200
    out = await client.post("/inbox/logout", data={"csrf": csrf_of(page)})
    # A redirect, so that a refresh does not post the form again.
    assert (out.status_code, out.headers["location"]) == (303, "/inbox/signed-out")
    assert "You are signed out" in (await client.get("/inbox/signed-out")).text
    assert "nodbot_session" not in client.cookies
    # The old cookie, kept by someone, no longer works either.
    again = await web.browser().get("/inbox", headers={"Cookie": f"nodbot_session={cookie}"})
    assert again.status_code == 401


async def test_the_session_cookie_is_secure_behind_an_https_address(tmp_path: Path) -> None:
    async with served_inbox(tmp_path, public_url="https://nodbot.example.com") as web:
        link = sign_in_link(web.config, LEAD, clock=web.clock)
        assert link.startswith("https://nodbot.example.com/inbox/login?token=")
        answer = await web.browser().get(web.url + "/inbox/login?" + link.split("?", 1)[1])
        assert answer.status_code == 303
        assert "secure" in answer.headers["set-cookie"].lower()


# --- deciding -------------------------------------------------------------------------------


async def test_approving_through_the_form_records_the_reviewer_and_channel_web(
    web: Inbox,
) -> None:
    call, ctx, approval_id = await web.pending()
    client = await web.signed_in(SLACK_LEAD)
    page = await client.get(f"/inbox/approvals/{approval_id}")
    shown = text_of(page)
    for fact in ("refund", "Refunds need a support lead.", CAROL, "run_a", "o-7", "500.0"):
        assert fact in shown
    assert 'value="approve"' in page.text and 'value="deny"' in page.text
    assert 'name="arg.amount"' in page.text and 'name="arg.order_id"' not in page.text

    answer = await decide(client, approval_id, "approve")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/inbox/approvals/{approval_id}"

    record = await web.store.get(approval_id)
    assert record.status == "approved"
    assert record.decision is not None and record.decision.decided_by == SLACK_LEAD
    assert await web.events(approval_id) == [
        ("created", CAROL, None),
        ("voted", SLACK_LEAD, "web"),
        ("decided", SLACK_LEAD, "web"),
    ]
    after = text_of(await client.get(answer.headers["location"]))
    assert f"approved by {SLACK_LEAD} just now" in after
    assert 'value="approve"' not in after

    inbox = text_of(await client.get("/inbox"))
    assert "Nothing waits for you." in inbox
    assert f"approved {SLACK_LEAD}" in inbox

    result = await web.executor.run_call(call, ctx)
    assert (result.status, web.ran) == ("ok", ["refund o-7 500.0"])


async def test_an_invalid_edit_is_422_beside_the_field_then_a_valid_one_is_recorded(
    web: Inbox,
) -> None:
    call, ctx, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    bad = await decide(client, approval_id, "edit", **{"arg.amount": "lots"})
    assert bad.status_code == 422
    assert re.search(r'id="error-amount">amount: expected a number, not &#39;lots&#39;<', bad.text)
    assert 'value="lots"' in bad.text  # what was typed is kept in the field
    assert (await web.store.get(approval_id)).status == "pending"
    assert await web.events(approval_id) == [("created", CAROL, None)]

    unchanged = await decide(client, approval_id, "edit", **{"arg.amount": "500"})
    assert unchanged.status_code == 422
    assert "Nothing was changed" in unchanged.text

    good = await decide(client, approval_id, "edit", **{"arg.amount": "100", "reason": "max"})
    assert good.status_code == 303
    record = await web.store.get(approval_id)
    assert record.decision is not None
    assert record.decision.edited_args == {"amount": 100}
    assert (record.decision.decided_by, record.decision.reason) == (LEAD, "max")
    page = text_of(await client.get(f"/inbox/approvals/{approval_id}"))
    assert f"edited and approved by {LEAD}" in page and "Reason: max" in page
    result = await web.executor.run_call(call, ctx)
    assert result.status == "ok" and web.ran == ["refund o-7 100.0"]


async def test_the_edit_form_follows_the_tools_schema(web: Inbox) -> None:
    arguments = {"level": 3, "enabled": True, "mode": "safe", "name": "db", "tags": ["a"]}
    _, _, approval_id = await web.pending("configure", **arguments)
    client = await web.signed_in(LEAD)
    page = (await client.get(f"/inbox/approvals/{approval_id}")).text
    assert re.search(r'<input type="number" id="f-level" name="arg.level" value="3" step="1"', page)
    assert re.search(r'<select id="f-enabled" name="arg.enabled">', page)
    assert '<option value="true" selected>true</option>' in page
    assert '<option value="&#34;safe&#34;" selected>safe</option>' in page
    assert '<input type="text" id="f-name" name="arg.name" value="db"' in page
    assert re.search(r'<textarea id="f-tags" name="arg.tags"[^>]*>\[\s*&#34;a&#34;\s*\]<', page)
    assert re.search(r'<input type="text" id="f-note" name="arg.note" value=""', page)

    bad = await decide(
        client,
        approval_id,
        "edit",
        **{"arg.level": "2.5", "arg.enabled": "maybe", "arg.tags": "[not json"},
    )
    assert bad.status_code == 422
    errors = dict(re.findall(r'id="error-(\w+)">\w+: ([^<]*)<', bad.text))
    assert errors == {
        "level": "expected a whole number, not &#39;2.5&#39;",
        "enabled": "expected true or false, not &#39;maybe&#39;",
        "tags": "not valid JSON: Expecting value (line 1, column 2)",
    }
    model = await decide(client, approval_id, "edit", **{"arg.tags": '[{"a": 1}]'})
    assert model.status_code == 422  # JSON, but not a list of strings: the tool's model says
    assert re.search(r'id="error-tags">tags: [^<]*string', model.text)
    extra = await decide(client, approval_id, "edit", **{"arg.bogus": "1"})
    assert extra.status_code == 422
    assert "The tool does not accept these values; nothing was recorded. bogus:" in extra.text
    assert await web.events(approval_id) == [("created", CAROL, None)]

    good = await decide(
        client,
        approval_id,
        "edit",
        **{"arg.mode": '"fast"', "arg.enabled": "false", "arg.tags": '["a", "b"]'},
    )
    assert good.status_code == 303
    record = await web.store.get(approval_id)
    assert record.decision is not None
    assert record.decision.edited_args == {"mode": "fast", "enabled": False, "tags": ["a", "b"]}


async def test_an_edit_of_an_argument_the_rule_keeps_is_403(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    answer = await decide(client, approval_id, "edit", **{"arg.order_id": "o-8"})
    assert answer.status_code == 403
    assert "order_id may not be edited here (editable: amount)" in text_of(answer)
    # Nothing decided; the refused attempt is in the audit log.
    assert await web.events(approval_id) == [("created", CAROL, None), ("refused", LEAD, "web")]


async def test_a_deny_records_its_reason(web: Inbox) -> None:
    call, ctx, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    answer = await decide(client, approval_id, "deny", reason="no receipt")
    assert answer.status_code == 303
    record = await web.store.get(approval_id)
    assert record.status == "denied" and record.decision is not None
    assert (record.decision.decided_by, record.decision.reason) == (LEAD, "no receipt")
    page = text_of(await client.get(f"/inbox/approvals/{approval_id}"))
    assert f"denied by {LEAD}" in page and "Reason: no receipt" in page
    result = await web.executor.run_call(call, ctx)
    assert result.error is not None and result.error.details["reason"] == "no receipt"
    assert web.ran == []


@pytest.mark.parametrize("token", [None, "", "wrong", "other-session"])
async def test_a_post_without_the_forms_token_is_403_and_records_nothing(
    web: Inbox, token: str | None
) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    form = {"action": "approve"}
    if token == "other-session":
        other = await web.signed_in(LEAD)  # the same reviewer, another session
        form["csrf"] = csrf_of(await other.get(f"/inbox/approvals/{approval_id}"))
    elif token is not None:
        form["csrf"] = token
    answer = await client.post(f"/inbox/approvals/{approval_id}/decide", data=form)
    assert answer.status_code == 403
    assert "nothing was recorded" in answer.text
    assert (await web.store.get(approval_id)).status == "pending"
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_a_reviewer_the_rule_does_not_name_is_refused(web: Inbox) -> None:
    # Someone the rule does not name does not see the approval at all: the page and the
    # decision answer as for an unknown id (tests/bot/test_inbox_visibility.py has more).
    _, _, approval_id = await web.pending()
    client = await web.signed_in(OTHER)
    inbox = await client.get("/inbox")
    assert approval_id not in inbox.text
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 404
    assert f"No approval has the id &#39;{approval_id}&#39;." in page.text
    for action in ("approve", "deny"):
        form = {"action": action, "csrf": csrf_of(inbox)}
        answer = await client.post(f"/inbox/approvals/{approval_id}/decide", data=form)
        assert answer.status_code == 404
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_the_requester_may_not_approve_their_own_call_unless_the_rule_allows(
    web: Inbox,
) -> None:
    _, _, refund = await web.pending("refund", requested_by=LEAD)
    arguments = {"level": 1, "enabled": True, "mode": "fast", "name": "x", "tags": []}
    _, _, own = await web.pending("configure", run_id="run_b", requested_by=LEAD, **arguments)
    client = await web.signed_in(LEAD)
    page = await client.get(f"/inbox/approvals/{refund}")
    assert 'value="approve"' not in page.text and 'value="deny"' in page.text
    for action, extra in (("approve", {}), ("edit", {"arg.amount": "1"})):
        form = {"action": action, "csrf": csrf_of(page), **extra}
        answer = await client.post(f"/inbox/approvals/{refund}/decide", data=form)
        assert answer.status_code == 403
        assert SELF_APPROVAL_REASON in answer.text
    assert await web.events(refund) == [
        ("created", LEAD, None),
        ("refused", LEAD, "web"),
        ("refused", LEAD, "web"),
    ]
    # configure's rule has allow_self_approval: true
    assert (await decide(client, own, "approve")).status_code == 303
    assert (await web.store.get(own)).status == "approved"


async def test_a_second_decision_is_409_naming_who_decided_first(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    first = await web.signed_in(SLACK_LEAD)
    second = await web.signed_in(LEAD)
    page = await second.get(f"/inbox/approvals/{approval_id}")  # loaded before the decision
    assert (await decide(first, approval_id, "approve")).status_code == 303
    late = await second.post(
        f"/inbox/approvals/{approval_id}/decide",
        data={"action": "deny", "csrf": csrf_of(page), "reason": "no"},
    )
    assert late.status_code == 409
    assert f"This approval was already decided by {SLACK_LEAD}" in text_of(late)
    record = await web.store.get(approval_id)
    assert record.decision is not None and record.decision.approved
    late_edit = await second.post(
        f"/inbox/approvals/{approval_id}/decide",
        data={"action": "edit", "csrf": csrf_of(page), "arg.amount": "lots"},
    )
    assert late_edit.status_code == 409
    assert f"already decided by {SLACK_LEAD}" in text_of(late_edit)
    refused = [e for e in await web.store.events(approval_id) if e.kind == "refused"]
    assert [(e.actor, e.channel) for e in refused] == [(LEAD, "web")]


async def test_a_review_of_two_approvals_counts_each_reviewer_once(web: Inbox) -> None:
    _, _, approval_id = await web.pending("pay", to="acme", amount=10.0)
    lead = await web.signed_in(LEAD)
    page = await lead.get(f"/inbox/approvals/{approval_id}")
    assert 'name="arg.amount"' not in page.text  # such a review cannot be edited
    assert (await decide(lead, approval_id, "approve")).status_code == 303
    after = text_of(await lead.get(f"/inbox/approvals/{approval_id}"))
    assert "1 of 2 votes" in after and "You have voted" in after
    again = await lead.post(
        f"/inbox/approvals/{approval_id}/decide", data={"action": "approve", "csrf": csrf_of(page)}
    )
    assert again.status_code == 409 and "You have voted on this approval already" in again.text
    other = await web.signed_in(SLACK_LEAD)
    assert (await decide(other, approval_id, "approve")).status_code == 303
    record = await web.store.get(approval_id)
    assert record.decision is not None
    assert record.decision.decided_by == f"{LEAD}, {SLACK_LEAD}"


async def test_untrusted_arguments_are_escaped_everywhere(web: Inbox) -> None:
    script = "<script>alert(1)</script>"
    quoted = "\"><img src=x onerror=alert('q')>"
    long_body = f"Dear customer,\n{script}\n" + "x" * 200
    _, _, approval_id = await web.pending(
        "send_email", to=quoted, subject=f'say "{script}"', body=long_body
    )
    arguments = {"level": 1, "enabled": True, "mode": "fast", "name": quoted, "tags": [script]}
    _, _, form_id = await web.pending("configure", run_id="run_c", **arguments)
    client = await web.signed_in(LEAD)
    pages = [
        await client.get("/inbox"),
        await client.get(f"/inbox/approvals/{approval_id}"),
        await client.get(f"/inbox/approvals/{form_id}"),
        await decide(client, form_id, "edit", **{"arg.name": quoted, "arg.level": script}),
    ]
    assert [page.status_code for page in pages] == [200, 200, 200, 422]
    for page in pages:
        # No script but the page's own, allowed by the nonce of its response's CSP.
        own = re.findall(r'<script nonce="([^"]+)">', page.text)
        assert page.text.count("<script") == len(own) and "<img" not in page.text
        for nonce in own:
            assert f"script-src 'nonce-{nonce}'" in page.headers["content-security-policy"]
        assert "'q'" not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["x-frame-options"] == "DENY"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[1].text
    assert "&#34;&gt;&lt;img src=x onerror=alert(&#39;q&#39;)&gt;" in pages[1].text
    # a long value is shown whole, in a <pre>
    assert f"<pre>Dear customer,\n&lt;script&gt;alert(1)&lt;/script&gt;\n{'x' * 200}</pre>" in (
        pages[1].text
    )
    assert 'value="&#34;&gt;&lt;img src=x onerror=alert(&#39;q&#39;)&gt;"' in pages[3].text


async def test_an_unknown_approval_is_a_404_page(web: Inbox) -> None:
    client = await web.signed_in(LEAD)
    answer = await client.get("/inbox/approvals/apr_nope")
    assert answer.status_code == 404
    assert "No approval has the id &#39;apr_nope&#39;." in answer.text


async def test_a_post_that_is_not_a_form_is_refused_and_records_nothing(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    page = await client.get(f"/inbox/approvals/{approval_id}")
    url = f"/inbox/approvals/{approval_id}/decide"
    as_json = await client.post(url, json={"action": "approve", "csrf": csrf_of(page)})
    assert as_json.status_code == 415
    huge = await client.post(
        url, data={"action": "approve", "csrf": csrf_of(page), "reason": "x" * 1_100_000}
    )
    assert huge.status_code == 413
    assert await web.events(approval_id) == [("created", CAROL, None)]


async def test_an_unexpected_failure_is_a_500_page_and_records_nothing(tmp_path: Path) -> None:
    async def broken(principal: str, record: ApprovalRecord, decision: Decision) -> Verdict:
        raise RuntimeError("policy service down")

    async with served_inbox(tmp_path, authorize=broken) as web:
        _, _, approval_id = await web.pending()
        client = await web.signed_in(LEAD)
        page = await client.get(f"/inbox/approvals/{approval_id}")
        assert page.status_code == 500
        assert "The bot failed to answer; it is logged. Nothing was recorded." in page.text
        assert "policy service down" not in page.text
        assert await web.events(approval_id) == [("created", CAROL, None)]


# --- forms, without a server ----------------------------------------------------------------


def test_parse_edit_keeps_only_what_changed_and_reads_none() -> None:
    registry = registry_of([])
    schema = registry.get("configure").model.model_json_schema()
    current = {"level": 3, "enabled": True, "mode": "safe", "name": "db", "tags": [], "note": "n"}
    fields = edit_fields(schema, current, ["level", "note"])
    assert [(f.name, f.kind, f.nullable) for f in fields] == [
        ("level", "integer", False),
        ("note", "string", True),
    ]
    parsed = parse_edit(fields, {"arg.level": "3", "arg.note": ""}, current)
    assert (parsed.edited, parsed.errors) == ({"note": None}, {})
    parsed = parse_edit(fields, {"arg.level": "", "arg.note": "n"}, current)
    assert parsed.edited == {} and parsed.errors == {"level": "expected a whole number, not ''"}


# --- the bot, end to end --------------------------------------------------------------------


BOT = """
store:
  url: sqlite:///{db}
server:
  host: 127.0.0.1
  port: 0
workers:
  poll: 60          # so only the decision's wake-up can move the run on in time
{web}
api:
  tokens:
    - name: ana
      token: ${{NODBOT_TOKEN_ANA}}
      scopes: [runs:write, runs:write-as, approvals:read]
    - name: U0123LEADS
      token: ${{NODBOT_TOKEN_LEAD}}
      scopes: [approvals:read, approvals:decide]
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    when: {{gt: {{amount: 100}}}}
    reviewers: [U0123LEADS]
"""


@pytest.mark.parametrize("secret", [None, SECRET])
async def test_a_decision_made_in_the_inbox_finishes_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret: str | None
) -> None:
    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)
    path = tmp_path / "nodbot.yml"
    web_section = f"web: {{secret: {secret}}}" if secret else ""
    path.write_text(BOT.format(db=tmp_path / "nodbot.db", web=web_section))
    async with serving(str(path)) as bot, httpx.AsyncClient(base_url=bot.url) as client:
        body = {"agent": "support", "input": "Refund order A-1001", "requested_by": "carol"}
        run = (await client.post("/runs", json=body, headers=as_("ana"))).json()
        [pending] = run["pending"]
        link = bot.sign_in_link(SLACK_LEAD)  # signed with the random secret when none is set
        assert link.startswith(f"{bot.url}/inbox/login?token=")
        assert (await client.get(link)).status_code == 303
        answer = await decide(client, pending["approval_id"], "edit", **{"arg.amount": "100"})
        assert answer.status_code == 303
        finished = await until_finished(client, run["run_id"])
        assert finished["status"] == "finished"
        [result] = finished["tool_results"]
        assert (result["status"], result["arguments"]["amount"]) == ("ok", 100.0)
        page = text_of(await client.get(f"/inbox/approvals/{pending['approval_id']}"))
        assert "The call has ended: ok." in page
        assert "Result: refunded 100.0 on A-1001" in page  # from the run's tool message
        metrics = (await client.get("/metrics")).text.splitlines()
        assert "nodbot_decisions_total 1" in metrics


def test_nodbot_inbox_link_prints_a_link_the_running_bot_accepts(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    completed = subprocess.run(
        [nodbot(), "inbox-link", "--config", str(path), "--reviewer", LEAD],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    link = completed.stdout.strip()
    assert link.startswith("http://127.0.0.1:8080/inbox/login?token=")
    token = parse_qs(urlsplit(link).query)["token"][0]
    assert Signer(SECRET).principal_of_link(token) == LEAD

    async def sign_in() -> int:
        async with served_inbox(tmp_path) as web:
            answer = await web.browser().get(f"{web.url}/inbox/login?token={token}")
            return answer.status_code

    assert asyncio.run(sign_in()) == 303


def test_nodbot_inbox_link_needs_web_secret(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text("rules: []\n")
    completed = subprocess.run(
        [nodbot(), "inbox-link", "--config", str(path), "--reviewer", LEAD],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 2  # the configuration lacks what the command needs
    assert completed.stdout == ""
    assert completed.stderr.startswith("nodbot: web.secret is not set")
    bad = subprocess.run(
        [nodbot(), "inbox-link", "--config", str(write_config(tmp_path)), "--reviewer", "a b"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not 'a b'" in bad.stderr


# --- limits ---------------------------------------------------------------------------------


async def test_a_reason_over_2000_characters_is_422_and_records_nothing(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert 'name="reason" maxlength="2000"' in page.text  # the browser stops at the limit too
    answer = await decide(client, approval_id, "deny", reason="x" * 2_001)
    assert answer.status_code == 422
    assert "The reason has 2001 characters; at most 2000 are allowed" in text_of(answer)
    assert (await web.store.get(approval_id)).status == "pending"
    assert await web.events(approval_id) == [("created", CAROL, None)]
    kept = await decide(client, approval_id, "deny", reason="x" * 2_000)
    assert kept.status_code == 303


CONFIGURE = {"level": 1, "enabled": True, "mode": "safe", "name": "n", "tags": []}


async def test_a_long_or_deep_value_in_an_edit_is_422_beside_its_field(web: Inbox) -> None:
    _, _, approval_id = await web.pending("configure", **CONFIGURE)
    client = await web.signed_in(LEAD)
    long = await decide(client, approval_id, "edit", **{"arg.name": "n" * 10_001})
    assert long.status_code == 422
    assert "name: 10001 characters; at most 10000 are allowed" in text_of(long)
    inside = await decide(client, approval_id, "edit", **{"arg.tags": json.dumps(["t" * 10_001])})
    assert inside.status_code == 422
    assert "tags.0 has 10001 characters; at most 10000 are allowed" in text_of(inside)
    deep = await decide(client, approval_id, "edit", **{"arg.tags": "[" * 100_000})
    assert deep.status_code == 422
    assert "nested too deeply" in text_of(deep)
    assert (await web.store.get(approval_id)).status == "pending"
    assert await web.events(approval_id) == [("created", CAROL, None)]


# --- what reviewers see ---------------------------------------------------------------------


def iso(moment: datetime | None) -> str:
    assert moment is not None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_an_edit_is_shown_beside_the_original_value_and_who_decided(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    assert (await decide(client, approval_id, "edit", **{"arg.amount": "100"})).status_code == 303
    page = await client.get(f"/inbox/approvals/{approval_id}")
    assert re.search(r"<del[^>]*>500.0</del>\s*→\s*<ins[^>]*>100</ins>", page.text), page.text
    assert "amount 500.0 → 100 (edited)" in text_of(page)
    assert "order_id o-7" in text_of(page)  # not edited: shown once
    listed = await client.get("/inbox")
    assert re.search(r"<del[^>]*>500.0</del>\s*→\s*<ins[^>]*>100</ins>", listed.text)
    assert f"edited and approved {LEAD}" in text_of(listed)


async def test_approving_a_destructive_tool_asks_to_confirm_first(web: Inbox) -> None:
    call, ctx, approval_id = await web.pending("drop_table", name="orders")
    client = await web.signed_in(LEAD)
    first = await decide(client, approval_id, "approve")
    assert first.status_code == 303
    assert first.headers["location"] == f"/inbox/approvals/{approval_id}?confirm=approve"
    assert (await web.store.get(approval_id)).status == "pending"
    assert await web.events(approval_id) == [("created", CAROL, None)]

    step = await client.get(first.headers["location"])
    assert step.status_code == 200
    assert "drop_table changes things that may not be undone" in text_of(step)
    assert 'name="confirm" value="yes"' in step.text
    url = f"/inbox/approvals/{approval_id}/decide"
    forged = await client.post(url, data={"action": "approve", "confirm": "yes", "csrf": "x"})
    assert forged.status_code == 403
    assert await web.events(approval_id) == [("created", CAROL, None)]

    confirmed = await client.post(
        url, data={"action": "approve", "confirm": "yes", "csrf": csrf_of(step)}
    )
    assert (confirmed.status_code, confirmed.headers["location"]) == (
        303,
        f"/inbox/approvals/{approval_id}",
    )
    assert (await web.store.get(approval_id)).status == "approved"
    result = await web.executor.run_call(call, ctx)
    assert (result.status, web.ran) == ("ok", ["drop orders"])


async def test_a_deny_of_a_destructive_tool_needs_no_confirmation(web: Inbox) -> None:
    _, _, approval_id = await web.pending("drop_table", name="orders")
    client = await web.signed_in(LEAD)
    answer = await decide(client, approval_id, "deny", reason="no")
    assert (answer.status_code, answer.headers["location"]) == (
        303,
        f"/inbox/approvals/{approval_id}",
    )
    assert (await web.store.get(approval_id)).status == "denied"


async def test_times_are_said_in_words_with_the_exact_time_on_hover(web: Inbox) -> None:
    _, _, approval_id = await web.pending("drop_table", name="orders")
    record = await web.store.get(approval_id)
    deadline = iso(record.request.deadline)
    client = await web.signed_in(LEAD)
    listed = await client.get("/inbox")
    assert f'<time datetime="{deadline}" title="{deadline}">in 30 min</time>' in listed.text
    assert f'title="{iso(record.created_at)}">just now</time>' in listed.text
    web.clock.now += 16 * 60
    listed = await client.get("/inbox")
    assert f'title="{deadline}">in 14 min</time>' in listed.text
    page = text_of(await client.get(f"/inbox/approvals/{approval_id}"))
    assert "Asked at 16 min ago" in page and "Deadline in 14 min" in page

    assert (await decide(client, approval_id, "deny")).status_code == 303
    web.clock.now += 3 * 3600
    later = await web.signed_in(LEAD)  # the first session has ended by now
    decided = await web.store.get(approval_id)
    listed = await later.get("/inbox")
    assert f'title="{iso(decided.decided_at)}">3 h ago</time>' in listed.text
    page = text_of(await later.get(f"/inbox/approvals/{approval_id}"))
    assert f"denied by {LEAD} 3 h ago" in page and "Deadline 3 h ago" in page


async def test_two_reviews_of_one_tool_are_told_apart_in_the_list(web: Inbox) -> None:
    runs = ["run_0192f0aa0000aaaa0001", "run_0192f0aa0000aaaa0002"]
    ids = [(await web.pending(run_id=run))[2] for run in runs]
    client = await web.signed_in(LEAD)
    listed = await client.get("/inbox")
    shown = text_of(listed)
    for run, approval_id in zip(runs, ids, strict=True):
        assert f"run_…{run[-8:]}" in shown and f'title="{run}"' in listed.text
        assert f"apr_…{approval_id[-8:]}" in shown and f'title="{approval_id}"' in listed.text
    assert shown.count("just now") >= 2  # each one's time


async def test_every_successful_post_is_a_redirect(web: Inbox) -> None:
    _, _, approval_id = await web.pending()
    client = await web.signed_in(LEAD)
    posts = [
        await decide(client, approval_id, "edit", **{"arg.amount": "1"}),
        await client.post("/inbox/logout", data={"csrf": csrf_of(await client.get("/inbox"))}),
    ]
    assert [answer.status_code for answer in posts] == [303, 303]


async def test_an_edit_and_a_result_are_escaped(web: Inbox) -> None:
    script = "<script>alert(1)</script>"
    run = await web.store.create_run(agent="app", messages=[], worker="w", run_id="run_x")
    configured: dict[str, Any] = dict(CONFIGURE)
    call, ctx, approval_id = await web.pending("configure", run_id="run_x", **configured)
    client = await web.signed_in(LEAD)
    edit = {"arg.name": script}
    assert (await decide(client, approval_id, "edit", **edit)).status_code == 303
    assert (await web.executor.run_call(call, ctx)).status == "ok"
    answer = ToolMessage(
        tool_call_id="c1", name="configure", content=json.dumps({"result": script}), status="ok"
    )
    await web.store.save_run(run, status="finished", messages=[answer])
    pages = [await client.get(f"/inbox/approvals/{approval_id}"), await client.get("/inbox")]
    for page in pages:
        assert "<script>" not in page.text  # the page's own script carries its nonce
        assert '→ <ins title="what ran">&lt;script&gt;alert(1)&lt;/script&gt;</ins>' in page.text
    assert f"Result: {script}" in text_of(pages[0])
