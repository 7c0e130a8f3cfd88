"""A run started over the API has the reviews its first step opened announced at once, in
the transaction of its first save (on SQLite), and delivered with the records that save
wrote, which are its answer's too, not read back (`BotService.begin_run`): the outbox lane
does not read what is unannounced for them, nor the runs lane look for ready runs. Without
workers (`nodbot runs start`) they are left to the lane of whoever runs the workers. A run's
view lists its pending reviews only when the run, as read, has any."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.config import Config, load_agents, load_config
from nodbot.bot.config.models import ApiToken
from nodbot.bot.http import create_app
from nodbot.bot.outbox import Moment
from nodbot.bot.service import BotService
from nodbot.core import (
    ApprovalRecord,
    ApprovalStatus,
    Decision,
    Delivery,
    NewDelivery,
    RunRecord,
    SqlApprovalStore,
)
from nodbot.core.outbox import Announcement, Stage
from tests.bot.ledger_agent import config_yaml
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t-reviewer-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REVIEWER_TOKEN = "t-other-reviewer-0123456789abcdef"
"""A reviewer's, who did not start the runs and may decide them over the API."""
REVIEWER = {"Authorization": f"Bearer {REVIEWER_TOKEN}"}


class Counted(SqlApprovalStore):
    """The SQL store, counting the reads the lanes and the views make through it."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.unannounced_reads = 0
        self.ready_claims = 0
        self.lists: list[tuple[str | None, str | None]] = []
        self.announced: list[str] = []
        self.reads: list[str] = []
        """The ids of the reviews and runs read one by one (`get`, `get_run`)."""

    async def get(self, approval_id: str) -> ApprovalRecord:
        self.reads.append(approval_id)
        return await super().get(approval_id)

    async def get_run(self, run_id: str) -> RunRecord:
        self.reads.append(run_id)
        return await super().get_run(run_id)

    async def announce(
        self,
        approval_id: str,
        stage: Stage | None,
        deliveries: Sequence[NewDelivery],
        *,
        worker: str | None = None,
        lease: float = 60.0,
    ) -> list[Delivery]:
        self.announced.append(approval_id)
        return await super().announce(approval_id, stage, deliveries, worker=worker, lease=lease)

    async def unannounced(self, *, limit: int = 100) -> list[Announcement]:
        self.unannounced_reads += 1
        return await super().unannounced(limit=limit)

    async def claim_ready(
        self, *, worker: str, lease: float = 300.0, limit: int = 10
    ) -> list[RunRecord]:
        self.ready_claims += 1
        return await super().claim_ready(worker=worker, lease=lease, limit=limit)

    async def list(
        self,
        *,
        run_id: str | None = None,
        status: ApprovalStatus | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[ApprovalRecord]:
        self.lists.append((run_id, status))
        return await super().list(
            run_id=run_id, status=status, limit=limit, newest_first=newest_first
        )


class Recording:
    """A channel that posts each review's request, and fails while `broken` is set."""

    name = "rec"
    answers = False
    makes_deliveries = False
    tells_outcomes = False

    def __init__(self) -> None:
        self.posted: list[str] = []
        self.broken = False

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        if self.broken:
            raise RuntimeError("the channel's bug")
        return [NewDelivery("request", "rec:ops")] if stage == "request" else []

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        self.posted.append(record.approval_id)
        return None

    async def close(self) -> None:
        return None


def write_config(tmp_path: Path) -> Config:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        config_yaml(f"sqlite:///{tmp_path / 'nodbot.db'}", settings="workers: {poll: 60}")
    )
    return load_config(path)


class Bot:
    def __init__(self, service: BotService, store: Counted, channel: Recording) -> None:
        self.service = service
        self.store = store
        self.channel = channel
        self.client: httpx.AsyncClient

    async def lanes_idle(self) -> None:
        """Until both lanes have made their first step (then they wait: `poll` is 60 s)."""

        async def stepped() -> bool:
            health = self.service.health
            return (
                health.stepped
                and self.store.unannounced_reads >= 1
                and self.store.ready_claims >= 1
                and not health.lanes
            )

        await eventually(stepped, "the lanes' first steps")

    async def start(self, order: str) -> dict[str, Any]:
        answer = await self.client.post(
            "/runs",
            json={"agent": "ledger", "input": f"refund {order} 5"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert answer.status_code == 201, answer.text
        run: dict[str, Any] = answer.json()
        return run


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)  # where tests.bot.ledger_agent is imported from
    config = write_config(tmp_path)
    agents, problems = load_agents(config)
    assert not problems
    channel = Recording()
    async with Counted(config.store.url) as store:
        service = BotService(config, store, agents, channels=[channel])
        tokens = [
            ApiToken(name="U0123LEADS", token=TOKEN, scopes=["runs:write", "approvals:read"]),
            ApiToken(name="U0777REVIEW", token=REVIEWER_TOKEN, scopes=["approvals:decide"]),
        ]
        app = create_app(store=store, registry=service.registry, tokens=tokens, service=service)
        stop = asyncio.Event()
        working = asyncio.create_task(service.work(stop))
        bot = Bot(service, store, channel)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bot"
        ) as bot.client:
            await bot.lanes_idle()
            yield bot
        stop.set()
        await working


async def test_a_new_runs_review_is_posted_without_reading_what_is_unannounced(bot: Bot) -> None:
    reads, claims = bot.store.unannounced_reads, bot.store.ready_claims
    lists = len(bot.store.lists)
    run = await bot.start("o-1")
    assert run["status"] == "waiting"
    [pending] = run["pending"]

    async def posted() -> bool:
        return bot.channel.posted == [pending["approval_id"]]

    await eventually(posted, "the new review posted")
    assert bot.store.unannounced_reads == reads  # announced with the record read for the view
    assert bot.store.announced == []  # announced in the transaction that wrote the run
    assert bot.store.ready_claims == claims  # a new run makes no run ready
    # No read of the reviews either: the answer and the post have them as the run's first
    # save wrote them.
    assert len(bot.store.lists) == lists
    assert (
        run["pending"]
        == (await bot.client.get(f"/runs/{run['run_id']}", headers=AUTH)).json()["pending"]
    )
    [delivery] = await bot.store.deliveries(pending["approval_id"])
    assert (delivery.status, delivery.attempts) == ("sent", 1)


async def test_a_review_that_cannot_be_announced_at_once_is_left_to_the_lane(bot: Bot) -> None:
    reads = bot.store.unannounced_reads
    bot.channel.broken = True
    run = await bot.start("o-2")
    [pending] = run["pending"]

    async def lane_tried() -> bool:
        return bot.store.unannounced_reads > reads and "outbox" in bot.service.health.lanes

    await eventually(lane_tried, "the outbox lane woken to announce it")
    assert bot.channel.posted == []
    bot.channel.broken = False
    bot.service.decided()  # any wake will do: the lane's next step announces what is left

    async def posted() -> bool:
        return bot.channel.posted == [pending["approval_id"]]

    await eventually(posted, "the review posted by the lane")


async def test_the_view_of_a_run_lists_its_reviews_only_while_some_are_pending(bot: Bot) -> None:
    run = await bot.start("o-3")
    [pending] = run["pending"]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    lists = len(bot.store.lists)
    waiting = (await bot.client.get(f"/runs/{run['run_id']}", headers=headers)).json()
    assert [each["approval_id"] for each in waiting["pending"]] == [pending["approval_id"]]
    assert bot.store.lists[lists:] == [(run["run_id"], "pending")]
    approve = Decision(approved=True, decided_by="U0123LEADS")
    await bot.store.decide(pending["approval_id"], approve, channel="api")
    bot.service.decided()
    finished = (
        await bot.client.get(f"/runs/{run['run_id']}", params={"wait": "10"}, headers=headers)
    ).json()
    assert finished["status"] == "finished" and finished["pending"] == []
    assert finished["tool_results"][0]["status"] == "ok"
    assert bot.store.lists[lists + 1 :] == []  # none pending as read: nothing listed


async def test_without_workers_a_new_runs_reviews_wait_for_the_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    config = write_config(tmp_path)
    agents, _ = load_agents(config)
    channel = Recording()
    async with Counted(config.store.url) as store:
        service = BotService(config, store, agents, channels=[channel])
        run, pending = await service.begin_run("ledger", "refund o-4 5", requested_by=None)
        assert run.status == "waiting" and pending is not None
        [review] = pending
        assert channel.posted == []
        [announcement] = await store.unannounced()  # left for the workers, unclaimed
        assert announcement.record.approval_id == review.approval_id
        assert await store.deliveries(review.approval_id) == []
        stop = asyncio.Event()
        working = asyncio.create_task(service.work(stop))

        async def posted() -> bool:
            return channel.posted == [review.approval_id]

        try:
            await eventually(posted, "the review posted once the workers run")
        finally:
            stop.set()
            await working


async def test_a_decision_and_a_wait_for_the_end_read_nothing_this_bot_knows(bot: Bot) -> None:
    run = await bot.start("o-6")
    [pending] = run["pending"]
    before = len(bot.store.reads)
    path = f"/approvals/{pending['approval_id']}/decide"
    decided = await bot.client.post(path, json={"action": "approve"}, headers=REVIEWER)
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "approved"
    # Authorized on the review as the store made it pending: its request never changes.
    assert bot.store.reads[before:] == []
    waited = await bot.client.get(f"/runs/{run['run_id']}", params={"wait": "10"}, headers=AUTH)
    finished = waited.json()
    assert finished["status"] == "finished" and finished["pending"] == []
    assert finished["tool_results"][0]["status"] == "ok"
    # The run read once, when the wait began; its end shown as the step that ended it saved it.
    assert bot.store.reads[before:] == [run["run_id"]]
    assert finished == (await bot.client.get(f"/runs/{run['run_id']}", headers=AUTH)).json()


async def test_a_review_decided_elsewhere_is_not_decided_again_over_the_api(bot: Bot) -> None:
    run = await bot.start("o-7")
    [pending] = run["pending"]
    async with SqlApprovalStore(bot.store.url) as other:  # another replica decides it first
        await other.decide(pending["approval_id"], Decision(approved=False, decided_by="U0999"))
    path = f"/approvals/{pending['approval_id']}/decide"
    answer = await bot.client.post(path, json={"action": "approve"}, headers=REVIEWER)
    assert answer.status_code == 409, answer.text
    assert "already decided by U0999" in answer.json()["error"]
    assert (await bot.store.get(pending["approval_id"])).status == "denied"
