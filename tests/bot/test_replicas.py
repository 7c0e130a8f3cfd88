"""Two bots on one PostgreSQL database: every run is resumed by one of them, each refund
runs once, whichever bot started the run and whichever recorded the decision, and each
review is posted (to a webhook) once when it opens and once when it is decided. The two
bots are `nodbot serve` processes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import pytest

from nodbot.bot.serve import serving
from nodbot.core import Decision, SqlApprovalStore
from tests.bot import ledger_agent
from tests.bot.ledger_agent import config_yaml
from tests.bot.processes import nodbot_serve
from tests.bot.webhook_receiver import SECRET, receiving
from tests.support import eventually, postgres_database

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-lead-00000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
RUNS = 12


def config(tmp_path: Path, url: str, name: str, hook: str | None = None) -> Path:
    path = tmp_path / f"{name}.yml"
    webhooks = f"webhooks: [{{name: ops, url: '{hook}', secret: {SECRET}}}]" if hook else ""
    settings = f"{webhooks}\nserver: {{host: 127.0.0.1, port: 0}}"
    path.write_text(config_yaml(url, settings=settings, token=TOKEN, self_approval=True))
    return path


async def statuses(client: httpx.AsyncClient, run_ids: list[str]) -> list[str]:
    views = [(await client.get(f"/runs/{run_id}", headers=HEADERS)).json() for run_id in run_ids]
    return [view["status"] for view in views]


async def settled(store: SqlApprovalStore, approval_ids: list[str]) -> bool:
    """Whether every delivery of these reviews is done with (sent or given up)."""
    for approval_id in approval_ids:
        deliveries = await store.deliveries(approval_id)
        if not deliveries or any(d.status == "due" for d in deliveries):
            return False
    return True


@pytest.mark.postgres
async def test_two_replicas_resume_each_run_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"  # both bots' refunds, one line each
    async with (
        postgres_database() as url,
        receiving() as receiver,
        contextlib.AsyncExitStack() as stack,
    ):
        bots = [
            await stack.enter_async_context(
                nodbot_serve(
                    config(tmp_path, url, name, hook=receiver.url), NODBOT_TEST_LEDGER=str(ledger)
                )
            )
            for name in ("a", "b")
        ]
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=bot.url)) for bot in bots
        ]
        run_ids, approvals = [], []
        for number in range(RUNS):
            client = clients[number % 2]  # runs start on both bots
            body = {"agent": "ledger", "input": f"refund o-{number} {number + 1}"}
            started = (await client.post("/runs", json=body, headers=HEADERS)).json()
            run_ids.append(started["run_id"])
            approvals.append(started["pending"][0]["approval_id"])
        await asyncio.gather(  # and decisions land on the other one, all at once
            *(
                clients[(number + 1) % 2].post(
                    f"/approvals/{approval_id}/decide", json={"action": "approve"}, headers=HEADERS
                )
                for number, approval_id in enumerate(approvals)
            )
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if set(await statuses(clients[0], run_ids)) == {"finished"}:
                break
            await asyncio.sleep(0.05)
        assert set(await statuses(clients[0], run_ids)) == {"finished"}
        await receiver.wait_for(2 * RUNS)
        async with SqlApprovalStore(url) as store:
            # Once no delivery is due, none is sent again: a repeat would have arrived by now.
            await eventually(lambda: settled(store, approvals), "every webhook delivery")
        for event in ("approval.pending", "approval.decided"):
            posted = [r.body["approval"]["approval_id"] for r in receiver.events(event)]
            assert sorted(posted) == sorted(approvals), event
        assert all(r.signed for r in receiver.received)
    assert sorted(ledger.read_text().splitlines()) == sorted(
        f"o-{n} {float(n + 1)}" for n in range(RUNS)
    )


@pytest.mark.postgres
async def test_a_decision_made_elsewhere_wakes_the_bot_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    ledger_agent.RUNS.clear()
    async with postgres_database() as url:
        path = config(tmp_path, url, "slow")
        path.write_text(path.read_text() + "workers: {poll: 60}\n")  # polling would take 60 s
        async with serving(str(path)) as bot, httpx.AsyncClient(base_url=bot.url) as client:
            body = {"agent": "ledger", "input": "refund o-1 3"}
            run = (await client.post("/runs", json=body, headers=HEADERS)).json()
            approval_id = run["pending"][0]["approval_id"]
            async with SqlApprovalStore(url) as elsewhere:  # another process, say
                await elsewhere.vote(approval_id, Decision(approved=True, decided_by="U0123LEADS"))
            started = time.monotonic()
            while ledger_agent.RUNS != [("o-1", 3.0)]:
                assert time.monotonic() - started < 5, "the bot was not woken by the notice"
                await asyncio.sleep(0.01)


@pytest.mark.postgres
async def test_a_run_one_bot_finishes_ends_a_wait_on_another_at_once(tmp_path: Path) -> None:
    """A client behind a balancer asks one replica to wait for a run that another replica
    moves on: the wait answers when the run ends, not at the waiting bot's next look (60 s
    here, beyond the wait)."""
    ledger = tmp_path / "ledger.txt"
    async with (
        postgres_database() as url,
        contextlib.AsyncExitStack() as stack,
    ):
        bots = []
        for name in ("a", "b"):
            path = config(tmp_path, url, name)
            path.write_text(path.read_text() + "workers: {poll: 60}\n")
            bots.append(
                await stack.enter_async_context(nodbot_serve(path, NODBOT_TEST_LEDGER=str(ledger)))
            )
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=bot.url, timeout=60))
            for bot in bots
        ]
        body = {"agent": "ledger", "input": "refund held-1 3"}  # its refund waits for a file
        started = (await clients[0].post("/runs", json=body, headers=HEADERS)).json()
        run_id, approval_id = started["run_id"], started["pending"][0]["approval_id"]
        decided = await clients[0].post(
            f"/approvals/{approval_id}/decide", json={"action": "approve"}, headers=HEADERS
        )
        assert decided.status_code == 200, decided.text

        async def refunding() -> bool:
            return ledger.exists() and "held-1" in ledger.read_text()

        await eventually(refunding, "the refund to start")
        async with SqlApprovalStore(url) as store:  # the bot whose worker runs the refund
            running = await store.get_run(run_id)
        assert running.status == "running" and running.claimed_by is not None
        pids = [bot.process.pid for bot in bots]
        runner = pids.index(int(running.claimed_by.rsplit(":", 1)[1]))
        other = clients[1 - runner]
        waiting = asyncio.create_task(other.get(f"/runs/{run_id}?wait=40", headers=HEADERS))
        done, _ = await asyncio.wait([waiting], timeout=0.5)
        assert not done, "the wait answered while the refund ran"
        released = time.monotonic()
        (tmp_path / "ledger.txt.go").touch()
        answer = await waiting
        assert answer.json()["status"] == "finished"
        assert time.monotonic() - released < 10, "woken by its own look, not by the run's end"
