"""The Slack fake against the real slack_sdk and slack_bolt: Web API calls over HTTP, Socket
Mode over a WebSocket, and signed interactive requests, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import httpx
import pytest
import uvicorn
from slack_sdk.signature import SignatureVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.slack import (
    Failure,
    SlackFake,
    block_actions_payload,
    command_request,
    interactive_request,
    send_interactive,
    signed_headers,
    slack_fake,
    slack_signature,
    view_submission_payload,
)

if TYPE_CHECKING:
    from slack_bolt.adapter.socket_mode.websockets import AsyncSocketModeHandler
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

JSON = dict[str, Any]
TS = re.compile(r"^\d{10}\.\d{6}$")


def needs_aiohttp() -> None:
    """slack_sdk's async clients import aiohttp: without it skip here, fail under CI."""
    if importlib.util.find_spec("aiohttp") is not None:
        return
    reason = "slack_sdk's AsyncWebClient and slack_bolt's AsyncApp need aiohttp (not installed)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def web_client(slack: SlackFake, token: str | None = None, **options: Any) -> AsyncWebClient:
    needs_aiohttp()
    from slack_sdk.web.async_client import AsyncWebClient

    return AsyncWebClient(token=token or slack.bot_token, base_url=slack.api_url, **options)


def approval_blocks(text: str = "Refund 120.0 on A-1001?") -> list[JSON]:
    return [
        {"type": "section", "block_id": "summary", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "actions",
            "block_id": "decide",
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "value": "apr_1",
                },
                {
                    "type": "button",
                    "action_id": "deny",
                    "text": {"type": "plain_text", "text": "Deny"},
                    "style": "danger",
                    "value": "apr_1",
                },
            ],
        },
    ]


def deny_modal(title: str = "Deny refund", blocks: list[JSON] | None = None) -> JSON:
    return {
        "type": "modal",
        "callback_id": "deny_reason",
        "private_metadata": "apr_1",
        "title": {"type": "plain_text", "text": title},
        "submit": {"type": "plain_text", "text": "Deny"},
        "blocks": blocks
        if blocks is not None
        else [
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": "Why?"},
                "element": {"type": "plain_text_input", "action_id": "reason_input"},
            }
        ],
    }


@pytest.fixture
async def slack() -> AsyncIterator[SlackFake]:
    async with slack_fake() as fake:
        yield fake


# --------------------------------------------------------------------------------------------
# Web API through AsyncWebClient


async def test_a_posted_message_is_kept_and_updated_in_place_with_its_history(
    slack: SlackFake,
) -> None:
    ops = slack.add_channel("ops")
    client = web_client(slack)

    posted = await client.chat_postMessage(
        channel=ops.id, text="Refund 120.0 needs review", blocks=approval_blocks()
    )
    assert posted["ok"] and posted["channel"] == ops.id and TS.match(posted["ts"])
    assert posted["message"]["blocks"][1]["elements"][0]["action_id"] == "approve"
    assert posted["message"]["bot_id"] == slack.bot_id

    updated = await client.chat_update(
        channel=ops.id,
        ts=posted["ts"],
        text="Approved by alice",
        blocks=approval_blocks("Approved by alice")[:1],
    )
    assert updated["ts"] == posted["ts"] and updated["text"] == "Approved by alice"

    [message] = slack.messages(ops)
    assert message.ts == posted["ts"] and message.text == "Approved by alice"
    assert len(message.blocks) == 1
    first, second = message.versions
    assert (first.via, first.text, len(first.blocks)) == (
        "chat.postMessage",
        "Refund 120.0 needs review",
        2,
    )
    assert (second.via, second.text) == ("chat.update", "Approved by alice")
    assert message.updates == [second]

    [post, update] = slack.calls
    assert (post.method, post.token, post.content_type) == (
        "chat.postMessage",
        slack.bot_token,
        "application/json",
    )
    assert post.params["blocks"] == approval_blocks()
    assert update.method == "chat.update" and update.ok

    again = await client.chat_postMessage(channel=ops.id, text="second")
    assert again["ts"] > posted["ts"]
    assert [m.ts for m in slack.messages(ops)] == [posted["ts"], again["ts"]]


async def test_posting_to_a_user_id_lands_in_their_dm(slack: SlackFake) -> None:
    alice = slack.add_user("alice", "alice@example.com")
    posted = await web_client(slack).chat_postMessage(channel=alice.id, text="for you")
    dm = slack.dm(alice)
    assert dm is not None and dm.id.startswith("D") and posted["channel"] == dm.id
    assert [m.text for m in slack.messages(alice)] == ["for you"]


async def test_an_ephemeral_message_is_kept_for_its_user_only(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    alice, bob = slack.add_user("alice"), slack.add_user("bob")
    ops = slack.add_channel("ops", [alice])
    client = web_client(slack)

    answer = await client.chat_postEphemeral(channel=ops.id, user=alice.id, text="only you")
    assert TS.match(answer["message_ts"])
    [shown] = slack.ephemerals
    assert (shown.channel, shown.user, shown.text) == (ops.id, alice.id, "only you")
    with pytest.raises(SlackApiError) as raised:
        await client.chat_postEphemeral(channel=ops.id, user=bob.id, text="not a member")
    assert raised.value.response["error"] == "user_not_in_channel"
    assert slack.messages(ops) == [] and len(slack.ephemerals) == 1


async def test_lookups_answer_from_the_workspace_the_test_set_up(slack: SlackFake) -> None:
    alice = slack.add_user("alice", "alice@example.com", "Alice Liddell")
    bob = slack.add_user("bob", "bob@example.com")
    carol = slack.add_user("carol", "carol@example.com")
    finance = slack.add_usergroup("finance", [alice, bob])
    ops = slack.add_channel("ops", [alice, bob, carol])
    client = web_client(slack)

    found = await client.users_lookupByEmail(email="Alice@Example.com")
    assert found["user"]["id"] == alice.id
    assert found["user"]["profile"]["email"] == "alice@example.com"
    assert found["user"]["real_name"] == "Alice Liddell"
    assert (await client.users_info(user=bob.id))["user"]["name"] == "bob"

    group = await client.usergroups_users_list(usergroup=finance.id)
    assert group["users"] == [alice.id, bob.id]

    opened = await client.conversations_open(users=carol.id)
    dm_id = opened["channel"]["id"]
    assert dm_id.startswith("D") and "already_open" not in opened
    again = await client.conversations_open(users=[carol.id])
    assert again["channel"]["id"] == dm_id and again["already_open"] is True

    members: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await client.conversations_members(channel=ops.id, limit=2, cursor=cursor)
        members += page["members"]
        pages += 1
        cursor = page["response_metadata"]["next_cursor"]
        if not cursor:
            break
    assert pages == 2
    assert members == [alice.id, bob.id, carol.id, slack.bot_user.id]

    identity = await client.auth_test()
    assert (identity["user_id"], identity["bot_id"], identity["team_id"]) == (
        slack.bot_user.id,
        slack.bot_id,
        slack.team_id,
    )


async def test_a_channel_refuses_the_bot_until_it_is_invited(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    public = slack.add_channel("refunds", bot_member=False)
    private = slack.add_channel("payroll", bot_member=False, private=True)
    client = web_client(slack)
    for channel, error in ((public, "not_in_channel"), (private, "channel_not_found")):
        with pytest.raises(SlackApiError) as raised:
            await client.chat_postMessage(channel=channel.id, text="review")
        assert raised.value.response["error"] == error  # a private channel is hidden
        slack.invite(channel)
        posted = await client.chat_postMessage(channel=channel.id, text="review")
        assert [m.ts for m in slack.messages(channel)] == [posted["ts"]]
        history = await client.conversations_history(channel=channel.id)
        assert [m["ts"] for m in history["messages"]] == [posted["ts"]]


async def test_errors_come_back_as_slack_sends_them(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    ops = slack.add_channel("ops")
    elsewhere = slack.add_channel("elsewhere", bot_member=False)
    client = web_client(slack)

    async def error(call: Any) -> str:
        with pytest.raises(SlackApiError) as raised:
            await call
        assert raised.value.response.status_code == 200
        assert raised.value.response["ok"] is False
        return str(raised.value.response["error"])

    stranger = web_client(slack, token="xoxb-not-a-token")
    assert await error(stranger.chat_postMessage(channel=ops.id, text="hi")) == "invalid_auth"
    assert await error(client.users_lookupByEmail(email="nobody@example.com")) == (
        "users_not_found"
    )
    assert await error(client.users_info(user="U0NOBODY")) == "user_not_found"
    assert await error(client.usergroups_users_list(usergroup="S0NOTHING")) == "no_such_subteam"
    assert await error(client.chat_update(channel=ops.id, ts="1.000001", text="x")) == (
        "message_not_found"
    )
    assert await error(client.chat_postMessage(channel="C0NOWHERE", text="x")) == (
        "channel_not_found"
    )
    assert await error(client.chat_postMessage(channel=elsewhere.id, text="x")) == (
        "not_in_channel"
    )
    assert await error(client.api_call("chat.flyAway")) == "unknown_method"
    app_token = web_client(slack, token=slack.app_token)
    assert await error(app_token.chat_postMessage(channel=ops.id, text="x")) == (
        "not_allowed_token_type"
    )
    assert await error(client.apps_connections_open(app_token=slack.bot_token)) == (
        "not_allowed_token_type"
    )

    assert slack.messages() == []
    assert [c.error for c in slack.calls][:2] == ["invalid_auth", "users_not_found"]
    assert not any(c.ok for c in slack.calls)


async def test_a_429_is_retried_after_retry_after_and_posts_once(slack: SlackFake) -> None:
    needs_aiohttp()
    from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler

    ops = slack.add_channel("ops")
    slack.fail("chat.postMessage", Failure(429, "ratelimited", retry_after=2))
    client = web_client(slack, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=2)])

    posted = await client.chat_postMessage(channel=ops.id, text="once")

    assert [m.text for m in slack.messages(ops)] == ["once"]
    limited, accepted = slack.calls_to("chat.postMessage")
    assert (limited.status, limited.error, limited.fault) == (429, "ratelimited", True)
    assert (accepted.status, accepted.ok, accepted.fault) == (200, True, False)
    assert accepted.at - limited.at >= 2.0  # Retry-After: 2 was honoured (without it: 1-2 s)
    assert posted["ts"] == slack.messages(ops)[0].ts
    assert slack.faults == [limited]


async def test_every_nth_call_is_rate_limited_with_retry_after(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    ops = slack.add_channel("ops")
    slack.rate_limit_every(3, retry_after=7, methods=["chat.postMessage"])
    client = web_client(slack)

    await client.auth_test()  # not counted: another method
    await client.chat_postMessage(channel=ops.id, text="1")
    await client.chat_postMessage(channel=ops.id, text="2")
    with pytest.raises(SlackApiError) as raised:
        await client.chat_postMessage(channel=ops.id, text="3")
    assert raised.value.response.status_code == 429
    assert raised.value.response.headers["Retry-After"] == "7"
    assert raised.value.response["error"] == "ratelimited"
    await client.chat_postMessage(channel=ops.id, text="4")

    assert [m.text for m in slack.messages(ops)] == ["1", "2", "4"]
    assert [c.params["text"] for c in slack.faults] == ["3"]


async def test_injected_failures_are_served_in_order(slack: SlackFake) -> None:
    needs_aiohttp()
    from slack_sdk.errors import SlackApiError
    from slack_sdk.http_retry.builtin_async_handlers import AsyncServerErrorRetryHandler

    alice = slack.add_user("alice", "alice@example.com")
    slack.fail("users.info", 503, "fatal_error")
    client = web_client(slack, retry_handlers=[AsyncServerErrorRetryHandler(max_retry_count=1)])

    with pytest.raises(SlackApiError) as raised:
        await client.users_info(user=alice.id)  # 503 retried, then the error code
    assert raised.value.response["error"] == "fatal_error"
    assert (await client.users_info(user=alice.id))["user"]["id"] == alice.id
    assert [(c.status, c.error) for c in slack.calls_to("users.info")] == [
        (503, "service_unavailable"),
        (200, "fatal_error"),
        (200, None),
    ]


async def test_block_kit_limits_are_refused_as_slack_refuses_them(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    ops = slack.add_channel("ops")
    client = web_client(slack)

    async def refused(text: str = "fallback", **message: Any) -> JSON:
        with pytest.raises(SlackApiError) as raised:
            await client.chat_postMessage(channel=ops.id, text=text, **message)
        answer = raised.value.response.data
        assert isinstance(answer, dict)
        return answer

    divider: JSON = {"type": "divider"}
    answer = await refused(blocks=[divider] * 51)
    assert answer["error"] == "invalid_blocks"
    assert answer["response_metadata"]["messages"] == [
        "[ERROR] no more than 50 items allowed [json-pointer:/blocks]"
    ]
    await client.chat_postMessage(channel=ops.id, text="fallback", blocks=[divider] * 50)

    def section(n: int) -> JSON:
        return {"type": "section", "text": {"type": "mrkdwn", "text": "x" * n}}

    answer = await refused(blocks=[divider, section(3001)])
    assert answer["error"] == "invalid_blocks"
    assert answer["response_metadata"]["messages"] == [
        "[ERROR] must be less than 3001 characters [json-pointer:/blocks/1/text/text]"
    ]
    await client.chat_postMessage(channel=ops.id, text="fallback", blocks=[section(3000)])

    header = {"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}
    assert (await refused(blocks=[header]))["error"] == "invalid_blocks"
    button = approval_blocks()[1]
    button["elements"][0]["text"]["text"] = "b" * 76
    button["elements"][1]["value"] = "v" * 2001
    messages = (await refused(blocks=[button]))["response_metadata"]["messages"]
    assert messages == [
        "[ERROR] must be less than 76 characters [json-pointer:/blocks/0/elements/0/text/text]",
        "[ERROR] must be less than 2001 characters [json-pointer:/blocks/0/elements/1/value]",
    ]
    assert (await refused(text="t" * 40_001))["error"] == "msg_too_long"

    assert [len(m.blocks) for m in slack.messages(ops)] == [50, 1]


async def test_views_open_takes_a_trigger_once_and_checks_the_modal(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    alice = slack.add_user("alice", "alice@example.com")
    ops = slack.add_channel("ops", [alice])
    client = web_client(slack)
    posted = await client.chat_postMessage(channel=ops.id, text="review", blocks=approval_blocks())
    click = slack.click(slack.message(ops, posted["ts"]), "deny", alice)

    opened = await client.views_open(trigger_id=click["trigger_id"], view=deny_modal())
    view = opened["view"]
    assert view["id"].startswith("V") and view["callback_id"] == "deny_reason"
    assert view["private_metadata"] == "apr_1" and view["state"] == {"values": {}}
    [kept] = slack.views
    assert (kept.id, kept.user, kept.trigger_id) == (view["id"], alice.id, click["trigger_id"])

    async def error(**arguments: Any) -> JSON:
        with pytest.raises(SlackApiError) as raised:
            await client.views_open(**arguments)
        answer = raised.value.response.data
        assert isinstance(answer, dict)
        return answer

    assert (await error(trigger_id=click["trigger_id"], view=deny_modal()))["error"] == (
        "exchanged_trigger_id"
    )
    assert (await error(trigger_id="123.456.abc", view=deny_modal()))["error"] == (
        "invalid_trigger_id"
    )
    long_title = await error(trigger_id=slack.mint_trigger(alice), view=deny_modal("t" * 25))
    assert long_title["error"] == "invalid_arguments"
    assert long_title["response_metadata"]["messages"] == [
        "[ERROR] must be less than 25 characters [json-pointer:/view/title/text]"
    ]
    too_many = await error(
        trigger_id=slack.mint_trigger(alice), view=deny_modal(blocks=[{"type": "divider"}] * 101)
    )
    assert too_many["response_metadata"]["messages"] == [
        "[ERROR] no more than 100 items allowed [json-pointer:/view/blocks]"
    ]
    assert len(slack.views) == 1

    updated = await client.views_update(
        view_id=view["id"], hash=view["hash"], view=deny_modal("Denied")
    )
    assert updated["view"]["title"]["text"] == "Denied"
    assert [v["title"]["text"] for v in kept.versions] == ["Deny refund", "Denied"]


# --------------------------------------------------------------------------------------------
# The wire: form and JSON bodies, tokens, response URLs (plain httpx, no aiohttp needed)


async def test_form_encoded_and_json_bodies_are_read_alike(slack: SlackFake) -> None:
    ops = slack.add_channel("ops")
    blocks = approval_blocks()
    async with httpx.AsyncClient() as http:
        form = await http.post(
            slack.api_url + "chat.postMessage",
            data={
                "token": slack.bot_token,
                "channel": "#ops",
                "text": "form",
                "blocks": json.dumps(blocks),
            },
        )
        as_json = await http.post(
            slack.api_url + "chat.postMessage",
            json={"channel": ops.id, "text": "json", "blocks": blocks},
            headers={"Authorization": f"Bearer {slack.bot_token}"},
        )
        token_in_json = await http.post(
            slack.api_url + "chat.postMessage",
            json={"token": slack.bot_token, "channel": ops.id, "text": "no"},
        )
        query = await http.get(
            slack.api_url + "users.info",
            params={"user": slack.bot_user.id},
            headers={"Authorization": f"Bearer {slack.bot_token}"},
        )
    assert form.status_code == as_json.status_code == 200
    assert form.headers["content-type"].startswith("application/json")
    assert form.json()["ok"] and as_json.json()["ok"]
    assert token_in_json.json() == {"ok": False, "error": "not_authed"}
    assert query.json()["user"]["is_bot"] is True
    assert [(m.text, m.blocks) for m in slack.messages(ops)] == [
        ("form", blocks),
        ("json", blocks),
    ]
    first = slack.calls[0]
    assert first.token == slack.bot_token and "token" not in first.params
    assert first.content_type == "application/x-www-form-urlencoded"


async def test_a_response_url_replaces_the_clicked_message(slack: SlackFake) -> None:
    alice = slack.add_user("alice")
    ops = slack.add_channel("ops", [alice])
    async with httpx.AsyncClient() as http:
        await http.post(
            slack.api_url + "chat.postMessage",
            data={
                "token": slack.bot_token,
                "channel": ops.id,
                "text": "review",
                "blocks": json.dumps(approval_blocks()),
            },
        )
        [message] = slack.messages(ops)
        click = slack.click(message, "approve", alice)
        answer = await http.post(
            click["response_url"], json={"replace_original": True, "text": "Approved by alice"}
        )
    assert (answer.status_code, answer.text) == (200, "ok")
    assert click["response_url"].startswith(slack.base_url)
    assert message.text == "Approved by alice" and message.versions[-1].via == "response_url"
    assert slack.response_posts[0].body["replace_original"] is True


def test_ids_are_slack_shaped_and_the_same_for_the_same_setup() -> None:
    def setup(fake: SlackFake) -> list[str]:
        user = fake.add_user("alice", "alice@example.com")
        channel = fake.add_channel("ops", [user])
        group = fake.add_usergroup("finance", [user])
        dm = fake.open_dm(user)
        ids = [fake.team_id, fake.app_id, fake.bot_id, fake.bot_user.id, user.id]
        return [*ids, channel.id, group.id, dm.id]

    one, two = SlackFake(), SlackFake()
    ids = setup(one)
    assert ids == setup(two)
    prefixes = "TABUUCSD"
    assert all(re.match(rf"^{p}[0-9A-F]{{10}}$", i) for p, i in zip(prefixes, ids, strict=True))
    assert len(set(ids)) == len(ids)


# --------------------------------------------------------------------------------------------
# Socket Mode with a real slack_bolt AsyncApp


@contextlib.asynccontextmanager
async def socket_app(slack: SlackFake) -> AsyncIterator[tuple[AsyncApp, list[JSON]]]:
    """A bolt AsyncApp connected to the fake over Socket Mode; yields it and every message
    the Socket Mode client received."""
    needs_aiohttp()
    from slack_bolt.adapter.socket_mode.websockets import AsyncSocketModeHandler
    from slack_bolt.async_app import AsyncApp

    app = AsyncApp(client=web_client(slack), signing_secret=slack.signing_secret)
    handler: AsyncSocketModeHandler = AsyncSocketModeHandler(app, app_token=slack.app_token)
    received: list[JSON] = []

    async def listen(_client: Any, message: JSON, _raw: str | None) -> None:
        received.append(message)

    handler.client.message_listeners.append(listen)
    await handler.connect_async()
    try:
        yield app, received
    finally:
        await handler.close_async()


async def test_a_bolt_app_acks_a_button_click_pushed_over_socket_mode(slack: SlackFake) -> None:
    alice = slack.add_user("alice", "alice@example.com")
    ops = slack.add_channel("ops", [alice])
    async with socket_app(slack) as (app, received):
        clicks: list[JSON] = []

        @app.action("approve")
        async def approve(ack: Any, body: JSON, client: AsyncWebClient) -> None:
            await ack()
            clicks.append(body)
            await client.chat_update(
                channel=body["channel"]["id"],
                ts=body["message"]["ts"],
                text=f"Approved by <@{body['user']['id']}>",
                blocks=[],
            )

        connection = await slack.wait_for_socket()
        await slack.wait_until(lambda: bool(received), what="hello")
        assert received[0]["type"] == "hello"
        assert received[0]["connection_info"]["app_id"] == slack.app_id
        [opened] = slack.calls_to("apps.connections.open", ok=True)
        assert opened.token == slack.app_token

        posted = await app.client.chat_postMessage(
            channel=ops.id, text="review", blocks=approval_blocks()
        )
        message = slack.message(ops, posted["ts"])
        ack = await slack.socket_send("interactive", slack.click(message, "approve", alice))

        envelope = slack.envelopes[-1]
        assert ack == {"envelope_id": envelope["envelope_id"]}
        assert envelope["accepts_response_payload"] is False
        assert connection.received == [ack] and slack.socket_messages == [ack]
        await slack.wait_until(lambda: len(message.versions) == 2, what="the update")
        [click] = clicks
        assert click["actions"][0]["value"] == "apr_1" and click["user"]["id"] == alice.id
        assert message.text == f"Approved by <@{alice.id}>" and message.blocks == []
        assert slack.calls_to("auth.test", ok=True)  # bolt authorised with the bot token


async def test_a_view_submission_ack_carries_the_apps_errors(slack: SlackFake) -> None:
    alice = slack.add_user("alice", "alice@example.com")
    ops = slack.add_channel("ops", [alice])
    async with socket_app(slack) as (app, _):
        reasons: list[str] = []
        closed: list[str] = []

        @app.action("deny")
        async def deny(ack: Any, body: JSON, client: AsyncWebClient) -> None:
            await ack()
            await client.views_open(trigger_id=body["trigger_id"], view=deny_modal())

        @app.view("deny_reason")
        async def submitted(ack: Any, view: JSON) -> None:
            reason = view["state"]["values"]["reason"]["reason_input"]["value"]
            if not reason:
                await ack(response_action="errors", errors={"reason": "Say why"})
                return
            reasons.append(f"{view['private_metadata']}: {reason}")
            await ack()

        @app.view_closed("deny_reason")
        async def dismissed(ack: Any, view: JSON) -> None:
            await ack()
            closed.append(view["id"])

        posted = await app.client.chat_postMessage(
            channel=ops.id, text="review", blocks=approval_blocks()
        )
        await slack.socket_send(
            "interactive", slack.click(slack.message(ops, posted["ts"]), "deny", alice)
        )
        await slack.wait_until(lambda: bool(slack.views), what="the modal")
        [view] = slack.views

        empty = await slack.socket_send("interactive", slack.submit(view, alice))
        assert slack.envelopes[-1]["accepts_response_payload"] is True
        assert empty["payload"] == {"response_action": "errors", "errors": {"reason": "Say why"}}
        given = await slack.socket_send(
            "interactive", slack.submit(view, alice, {"reason": {"reason_input": "no receipt"}})
        )
        assert "payload" not in given and reasons == ["apr_1: no receipt"]
        await slack.socket_send("interactive", slack.close(view, alice))
        assert closed == [view.id]


async def test_the_app_reconnects_when_slack_asks_and_unacked_envelopes_fail(
    slack: SlackFake,
) -> None:
    alice = slack.add_user("alice")
    ops = slack.add_channel("ops", [alice])
    async with socket_app(slack) as (app, _):

        @app.action("approve")
        async def approve(ack: Any) -> None:
            await ack()

        first = await slack.wait_for_socket()
        await slack.socket_disconnect()
        second = await slack.wait_for_socket(count=2)
        await slack.wait_until(lambda: not first.open, what="the old connection closing")
        assert second is not first and len(slack.calls_to("apps.connections.open")) == 2

        posted = await app.client.chat_postMessage(
            channel=ops.id, text="review", blocks=approval_blocks()
        )
        message = slack.message(ops, posted["ts"])
        ack = await slack.socket_send("interactive", slack.click(message, "approve", alice))
        assert second.received == [ack]

        unhandled = slack.click(message, "deny", alice)  # no listener: bolt does not ack
        with pytest.raises(AssertionError, match="did not ack"):
            await slack.socket_send("interactive", unhandled, within=0.5)


# --------------------------------------------------------------------------------------------
# Signed requests to an app's HTTP endpoint


def test_signatures_match_slacks_documented_example_and_the_sdk_verifier() -> None:
    # The example of Slack's "Verifying requests from Slack" page.
    secret = "8f742231b10e8888abcd99yyyzzz85a5"
    body = (
        "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id="
        "G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook"
        "-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F3977"
        "00885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d"
        "10d2c447fce8b6703c"
    )
    assert slack_signature(secret, 1531420618, body) == (
        "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    )

    payload = block_actions_payload(
        action_id="approve",
        block_id="decide",
        value="apr_1",
        user_id="U0000000002",
        user_name="alice",
        team_id="T0000000001",
        channel_id="C0000000001",
        message_ts="1700000000.000100",
    )
    body_bytes, headers = interactive_request(payload, secret)
    verifier = SignatureVerifier(secret)
    assert verifier.is_valid_request(body_bytes, headers)
    assert json.loads(parse_qs(body_bytes.decode())["payload"][0]) == payload
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"

    tampered = body_bytes.replace(b"apr_1", b"apr_2")
    assert tampered != body_bytes and not verifier.is_valid_request(tampered, headers)
    assert not SignatureVerifier("another-secret").is_valid_request(body_bytes, headers)
    stale = signed_headers(secret, body_bytes, timestamp=int(time.time()) - 600)
    assert not verifier.is_valid_request(body_bytes, stale)


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """An ASGI app served on a free loopback port; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def test_a_bolt_http_endpoint_accepts_signed_payloads_and_refuses_forged_ones(
    slack: SlackFake,
) -> None:
    needs_aiohttp()
    from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
    from slack_bolt.async_app import AsyncApp

    alice = slack.add_user("alice")
    ops = slack.add_channel("ops", [alice])
    bolt = AsyncApp(client=web_client(slack), signing_secret=slack.signing_secret)
    seen: list[JSON] = []

    @bolt.action("approve")
    async def approve(ack: Any, body: JSON) -> None:
        await ack()
        seen.append(body)

    @bolt.view("deny_reason")
    async def submitted(ack: Any, view: JSON) -> None:
        await ack(response_action="errors", errors={"reason": "Say why"})

    handler = AsyncSlackRequestHandler(bolt)

    async def events(request: Request) -> Response:
        return await handler.handle(request)

    posted = await bolt.client.chat_postMessage(
        channel=ops.id, text="review", blocks=approval_blocks()
    )
    click = slack.click(slack.message(ops, posted["ts"]), "approve", alice)
    submission = view_submission_payload(
        view_id="V0000000001",
        callback_id="deny_reason",
        values={"reason": {"reason_input": {"type": "plain_text_input", "value": None}}},
        user_id=alice.id,
        user_name=alice.name,
        team_id=slack.team_id,
    )
    async with serving(Starlette(routes=[Route("/slack/events", events, methods=["POST"])])) as url:
        accepted = await send_interactive(f"{url}/slack/events", click, slack.signing_secret)
        forged = await send_interactive(f"{url}/slack/events", click, "not-the-secret")
        errors = await send_interactive(f"{url}/slack/events", submission, slack.signing_secret)
    assert accepted.status_code == 200 and len(seen) == 1
    assert seen[0]["actions"][0]["action_id"] == "approve"
    assert forged.status_code == 401 and len(seen) == 1
    assert errors.json() == {"response_action": "errors", "errors": {"reason": "Say why"}}


# --------------------------------------------------------------------------------------------
# The synchronous WebClient (urllib, no aiohttp) sees the same fake


async def test_the_sync_web_client_posts_and_retries_a_429(slack: SlackFake) -> None:
    from slack_sdk import WebClient
    from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

    ops = slack.add_channel("ops")
    slack.fail("chat.postMessage", 429)
    client = WebClient(
        token=slack.bot_token,
        base_url=slack.api_url,
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=1)],
    )
    posted = await asyncio.to_thread(client.chat_postMessage, channel=ops.id, text="sync")
    await asyncio.to_thread(client.chat_update, channel=ops.id, ts=posted["ts"], text="edited")
    [message] = slack.messages(ops)
    assert [v.text for v in message.versions] == ["sync", "edited"]
    assert [c.status for c in slack.calls] == [429, 200, 200]


async def test_history_and_threads_are_read_with_their_metadata(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    ops = slack.add_channel("ops")
    outside = slack.add_channel("elsewhere", bot_member=False)
    client = web_client(slack)
    tagged = {"event_type": "nodbot_review", "event_payload": {"approval_id": "apr_1"}}
    first = await client.chat_postMessage(channel=ops.id, text="first", metadata=tagged)
    reply = await client.chat_postMessage(
        channel=ops.id, thread_ts=first["ts"], text="in the thread", metadata=tagged
    )
    second = await client.chat_postMessage(channel=ops.id, text="second")

    plain = await client.conversations_history(channel=ops.id)
    assert [m["ts"] for m in plain["messages"]] == [second["ts"], first["ts"]]  # no replies
    assert not any("metadata" in m for m in plain["messages"])
    full = await client.conversations_history(channel=ops.id, include_all_metadata=True)
    assert full["messages"][1]["metadata"] == tagged
    paged = await client.conversations_history(channel=ops.id, limit=1, oldest=first["ts"])
    assert [m["ts"] for m in paged["messages"]] == [second["ts"]]  # oldest is exclusive
    cursor = paged["response_metadata"]["next_cursor"]
    assert paged["has_more"] is False and cursor == ""
    older = await client.conversations_history(channel=ops.id, limit=1)
    assert older["has_more"] is True
    rest = await client.conversations_history(
        channel=ops.id, limit=1, cursor=older["response_metadata"]["next_cursor"]
    )
    assert [m["ts"] for m in rest["messages"]] == [first["ts"]]

    thread = await client.conversations_replies(
        channel=ops.id, ts=first["ts"], include_all_metadata=True
    )
    assert [m["ts"] for m in thread["messages"]] == [first["ts"], reply["ts"]]
    assert thread["messages"][1]["metadata"] == tagged
    refused = [
        (client.conversations_history(channel=outside.id), "not_in_channel"),
        (client.conversations_history(channel="#ops"), "channel_not_found"),  # ids only
        (client.conversations_replies(channel=ops.id, ts="1.000001"), "thread_not_found"),
    ]
    for reading, error in refused:
        with pytest.raises(SlackApiError) as raised:
            await reading
        assert raised.value.response["error"] == error


async def test_a_held_answer_is_done_but_not_told_until_released(slack: SlackFake) -> None:
    ops = slack.add_channel("ops")
    client = web_client(slack)
    slack.hold("chat.postMessage")
    posting = asyncio.create_task(client.chat_postMessage(channel=ops.id, text="held"))
    await slack.wait_until(lambda: bool(slack.held), what="a held call")
    # Slack has the message; the app has no answer yet.
    assert [m.text for m in slack.messages(ops)] == ["held"] and not posting.done()
    slack.release("chat.postMessage")
    answer = await posting
    assert answer["ts"] == slack.messages(ops)[0].ts
    await client.chat_postMessage(channel=ops.id, text="not held")
    assert [c.held for c in slack.calls_to("chat.postMessage")] == [True, False]


async def test_failures_can_be_aimed_at_some_calls_only(slack: SlackFake) -> None:
    from slack_sdk.errors import SlackApiError

    ops = slack.add_channel("ops")
    client = web_client(slack)
    slack.fail("chat.postMessage", "fatal_error", "fatal_error", where=lambda p: "thread_ts" in p)
    parent = await client.chat_postMessage(channel=ops.id, text="parent")  # not aimed at
    for _ in range(2):
        with pytest.raises(SlackApiError):
            await client.chat_postMessage(channel=ops.id, thread_ts=parent["ts"], text="reply")
    await client.chat_postMessage(channel=ops.id, thread_ts=parent["ts"], text="reply")
    assert [m.text for m in slack.messages(ops)] == ["parent", "reply"]
    assert [c.fault for c in slack.calls_to("chat.postMessage")] == [False, True, True, False]


# --------------------------------------------------------------------------------------------
# App Home and slash commands


def home_view(blocks: list[JSON] | None = None) -> JSON:
    return {"type": "home", "blocks": approval_blocks() if blocks is None else blocks}


async def test_views_publish_keeps_each_users_home_and_checks_it_as_slack_does(
    slack: SlackFake,
) -> None:
    from slack_sdk.errors import SlackApiError

    alice = slack.add_user("alice")
    bob = slack.add_user("bob")
    client = web_client(slack)
    first = await client.views_publish(user_id=alice.id, view=home_view())
    assert first["view"]["type"] == "home" and first["view"]["id"].startswith("V")
    again = await client.views_publish(
        user_id=alice.id, view=home_view([{"type": "divider"}]), hash=first["view"]["hash"]
    )
    assert again["view"]["id"] == first["view"]["id"]  # one Home per user, updated
    home = slack.home_view(alice)
    assert home is not None and len(home.versions) == 2 and home.blocks == [{"type": "divider"}]
    assert slack.home_view(bob) is None and await slack.wait_for_home(alice, 2) is home

    async def error(**arguments: Any) -> JSON:
        with pytest.raises(SlackApiError) as raised:
            await client.views_publish(**arguments)
        answer = raised.value.response.data
        assert isinstance(answer, dict)
        return answer

    stale = await error(user_id=alice.id, view=home_view(), hash=first["view"]["hash"])
    assert stale["error"] == "hash_conflict"
    modal = await error(user_id=alice.id, view={**home_view(), "type": "modal"})
    assert modal["response_metadata"]["messages"] == [
        "[ERROR] must be one of home [json-pointer:/view/type]"
    ]
    too_many = await error(user_id=alice.id, view=home_view([{"type": "divider"}] * 101))
    assert too_many["response_metadata"]["messages"] == [
        "[ERROR] no more than 100 items allowed [json-pointer:/view/blocks]"
    ]
    nobody = await error(user_id="U9999999999", view=home_view())
    assert nobody["error"] == "invalid_arguments"
    assert len(home.versions) == 2 and slack.home_view(bob) is None


async def test_an_opened_home_and_a_click_on_it_reach_a_bolt_app_signed(
    slack: SlackFake,
) -> None:
    needs_aiohttp()
    from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
    from slack_bolt.async_app import AsyncApp

    alice = slack.add_user("alice")
    bolt = AsyncApp(client=web_client(slack), signing_secret=slack.signing_secret)
    opened: list[JSON] = []
    clicks: list[JSON] = []

    @bolt.event("app_home_opened")
    async def publish_home(event: JSON, client: AsyncWebClient) -> None:
        opened.append(event)
        await client.views_publish(user_id=event["user"], view=home_view())

    @bolt.action("approve")
    async def approve(ack: Any, body: JSON) -> None:
        await ack()
        clicks.append(body)

    handler = AsyncSlackRequestHandler(bolt)

    async def events(request: Request) -> Response:
        return await handler.handle(request)

    async with serving(Starlette(routes=[Route("/slack/events", events, methods=["POST"])])) as url:
        slack.events_url = f"{url}/slack/events"
        sent = await slack.open_home(alice)
        assert sent.status == 200 and sent.via == "http"
        home = await slack.wait_for_home(alice)
        [event] = opened
        assert event["type"] == "app_home_opened" and event["tab"] == "home"
        assert event["user"] == alice.id and event["channel"] == slack.open_dm(alice).id
        assert "view" not in event  # nothing was published before
        second = slack.app_home_opened_event(alice)
        assert second["view"]["id"] == home.id and second["view"]["type"] == "home"
        click = slack.home_click(alice, "approve")
        answer = await send_interactive(f"{url}/slack/events", click, slack.signing_secret)
    assert answer.status_code == 200
    [body] = clicks
    assert body["container"] == {"type": "view", "view_id": home.id}
    assert body["view"]["type"] == "home" and body["actions"][0]["value"] == "apr_1"
    assert "channel" not in body and "message" not in body and "response_url" not in body
    with pytest.raises(AssertionError, match="no element"):
        slack.home_click(alice, "approve", value="apr_2")


async def test_a_slash_command_is_signed_and_answered_through_its_response_url(
    slack: SlackFake,
) -> None:
    needs_aiohttp()
    from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
    from slack_bolt.async_app import AsyncApp

    alice = slack.add_user("alice")
    bolt = AsyncApp(client=web_client(slack), signing_secret=slack.signing_secret)
    commands: list[JSON] = []

    @bolt.command("/nodbot")
    async def nodbot(ack: Any, command: JSON, respond: Any) -> None:
        await ack()
        commands.append(command)
        await respond(text=f"you said {command['text']}", blocks=approval_blocks())

    @bolt.action("approve")
    async def approve(ack: Any, respond: Any) -> None:
        await ack()
        await respond(text="Approved", replace_original=True)

    handler = AsyncSlackRequestHandler(bolt)

    async def events(request: Request) -> Response:
        return await handler.handle(request)

    async with serving(Starlette(routes=[Route("/slack/events", events, methods=["POST"])])) as url:
        slack.events_url = f"{url}/slack/events"
        forged = await slack.send_command(alice, "pending", secret="not-the-secret")
        assert forged.status == 401 and commands == [] and slack.responses(forged) == []
        sent = await slack.send_command(alice, "pending")
        assert sent.status == 200 and sent.body == ""
        [response] = await slack.wait_for_responses(sent)
        [command] = commands
        assert command["command"] == "/nodbot" and command["text"] == "pending"
        assert command["user_id"] == alice.id and command["channel_id"] == slack.open_dm(alice).id
        assert response.body["text"] == "you said pending"
        [shown] = slack.ephemerals
        assert (shown.user, shown.text) == (alice.id, "you said pending")
        click = slack.ephemeral_click(shown, "approve")
        assert click["container"]["is_ephemeral"] is True and "message" not in click
        answer = await send_interactive(f"{url}/slack/events", click, slack.signing_secret)
        assert answer.status_code == 200
        await slack.wait_for_responses(shown)
    assert shown.text == "Approved" and shown.blocks == [] and len(shown.earlier) == 1
    assert len(slack.ephemerals) == 1  # replaced, not another message
    body, headers = command_request(sent.payload, slack.signing_secret)
    assert SignatureVerifier(slack.signing_secret).is_valid_request(body, headers)
    assert parse_qs(body.decode())["text"] == ["pending"]


async def test_a_slash_command_goes_over_socket_mode_without_an_events_url(
    slack: SlackFake,
) -> None:
    alice = slack.add_user("alice")
    async with socket_app(slack) as (app, _):

        @app.command("/nodbot")
        async def nodbot(ack: Any, command: JSON) -> None:
            await ack(text=f"ok {command['text']}")

        await slack.wait_for_socket()
        sent = await slack.send_command(alice, "help")
        assert sent.via == "socket" and sent.ack is not None
        assert slack.envelopes[-1]["type"] == "slash_commands"
        assert slack.envelopes[-1]["accepts_response_payload"] is True
        assert sent.ack["payload"]["text"] == "ok help"
