"""An approved tool runs, and the database goes away while it runs, for longer than the
workers' lease: the run still finishes with the tool's own result, the review is finished,
and the refund ran once, whichever of two replicas ends up saving the run.

The worker that ran the tool tries its save while its claim holds, then keeps the result with
the consumed review and goes on trying; a replica that claims the run once the lease has run
out finds the call in flight, waits for that result (one lease), and answers the call with it.
On the code before this, the save gave up after the lease and the next step denied the call
("approval already used by a concurrent request") though the tool had run.

The outage is real (`ALLOW_CONNECTIONS false` and every session ended), and the bots are
`nodbot serve`, each in a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx
import pytest

from nodbot.core import SqlApprovalStore
from tests.bot.ledger_agent import config_yaml
from tests.bot.processes import nodbot_serve
from tests.bot.test_database_faults import HEADERS, TOKEN, administered, decide
from tests.support import eventually, postgres_database

pytestmark = pytest.mark.postgres

LEASE = 2.0
OUTAGE = 3 * LEASE
"""Seconds the database refuses every connection once the tool has started: longer than the
lease, so the save cannot be written while the claim holds."""


def config(tmp_path: Path, url: str, name: str) -> Path:
    path = tmp_path / f"{name}.yml"
    settings = f"server: {{host: 127.0.0.1, port: 0}}\nworkers: {{poll: 0.2, lease: {LEASE:g}s}}"
    path.write_text(config_yaml(url, settings=settings, token=TOKEN, self_approval=True))
    return path


async def test_a_result_survives_an_outage_longer_than_the_lease(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    gate = Path(f"{ledger}.go")
    environment = {"NODBOT_TEST_LEDGER": str(ledger)}
    async with (
        postgres_database() as url,
        administered(url) as database,
        nodbot_serve(config(tmp_path, url, "a"), **environment) as first,
        nodbot_serve(config(tmp_path, url, "b"), **environment),
        httpx.AsyncClient(base_url=first.url, timeout=30) as client,
    ):
        body = {"agent": "ledger", "input": "refund held-1 5"}
        started = (await client.post("/runs", json=body, headers=HEADERS)).json()
        run_id, approval_id = started["run_id"], started["pending"][0]["approval_id"]
        await decide(client, approval_id)

        async def tool_running() -> bool:
            return ledger.exists() and ledger.read_text().splitlines() == ["held-1 5.0"]

        await eventually(tool_running, "the approved refund started")
        await database.allow_connections(False)
        await database.terminate()
        await asyncio.to_thread(gate.touch)  # the tool returns now, with the database gone
        await asyncio.sleep(OUTAGE)  # the fault itself lasts this long: it is what is tested
        await database.allow_connections(True)

        async def finished() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"/runs/{run_id}", headers=HEADERS)
                return answer.status_code == 200 and answer.json()["status"] != "running"
            return False

        await eventually(finished, "the run ended once the database was back", within=60)
        run = (await client.get(f"/runs/{run_id}", headers=HEADERS)).json()
        assert run["status"] == "finished", run
        [result] = run["tool_results"]
        assert result["status"] == "ok", result
        assert json.loads(result["content"]) == {"result": "refunded 5.0 on held-1"}
        assert ledger.read_text().splitlines() == ["held-1 5.0"]  # it ran once

        async with SqlApprovalStore(url) as store:
            record = await store.get(approval_id)
            assert (record.status, record.finished, record.outcome) == ("approved", True, "ok")
            kinds = [event.kind for event in await store.events(approval_id)]
        assert kinds.count("consumed") == 1 and kinds.count("finished") == 1
        for bot in ("a", "b"):
            log = (tmp_path / f"{bot}.log").read_text()
            assert "never retrieved" not in log
            assert "approval already used by a concurrent request" not in log
