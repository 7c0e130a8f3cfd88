"""The bot's PostgreSQL connections terminated while runs are decided, then the database
unreachable for a while: every run finishes, each refund runs once, `/healthz` and
`/readyz` say the bot is unhealthy while the database cannot be used, and once it is back a
decision made by another process wakes the bot (its LISTEN connection is made again).

The faults are real: `pg_terminate_backend` on every connection of the bot's database, and
`ALTER DATABASE ... ALLOW_CONNECTIONS false` to refuse new ones. The bot is `nodbot serve`
in a process of its own, polling only every 60 s, so that only its own retries and the
database's notices can move runs on in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from nodbot.core import Decision, SqlApprovalStore
from tests.bot.ledger_agent import config_yaml
from tests.bot.processes import nodbot_serve
from tests.support import eventually, postgres_database, postgres_server_url

TOKEN = "token-of-lead-00000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
RUNS = 20


def config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "bot.yml"
    settings = "server: {host: 127.0.0.1, port: 0}\nworkers: {poll: 60}"
    path.write_text(config_yaml(url, settings=settings, token=TOKEN, self_approval=True))
    return path


class Database:
    """The test database as its administrator sees it: terminate its sessions, shut it."""

    def __init__(self, admin: asyncpg.Connection, name: str) -> None:
        self.admin = admin
        self.name = name

    async def terminate(self) -> int:
        """End every session on the database; how many there were."""
        ended = await self.admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            self.name,
        )
        return len(ended)

    async def allow_connections(self, allowed: bool) -> None:
        await self.admin.execute(
            f'ALTER DATABASE "{self.name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}'
        )


@contextlib.asynccontextmanager
async def administered(url: str) -> AsyncIterator[Database]:
    server = postgres_server_url()
    assert server is not None
    admin = await asyncpg.connect(server)
    database = Database(admin, urlsplit(url).path.lstrip("/"))
    try:
        yield database
    finally:
        await database.allow_connections(True)
        await admin.close()


async def decide(client: httpx.AsyncClient, approval_id: str) -> None:
    """Approve as a client would through faults: again after a 503; a 409 then means the
    first try was recorded."""
    for _ in range(200):
        answer = await client.post(
            f"/approvals/{approval_id}/decide", json={"action": "approve"}, headers=HEADERS
        )
        if answer.status_code == 200 or (answer.status_code == 409 and _ > 0):
            return
        assert answer.status_code == 503, answer.text
        await asyncio.sleep(0.05)
    raise AssertionError(f"approval {approval_id} could not be decided")


async def status_of(client: httpx.AsyncClient, path: str) -> int:
    try:
        return (await client.get(path, timeout=5)).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.postgres
async def test_runs_finish_through_terminated_connections_and_an_outage(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    async with (
        postgres_database() as url,
        administered(url) as database,
        nodbot_serve(config(tmp_path, url), NODBOT_TEST_LEDGER=str(ledger)) as bot,
        httpx.AsyncClient(base_url=bot.url, timeout=30) as client,
    ):
        run_ids, approvals = [], []
        for number in range(RUNS):
            body = {"agent": "ledger", "input": f"refund o-{number} {number + 1}"}
            started = (await client.post("/runs", json=body, headers=HEADERS)).json()
            run_ids.append(started["run_id"])
            approvals.append(started["pending"][0]["approval_id"])

        # Half the decisions land while every connection of the bot is cut, again and again.
        terminated = 0
        stop = asyncio.Event()

        async def keep_terminating() -> None:
            nonlocal terminated
            while not stop.is_set():
                terminated += await database.terminate()
                await asyncio.sleep(0.1)

        cutter = asyncio.create_task(keep_terminating())
        try:
            await asyncio.gather(*(decide(client, a) for a in approvals[: RUNS // 2]))
            await asyncio.sleep(0.2)  # the workers take the decided runs on under the cuts
        finally:
            stop.set()
            await cutter
        assert terminated > 0

        # The rest are decided, then the database goes away while the workers take them on.
        await asyncio.gather(*(decide(client, a) for a in approvals[RUNS // 2 :]))
        await database.allow_connections(False)
        await database.terminate()

        async def unhealthy() -> bool:
            return await status_of(client, "/healthz") == 503

        await eventually(unhealthy, "/healthz unhealthy while the database is unreachable")
        assert await status_of(client, "/readyz") == 503
        health = (await client.get("/healthz")).json()
        assert health["status"] == "unavailable", health
        await database.allow_connections(True)

        async def healthy() -> bool:
            return await status_of(client, "/healthz") == 200

        await eventually(healthy, "/healthz healthy once the database is back", within=30)
        assert await status_of(client, "/readyz") == 200

        async def all_finished() -> bool:
            views = [(await client.get(f"/runs/{r}", headers=HEADERS)).json() for r in run_ids]
            assert not [v for v in views if v["status"] == "failed"], views
            return {v["status"] for v in views} == {"finished"}

        await eventually(all_finished, "every run finished", within=60)
        expected = sorted(f"o-{n} {float(n + 1)}" for n in range(RUNS))
        assert sorted(ledger.read_text().splitlines()) == expected  # each refund once

        # LISTEN is back: a decision recorded by another process wakes the bot at once
        # (it would otherwise wait for its 60 s poll).
        body = {"agent": "ledger", "input": "refund o-late 7"}
        late = (await client.post("/runs", json=body, headers=HEADERS)).json()
        async with SqlApprovalStore(url) as elsewhere:
            await elsewhere.vote(
                late["pending"][0]["approval_id"], Decision(approved=True, decided_by="U0123LEADS")
            )
        started = time.monotonic()

        async def refunded_late() -> bool:
            return "o-late 7.0" in ledger.read_text().splitlines()

        await eventually(refunded_late, "the late refund, woken by the database's notice")
        assert time.monotonic() - started < 10
