"""The App Home tab end to end: the real bot (`serving`), the real slack_bolt and slack_sdk
code, the local fake of Slack, `app_home_opened` events and Home clicks sent to
`/slack/events` signed as Slack signs them. Also the link of every message to the review's
inbox page, and the Home view's limits whatever the reviews hold."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.bulk import Decider
from nodbot.bot.config.models import SlackConfig
from nodbot.bot.outbox import OutboxStore
from nodbot.bot.policy.authorize import NOT_A_REVIEWER
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.serve import serving
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.slack.commands import COMMAND
from nodbot.bot.slack.home import (
    ACTION_HOME_APPROVE,
    ACTION_HOME_DENY,
    HOME_DENY_CALLBACK,
    SHOWN,
    WATCH_FOR,
    WATCHED,
    SlackHome,
    Waiting,
    home_view,
)
from nodbot.bot.slack.messages import ACTION_OPEN
from nodbot.core import (
    ApprovalRecord,
    ApprovalRequest,
    Decision,
    Delivery,
    MemoryApprovalStore,
    ToolCall,
    ToolRegistry,
    arguments_digest,
)
from tests.bot.test_email_outbound import emailing, parts
from tests.bot.test_slack import ROOT, TOKEN, Bot, actions_of, all_text
from tests.fakes.slack import HomeView, User, home_actions_payload, slack_fake, view_errors

PUBLIC = "https://nodbot.example.com"
LEAD_API = {"Authorization": "Bearer token-of-lead-000000"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
{web}
api:
  tokens:
    - {{name: api, token: {token}, scopes: [runs:write, runs:write-as, approvals:read]}}
    - {{name: {lead}, token: token-of-lead-000000, scopes: [approvals:read, approvals:decide]}}
agents:
  support: examples.support_agent:agent
slack:
  bot_token: {bot_token}
  {transport}
  api_url: {api_url}
rules:
  - tool: refund
    description: Refunds over 100 need a lead.
    reviewers: [{lead}, {second}]
  - tool: send_email
    description: Emails to customers are read first.
    reviewers: [{other}]
"""


@contextlib.asynccontextmanager
async def home_bot(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    public_url: str | None = PUBLIC,
    socket: bool = False,
) -> AsyncIterator[Bot]:
    """The bot serving against a fresh fake workspace: refunds are reviewed by lead and
    second, emails by other; carol asks for them. Slack's events and commands go to the
    bot's `/slack/events` (over Socket Mode with `socket`)."""
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        second = slack.add_user("second", email="second@example.com")
        carol = slack.add_user("carol", email="carol@example.com")
        other = slack.add_user("other", email="other@example.com")
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                web=f'web: {{public_url: "{public_url}"}}' if public_url else "",
                token=TOKEN,
                lead=lead.id,
                second=second.id,
                other=other.id,
                bot_token=slack.bot_token,
                transport=(
                    f"mode: socket\n  app_token: {slack.app_token}"
                    if socket
                    else f"signing_secret: {slack.signing_secret}"
                ),
                api_url=slack.api_url,
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            bot = Bot(served, slack, client, lead, second, carol, other)
            if socket:
                await slack.wait_for_socket()
            else:
                slack.events_url = bot.events_url
            yield bot


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with home_bot(tmp_path, monkeypatch) as running:
        yield running


async def review(
    bot: Bot, tool: str = "refund", requested_by: User | None = None, **arguments: Any
) -> str:
    """A call made to wait for review as a run of the bot makes it (asked by carol)."""
    service = bot.served.service
    executor = rules_executor(service.agents["support"].tools, service.config, service.store)
    if not arguments:
        arguments = (
            {"order_id": "A-1001", "amount": 500}
            if tool == "refund"
            else {"to": "x@example.com", "subject": "Hello", "body": "Hi"}
        )
    asker = requested_by or bot.carol
    call = ToolCall(name=tool, arguments=arguments, id="c1")
    run_id = f"run_{len(await service.store.list())}"
    paused = await executor.run_call(call, executor.context(run_id, requested_by=asker.id))
    assert paused.error is not None, paused
    service.decided()  # wake the workers, as a run of this bot would
    approval_id: str = paused.error.details["approval_id"]
    return approval_id


def listed(home: HomeView | dict[str, Any]) -> list[str]:
    """The reviews a Home view lists, in order (the values of their Approve or Deny)."""
    blocks = home.blocks if isinstance(home, HomeView) else home["blocks"]
    found: list[str] = []
    for block in blocks:
        for element in block.get("elements") or []:
            value = element.get("value")
            decides = element.get("action_id") in (ACTION_HOME_APPROVE, ACTION_HOME_DENY)
            if decides and value and value not in found:
                found.append(str(value))
    return found


DECIDING = ("decided", "refused")


def text_of(home: HomeView) -> str:
    return json.dumps(home.blocks, ensure_ascii=False)


async def events_of(bot: Bot, approval_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The review's events but its deliveries: (kind, actor, evidence)."""
    found = await bot.served.service.store.events(approval_id)
    return [
        (e.kind, e.actor, dict(e.detail.get("evidence") or {}))
        for e in found
        if e.kind != "delivered"
    ]


async def home_of(bot: Bot, user: User, count: int = 1) -> HomeView:
    """`user`'s Home, once it was published `count` times."""
    return await bot.slack.wait_for_home(user, count, within=10)


async def press(bot: Bot, payload: dict[str, Any]) -> None:
    answer = await bot.send(payload)
    assert answer.status_code == 200, answer.text


async def test_the_home_lists_the_reviews_its_user_may_decide_newest_first(bot: Bot) -> None:
    first = await review(bot, order_id="<!channel> A-1", amount=150)
    email = await review(bot, "send_email")
    newest = await review(bot, order_id="A-2", amount=300)
    opened = await bot.slack.open_home(bot.lead)
    assert opened.status == 200
    home = await home_of(bot, bot.lead)
    assert view_errors(home.view, "home") == []
    assert listed(home) == [newest, first]  # not the email: other reviews those
    assert "<!channel>" not in text_of(home) and "&lt;!channel&gt; A-1" in text_of(home)
    assert "Refunds over 100 need a lead." in text_of(home)
    _, approve = home.action(ACTION_HOME_APPROVE, newest)
    assert "confirm" in approve  # refund is destructive: Slack asks first
    _, link = home.action(ACTION_OPEN, None)
    assert link["url"] == f"{PUBLIC}/inbox/approvals/{newest}"
    await bot.slack.open_home(bot.other)
    theirs = await home_of(bot, bot.other)
    assert listed(theirs) == [email]
    _, approve_email = theirs.action(ACTION_HOME_APPROVE, email)
    assert "confirm" not in approve_email  # send_email changes nothing that cannot be undone
    await bot.slack.open_home(bot.carol)  # who asked reviews none of them
    assert listed(await home_of(bot, bot.carol)) == []
    assert "Nothing waits for your decision." in text_of(await home_of(bot, bot.carol))
    # The Messages tab opened is no reason to publish the Home.
    await bot.slack.open_home(bot.second, tab="messages")
    await bot.slack.events_answered(4)
    assert bot.slack.home_view(bot.second) is None


async def test_approve_on_the_home_decides_as_its_user_and_the_home_says_so(bot: Bot) -> None:
    approval_id = await review(bot)
    [message] = await bot.posted(bot.lead)
    await bot.slack.open_home(bot.lead)
    home = await home_of(bot, bot.lead)
    assert listed(home) == [approval_id]
    await press(bot, bot.slack.home_click(bot.lead, ACTION_HOME_APPROVE, value=approval_id))
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.approved
    assert record.decision.decided_by == bot.lead.id
    decisions = [e for e in await events_of(bot, approval_id) if e[0] in DECIDING]
    [(kind, actor, evidence)] = decisions
    assert (kind, actor) == ("decided", bot.lead.id)
    assert evidence["via"] == "app home" and evidence["user"] == bot.lead.id
    assert evidence["view_id"] == home.id
    assert ("decided", bot.lead.id, "slack") in await bot.events(approval_id)
    await bot.slack.wait_until(lambda: "Approved" in text_of(home), 10, "the Home saying so")
    assert listed(home) == []
    # The review's message is updated as after a click on it.
    await bot.updated(message)
    assert actions_of(message) == [] and f"*Approved* by <@{bot.lead.id}>" in all_text(message)


async def test_a_home_approve_by_someone_who_may_not_is_refused_and_recorded(bot: Bot) -> None:
    approval_id = await review(bot)
    await bot.slack.open_home(bot.other)
    home = await home_of(bot, bot.other)
    assert listed(home) == []
    # A payload naming a review the Home does not list (an old Home, a modified client).
    forged = home_actions_payload(
        action_id=ACTION_HOME_APPROVE,
        block_id="nodbot.review.0",
        value=approval_id,
        user_id=bot.other.id,
        user_name=bot.other.name,
        team_id=bot.slack.team_id,
        view=home.to_api(),
    )
    await press(bot, forged)
    await bot.logged(approval_id, 1, "refused")
    refused = [e for e in await events_of(bot, approval_id) if e[0] == "refused"]
    assert [(kind, actor) for kind, actor, _ in refused] == [("refused", bot.other.id)]
    assert refused[0][2]["via"] == "app home"
    events = await bot.served.service.store.events(approval_id)
    assert [e.detail.get("reason") for e in events if e.kind == "refused"] == [NOT_A_REVIEWER]
    assert (await bot.record(approval_id)).decision is None
    await bot.slack.wait_until(lambda: len(home.versions) >= 2, 10, "the Home again")
    assert "Nothing was decided" in text_of(home) and NOT_A_REVIEWER in text_of(home)


async def test_deny_on_the_home_asks_for_a_reason_in_a_modal(bot: Bot) -> None:
    approval_id = await review(bot)
    await bot.slack.open_home(bot.lead)
    home = await home_of(bot, bot.lead)
    await press(bot, bot.slack.home_click(bot.lead, ACTION_HOME_DENY, value=approval_id))
    view = await bot.modal()
    assert view.callback_id == HOME_DENY_CALLBACK
    assert (await bot.record(approval_id)).decision is None  # nothing until it is submitted
    # Submitted by someone who may not deny: the modal says why, and it is recorded.
    refused = await bot.send(bot.slack.submit(view, bot.other, {"reason": {"value": "no"}}))
    answer = refused.json()
    assert (
        answer["response_action"] == "errors"
        and "Nothing was decided" in answer["errors"]["reason"]
    )
    assert [e[1] for e in await events_of(bot, approval_id) if e[0] == "refused"] == [bot.other.id]
    long = await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": "x" * 2001}}))
    assert long.json()["errors"] == {
        "reason": "the reason has 2001 characters; at most 2000 are allowed"
    }
    reason = "no receipt <!here>"
    done = await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": reason}}))
    assert done.status_code == 200 and not done.content
    record = await bot.decided(approval_id)
    assert record.decision is not None and not record.decision.approved
    assert (record.decision.reason, record.decision.decided_by) == (reason, bot.lead.id)
    await bot.slack.wait_until(lambda: "Denied" in text_of(home), 10, "the Home saying so")
    assert listed(home) == []


async def test_a_home_whose_user_slack_cannot_tell_lists_nothing_and_says_why(bot: Bot) -> None:
    approval_id = await review(bot)
    await bot.posted(bot.lead)
    bot.slack.fail(
        "users.info", *["fatal_error"] * 20, where=lambda p: p.get("user") == bot.lead.id
    )
    await bot.slack.open_home(bot.lead)
    home = await home_of(bot, bot.lead)
    assert listed(home) == []  # a check that cannot be made allows nothing
    assert "Some may be missing: could not check who" in text_of(home)
    assert (await bot.record(approval_id)).decision is None


async def test_the_home_is_published_again_when_a_review_is_posted_or_decided(bot: Bot) -> None:
    await bot.slack.open_home(bot.lead)
    home = await home_of(bot, bot.lead)
    assert listed(home) == []
    approval_id = await review(bot)
    # No other opening: the post of the review publishes the Home again.
    await bot.slack.wait_until(lambda: listed(home) == [approval_id], 10, "the new review")
    answer = await bot.client.post(
        f"/approvals/{approval_id}/decide", json={"action": "deny"}, headers=LEAD_API
    )
    assert answer.status_code == 200, answer.text
    await bot.slack.wait_until(lambda: listed(home) == [], 10, "the decided review gone")
    assert [sent.body["event"]["type"] for sent in bot.slack.events] == ["app_home_opened"]
    # Whoever did not open their Home here has none published.
    assert bot.slack.home_view(bot.second) is None


async def test_every_message_links_to_the_reviews_inbox_page(bot: Bot) -> None:
    approval_id = await review(bot)
    [message] = await bot.posted(bot.lead)
    page = f"{PUBLIC}/inbox/approvals/{approval_id}"
    assert actions_of(message) == ["nodbot.approve", "nodbot.edit", "nodbot.deny", ACTION_OPEN]
    _, link = message.action(ACTION_OPEN)
    assert link["url"] == page and "value" not in link
    # A click of the link is only acknowledged (Slack opens the page).
    await bot.click(message, ACTION_OPEN, bot.lead)
    assert (await bot.record(approval_id)).decision is None
    await bot.click(message, "nodbot.deny", bot.lead)
    view = await bot.modal()
    await press(bot, bot.slack.submit(view, bot.lead, {"reason": {"value": "no"}}))
    await bot.updated(message)
    assert f"<{page}|Open in inbox>" in all_text(message)


async def test_without_a_public_url_no_message_links_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with home_bot(tmp_path, monkeypatch, public_url=None) as bot:
        approval_id = await review(bot)
        [message] = await bot.posted(bot.lead)
        assert actions_of(message) == ["nodbot.approve", "nodbot.edit", "nodbot.deny"]
        await bot.slack.open_home(bot.lead)
        home = await home_of(bot, bot.lead)
        assert listed(home) == [approval_id]
        assert "/inbox" not in text_of(home) and "/inbox" not in all_text(message)


def test_a_reminder_links_to_the_reviews_inbox_page() -> None:
    store = MemoryApprovalStore()
    config = SlackConfig.model_validate(
        {"bot_token": "xoxb-" + "1" * 20, "signing_secret": "s" * 32}
    )
    [waiting] = [pending(0, "refund", {"amount": 5}, "")]
    record = waiting.record
    delivery = Delivery(1, record.approval_id, "reminder", "slack:reminder:1", "due", 0, NOW, NOW)
    for public_url, link in (
        (PUBLIC, f"<{PUBLIC}/inbox/approvals/{record.approval_id}|its page in the inbox>"),
        (None, None),
    ):
        channel = SlackChannel(
            config, cast(OutboxStore, store), ToolRegistry(), public_url=public_url
        )
        text = channel._reminder_text(record, delivery, ["U0123ABCDE"])
        assert text.startswith("<@U0123ABCDE> Reminder 1 of 0")
        if link is None:
            assert "inbox" not in text
        else:
            assert text.endswith(f"Decide with the buttons above, or on {link}.")


EMAIL_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
web: {{secret: web-secret-for-email-pages-01}}
api:
  tokens:
    - {{name: starter, token: token-of-starter-000, scopes: [runs:write, approvals:read]}}
agents:
  notes: tests.bot.test_email_outbound:agent
rules:
  - tool: send_urgent_note
    reviewers: [ana@example.com]
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
"""


async def test_the_review_emails_give_the_reviews_inbox_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)

    def config(port: int) -> str:
        return EMAIL_CONFIG.format(db=tmp_path / "nodbot.db", port=port)

    async with emailing(tmp_path, config) as (served, client, mail):
        asked = {"_tool": "send_urgent_note", "title": "Hi"}
        run = await client.post(
            "/runs",
            json={"agent": "notes", "input": json.dumps(asked)},
            headers={"Authorization": "Bearer token-of-starter-000"},
        )
        assert run.status_code == 201, run.text
        approval_id = str(run.json()["pending"][0]["approval_id"])
        await mail.wait_for(lambda: len(mail.received) >= 1)
        page = f"{served.url}/inbox/approvals/{approval_id}"
        text, html = parts(mail.received[0].message)
        assert f"Its page in the web inbox (sign in first): {page}" in text
        assert f'<a href="{page}">{page}</a>' in html
        # The page asks whoever opens it without a session to sign in.
        opened = await client.get(page.removeprefix(served.url))
        assert opened.status_code == 401 and "sign in" in opened.text
        await served.service.store.decide(
            approval_id, Decision(approved=False, decided_by="ana@example.com"), channel="test"
        )
        served.service.decided()
        await mail.wait_for(lambda: len(mail.received) >= 2)
        outcome, outcome_html = parts(mail.received[1].message)
        assert "was denied" in outcome
        assert f"Its page in the web inbox (sign in first): {page}" in outcome
        assert f'<a href="{page}">' in outcome_html


async def test_the_home_over_socket_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with home_bot(tmp_path, monkeypatch, socket=True) as bot:
        approval_id = await review(bot)
        sent = await bot.slack.open_home(bot.lead)
        assert sent.via == "socket"
        home = await home_of(bot, bot.lead)
        assert listed(home) == [approval_id]
        click = bot.slack.home_click(bot.lead, ACTION_HOME_APPROVE, value=approval_id)
        await bot.slack.socket_send("interactive", click)
        record = await bot.decided(approval_id)
        assert record.decision is not None and record.decision.decided_by == bot.lead.id


def test_the_manifest_has_the_home_tab_and_the_slash_command() -> None:
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    features = manifest["features"]
    assert features["app_home"]["home_tab_enabled"] is True
    assert features["app_home"]["messages_tab_enabled"] is True  # the reviewers' messages
    [command] = features["slash_commands"]
    assert command["command"] == COMMAND and command["url"].endswith("/slack/events")
    assert command["description"] and "approve <id>" in command["usage_hint"]
    assert "commands" in manifest["oauth_config"]["scopes"]["bot"]
    assert "app_home_opened" in manifest["settings"]["event_subscriptions"]["bot_events"]


# --------------------------------------------------------------------------------------------
# The Home view and the watched users, without a bot


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

PIECES = [*"ab <>&|`*_~\n@!#:", "<!channel>", "<@U0123ABCDE>", "```", "é", "x" * 200]
texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
values = st.one_of(texts, st.integers(), st.floats(allow_nan=False), st.lists(texts, max_size=3))


def pending(index: int, tool: str, arguments: dict[str, Any], description: str) -> Waiting:
    request = ApprovalRequest(
        f"run_{index}",
        "c1",
        tool or "t",
        arguments,
        arguments_digest(arguments),
        "U0ASKER0001",
        NOW + timedelta(hours=1),
        approvals_required=1 + index % 2,
        policy={"description": description},
    )
    record = ApprovalRecord(f"apr_{index:028x}", request, created_at=NOW)
    return Waiting(record, approve=index % 2 == 0, deny=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reviews=st.lists(
        st.tuples(texts, st.dictionaries(texts, values, max_size=12), texts), max_size=40
    ),
    notice=st.one_of(st.none(), texts),
    public_url=st.sampled_from([None, PUBLIC]),
)
def test_a_home_keeps_to_slacks_limits_whatever_the_reviews_hold(
    reviews: list[tuple[str, dict[str, Any], str]], notice: str | None, public_url: str | None
) -> None:
    waiting = [pending(i, *review) for i, review in enumerate(reviews)]
    view = home_view(
        waiting,
        public_url=public_url,
        destructive=lambda record: record.request.tool.startswith("a"),
        notice=None if notice is None else "Done: " + notice.replace("<", "&lt;"),
    )
    assert view_errors(view, "home") == []
    assert len(view["blocks"]) <= 100
    assert listed(view) == [w.record.approval_id for w in waiting[:SHOWN]]
    shown = json.dumps(view["blocks"], ensure_ascii=False)
    assert "<!channel>" not in shown and "<@U0123ABCDE>" not in shown
    if len(waiting) > SHOWN:
        assert f"… and {len(waiting) - SHOWN} more in" in shown


def test_homes_are_kept_up_to_date_for_a_bounded_number_of_recent_users() -> None:
    moment = [0.0]
    store = MemoryApprovalStore()
    config = SlackConfig.model_validate(
        {"bot_token": "xoxb-" + "1" * 20, "signing_secret": "s" * 32}
    )
    channel = SlackChannel(config, cast(OutboxStore, store), ToolRegistry())

    async def allow(*_: Any) -> Any:
        raise AssertionError("not asked")

    home = SlackHome(
        channel, allow, Decider(store, ToolRegistry(), allow, "slack"), clock=lambda: moment[0]
    )
    for n in range(WATCHED + 1):
        moment[0] = float(n)
        home.watch(f"U{n:010d}")
    watched = home.watched
    assert len(watched) == WATCHED and "U0000000000" not in watched
    assert watched[0] == "U0000000001" and watched[-1] == f"U{WATCHED:010d}"
    home.watch("U0000000001")  # opened again: the most recent now
    assert home.watched[-1] == "U0000000001"
    # WATCH_FOR later, only those who opened it at the last moment are still watched.
    moment[0] = WATCHED + WATCH_FOR - 0.5
    assert home.watched == [f"U{WATCHED:010d}", "U0000000001"]
    moment[0] += 1
    assert home.watched == []
