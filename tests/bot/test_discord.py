"""The Discord channel's parts: the signature check (any change to the body, the timestamp or
the signature is refused), the reading of interactions (a shape Discord does not send is
refused with 400 and records nothing), the messages (untrusted arguments shown, never
obeyed), and the posting (once, with a nonce; a lost answer does not post twice), with the bot
served in this process against the local fake of Discord."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nodbot.bot.config.models import Config
from nodbot.bot.discord.messages import button_of, code, escape, form_of, request_message
from nodbot.bot.discord.signature import MAX_SKEW, NotSigned, Verifier
from nodbot.bot.serve import Served, serving
from nodbot.core import ApprovalRecord, ApprovalRequest, arguments_digest
from tests.fakes.discord import DiscordFake, Message, Signer, button_click, discord_fake
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
SIGNER = Signer()
NOW = 1_800_000_000
VERIFIER = Verifier(SIGNER.public_key, clock=lambda: NOW)
BODY = b'{"type":1,"id":"1","application_id":"2"}'


def lowered(headers: dict[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}


# --- the signature --------------------------------------------------------------------------


def test_a_body_signed_as_discord_signs_it_is_accepted() -> None:
    VERIFIER.check(lowered(SIGNER.headers(BODY, timestamp=NOW)), BODY)
    VERIFIER.check(lowered(SIGNER.headers(BODY, timestamp=NOW - MAX_SKEW)), BODY)


@given(body=st.binary(max_size=300), index=st.integers(min_value=0), flip=st.integers(1, 255))
def test_any_change_to_the_body_is_refused(body: bytes, index: int, flip: int) -> None:
    headers = lowered(SIGNER.headers(body, timestamp=NOW))
    VERIFIER.check(headers, body)
    changed = bytearray(body or b"\x00")
    changed[index % len(changed)] ^= flip
    if bytes(changed) == body:
        return
    with pytest.raises(NotSigned):
        VERIFIER.check(headers, bytes(changed))
    with pytest.raises(NotSigned):
        VERIFIER.check(headers, body + b" ")


@given(shift=st.integers(min_value=-MAX_SKEW, max_value=MAX_SKEW).filter(lambda n: n != 0))
def test_a_changed_timestamp_is_refused(shift: int) -> None:
    headers = lowered(SIGNER.headers(BODY, timestamp=NOW))
    headers["x-signature-timestamp"] = str(NOW + shift)
    with pytest.raises(NotSigned):
        VERIFIER.check(headers, BODY)


@given(index=st.integers(min_value=0, max_value=127), digit=st.sampled_from("0123456789abcdef"))
def test_a_changed_signature_is_refused(index: int, digit: str) -> None:
    headers = lowered(SIGNER.headers(BODY, timestamp=NOW))
    signature = headers["x-signature-ed25519"]
    if signature[index] == digit:
        return
    headers["x-signature-ed25519"] = signature[:index] + digit + signature[index + 1 :]
    with pytest.raises(NotSigned):
        VERIFIER.check(headers, BODY)


@given(
    signature=st.text(max_size=200),
    timestamp=st.text(max_size=40),
)
def test_any_header_text_that_is_not_a_signature_is_refused(signature: str, timestamp: str) -> None:
    with pytest.raises(NotSigned):
        VERIFIER.check({"x-signature-ed25519": signature, "x-signature-timestamp": timestamp}, BODY)


def test_unsigned_stale_and_other_keys_are_refused() -> None:
    with pytest.raises(NotSigned, match="not signed"):
        VERIFIER.check({}, BODY)
    for stamp in (NOW - MAX_SKEW - 1, NOW + MAX_SKEW + 1):
        with pytest.raises(NotSigned, match="expired"):
            VERIFIER.check(lowered(SIGNER.headers(BODY, timestamp=stamp)), BODY)
    with pytest.raises(NotSigned, match="not valid"):
        VERIFIER.check(lowered(Signer().headers(BODY, timestamp=NOW)), BODY)


# --- the messages ---------------------------------------------------------------------------


def record_of(arguments: dict[str, Any], *, tool: str = "refund") -> ApprovalRecord:
    request = ApprovalRequest(
        run_id="run_1",
        call_id="call_1",
        tool=tool,
        arguments=arguments,
        digest=arguments_digest(arguments),
        requested_by="agent",
    )
    return ApprovalRecord("apr_0123456789abcdef0123456789ab", request, created_at=datetime.now(UTC))


def test_untrusted_arguments_are_shown_not_obeyed() -> None:
    hostile = "```\n@everyone <@&123> [click](https://evil.example) **bold** <t:0:R>" + "x" * 5000
    message = request_message(
        record_of({"note": hostile}, tool="**tool**"), can_edit=True, can_deny=True, page=None
    )
    content = message["content"]
    assert len(content) <= 2000
    assert message["allowed_mentions"] == {"parse": []}
    body = content.split("```\n", 1)[1].rsplit("\n```", 1)[0]
    assert "```" not in body  # the block cannot be closed early
    assert "\\*\\*tool\\*\\*" in content
    assert [button_of(b["custom_id"]) for b in message["components"][0]["components"]] == [
        ("approve", "apr_0123456789abcdef0123456789ab"),
        ("edit", "apr_0123456789abcdef0123456789ab"),
        ("deny", "apr_0123456789abcdef0123456789ab"),
    ]


@given(st.text(max_size=200))
def test_escaped_text_has_no_markdown_left(text: str) -> None:
    escaped = escape(text)
    # Read back as Discord reads it: every mark is escaped, and nothing else changed.
    shown, rest = [], iter(escaped)
    for char in rest:
        if char == "\\":
            shown.append(next(rest))
        else:
            assert char not in "*_~`|<>@[]()#:-", (text, escaped)
            shown.append(char)
    assert "".join(shown) == text
    assert len(code(text, 300)) <= 300


def test_the_configuration_names_discord_users_and_checks_the_section() -> None:
    section = {
        "application_id": "1100000000000000001",
        "public_key": "ab" * 32,
        "bot_token": "a-discord-bot-token-0000",
        "channels": ["1500000000000000005"],
    }
    config = Config.model_validate(
        {"people": {"ana": ["ana@example.com", "discord:160000000000000000"]}, "discord": section}
    )
    assert config.discord is not None and config.discord.channels == ["1500000000000000005"]
    for key, value in [
        ("public_key", "not-hex"),
        ("channels", []),
        ("channels", ["#general"]),
        ("application_id", "my-app"),
        ("api_url", "ftp://x"),
    ]:
        with pytest.raises(ValidationError, match=key):
            Config.model_validate({"discord": {**section, key: value}})
    with pytest.raises(ValidationError, match="principal"):
        Config.model_validate({"people": {"ana": ["discord:not-an-id"]}})


@given(st.text(max_size=120))
def test_only_the_ids_nodbot_makes_are_read(custom_id: str) -> None:
    named = button_of(custom_id)
    if named is not None:
        assert custom_id == f"nodbot:{named[0]}:{named[1]}"
    form = form_of(custom_id)
    if form is not None:
        assert custom_id == f"nodbot:{form[0]}-form:{form[1]}:{form[2]}"


# --- the endpoint, in this process ----------------------------------------------------------

TOKEN = "token-of-the-starter-000000000000"
ANA = "1600000000000000006"
CHANNEL = "1500000000000000005"
CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: starter, token: {token}, scopes: [runs:write, approvals:read]}}
    - {{name: ana@example.com, token: {ana_token}, scopes: [approvals:read, approvals:decide]}}
    - {{name: bob@example.com, token: {bob_token}, scopes: [approvals:read, approvals:decide]}}
agents:
  ledger: tests.bot.ledger_agent:agent
people:
  ana: [ana@example.com, "discord:{ana}"]
reviewer_groups:
  leads: [ana@example.com, bob@example.com]
discord:
  application_id: "{application_id}"
  public_key: {public_key}
  bot_token: {bot_token}
  channels: ["{channel}"]
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [{reviewers}]
    approvals_required: {required}
"""
ANA_TOKEN = "token-of-ana-the-reviewer-0000000"
BOB_TOKEN = "token-of-bob-the-reviewer-0000000"


@dataclass
class Bot:
    served: Served
    discord: DiscordFake
    client: httpx.AsyncClient

    async def review(self) -> tuple[str, Message]:
        body = {"agent": "ledger", "input": "refund order-1 30"}
        answer = await self.client.post(
            "/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        [pending] = answer.json()["pending"]
        approval_id = str(pending["approval_id"])
        store = self.served.service.store

        async def posted() -> bool:
            found = await store.deliveries(approval_id)
            return any(d.channel == "discord" and d.status == "sent" for d in found)

        await eventually(posted, f"the Discord post of {approval_id}")
        [message] = [
            m for m in self.discord.messages(CHANNEL) if approval_id in " ".join(m.custom_ids)
        ]
        return approval_id, message

    async def send(self, interaction: Any) -> httpx.Response:
        body = json.dumps(interaction).encode()
        headers = self.discord.signer.headers(body)
        return await self.client.post("/discord/interactions", content=body, headers=headers)

    async def events(self, approval_id: str) -> list[str]:
        return [e.kind for e in await self.served.service.store.events(approval_id)]


@contextlib.asynccontextmanager
async def discord_bot(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    reviewers: str = "ana@example.com",
    required: int = 1,
) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with discord_fake() as discord:
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                ana_token=ANA_TOKEN,
                bob_token=BOB_TOKEN,
                reviewers=reviewers,
                required=required,
                ana=ANA,
                application_id=discord.application_id,
                public_key=discord.public_key,
                bot_token=discord.bot_token,
                channel=CHANNEL,
                api_url=discord.api_url,
            )
        )
        async with serving(str(path)) as served, httpx.AsyncClient(base_url=served.url) as client:
            yield Bot(served, discord, client)


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    async with discord_bot(tmp_path, monkeypatch) as running:
        yield running


def bad_shapes(good: dict[str, Any]) -> list[Any]:
    """Interactions Discord does not send: each refused with 400 (or 422 for bad JSON)."""
    member = good["member"]
    return [
        [],
        "approve",
        {**good, "type": "3"},
        {**good, "type": 2},
        {**good, "id": "not-a-snowflake"},
        {**good, "application_id": "99999"},
        {**good, "member": {"user": {"id": "<@everyone>"}}},
        {key: value for key, value in good.items() if key not in ("member", "user")},
        {key: value for key, value in good.items() if key != "data"},
        {**good, "data": {"custom_id": "nodbot:approve:" + "a" * 200}},
        {**good, "data": {"custom_id": "nodbot:launch:apr_1"}},
        {**good, "data": {"custom_id": ["nodbot:approve:apr_1"]}},
        {key: value for key, value in good.items() if key != "message"},
        {**good, "token": "a token with spaces"},
        {**good, "type": 5, "data": {"custom_id": "nodbot:edit-form:apr_1"}},
        {**good, "member": {**member, "user": {"id": 12}}},
    ]


async def test_interactions_of_other_shapes_are_refused_and_record_nothing(bot: Bot) -> None:
    approval_id, message = await bot.review()
    good = button_click(bot.discord, message, f"nodbot:approve:{approval_id}", user=ANA)
    before = await bot.events(approval_id)
    for shape in bad_shapes(good):
        answer = await bot.send(shape)
        assert answer.status_code == 400, (shape, answer.text)
        assert answer.json()["error"]
    body = b"{not json"
    answer = await bot.client.post(
        "/discord/interactions", content=body, headers=bot.discord.signer.headers(body)
    )
    assert answer.status_code == 422
    assert await bot.events(approval_id) == before
    assert (await bot.served.service.store.get(approval_id)).decision is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shape=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=30),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
        max_leaves=20,
    )
)
async def test_any_signed_json_is_answered_without_a_decision(bot: Bot, shape: Any) -> None:
    answer = await bot.send(shape)
    assert answer.status_code in (200, 400), answer.text
    if answer.status_code == 200:
        assert answer.json() == {"type": 1}  # a PING


async def test_a_click_on_another_reviews_message_is_refused_and_recorded(bot: Bot) -> None:
    first, _ = await bot.review()
    _second, message = await bot.review()
    # The button of review `first`, on the message of review `second`.
    click = button_click(bot.discord, message, f"nodbot:approve:{first}", user=ANA)
    assert (await bot.send(click)).json() == {"type": 6}

    async def refused() -> bool:
        return "refused" in await bot.events(first)

    await eventually(refused, "the refusal")
    assert (await bot.served.service.store.get(first)).decision is None

    async def told_them() -> bool:
        return any(f.token == click["token"] for f in bot.discord.follow_ups)

    await eventually(told_them, "the clicker is told")
    [told] = [f for f in bot.discord.follow_ups if f.token == click["token"]]
    assert "does not belong to this review" in told.body["content"]
    assert told.body["flags"] == 64


async def test_a_post_whose_answer_was_lost_is_not_posted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch) as bot:
        bot.discord.fail_next(500)  # the first attempt fails before posting
        approval_id, message = await bot.review()
        assert len(bot.discord.messages(CHANNEL)) == 1
        deliveries = await bot.served.service.store.deliveries(approval_id)
        [post] = [d for d in deliveries if d.channel == "discord"]
        assert post.attempts >= 1 and post.ref == {
            "messages": [{"channel": CHANNEL, "id": message.id}]
        }
        # The channel was read before the second attempt posted.
        assert ("GET", f"/api/v10/channels/{CHANNEL}/messages") in bot.discord.requests


async def test_votes_count_by_person_across_channels_and_groups_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_bot(tmp_path, monkeypatch, reviewers="group:leads", required=2) as bot:
        approval_id, message = await bot.review()
        assert [b.split(":")[1] for b in message.custom_ids] == ["approve", "deny"]  # no Edit
        click = button_click(bot.discord, message, f"nodbot:approve:{approval_id}", user=ANA)
        await bot.send(click)  # Ana, a lead through the group, by her Discord handle

        async def told_them() -> bool:
            return any(f.token == click["token"] for f in bot.discord.follow_ups)

        await eventually(told_them, "Ana is told her vote counts")
        [told] = [f for f in bot.discord.follow_ups if f.token == click["token"]]
        assert "2 are needed" in told.body["content"]

        def decide(token: str) -> Any:
            return bot.client.post(
                f"/approvals/{approval_id}/decide",
                json={"action": "approve"},
                headers={"Authorization": f"Bearer {token}"},
            )

        again = await decide(ANA_TOKEN)  # Ana again, by her address: one person, one vote
        assert again.status_code in (403, 409), again.text
        assert (await bot.served.service.store.get(approval_id)).decision is None
        assert (await decide(BOB_TOKEN)).status_code == 200
        record = await bot.served.service.store.get(approval_id)
        assert record.decision is not None and record.decision.approved

        async def edited() -> bool:
            return not message.custom_ids and "Approved" in message.content

        await eventually(edited, "the message edited to the outcome")
