"""One person is one reviewer on every channel: the real bot (`serving`) with the Slack channel
against the local fake of Slack's Web API, the web inbox, the HTTP API and the CLI. A Slack
user and the address Slack holds for them are one person; `people:` joins other handles."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from slack_sdk.web.async_client import AsyncWebClient

from nodbot.bot.cli.commands import main
from nodbot.bot.config import ConfigError, load_config
from nodbot.bot.policy.people import IdentityUnavailable, People
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON
from nodbot.bot.serve import Served, serving
from nodbot.bot.slack.directory import Directory
from nodbot.core import ApprovalEvent, ApprovalRecord
from tests.fakes.slack import Message, SlackFake, User, interactive_request, slack_fake

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-api-000000"
API = {"Authorization": f"Bearer {TOKEN}"}
ANA_TOKEN = {"Authorization": "Bearer token-of-ana-000000"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
web: {{secret: web-secret-of-the-tests-000}}
api:
  tokens:
    - {{name: api, token: {token}, scopes: [runs:write, runs:write-as, approvals:read]}}
    - {{name: ana, token: token-of-ana-000000, scopes: [approvals:read, approvals:decide]}}
people:
  ana: [ana, {ana}]
agents:
  support: examples.support_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: refund
    description: Refunds over 100 need a lead.
    reviewers: [{reviewers}]
    {post_to}
    editable: [amount]
    approvals_required: {required}
"""


@dataclass
class Bot:
    """The bot serving with Slack and the inbox, the fake, and the workspace's people."""

    served: Served
    slack: SlackFake
    client: httpx.AsyncClient
    config: Path
    users: dict[str, User]
    room: str
    """The id of the channel #refund-approvals (members: second, other)."""
    browsers: contextlib.AsyncExitStack

    async def start(self, requested_by: str) -> str:
        """Start a run of the support agent; the approval its refund of 120 waits for."""
        body = {"agent": "support", "input": "Refund order A-1001", "requested_by": requested_by}
        run = (await self.client.post("/runs", json=body, headers=API)).json()
        assert run["status"] == "waiting", run
        approval_id: str = run["pending"][0]["approval_id"]
        return approval_id

    async def posted(self, user: str) -> Message:
        """The review's message in `user`'s direct messages with the bot."""
        where = self.users[user]

        def top() -> list[Message]:
            return [m for m in self.slack.messages(where) if m.thread_ts is None]

        await self.slack.wait_until(lambda: bool(top()), 10, f"a message to {user}")
        return top()[-1]

    async def click(self, message: Message, action: str, user: str) -> None:
        payload = self.slack.click(message, action, self.users[user])
        body, headers = interactive_request(payload, self.slack.signing_secret)
        answer = await self.client.post("/slack/events", content=body, headers=headers)
        assert answer.status_code == 200, answer.text

    async def signed_in(self, reviewer: str) -> httpx.AsyncClient:
        """A browser signed in to the inbox as `reviewer`."""
        browser = await self.browsers.enter_async_context(
            httpx.AsyncClient(base_url=self.served.url)
        )
        answer = await browser.get(self.served.sign_in_link(reviewer))
        assert answer.status_code == 303, answer.text
        return browser

    async def record(self, approval_id: str) -> ApprovalRecord:
        return await self.served.service.store.get(approval_id)

    async def events(self, approval_id: str) -> list[ApprovalEvent]:
        return await self.served.service.store.events(approval_id)

    async def event(self, approval_id: str, kind: str, count: int = 1) -> ApprovalEvent:
        """The `count`-th event of `kind`, once the bot has recorded it."""

        async def found() -> list[ApprovalEvent]:
            return [e for e in await self.events(approval_id) if e.kind == kind]

        deadline = time.monotonic() + 10
        while len(events := await found()) < count:
            assert time.monotonic() < deadline, f"{count} {kind} event(s) were not recorded"
            await asyncio.sleep(0.02)
        return events[count - 1]


async def inbox_decide(
    browser: httpx.AsyncClient, approval_id: str, action: str, **fields: str
) -> httpx.Response:
    """Submit the approval page's form, as a browser does after loading the page."""
    page = await browser.get(f"/inbox/approvals/{approval_id}")
    assert page.status_code == 200, page.text
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token, "the page has no form token"
    form = {"csrf": token.group(1), "action": action, **fields}
    return await browser.post(f"/inbox/approvals/{approval_id}/decide", data=form)


@contextlib.asynccontextmanager
async def identity_bot(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    reviewers: str = "{lead}, {carol_email}",
    required: int = 1,
    post_to: str = "",
) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack:
        users = {
            "lead": slack.add_user("lead", email="lead@example.com"),
            "second": slack.add_user("second", email="second@example.com"),
            "carol": slack.add_user("carol", email="Carol@Example.com"),
            "ana": slack.add_user("ana", email="ana@example.com"),
            "other": slack.add_user("other", email="other@example.com"),
        }
        group = slack.add_usergroup("leads", [users["lead"], users["second"]])
        room = slack.add_channel("refund-approvals", [users["second"], users["other"]])
        names = {name: user.id for name, user in users.items()}
        names |= {"group": group.id, "room": room.id, "carol_email": "carol@example.com"}
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                ana=users["ana"].id,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                reviewers=reviewers.format(**names),
                required=required,
                post_to=post_to.format(**names),
            )
        )
        async with (
            serving(str(path)) as served,
            httpx.AsyncClient(base_url=served.url) as client,
            contextlib.AsyncExitStack() as browsers,
        ):
            yield Bot(served, slack, client, path, users, room.id, browsers)


async def test_the_requester_under_another_handle_may_not_approve_in_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with identity_bot(tmp_path, monkeypatch) as bot:
        carol = bot.users["carol"]
        approval_id = await bot.start(requested_by=carol.id)  # her Slack user id
        browser = await bot.signed_in("carol@example.com")  # her address, as Slack holds it
        answer = await inbox_decide(browser, approval_id, "approve")
        assert answer.status_code == 403
        assert SELF_APPROVAL_REASON in answer.text
        assert (await bot.record(approval_id)).status == "pending"
        refused = await bot.event(approval_id, "refused")
        assert (refused.actor, refused.channel) == ("carol@example.com", "web")
        assert refused.person == "email:carol@example.com"
        assert refused.detail["reason"] == SELF_APPROVAL_REASON
        # She may still deny her own call, and a lead may approve it.
        lead = await bot.posted("lead")
        await bot.click(lead, "nodbot.approve", "lead")
        decided = await bot.event(approval_id, "decided")
        assert (decided.actor, decided.person) == (bot.users["lead"].id, "email:lead@example.com")
        evidence = decided.detail["evidence"]
        assert evidence["user"] == bot.users["lead"].id
        assert evidence["team"] == bot.slack.team_id
        assert float(evidence["action_ts"]) > 0
        assert decided.detail["action"] == "approve"
        assert decided.detail["digest"] == (await bot.record(approval_id)).request.digest


async def test_one_person_votes_once_across_slack_and_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with identity_bot(tmp_path, monkeypatch, reviewers="{lead}, {second}", required=2) as bot:
        approval_id = await bot.start(requested_by=bot.users["carol"].id)
        await bot.click(await bot.posted("lead"), "nodbot.approve", "lead")
        voted = await bot.event(approval_id, "voted")
        assert (voted.actor, voted.person) == (bot.users["lead"].id, "email:lead@example.com")
        browser = await bot.signed_in("LEAD@example.com")
        page = await browser.get(f"/inbox/approvals/{approval_id}")
        assert "You have voted" in page.text
        again = await inbox_decide(browser, approval_id, "approve")
        assert again.status_code == 409
        assert "voted on this approval already" in again.text
        assert (await bot.record(approval_id)).status == "pending"
        await bot.click(await bot.posted("second"), "nodbot.approve", "second")
        decided = await bot.event(approval_id, "decided")
        record = await bot.record(approval_id)
        assert record.status == "approved"
        assert decided.actor == f"{bot.users['lead'].id}, {bot.users['second'].id}"


async def test_people_join_an_api_token_and_a_slack_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with identity_bot(tmp_path, monkeypatch, reviewers="{ana}, {lead}", required=2) as bot:
        ana = bot.users["ana"]
        own = await bot.start(requested_by=ana.id)
        answer = await bot.client.post(
            f"/approvals/{own}/decide", json={"action": "approve"}, headers=ANA_TOKEN
        )
        assert answer.status_code == 403
        assert answer.json()["error"] == SELF_APPROVAL_REASON
        refused = await bot.event(own, "refused")
        assert (refused.actor, refused.person, refused.channel) == ("ana", "person:ana", "api")
        assert refused.detail["evidence"] == {"token": "ana"}

        theirs = await bot.start(requested_by=bot.users["carol"].id)
        vote = await bot.client.post(
            f"/approvals/{theirs}/decide", json={"action": "approve"}, headers=ANA_TOKEN
        )
        assert vote.status_code == 200, vote.text
        message = next(
            m for m in bot.slack.messages(ana) if m.thread_ts is None and theirs in str(m.blocks)
        )
        before = len(bot.slack.ephemerals)
        await bot.click(message, "nodbot.approve", "ana")
        await bot.slack.wait_until(
            lambda: len(bot.slack.ephemerals) > before, 10, "the bot's answer to ana's click"
        )
        assert "voted on this call already" in bot.slack.ephemerals[-1].text
        assert (await bot.record(theirs)).status == "pending"
        votes = [e for e in await bot.events(theirs) if e.kind == "voted"]
        assert [(e.actor, e.person) for e in votes] == [("ana", "person:ana")]


async def test_a_user_group_member_decides_in_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with identity_bot(tmp_path, monkeypatch, reviewers="{group}") as bot:
        approval_id = await bot.start(requested_by=bot.users["carol"].id)
        outsider = await bot.signed_in("other@example.com")  # not in the group
        assert (await outsider.get(f"/inbox/approvals/{approval_id}")).status_code == 404
        browser = await bot.signed_in("lead@example.com")
        inbox = await browser.get("/inbox")
        assert approval_id in inbox.text
        # refund is destructive: the approve is confirmed, as on the inbox's confirm step
        answer = await inbox_decide(browser, approval_id, "approve", confirm="yes")
        assert answer.status_code == 303, answer.text
        record = await bot.record(approval_id)
        assert record.status == "approved"
        assert record.decision is not None and record.decision.decided_by == "lead@example.com"
        decided = await bot.event(approval_id, "decided")
        assert (decided.person, decided.channel) == ("email:lead@example.com", "web")


async def test_a_channel_member_decides_in_the_inbox_and_over_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with identity_bot(
        tmp_path, monkeypatch, reviewers="{room}", post_to="post_to: [{room}]"
    ) as bot:
        approval_id = await bot.start(requested_by=bot.users["carol"].id)
        await bot.slack.wait_until(
            lambda: any(m.thread_ts is None for m in bot.slack.messages(bot.room)),
            10,
            "the review posted to the channel",
        )
        lead = await bot.signed_in("lead@example.com")  # not a member of the channel
        assert (await lead.get(f"/inbox/approvals/{approval_id}")).status_code == 404
        member = await bot.signed_in("second@example.com")
        answer = await inbox_decide(member, approval_id, "deny", reason="not today")
        assert answer.status_code == 303, answer.text
        assert (await bot.record(approval_id)).status == "denied"


async def test_a_failed_slack_lookup_refuses_the_click(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with identity_bot(tmp_path, monkeypatch, reviewers="{carol}, {lead}") as bot:
        # She started the run under her address, and clicks as her Slack user.
        approval_id = await bot.start(requested_by="carol@example.com")
        message = await bot.posted("carol")
        bot.slack.fail("users.info", "fatal_error")  # Slack cannot say who the clicker is
        await bot.click(message, "nodbot.approve", "carol")
        refused = await bot.event(approval_id, "refused")
        assert "try again" in refused.detail["reason"]
        assert refused.person is None
        assert (await bot.record(approval_id)).status == "pending"
        await bot.slack.wait_until(lambda: bool(bot.slack.ephemerals), 10, "the refusal told")
        assert "try again" in bot.slack.ephemerals[-1].text
        # Once Slack answers again, her own click is the self-approval it is.
        await bot.click(message, "nodbot.approve", "carol")
        second = await bot.event(approval_id, "refused", count=2)
        assert second.detail["reason"] == SELF_APPROVAL_REASON
        assert (await bot.record(approval_id)).status == "pending"


async def test_the_cli_resolves_the_decider_like_the_other_channels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with identity_bot(tmp_path, monkeypatch, reviewers="{group}") as bot:
        approval_id = await bot.start(requested_by=bot.users["lead"].id)
        config = str(bot.config)

        # The requester, under their address: a self-approval.
        def decide(who: str) -> int:
            command = ["approvals", "decide", approval_id, "approve", "--as", who]
            return main([*command, "--config", config])

        assert await asyncio.to_thread(decide, "lead@example.com") == 1
        assert SELF_APPROVAL_REASON in capsys.readouterr().err
        assert await asyncio.to_thread(decide, "second@example.com") == 0
        decided = await bot.event(approval_id, "decided")
        assert (decided.person, decided.channel) == ("email:second@example.com", "cli")
        assert "os_user" in decided.detail["evidence"]


async def test_people_resolve_slack_users_to_their_addresses() -> None:
    async with slack_fake() as slack:
        ana = slack.add_user("ana", email="Ana@Example.com")
        bob = slack.add_user("bob", email="bob@example.com")
        bare = slack.add_user("bare")  # Slack holds no address for this one
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        people = People({"robert": ["bob", bob.id]}, directory=Directory(client))
        assert (await people.person(ana.id)).key == "email:ana@example.com"
        assert await people.same(ana.id, "ANA@example.com")
        assert (await people.person("bob@example.com")).key == "person:robert"
        assert (await people.person("Bob")).key == "person:robert"
        assert (await people.person(bare.id)).key == f"slack:{bare.id}"
        assert not await people.same(ana.id, bob.id)
        assert await people.slack_ids(await people.person("ana@example.com")) == {ana.id}
        slack.fail("users.info", "fatal_error")
        with pytest.raises(IdentityUnavailable, match="try again"):
            await People(directory=Directory(client)).person(bob.id)


async def test_without_slack_handles_compare_as_written_but_case_insensitively() -> None:
    people = People({"ana": ["ana", "U0123ANA99", "ana@example.com"]})
    assert await people.same("U0123ANA99", "Ana@Example.COM")
    assert await people.same("ANA", "U0123ANA99")
    assert not await people.same("carl@example.com", "ana@example.com")
    assert (await people.person("Carl@Example.com")).key == "email:carl@example.com"


def test_a_handle_belongs_to_one_person(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "people:\n  ana: [ana, ana@example.com]\n  bob: [bob, Ana@Example.com]\n  eve: []\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert raised.value.problems == [
        f"{path}:3: people.bob.1: 'Ana@Example.com' is a handle of 'ana' already",
        f"{path}:4: people.eve: expected at least one handle",
    ]
