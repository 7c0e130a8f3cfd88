"""A busy bot finishes what it has under way before it starts more (`BotService.begin_run`):
a new run waits for its start while the event loop is behind with its work, or while every
database connection of the store is in use, and starts once neither holds, or after
`ADMIT_WAIT_MOST` seconds whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodbot.bot import service as service_module
from nodbot.bot.config import load_agents, load_config
from nodbot.bot.service import BotService
from nodbot.core import SqlApprovalStore
from tests.bot.ledger_agent import config_yaml
from tests.support import postgres_database

ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def bot(tmp_path: Path, url: str) -> AsyncIterator[tuple[BotService, SqlApprovalStore]]:
    """A bot on the store at `url`, with the ledger agent and no workers."""
    path = tmp_path / "nodbot.yml"
    path.write_text(config_yaml(url))
    config = load_config(path)
    agents, problems = load_agents(config)
    assert not problems
    async with SqlApprovalStore(url) as store:
        yield BotService(config, store, agents), store


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # where tests.bot.ledger_agent is imported from


class Hog:
    """Keeps the event loop behind: each of its turns blocks the loop for 5 ms."""

    def __init__(self) -> None:
        self.turns = 0
        self.stopped = False
        self._turned = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.stopped:
            time.sleep(0.005)  # noqa: ASYNC251 (blocking the loop is the point)
            self.turns += 1
            self._turned.set()
            await asyncio.sleep(0)

    async def turned(self, turns: int) -> None:
        """Until it has taken `turns` more turns."""
        until = self.turns + turns
        while self.turns < until:
            self._turned.clear()
            await self._turned.wait()

    async def stop(self) -> None:
        self.stopped = True
        await self.task


async def test_a_new_run_starts_once_the_loop_has_caught_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "ADMIT_WAIT_MOST", 60.0)
    async with bot(tmp_path, f"sqlite:///{tmp_path / 'nodbot.db'}") as (service, store):
        hog = Hog()
        start = asyncio.create_task(service.begin_run("ledger", "refund o-1 5", "U0123LEADS"))
        await hog.turned(40)  # 200 ms and more of a loop behind by 5 ms at every turn
        assert not start.done()
        assert service.counters["runs_started"] == 0
        await hog.stop()
        run, pending = await start
        assert run.status == "waiting"
        assert pending is not None and [r.request.tool for r in pending] == ["refund"]
        assert (await store.get_run(run.run_id)).status == "waiting"


async def test_a_bot_that_stays_busy_still_starts_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "ADMIT_WAIT_MOST", 0.3)
    async with bot(tmp_path, f"sqlite:///{tmp_path / 'nodbot.db'}") as (service, _):
        hog = Hog()
        began = time.monotonic()
        try:
            run, _ = await service.begin_run("ledger", "refund o-1 5", "U0123LEADS")
        finally:
            await hog.stop()
        assert run.status == "waiting"
        assert time.monotonic() - began >= 0.3


async def test_new_runs_start_in_the_order_they_came(tmp_path: Path) -> None:
    async with bot(tmp_path, f"sqlite:///{tmp_path / 'nodbot.db'}") as (service, store):
        inputs = [f"refund o-{n} 5" for n in range(5)]
        runs = await asyncio.gather(*(service.start_run("ledger", i, "U0123LEADS") for i in inputs))
        assert all(run.status == "waiting" for run in runs)
        # One at a time through the gate, in order: each was made after the one before.
        made = [(await store.get_run(run.run_id)).created_at for run in runs]
        assert made == sorted(made) and len(set(made)) == len(made)


@pytest.mark.postgres
async def test_a_new_run_waits_while_every_connection_is_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "ADMIT_WAIT_MOST", 60.0)
    async with postgres_database() as url, bot(tmp_path, url) as (service, store):
        assert not store.backlogged
        pool = store._backend._pool  # type: ignore[union-attr]
        release = asyncio.Event()
        holding: list[asyncio.Event] = []

        async def hold() -> None:
            async with pool.acquire():
                holding[-1].set()
                await release.wait()

        holders = []
        for _ in range(pool._max_size):  # one after the other: each holds one connection
            holding.append(asyncio.Event())
            holders.append(asyncio.create_task(hold()))
            await asyncio.wait_for(holding[-1].wait(), timeout=10)
        assert store.backlogged
        start = asyncio.create_task(service.begin_run("ledger", "refund o-1 5", "U0123LEADS"))
        with pytest.raises(TimeoutError):  # it has not started within 0.3 s
            await asyncio.wait_for(asyncio.shield(start), timeout=0.3)
        assert service.counters["runs_started"] == 0
        release.set()
        await asyncio.gather(*holders)
        assert not store.backlogged
        run, _ = await start
        assert run.status == "waiting"
