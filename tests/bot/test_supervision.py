"""The workers never die silently: a step that fails for any reason is logged and tried
again, `/healthz` and `/readyz` say so while it keeps failing, and once the fault is gone
the work gets done. (The same with a real database outage: test_database_faults.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.config import load_agents, load_config
from nodbot.bot.http import create_app
from nodbot.bot.outbox import Moment
from nodbot.bot.service import BotService
from nodbot.core import (
    Agent,
    ApprovalRecord,
    ChatResponse,
    Delivery,
    NewDelivery,
    SqlApprovalStore,
    ToolRegistry,
)
from tests.bot.ledger_agent import config_yaml
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]


class Flaky:
    """A channel whose `targets` raises (a channel's bug, say) until `mended` is set."""

    name = "flaky"
    answers = False
    makes_deliveries = False
    tells_outcomes = False

    def __init__(self) -> None:
        self.mended = False
        self.calls = 0
        self.delivered: list[str] = []

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        self.calls += 1
        if not self.mended:
            raise RuntimeError("the channel's bug")
        return [NewDelivery("request", "flaky:ops")] if stage == "request" else []

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        self.delivered.append(record.approval_id)
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.chdir(ROOT)  # where tests.bot.ledger_agent is imported from
    path = tmp_path / "nodbot.yml"
    path.write_text(
        config_yaml(f"sqlite:///{tmp_path / 'nodbot.db'}", settings="workers: {poll: 60}")
    )
    config = load_config(path)
    agents, problems = load_agents(config)
    assert not problems
    channel = Flaky()
    async with SqlApprovalStore(config.store.url) as store:
        service = BotService(config, store, agents, channels=[channel])
        app = create_app(store=store, registry=service.registry, tokens=[], service=service)
        stop = asyncio.Event()
        working = asyncio.create_task(service.work(stop))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
            yield service, channel, client, working
        stop.set()
        await working


async def test_a_failing_step_is_logged_retried_and_reported_unhealthy(
    bot: Any, caplog: pytest.LogCaptureFixture
) -> None:
    service, channel, client, working = bot
    caplog.set_level(logging.ERROR, logger="nodbot.bot.service")
    run = await service.start_run("ledger", "refund o-1 3", requested_by=None)
    assert run.status == "waiting"

    async def unhealthy() -> bool:
        return (await client.get("/healthz")).status_code == 503

    # With a 60 s poll, only the workers' own retries can call the channel again and again.
    await eventually(unhealthy, "/healthz unhealthy while every worker step fails")
    assert channel.calls >= 2
    answer = (await client.get("/healthz")).json()
    assert "the channel's bug" in answer["error"], answer
    assert (await client.get("/readyz")).status_code == 503
    assert not working.done()
    assert any("a worker step failed" in r.getMessage() for r in caplog.records)

    channel.mended = True

    async def delivered() -> bool:
        return len(channel.delivered) == 1

    await eventually(delivered, "the review delivered once the channel works again")

    async def healthy() -> bool:
        return (await client.get("/healthz")).status_code == 200

    await eventually(healthy, "/healthz healthy again")
    assert (await client.get("/readyz")).status_code == 200


async def test_readyz_waits_for_the_first_step_and_healthz_for_the_workers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(f'store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}\n')
    config = load_config(path)
    async with SqlApprovalStore(config.store.url) as store:
        service = BotService(config, store, {})
        app = create_app(store=store, registry=service.registry, tokens=[], service=service)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
            stopped = (await client.get("/healthz")).json()
            assert stopped["problems"] == ["the workers are not running"]
            stop = asyncio.Event()
            working = asyncio.create_task(service.work(stop))

            async def ready() -> bool:
                return (await client.get("/readyz")).status_code == 200

            await eventually(ready, "/readyz once the workers have done a step")
            assert (await client.get("/healthz")).json() == {
                "status": "ok",
                "error": None,
                "problems": [],
            }
            stop.set()
            await working
            assert (await client.get("/healthz")).status_code == 503


async def test_closing_the_service_closes_the_agents_models(tmp_path: Path) -> None:
    class Closable:
        closed = False

        async def respond(self, messages: object, tools: object) -> ChatResponse:
            return ChatResponse(content="done")

        async def aclose(self) -> None:
            self.closed = True

    path = tmp_path / "nodbot.yml"
    path.write_text(f'store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}\n')
    config = load_config(path)
    model = Closable()
    async with SqlApprovalStore(config.store.url) as store:
        service = BotService(config, store, {"a": Agent(model, ToolRegistry())})
        await service.close()
    assert model.closed
