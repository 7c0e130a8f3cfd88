"""Each Discord review message is posted once across replicas and restarts: two `nodbot
serve` processes on one PostgreSQL database post every review once between them and edit each
message once it is decided, whichever bot the click reaches; and a bot restarted on its SQLite
store posts nothing again, and acts on the clicks on the messages its earlier self posted.
One click sent to both replicas at once decides once; a click answered just as the bot stops
is not lost.

Every interaction is signed with the application's test key, as Discord signs it, and sent
over HTTP to a bot's `/discord/interactions`; the fake of Discord's REST API
(`tests.fakes.discord`) records every post, so a review posted twice shows as two posts."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bot.processes import nodbot_serve
from tests.bot.test_discord_end_to_end import ANA, CHANNEL
from tests.bot.test_email_end_to_end import ledger, until
from tests.fakes.discord import DiscordFake, Message, button_click, discord_fake
from tests.support import postgres_database

TOKEN = "token-of-the-lead-of-the-replicas-0"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
RUNS = 6

CONFIG = """
store: {{url: "{store}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: starter, token: {token}, scopes: [runs:write, approvals:read]}}
agents:
  ledger: tests.bot.ledger_agent:agent
people:
  ana: [ana@example.com, "discord:{ana}"]
discord:
  application_id: "{application_id}"
  public_key: {public_key}
  bot_token: {bot_token}
  channels: ["{channel}"]
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [ana@example.com]
"""


def _config(tmp_path: Path, name: str, store: str, discord: DiscordFake) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(
        CONFIG.format(
            store=store,
            token=TOKEN,
            ana=ANA,
            application_id=discord.application_id,
            public_key=discord.public_key,
            bot_token=discord.bot_token,
            channel=CHANNEL,
            api_url=discord.api_url,
        )
    )
    return path


def _environment(tmp_path: Path) -> dict[str, str]:
    return {"NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt")}


async def _start(client: httpx.AsyncClient, order: str) -> tuple[str, str]:
    body = {"agent": "ledger", "input": f"refund {order} 5"}
    answer = await client.post("/runs", json=body, headers=HEADERS)
    assert answer.status_code == 201, answer.text
    run = answer.json()
    return str(run["run_id"]), str(run["pending"][0]["approval_id"])


async def _approval(client: httpx.AsyncClient, approval_id: str) -> dict[str, Any]:
    found = await client.get(f"/approvals/{approval_id}", headers=HEADERS)
    assert found.status_code == 200, found.text
    approval: dict[str, Any] = found.json()
    return approval


def _posts_of(discord: DiscordFake, approval_id: str) -> list[Message]:
    """The messages the fake holds for the review (its Approve button names it)."""
    button = f"nodbot:approve:{approval_id}"
    return [m for m in discord.messages(CHANNEL) if button in m.custom_ids or _was(m, button)]


def _was(message: Message, button: str) -> bool:
    """Whether an earlier version of `message` (before an edit) had `button`."""
    return any(
        button == b.get("custom_id")
        for version in message.edits
        for row in version.get("components") or []
        for b in row.get("components") or []
    )


def _post_calls(discord: DiscordFake) -> int:
    """How many times a bot asked the fake to post a message to the channel."""
    return discord.requests.count(("POST", f"/api/v10/channels/{CHANNEL}/messages"))


async def _posted(client: httpx.AsyncClient, discord: DiscordFake, approval_id: str) -> Message:
    """The review's message, once posted and recorded as delivered to Discord."""

    async def found() -> Message | None:
        posts = _posts_of(discord, approval_id)
        if not posts:
            return None
        events = (await _approval(client, approval_id))["events"]
        delivered = any(e["kind"] == "delivered" and e["channel"] == "discord" for e in events)
        return posts[0] if delivered else None

    message: Message = await until(f"the Discord message of {approval_id}", found)
    return message


async def _approve(
    discord: DiscordFake, client: httpx.AsyncClient, message: Message, approval_id: str
) -> None:
    click = button_click(discord, message, f"nodbot:approve:{approval_id}", user=ANA)
    body, headers = discord.signer.sign(click)
    answer = await client.post("/discord/interactions", content=body, headers=headers)
    assert answer.status_code == 200 and answer.json() == {"type": 6}, answer.text


def _edited(message: Message) -> bool:
    """The message says who approved it, its buttons gone."""
    text = message.content
    return not message.custom_ids and "Approved" in text and f"<@{ANA}>" in text


async def _decided_once(client: httpx.AsyncClient, approval_id: str) -> None:
    """The review was approved by Ana's click, and decided once (one `decided` event)."""
    approval = await _approval(client, approval_id)
    assert approval["status"] == "approved"
    assert approval["decision"]["decided_by"] == f"discord:{ANA}"
    decided = [e for e in approval["events"] if e["kind"] == "decided"]
    assert len(decided) == 1 and decided[0]["channel"] == "discord", decided


@pytest.mark.postgres
async def test_two_replicas_post_each_review_once_and_edit_it_once_decided(
    tmp_path: Path,
) -> None:
    async with (
        postgres_database() as url,
        discord_fake() as discord,
        contextlib.AsyncExitStack() as stack,
    ):
        bots = [
            await stack.enter_async_context(
                nodbot_serve(_config(tmp_path, name, url, discord), **_environment(tmp_path))
            )
            for name in ("a", "b")
        ]
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=bot.url, timeout=30))
            for bot in bots
        ]
        started = [await _start(clients[n % 2], f"r-{n}") for n in range(RUNS)]
        messages = [
            await _posted(clients[n % 2], discord, approval_id)
            for n, (_, approval_id) in enumerate(started)
        ]
        # Each click goes to the bot that did not start the run.
        await asyncio.gather(
            *(
                _approve(discord, clients[(n + 1) % 2], message, approval_id)
                for n, (message, (_, approval_id)) in enumerate(zip(messages, started, strict=True))
            )
        )
        await until("every message is edited", lambda: all(_edited(m) for m in messages))
        await until("every refund ran", lambda: len(ledger(tmp_path)) == RUNS)
        for n, (_, approval_id) in enumerate(started):
            await _decided_once(clients[n % 2], approval_id)
            # Both bots were polling the outbox meanwhile: one message per review.
            assert len(_posts_of(discord, approval_id)) == 1, approval_id
        assert len(discord.messages(CHANNEL)) == RUNS
        assert _post_calls(discord) == RUNS  # no bot posted a review the other had posted
    assert ledger(tmp_path) == sorted(f"r-{n} 5.0" for n in range(RUNS))


async def test_a_restarted_bot_posts_nothing_again_and_acts_on_its_messages(
    tmp_path: Path,
) -> None:
    async with discord_fake() as discord:
        path = _config(tmp_path, "bot", f"sqlite:///{tmp_path / 'nodbot.db'}", discord)
        async with (
            nodbot_serve(path, **_environment(tmp_path)) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            run_id, approval_id = await _start(client, "s-1")
            message = await _posted(client, discord, approval_id)
        async with (
            nodbot_serve(path, **_environment(tmp_path)) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            await _approve(discord, client, message, approval_id)
            await until("the message is edited", lambda: _edited(message))
            await until("the refund ran", lambda: ledger(tmp_path) == ["s-1 5.0"])

            async def finished() -> bool:
                run = (await client.get(f"/runs/{run_id}", headers=HEADERS)).json()
                return bool(run["status"] == "finished")

            await until("the run finishes", finished)
            await _decided_once(client, approval_id)
        assert discord.messages(CHANNEL) == [message]
        assert _post_calls(discord) == 1
    assert ledger(tmp_path) == ["s-1 5.0"]


@pytest.mark.postgres
async def test_one_click_sent_to_both_replicas_at_once_decides_once(tmp_path: Path) -> None:
    """Discord may deliver a click again (or two reviewers click at once) while the replicas
    share the load: both bots take it at the same moment, the first decision wins, the refund
    runs once, and the clicker whose decision came second is told so."""
    async with (
        postgres_database() as url,
        discord_fake() as discord,
        contextlib.AsyncExitStack() as stack,
    ):
        bots = [
            await stack.enter_async_context(
                nodbot_serve(_config(tmp_path, name, url, discord), **_environment(tmp_path))
            )
            for name in ("a", "b")
        ]
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=bot.url, timeout=30))
            for bot in bots
        ]
        started = [await _start(clients[n % 2], f"d-{n}") for n in range(RUNS)]
        messages = [await _posted(clients[0], discord, a) for _, a in started]
        clicks = [
            [button_click(discord, m, f"nodbot:approve:{a}", user=ANA) for _ in clients]
            for m, (_, a) in zip(messages, started, strict=True)
        ]

        async def send(client: httpx.AsyncClient, click: dict[str, Any]) -> None:
            body, headers = discord.signer.sign(click)
            answer = await client.post("/discord/interactions", content=body, headers=headers)
            assert answer.status_code == 200 and answer.json() == {"type": 6}, answer.text

        await asyncio.gather(
            *(
                send(client, click)
                for pair in clicks
                for client, click in zip(clients, pair, strict=True)
            )
        )
        await until("every message is edited", lambda: all(_edited(m) for m in messages))
        await until("every refund ran", lambda: len(ledger(tmp_path)) == RUNS)

        def told(click: dict[str, Any]) -> list[str]:
            return [f.body["content"] for f in discord.follow_ups if f.token == click["token"]]

        await until(
            "the second clicker of each review is told",
            lambda: all(sum(bool(told(c)) for c in pair) == 1 for pair in clicks),
        )
        for pair in clicks:
            [said] = [text for c in pair for text in told(c)]
            assert "already decided" in said, said
        for _, approval_id in started:
            await _decided_once(clients[0], approval_id)
        assert _post_calls(discord) == RUNS
    assert ledger(tmp_path) == sorted(f"d-{n} 5.0" for n in range(RUNS))


async def test_a_click_answered_as_the_bot_stops_is_not_lost(tmp_path: Path) -> None:
    """Discord takes the deferred answer to an Approve click as the click handled: a bot
    stopped right after giving it still records the decision, and once started again runs
    the refund once, the message edited and not posted again."""
    async with discord_fake() as discord:
        path = _config(tmp_path, "bot", f"sqlite:///{tmp_path / 'nodbot.db'}", discord)
        async with (
            nodbot_serve(path, **_environment(tmp_path)) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            run_id, approval_id = await _start(client, "t-1")
            message = await _posted(client, discord, approval_id)
            await _approve(discord, client, message, approval_id)
        async with (
            nodbot_serve(path, **_environment(tmp_path)) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            await _decided_once(client, approval_id)
            await until("the message is edited", lambda: _edited(message))
            await until("the refund ran", lambda: ledger(tmp_path) == ["t-1 5.0"])

            async def finished() -> bool:
                run = (await client.get(f"/runs/{run_id}", headers=HEADERS)).json()
                return bool(run["status"] == "finished")

            await until("the run finishes", finished)
        assert discord.messages(CHANNEL) == [message]
        assert _post_calls(discord) == 1
    assert ledger(tmp_path) == ["t-1 5.0"]
