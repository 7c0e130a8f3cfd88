"""The Slack channel end to end: the real bot (`serving`), the real slack_bolt and slack_sdk
code, a local fake of Slack's Web API over HTTP, and clicks and modal submissions sent to
`/slack/events` as Slack sends them (form-encoded `payload=`, signed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rules_executor
from nodbot.bot.serve import Served, serving
from nodbot.core import ApprovalRecord, Delivery, ToolCall
from tests.fakes.slack import (
    Ephemeral,
    Message,
    SlackFake,
    User,
    View,
    interactive_request,
    slack_fake,
)
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-api-000000"
API = {"Authorization": f"Bearer {TOKEN}"}


Event = tuple[str, str | None, str | None]
"""An event of a review: its kind, actor and channel."""


@dataclass
class Bot:
    """The bot serving with Slack, the fake, and the people of the workspace."""

    served: Served
    slack: SlackFake
    client: httpx.AsyncClient
    lead: User
    second: User
    carol: User
    other: User
    room: str | None = None
    """The channel reviews are posted to, when the rule says so (else direct messages)."""

    @property
    def events_url(self) -> str:
        return f"{self.served.url}/slack/events"

    async def start(
        self, text: str = "Refund order A-1001", requested_by: str | None = None
    ) -> str:
        """Start a run of the support agent; the approval its refund waits for."""
        body = {"agent": "support", "input": text, "requested_by": requested_by or self.carol.id}
        run = (await self.client.post("/runs", json=body, headers=API)).json()
        assert run["status"] == "waiting", run
        approval_id: str = run["pending"][0]["approval_id"]
        return approval_id

    async def posted(self, user: User, count: int = 1) -> list[Message]:
        """The messages in `user`'s DM with the bot (or in the room), once `count` are there."""
        where: User | str = self.room or user

        def top() -> list[Message]:
            return [m for m in self.slack.messages(where) if m.thread_ts is None]

        await self.slack.wait_until(lambda: len(top()) >= count, 10, f"{count} message(s)")
        return top()

    async def send(self, payload: dict[str, Any], **overrides: Any) -> httpx.Response:
        """POST an interactive payload to the bot as Slack does (signed)."""
        body, headers = interactive_request(payload, self.slack.signing_secret, **overrides)
        return await self.client.post("/slack/events", content=body, headers=headers)

    async def click(self, message: Message, action: str, user: User) -> httpx.Response:
        answer = await self.send(self.slack.click(message, action, user))
        assert answer.status_code == 200, answer.text
        return answer

    async def record(self, approval_id: str) -> ApprovalRecord:
        return await self.served.service.store.get(approval_id)

    async def decided(self, approval_id: str) -> ApprovalRecord:
        """The record of `approval_id`, once it is decided."""

        async def check() -> bool:
            return (await self.record(approval_id)).decision is not None

        await eventually(check, f"the decision of {approval_id}")
        return await self.record(approval_id)

    async def events(self, approval_id: str) -> list[Event]:
        found = await self.served.service.store.events(approval_id)
        return [(e.kind, e.actor, e.channel) for e in found]

    async def logged(self, approval_id: str, count: int, *kinds: str) -> list[Event]:
        """The review's events, once `count` of them are of `kinds`."""

        async def check() -> bool:
            return sum(kind in kinds for kind, _, _ in await self.events(approval_id)) >= count

        await eventually(check, f"{count} {'/'.join(kinds)} event(s) of {approval_id}")
        return await self.events(approval_id)

    async def settled(self, approval_id: str) -> list[Delivery]:
        """The review's deliveries, once none is due: nothing of them is tried again."""
        store = self.served.service.store

        async def check() -> bool:
            found = await store.deliveries(approval_id)
            return bool(found) and all(d.status != "due" for d in found)

        await eventually(check, f"the deliveries of {approval_id}")
        return await store.deliveries(approval_id)

    async def told(self, count: int) -> list[Ephemeral]:
        """The ephemeral messages the bot sent, once there are `count`."""
        await self.slack.wait_until(
            lambda: len(self.slack.ephemerals) >= count, 10, f"{count} ephemeral message(s)"
        )
        return list(self.slack.ephemerals)

    async def modal(self, count: int = 1) -> View:
        """The last modal the bot opened, once it opened `count`."""
        await self.slack.wait_until(lambda: len(self.slack.views) >= count, 10, "views.open")
        return self.slack.views[-1]

    async def updated(self, message: Message) -> Message:
        """`message`, once the bot updated it (chat.update)."""
        await self.slack.wait_until(lambda: bool(message.updates), 10, f"an update of {message.ts}")
        return message


CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
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
    reviewers: [{reviewers}]
    {post_to}
    editable: [amount]
    approvals_required: {required}
"""


@contextlib.asynccontextmanager
async def slack_bot(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    required: int = 1,
    room: bool = False,
    socket: bool = False,
    group: bool = False,
    invited: bool = True,
    private: bool = False,
) -> AsyncIterator[Bot]:
    """The bot serving against a fresh fake workspace; `room`: reviews go to a channel
    (`private`: a private one) that the bot is a member of unless not `invited`."""
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack:
        lead = slack.add_user("lead", email="lead@example.com")
        second = slack.add_user("second", email="second@example.com")
        carol = slack.add_user("carol", email="carol@example.com")
        other = slack.add_user("other", email="other@example.com")
        channel = slack.add_channel(
            "refund-approvals", [lead, second, carol, other], bot_member=invited, private=private
        )
        leads = slack.add_usergroup("leads", [lead, second])
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                lead=lead.id,
                bot_token=slack.bot_token,
                transport=(
                    f"mode: socket\n  app_token: {slack.app_token}"
                    if socket
                    else f"signing_secret: {slack.signing_secret}"
                ),
                api_url=slack.api_url,
                reviewers=leads.id if group else f"{lead.id}, {second.id}",
                required=required,
                post_to=f"post_to: [{channel.id}]" if room else "",
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            yield Bot(
                served, slack, client, lead, second, carol, other, channel.id if room else None
            )


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with slack_bot(tmp_path, monkeypatch) as running:
        yield running


def actions_of(message: Message) -> list[str]:
    return [e["action_id"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]]


def all_text(message: Message) -> str:
    return json.dumps(message.blocks, ensure_ascii=False)


async def test_a_review_is_posted_to_each_reviewer_and_approved_with_a_click(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    [_] = await bot.posted(bot.second)
    assert actions_of(message) == ["nodbot.approve", "nodbot.edit", "nodbot.deny"]
    assert "Refunds over 100 need a lead." in all_text(message)
    assert f"<@{bot.carol.id}>" in all_text(message)  # who asked
    approve = next(e for b in message.blocks if b["type"] == "actions" for e in b["elements"])
    assert "confirm" in approve  # refund is destructive: Approve asks first
    await bot.click(message, "nodbot.approve", bot.lead)
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.decided_by == bot.lead.id
    assert ("decided", bot.lead.id, "slack") in await bot.events(approval_id)
    # Both messages lose their buttons and say who approved.
    for user in (bot.lead, bot.second):
        [posted] = await bot.posted(user)
        await bot.updated(posted)
        assert actions_of(posted) == []
        assert f"*Approved* by <@{bot.lead.id}>" in all_text(posted)
    run = (await bot.client.get(f"/runs/{record.request.run_id}?wait=10", headers=API)).json()
    assert run["status"] == "finished" and run["tool_results"][0]["status"] == "ok"
    # The run's answer goes to the thread of each message.
    for user in (bot.lead, bot.second):
        [posted] = await bot.posted(user)

        def replies(posted: Message = posted, user: User = user) -> list[Message]:
            return [m for m in bot.slack.messages(user) if m.thread_ts == posted.ts]

        await bot.slack.wait_until(lambda: bool(replies()), 10, "the answer in the thread")
        [reply] = replies()
        assert reply.text.startswith("The run finished.")
        assert run["final_text"][:40] in reply.text


async def test_an_edit_is_checked_in_the_modal_before_anything_is_recorded(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    await bot.click(message, "nodbot.edit", bot.lead)
    view = await bot.modal()
    assert [b["block_id"] for b in view.blocks if b["type"] == "input"] == ["arg.amount"]
    refused = await bot.send(bot.slack.submit(view, bot.lead, {"arg.amount": {"value": "lots"}}))
    assert refused.json() == {
        "response_action": "errors",
        "errors": {"arg.amount": "expected a number, not 'lots'"},
    }
    assert (await bot.record(approval_id)).decision is None
    answer = await bot.send(bot.slack.submit(view, bot.lead, {"arg.amount": {"value": "100"}}))
    assert answer.status_code == 200 and not answer.content
    # A submitted edit is acked once it is recorded (a refusal shows in the modal), so it
    # is recorded by now: read at once, not waited for.
    record = await bot.record(approval_id)
    assert record.decision is not None and record.decision.edited_args == {"amount": 100}
    run = (await bot.client.get(f"/runs/{record.request.run_id}?wait=10", headers=API)).json()
    assert run["tool_results"][0]["arguments"]["amount"] == 100


async def test_a_denial_with_its_reason_reaches_the_model(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    await bot.click(message, "nodbot.deny", bot.lead)
    view = await bot.modal()
    reason = "no receipt <!channel>"
    answer = await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": reason}}))
    assert answer.status_code == 200, answer.text
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.reason == reason
    run = (await bot.client.get(f"/runs/{record.request.run_id}?wait=10", headers=API)).json()
    assert reason in run["tool_results"][0]["content"]
    await bot.updated(message)
    assert "&lt;!channel&gt;" in all_text(message) and "<!channel>" not in all_text(message)


async def test_a_reason_over_2000_characters_keeps_the_modal_open_and_records_nothing(
    bot: Bot,
) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    await bot.click(message, "nodbot.deny", bot.lead)
    view = await bot.modal()
    long = "x" * 2_001  # Slack's client stops at the input's max_length; a forged one may not
    refused = await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": long}}))
    assert refused.json() == {
        "response_action": "errors",
        "errors": {"reason": "the reason has 2001 characters; at most 2000 are allowed"},
    }
    assert (await bot.record(approval_id)).decision is None
    answer = await bot.send(bot.slack.submit(view, bot.lead, {"reason": {"value": "x" * 2_000}}))
    assert answer.status_code == 200, answer.text
    record = await bot.decided(approval_id)
    assert record.decision is not None and record.decision.reason == "x" * 2_000


async def test_others_and_the_requester_are_told_no_and_the_attempt_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch, room=True) as bot:
        await others_are_told_no(bot)


async def others_are_told_no(bot: Bot) -> None:
    approval_id = await bot.start(requested_by=None)
    [message] = await bot.posted(bot.lead)
    await bot.click(message, "nodbot.approve", bot.other)
    [not_theirs] = await bot.told(1)
    assert not_theirs.user == bot.other.id
    assert "you are not one of the reviewers" in not_theirs.text
    events = await bot.logged(approval_id, 1, "refused", "decided")
    assert ("refused", bot.other.id, "slack") in events
    assert (await bot.record(approval_id)).decision is None

    own = await bot.start("Refund order A-1002", requested_by=bot.lead.id)
    messages = await bot.posted(bot.lead, 2)
    await bot.click(messages[-1], "nodbot.approve", bot.lead)
    [_, not_own] = await bot.told(2)
    assert not_own.user == bot.lead.id and SELF_APPROVAL_REASON in not_own.text
    events = await bot.logged(own, 1, "refused", "decided")
    assert ("refused", bot.lead.id, "slack") in events
    assert (await bot.record(own)).decision is None


async def test_a_double_click_decides_once(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    [theirs] = await bot.posted(bot.second)
    payloads = [
        bot.slack.click(message, "nodbot.approve", bot.lead),
        bot.slack.click(message, "nodbot.approve", bot.lead),
        bot.slack.click(theirs, "nodbot.approve", bot.second),
    ]
    answers = await asyncio.gather(*(bot.send(p) for p in payloads))
    assert [a.status_code for a in answers] == [200, 200, 200]
    # Each of the three clicks ends in one event, a decision or a refusal.
    events = await bot.logged(approval_id, 3, "decided", "refused")
    kinds = [kind for kind, _, _ in events]
    assert kinds.count("decided") == 1 and kinds.count("refused") == 2
    assert (await bot.record(approval_id)).decision is not None
    told = await bot.told(2)
    assert len(told) == 2 and all("already decided" in e.text for e in told)


async def test_two_approvals_from_two_people_are_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch, required=2) as bot:
        approval_id = await bot.start()
        [message] = await bot.posted(bot.lead)
        [theirs] = await bot.posted(bot.second)
        assert actions_of(message) == ["nodbot.approve", "nodbot.deny"]  # no edit with N-of-M
        await bot.click(message, "nodbot.approve", bot.lead)
        await bot.click(message, "nodbot.approve", bot.lead)  # the same person again
        events = await bot.logged(approval_id, 2, "voted", "refused", "decided")
        assert ("voted", bot.lead.id, "slack") in events
        assert ("refused", bot.lead.id, "slack") in events
        told = sorted(e.text for e in await bot.told(2))
        assert told == [
            "you have voted on this call already",
            "your approval is counted; 2 are needed in all",
        ]
        assert (await bot.record(approval_id)).decision is None
        await bot.click(theirs, "nodbot.approve", bot.second)
        record = await bot.decided(approval_id)
        assert record.decision is not None and record.decision.approved


async def test_a_decision_made_elsewhere_updates_the_slack_messages(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    lead_api = {"Authorization": "Bearer token-of-lead-000000"}
    answer = await bot.client.post(
        f"/approvals/{approval_id}/decide", json={"action": "deny"}, headers=lead_api
    )
    assert answer.status_code == 200, answer.text
    await bot.updated(message)
    assert actions_of(message) == [] and "*Denied*" in all_text(message)


@pytest.mark.parametrize("tamper", ["signature", "stale"])
async def test_a_request_not_signed_by_slack_is_refused(bot: Bot, tamper: str) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    payload = bot.slack.click(message, "nodbot.approve", bot.lead)
    if tamper == "stale":
        answer = await bot.send(payload, timestamp=int(time.time()) - 600)
    else:
        body, headers = interactive_request(payload, "another-signing-secret")
        answer = await bot.client.post("/slack/events", content=body, headers=headers)
    assert answer.status_code == 401
    assert (await bot.record(approval_id)).decision is None
    kinds = [kind for kind, _, _ in await bot.events(approval_id)]
    assert [kind for kind in kinds if kind != "delivered"] == ["created"]


async def test_untrusted_arguments_are_neutralized_and_long_ones_put_in_the_thread(
    bot: Bot,
) -> None:
    order = "<!channel> <@U0123ABCDE> <https://evil.example|click> ```x``` " + "y" * 10_000
    # A call made the way a run makes it, with what a model might put in its arguments.
    service = bot.served.service
    executor = rules_executor(service.agents["support"].tools, service.config, service.store)
    call = ToolCall(name="refund", arguments={"order_id": order, "amount": 500}, id="c1")
    paused = await executor.run_call(call, executor.context("run_evil"))
    assert paused.error is not None
    approval_id = paused.error.details["approval_id"]
    service.decided()  # wake the workers, as a run of this bot would
    [message] = await bot.posted(bot.lead)
    shown = all_text(message)
    for raw in ("<!channel>", "<@U0123ABCDE>", "<https://evil.example|click>"):
        assert raw not in shown
    assert "&lt;!channel&gt;" in shown
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in message.blocks)

    def thread() -> list[Message]:
        return [m for m in bot.slack.messages(bot.lead) if m.thread_ts == message.ts]

    await bot.slack.wait_until(lambda: bool(thread()), 10, "the arguments in the thread")
    assert len(thread()) == 1 and "y" * 10_000 in thread()[0].text.replace("\u200b", "")
    assert (await bot.record(approval_id)).decision is None


async def test_rate_limits_lose_nothing_and_post_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch) as bot:
        bot.slack.rate_limit_every(3, retry_after=1)
        approvals = [await bot.start(f"Refund order A-{n}") for n in range(4)]
        await bot.posted(bot.lead, 4)
        await bot.posted(bot.second, 4)
        for approval_id in approvals:
            # Once no delivery is due, none is posted again: a repeat would be there by now.
            deliveries = await bot.settled(approval_id)
            assert {d.status for d in deliveries} == {"sent"}
        for user in (bot.lead, bot.second):
            posted = await bot.posted(user)
            assert len(posted) == 4, [m.text for m in posted]
        assert bot.slack.faults  # the fake did limit


async def test_socket_mode_takes_the_clicks_over_the_websocket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch, socket=True) as bot:
        approval_id = await bot.start()
        [message] = await bot.posted(bot.lead)
        # No HTTP endpoint in socket mode: Slack's requests come over the connection.
        answer = await bot.send(bot.slack.click(message, "nodbot.approve", bot.lead))
        assert answer.status_code == 404
        ack = await bot.slack.socket_send(
            "interactive", bot.slack.click(message, "nodbot.deny", bot.lead)
        )
        assert ack["envelope_id"]
        view = await bot.modal()
        submitted = bot.slack.submit(view, bot.lead, {"reason": {"value": "not today"}})
        await bot.slack.socket_send("interactive", submitted)
        record = await bot.decided(approval_id)
        await bot.updated(message)
        assert record.decision is not None and record.decision.reason == "not today"
        assert "*Denied*" in all_text(message)


async def test_a_decision_in_the_web_inbox_updates_the_slack_messages(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    async with httpx.AsyncClient(base_url=bot.served.url, follow_redirects=True) as browser:
        await browser.get(bot.served.sign_in_link(bot.lead.id))
        page = await browser.get(f"/inbox/approvals/{approval_id}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None, page.text
        # refund is destructive: the approve is confirmed, as on the inbox's confirm step
        form = {"action": "approve", "csrf": csrf.group(1), "confirm": "yes"}
        done = await browser.post(f"/inbox/approvals/{approval_id}/decide", data=form)
        assert done.status_code == 200, done.text
    await bot.updated(message)
    assert actions_of(message) == []
    assert f"*Approved* by <@{bot.lead.id}>" in all_text(message)
    assert ("decided", bot.lead.id, "web") in await bot.events(approval_id)


SCOPES = {
    "chat.postMessage": "chat:write",
    "chat.update": "chat:write",
    "chat.postEphemeral": "chat:write",
    "conversations.open": "im:write",
    "users.info": "users:read",
    "users.lookupByEmail": "users:read.email",
    "usergroups.users.list": "usergroups:read",
    "conversations.members": "channels:read",
    "conversations.info": "channels:read",  # a joined channel's name (member_joined_channel)
    "conversations.history": "channels:history",  # and groups:, im:, mpim:history by kind
    "conversations.replies": "channels:history",
    "views.open": None,
    "views.publish": None,  # the App Home
    "auth.test": None,
}


async def test_the_manifest_grants_what_the_bot_calls_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    granted = set(manifest["oauth_config"]["scopes"]["bot"])
    assert manifest["settings"]["interactivity"]["request_url"].endswith("/slack/events")
    events = manifest["settings"]["event_subscriptions"]
    assert events["request_url"].endswith("/slack/events")
    # and no scope more for them (the App Home and /nodbot: tests/bot/test_slack_home.py)
    assert events["bot_events"] == ["member_joined_channel", "app_home_opened"]
    async with slack_bot(tmp_path, monkeypatch, room=True) as bot:
        await others_are_told_no(bot)
        called = {call.method for call in bot.slack.calls}
    assert called <= set(SCOPES), called - set(SCOPES)
    needed = {SCOPES[method] for method in called} - {None}
    assert needed <= granted
    # Nothing granted that no method of the bot needs (groups:read: private channels' members;
    # the other history scopes: reading private channels, DMs and group DMs).
    by_kind = {"groups:read", "groups:history", "im:history", "mpim:history"}
    commands = {"commands"}  # the /nodbot slash command, not a method
    assert granted <= {scope for scope in SCOPES.values() if scope} | by_kind | commands


async def test_a_user_group_gets_one_message_per_member_and_its_members_decide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with slack_bot(tmp_path, monkeypatch, group=True) as bot:
        approval_id = await bot.start()
        [theirs] = await bot.posted(bot.second)
        [message] = await bot.posted(bot.lead)
        # Once no delivery is due, none is posted again: a repeat would be there by now.
        deliveries = await bot.settled(approval_id)
        assert {d.status for d in deliveries} == {"sent"}
        assert len(await bot.posted(bot.lead)) == len(await bot.posted(bot.second)) == 1
        assert bot.slack.calls_to("usergroups.users.list")
        await bot.click(theirs, "nodbot.approve", bot.second)  # a member of the group
        record = await bot.decided(approval_id)
        assert record.decision is not None and record.decision.decided_by == bot.second.id
        await bot.updated(message)
        assert actions_of(message) == []
