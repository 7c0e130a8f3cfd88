"""Each Teams card is posted once across replicas and restarts: two `nodbot serve` processes
on one PostgreSQL database post every review once between them and replace each card once
it is decided, whichever bot takes the action; and a bot restarted on its SQLite store posts
nothing again, and acts on the cards its earlier self posted."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bot.processes import nodbot_serve
from tests.bot.test_email_end_to_end import ledger, until
from tests.bot.test_teams_end_to_end import ANA, APP_ID, CONVERSATION, PASSWORD
from tests.fakes.botframework import BotFrameworkFake, Posted, botframework_fake
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
teams:
  app_id: {app_id}
  app_password: ${{TEAMS_APP_PASSWORD}}
  openid_url: {openid_url}
  token_url: {token_url}
  post_to:
    - {{conversation: "{conversation}", service_url: {service_url}}}
rules:
  - tool: refund
    reviewers: [ana@example.com]
"""


def _config(tmp_path: Path, name: str, store: str, bf: BotFrameworkFake) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(
        CONFIG.format(
            store=store,
            token=TOKEN,
            app_id=APP_ID,
            openid_url=bf.openid_url,
            token_url=bf.token_url,
            conversation=CONVERSATION,
            service_url=bf.service_url,
        )
    )
    return path


async def _start(client: httpx.AsyncClient, order: str) -> tuple[str, str]:
    body = {"agent": "ledger", "input": f"refund {order} 5"}
    answer = await client.post("/runs", json=body, headers=HEADERS)
    assert answer.status_code == 201, answer.text
    run = answer.json()
    return str(run["run_id"]), str(run["pending"][0]["approval_id"])


async def _card(bf: BotFrameworkFake, approval_id: str) -> Posted:
    def found() -> Posted | None:
        cards = [p for p in bf.cards(CONVERSATION) if approval_id in json.dumps(p.versions[0])]
        return cards[0] if cards else None

    posted: Posted = await until(f"the card of {approval_id}", found)
    return posted


async def _approve(bf: BotFrameworkFake, client: httpx.AsyncClient, posted: Posted) -> None:
    activity = bf.invoke(posted, ANA, "approve")
    headers = {"Authorization": f"Bearer {bf.sign(activity)}"}
    answer = await client.post("/teams/messages", json=activity, headers=headers)
    assert answer.status_code == 200 and "Approved by" in answer.text, answer.text


def _decided(posted: Posted) -> bool:
    card: dict[str, Any] = posted.card
    return not card["actions"] and "Approved by ana@example.com" in json.dumps(card)


@pytest.mark.postgres
async def test_two_replicas_post_each_card_once_and_replace_it_once_decided(
    tmp_path: Path,
) -> None:
    environment = {
        "TEAMS_APP_PASSWORD": PASSWORD,
        "NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt"),
    }
    async with (
        postgres_database() as url,
        botframework_fake(app_id=APP_ID, password=PASSWORD) as bf,
        contextlib.AsyncExitStack() as stack,
    ):
        bf.add_member(ANA, "ana@example.com")
        bots = [
            await stack.enter_async_context(
                nodbot_serve(_config(tmp_path, name, url, bf), **environment)
            )
            for name in ("a", "b")
        ]
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=bot.url, timeout=30))
            for bot in bots
        ]
        started = [await _start(clients[n % 2], f"r-{n}") for n in range(RUNS)]
        cards = [await _card(bf, approval_id) for _, approval_id in started]
        # Each action goes to the bot that did not start the run.
        await asyncio.gather(
            *(_approve(bf, clients[(n + 1) % 2], posted) for n, posted in enumerate(cards))
        )
        await until("every card is replaced", lambda: all(_decided(p) for p in cards))
        await until("every refund ran", lambda: len(ledger(tmp_path)) == RUNS)
        # Both bots were polling the outbox meanwhile: still one card per review.
        assert len(bf.cards(CONVERSATION)) == RUNS
    assert ledger(tmp_path) == sorted(f"r-{n} 5.0" for n in range(RUNS))


async def test_a_restarted_bot_posts_nothing_again_and_acts_on_its_cards(tmp_path: Path) -> None:
    environment = {
        "TEAMS_APP_PASSWORD": PASSWORD,
        "NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt"),
    }
    async with botframework_fake(app_id=APP_ID, password=PASSWORD) as bf:
        bf.add_member(ANA, "ana@example.com")
        path = _config(tmp_path, "bot", f"sqlite:///{tmp_path / 'nodbot.db'}", bf)
        async with (
            nodbot_serve(path, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            run_id, approval_id = await _start(client, "s-1")
            posted = await _card(bf, approval_id)
        async with (
            nodbot_serve(path, **environment) as bot,
            httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
        ):
            await _approve(bf, client, posted)
            await until("the card is replaced", lambda: _decided(posted))
            await until("the refund ran", lambda: ledger(tmp_path) == ["s-1 5.0"])

            async def finished() -> bool:
                run = (await client.get(f"/runs/{run_id}", headers=HEADERS)).json()
                return bool(run["status"] == "finished")

            await until("the run finishes", finished)
        assert len(bf.cards(CONVERSATION)) == 1
