"""A review's page names people, not worker ids, keeps digests behind a disclosure, and links
back to the review's Slack messages.

`bot.web.history` on its own (each kind of actor, and, with hypothesis, any detail an event
may hold: never an error, never a digest on the summary line), then the pages the served
inbox renders: over SQLite (`served_inbox`), and the whole bot against the Slack fake
(`slack_bot`), where the page links to the message the bot posted."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.web.history import EventView, event_view, handles_to_name, is_worker
from nodbot.bot.web.slack_links import Workspace, message_link, slack_messages, workspace_of
from nodbot.core import ApprovalEvent, Delivery
from tests.bot.test_slack import Bot, slack_bot
from tests.bot.test_web_inbox import CAROL, LEAD, Inbox, decide, served_inbox, text_of

WORKER = "vm:11696"
DIGEST = "9f2c" * 16  # a SHA-256 as the events keep it
SESSION = "5be1c0de77aa0f31"  # the inbox's session digest (16 hex digits)
AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def event(kind: str = "decided", **fields: Any) -> ApprovalEvent:
    return ApprovalEvent(seq=1, approval_id="apr_1", kind=kind, at=AT, **fields)  # type: ignore[arg-type]


def line(view: EventView) -> str:
    """What the page shows outside the disclosure: who, for whom, through what, the summary."""
    parts = [view.who.name, view.who.role or "", view.for_whom or "", view.channel, view.kind]
    return " ".join(parts + [text for _, text in view.summary])


def details(view: EventView) -> dict[str, str]:
    return dict(view.details)


# --- who acted ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "channel"),
    [("delivered", "slack"), ("undelivered", "email"), ("consumed", "executor")],
)
def test_a_worker_is_shown_as_nodbot_with_the_worker_behind_the_disclosure(
    kind: str, channel: str
) -> None:
    view = event_view(event(kind, actor=WORKER, channel=channel, detail={"target": "slack:dm:U1"}))
    assert (view.who.name, view.who.kind) == ("nodbot", "bot")
    assert WORKER not in line(view)
    assert details(view)["worker"] == WORKER


def test_a_worker_id_is_told_from_handles() -> None:
    assert is_worker(WORKER) and is_worker("ip-10-0-0-7.eu-west-1.compute.internal:42")
    for handle in ("U0123LEADS", "ana@example.com", "ci-deployer", "nodbot:timeout", None, ""):
        assert not is_worker(handle)
    # A worker named otherwise still delivered: the kind says it was the bot.
    assert event_view(event("delivered", actor="worker-a", channel="slack")).who.name == "nodbot"


@pytest.mark.parametrize(
    ("actor", "role"),
    [("nodbot:rules.3", "rules.3"), ("nodbot:timeout", "timeout"), ("nodbot:no-rule", "no-rule")],
)
def test_the_bots_own_decisions_are_nodbots_saying_what_decided(actor: str, role: str) -> None:
    view = event_view(event(actor=actor, channel="timer", detail={"status": "denied"}))
    assert (view.who.name, view.who.kind, view.who.role) == ("nodbot", "bot", role)


def test_a_slack_user_is_shown_by_the_address_the_event_resolved() -> None:
    view = event_view(event(actor="U0123LEADS", channel="slack", person="email:lead@example.com"))
    assert (view.who.name, view.who.kind) == ("lead@example.com", "person")
    assert details(view)["handle"] == "U0123LEADS"
    named = event_view(event(actor="U0123LEADS", channel="slack", person="person:lee"))
    assert named.who.name == "lee"


def test_a_handle_the_event_did_not_resolve_takes_a_name_given_else_stays_itself() -> None:
    created = event("created", actor="U0CAROL001")
    assert handles_to_name([created]) == ["U0CAROL001"]
    assert event_view(created, {"u0carol001": "carol@example.com"}).who.name == "carol@example.com"
    assert event_view(created).who.name == "U0CAROL001"  # nobody could tell: the id
    resolved = event(actor="U0123LEADS", person="email:lead@example.com")
    assert handles_to_name([resolved, event("consumed", actor=WORKER, channel="executor")]) == []


def test_an_api_token_is_marked_as_one_unless_it_is_a_known_persons() -> None:
    token = event_view(event(actor="ci-deployer", channel="api", person="name:ci-deployer"))
    assert (token.who.name, token.who.kind) == ("ci-deployer", "token")
    theirs = event_view(event(actor="ci-deployer", channel="api", person="person:ana"))
    assert (theirs.who.name, theirs.who.kind) == ("ana", "person")


def test_a_quorums_decision_names_each_voter() -> None:
    both = event(actor="U0AAAAAAAA, U0BBBBBBBB", channel="slack")
    names = {"u0aaaaaaaa": "ana@example.com"}
    assert event_view(both, names).who.name == "ana@example.com, U0BBBBBBBB"


def test_a_delegates_decision_says_for_whom() -> None:
    evidence = {"session": SESSION, "for": "U0ANA00000", "for_person": "email:ana@example.com"}
    view = event_view(
        event(
            actor="bob@example.com", person="email:bob@example.com", detail={"evidence": evidence}
        )
    )
    assert (view.who.name, view.for_whom) == ("bob@example.com", "ana@example.com")


# --- what happened --------------------------------------------------------------------------


def test_a_decisions_digest_and_evidence_are_details_and_its_outcome_is_the_summary() -> None:
    detail = {
        "action": "edit",
        "reason": "smaller",
        "edited_args": {"amount": 100},
        "digest": DIGEST,
        "status": "approved",
        "evidence": {"session": SESSION, "via": "email link"},
    }
    view = event_view(event(actor=LEAD, channel="web", person=f"email:{LEAD}", detail=detail))
    assert view.summary == (
        ("status", "approved"),
        ("action", "edit"),
        ("edited_args", "amount"),
        ("reason", "smaller"),
    )
    assert details(view) == {
        "digest": DIGEST,
        "edited_args": '{"amount": 100}',
        "evidence.session": SESSION,
        "evidence.via": "email link",
    }
    assert DIGEST not in line(view) and SESSION not in line(view)


def test_a_long_reason_is_cut_on_the_line_and_whole_in_the_details() -> None:
    reason = "no: " + "r" * 300 + "\nsecond line"
    view = event_view(event("refused", actor=CAROL, channel="web", detail={"reason": reason}))
    [(_, shown)] = view.summary
    assert len(shown) <= 160 and shown.endswith("…") and "second line" not in shown
    assert details(view)["reason"] == reason


def test_a_digest_in_a_reason_is_shortened_on_the_line() -> None:
    view = event_view(event("refused", actor=CAROL, detail={"reason": f"digest {DIGEST} differs"}))
    assert dict(view.summary)["reason"] == f"digest {DIGEST[:8]}… differs"
    assert details(view)["reason"] == f"digest {DIGEST} differs"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
ACTORS = st.one_of(
    st.none(),
    st.just(WORKER),
    st.sampled_from(["nodbot:timeout", "nodbot:rules.0", "U0123LEADS", LEAD, "api", "a, b"]),
    st.text(max_size=40),
)
KINDS = st.sampled_from(
    [
        "created",
        "voted",
        "decided",
        "consumed",
        "kept",
        "finished",
        "refused",
        "delivered",
        "undelivered",
        "reminded",
    ]
)


@given(
    kind=KINDS,
    actor=ACTORS,
    channel=st.one_of(st.none(), st.sampled_from(["web", "slack", "api", "executor", "timer"])),
    person=st.one_of(st.none(), st.text(max_size=30)),
    extra=st.dictionaries(st.text(max_size=12), JSON, max_size=6),
    evidence=st.one_of(JSON, st.dictionaries(st.text(max_size=10), JSON, max_size=4)),
    digest=HEX,
    reason=st.text(max_size=300),
    planted=st.booleans(),
)
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_any_event_is_shown_without_an_error_and_without_a_digest_on_its_line(
    kind: str,
    actor: str | None,
    channel: str | None,
    person: str | None,
    extra: dict[str, Any],
    evidence: Any,
    digest: str,
    reason: str,
    planted: bool,
) -> None:
    detail: dict[str, Any] = {**extra, "digest": digest}
    if isinstance(evidence, dict):
        evidence = {**evidence, "session": digest[:16]}
    detail["evidence"] = evidence
    detail["reason"] = f"{reason} {digest} {reason}" if planted else reason
    view = event_view(
        event(kind, actor=actor, channel=channel, person=person, detail=detail), {"a": "ana"}
    )
    shown = line(view)
    assert digest not in shown
    if isinstance(evidence, dict) and digest[:16] not in f"{actor} {person} {reason}":
        assert digest[:16] not in shown
    assert ("digest", digest) in view.details
    if actor == WORKER:
        assert view.who.name == "nodbot" and WORKER not in shown
    assert all(len(text) <= 160 for _, text in view.summary)
    assert all(len(text) <= 2_000 for _, text in view.details)


# --- Slack links ----------------------------------------------------------------------------


def delivery(target: str, ref: dict[str, Any] | None, kind: str = "request") -> Delivery:
    return Delivery(
        delivery_id=1,
        approval_id="apr_1",
        kind=kind,  # type: ignore[arg-type]
        target=target,
        status="sent",
        attempts=1,
        due_at=AT,
        created_at=AT,
        ref=ref,
    )


def test_a_message_links_to_itself_in_a_known_workspace_else_to_its_conversation() -> None:
    message = {"channel": "C0123ROOM", "ts": "1712345678.000200"}
    workspace = workspace_of("https://acme.slack.com/")
    assert message_link(message, workspace) == (
        "https://acme.slack.com/archives/C0123ROOM/p1712345678000200"
    )
    assert message_link(message) == "https://slack.com/app_redirect?channel=C0123ROOM"
    kept = {**message, "permalink": "https://acme.slack.com/archives/C0123ROOM/p1"}
    assert message_link(kept) == kept["permalink"]


@pytest.mark.parametrize(
    "message",
    [
        {"channel": "C0123ROOM", "ts": "1712345678.000200", "permalink": "javascript:alert(1)"},
        {"channel": 'c0123"><script>', "ts": "1712345678.000200"},
        {"channel": "C0123ROOM", "ts": "now"},
        {"channel": 7, "ts": "1.2"},
    ],
)
def test_anything_but_a_slack_message_is_not_linked(message: dict[str, Any]) -> None:
    link = message_link(message, "https://acme.slack.com/")
    assert link is None or link == "https://acme.slack.com/archives/C0123ROOM/p1712345678000200"
    assert workspace_of("https://evil.example/") is None
    assert workspace_of("javascript:alert(1)//.slack.com/") is None


def test_only_the_reviews_own_slack_messages_are_linked() -> None:
    found = slack_messages(
        [
            delivery("slack:dm:U0LEAD0000", {"messages": [{"channel": "D0LEAD", "ts": "1.1"}]}),
            delivery("slack:channel:#refunds", {"messages": [{"channel": "C0ROOM", "ts": "2.1"}]}),
            delivery(
                "slack:messages", {"messages": [{"channel": "C0ROOM", "ts": "3.1"}]}, "outcome"
            ),
            delivery("email:lead@example.com", {"messages": [{"channel": "C0MAIL", "ts": "4.1"}]}),
            delivery("slack:dm:U0SECOND00", None),
        ],
        "https://acme.slack.com/",
    )
    assert [(m.place, m.to, m.link) for m in found] == [
        ("dm", "U0LEAD0000", "https://acme.slack.com/archives/D0LEAD/p11"),
        ("channel", "#refunds", "https://acme.slack.com/archives/C0ROOM/p21"),
    ]


async def test_the_workspace_is_asked_of_slack_once_and_again_only_after_a_failure() -> None:
    class Client:
        def __init__(self) -> None:
            self.answers: list[Any] = [OSError("down"), {"url": "https://acme.slack.com/"}]
            self.asked = 0

        async def auth_test(self) -> Any:
            self.asked += 1
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    now = [0.0]
    workspace = Workspace(retry=60.0, clock=lambda: now[0])
    client = Client()
    assert await workspace.address(client) is None
    assert await workspace.address(client) is None and client.asked == 1  # not yet again
    now[0] = 61.0
    assert await workspace.address(client) == "https://acme.slack.com/"
    assert await workspace.address(client) == "https://acme.slack.com/" and client.asked == 2
    assert await Workspace().address(None) is None


# --- the rendered page ----------------------------------------------------------------------


def history_of(page: httpx.Response) -> tuple[str, str]:
    """The History section's HTML: outside its disclosures, and inside them."""
    section = page.text.split("<h2>History</h2>", 1)[1]
    folded = re.findall(r"<details\b.*?</details>", section, flags=re.S)
    return re.sub(r"<details\b.*?</details>", "", section, flags=re.S), "".join(folded)


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[Inbox]:
    async with served_inbox(tmp_path) as harness:
        yield harness


async def test_the_pages_history_names_nodbot_and_folds_digests_and_workers(web: Inbox) -> None:
    call, ctx, approval_id = await web.pending()
    carol = await web.signed_in(CAROL)
    assert (await decide(carol, approval_id, "approve")).status_code == 403  # her own call
    lead = await web.signed_in(LEAD)
    assert (await decide(lead, approval_id, "edit", **{"arg.amount": "100"})).status_code == 303
    worker = rules_executor(web.executor.registry, web.config, web.store, worker=WORKER)
    assert (await worker.run_call(call, ctx)).status == "ok"
    events = await web.store.events(approval_id)
    assert [(e.kind, e.actor) for e in events][-2:] == [("consumed", WORKER), ("finished", None)]
    digest = (await web.store.get(approval_id)).request.digest
    session = next(e.detail["evidence"]["session"] for e in events if e.kind == "decided")

    page = await lead.get(f"/inbox/approvals/{approval_id}")
    shown, folded = history_of(page)
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", shown)).split())
    for hidden in (digest, session, WORKER):
        assert hidden not in shown, hidden
        assert hidden in folded, hidden
    assert "consumed nodbot executor" in text
    assert f"decided {LEAD} web approved action edit" in text
    assert "refused carol@example.com web reason" in text
    assert '<details class="more"><summary>more</summary>' in page.text
    assert "In Slack" not in text_of(page)  # never posted there: no link


async def test_a_folded_argument_keeps_its_whole_value_escaped(web: Inbox) -> None:
    script = "<script>alert(1)</script>"
    order = "ORD-" + "9" * 100 + script
    _, _, approval_id = await web.pending(order_id=order, amount=5.0)
    page = await (await web.signed_in(LEAD)).get(f"/inbox/approvals/{approval_id}")
    escaped = html.escape(order, quote=False)
    assert "<script>alert" not in page.text  # (the page's own script carries its nonce)
    summary = re.search(r'<details class="value"><summary><code>([^<]*)</code>', page.text)
    assert summary is not None and summary.group(1) == "ORD-" + "9" * 75 + "…"
    assert f"<pre>{escaped}</pre></details>" in page.text
    assert "amount 5.0" in text_of(page)  # short: inline, not folded


# --- the Slack message ----------------------------------------------------------------------


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with slack_bot(tmp_path, monkeypatch) as running:
        yield running


async def page_of(bot: Bot, principal: str, approval_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=bot.served.url, follow_redirects=True) as browser:
        await browser.get(bot.served.sign_in_link(principal))
        page = await browser.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200, page.text
    return page


async def test_the_page_links_to_the_reviews_slack_message_and_names_slack_users(
    bot: Bot,
) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    await bot.settled(approval_id)
    page = await page_of(bot, bot.lead.id, approval_id)
    link = (
        f"https://nodbot-test.slack.com/archives/{message.channel}/p{message.ts.replace('.', '')}"
    )
    assert f'<a href="{link}" rel="noopener noreferrer">direct message to lead@example.com</a>' in (
        page.text
    )
    assert f"Asked by carol@example.com ({bot.carol.id})" in text_of(page)
    shown, folded = history_of(page)
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", shown)).split())
    assert "created carol@example.com" in text  # the requester's Slack id, named
    assert "delivered nodbot slack" in text
    worker = bot.served.service.worker
    assert worker not in shown and worker in folded
    assert bot.carol.id not in shown and bot.carol.id in folded
    asked = len(bot.slack.calls_to("auth.test"))
    again = await page_of(bot, bot.second.id, approval_id)
    assert link in again.text
    assert len(bot.slack.calls_to("auth.test")) == asked  # asked once, then kept


async def test_without_the_workspaces_address_the_link_opens_the_conversation(
    bot: Bot,
) -> None:
    bot.slack.fail("auth.test", "invalid_auth")
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    await bot.settled(approval_id)
    page = await page_of(bot, bot.lead.id, approval_id)
    assert f'href="https://slack.com/app_redirect?channel={message.channel}"' in page.text
