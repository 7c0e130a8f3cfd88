"""Two bots on one PostgreSQL database through a network that breaks: 200 approvals decided
while a proxy drops and stalls the bots' connections at random and refuses new ones now
and then, and the server ends every session of the database every few seconds. Once the
faults stop and everything settles: every approved refund ran exactly once and no denied
one ran, every run finished (its tool's result what the reviewer decided), no review is
left approved but unfinished, no delivery is left due, every review was posted to the
webhook once when it opened and once when it was decided, the clients never saw a 500 (a
503 is theirs to retry), and neither bot's stderr shows an error nobody looked at or a
connection whose protocol was broken.

Everything runs as in production: each bot is `nodbot serve` in a process of its own, the
webhook receiver is another, the database is the real server, and the faults happen at the
network (`tests/fakes/pgproxy.py`, between both bots and the server, seeded). The workers'
lease is 5 s; stalls mostly last 0.2-2 s, a few last 5.5-8 s, longer than the lease.

The figures (faults injected, wall time, the client's retries, the statuses it saw) are
printed at the end (`pytest -s` shows them); on a failure, every problem found is listed,
and the database's rows are left in `database.json` beside the bots' logs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from tests.bot.ledger_agent import config_yaml
from tests.bot.processes import nodbot_serve
from tests.bot.webhook_receiver import SECRET
from tests.fakes.pgproxy import Chaos, FaultProxy, proxying
from tests.support import eventually, postgres_database

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-lead-00000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
APPROVALS = 200
AT_ONCE = 16
"""Approvals under way at once (started, not yet decided)."""
SEED = 20260612
CHAOS = Chaos(gap=0.05)
"""About twenty faults a second over the two bots' 20-odd connections."""
TERMINATE_EVERY = 3.0
"""Seconds between two terminations of every session of the database, on average."""
SETTLE = 70.0
"""Seconds the bots have to finish what was under way when the faults stopped."""
BROKEN = ("Task exception was never retrieved", "cannot switch to state")
"""What neither bot's stderr may show."""
TOLD = "SessionEnded: the server ended the session between two statements"
"""The protocol's refusal as the pool tells it (`core.sqlstore.pool`: the server ended the
session inside a transaction, a lost connection, a 503 to retry): its message quotes the
refusal, and is no broken protocol."""


def denied(order_id: str) -> bool:
    """Whether the test denies the refund of `order_id` (`o-<n>-<try>`): one in five."""
    return int(order_id.split("-")[1]) % 5 == 4


def config(tmp_path: Path, url: str, name: str, hook: str) -> Path:
    path = tmp_path / f"{name}.yml"
    settings = (
        f"webhooks: [{{name: ops, url: '{hook}', secret: {SECRET}}}]\n"
        "server: {host: 127.0.0.1, port: 0}\n"
        "workers: {lease: 5s}"
    )
    path.write_text(config_yaml(url, settings=settings, token=TOKEN, self_approval=True))
    return path


# The webhook receiver, in a process of its own.


def serve_receiver() -> None:
    """Serve `tests.bot.webhook_receiver`'s receiver, with what it received at
    `GET /received`; print its URL, then serve until interrupted."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tests.bot.webhook_receiver import Receiver

    async def main() -> None:
        receiver = Receiver()

        async def received(_: Request) -> JSONResponse:
            return JSONResponse(
                [
                    [r.event, r.body["approval"]["approval_id"], r.delivery, r.signed]
                    for r in receiver.received
                ]
            )

        routes = [
            Route("/hook", receiver.handle, methods=["POST"]),
            Route("/received", received, methods=["GET"]),
        ]
        config = uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=0)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            assert not task.done(), "the receiver did not start"
            await asyncio.sleep(0.01)
        print(f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", flush=True)
        await task

    asyncio.run(main())


@contextlib.asynccontextmanager
async def receiver_process(log: Path) -> AsyncIterator[str]:
    """The receiver's base URL, served by a process of its own."""
    code = "from tests.bot.test_fault_injection import serve_receiver; serve_receiver()"
    with log.open("w") as stderr:
        process = await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, "-c", code],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert process.stdout is not None
            line = await asyncio.to_thread(process.stdout.readline)
            assert line.startswith("http://127.0.0.1:"), f"the receiver did not start: {log}"
            yield line.strip()
        finally:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


# The client: a person's tool deciding through the API, retrying what the bots say to.


@dataclass
class Client:
    """Requests to the bots, retried after a 503 or a lost connection; what they saw."""

    bots: list[httpx.AsyncClient]
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    """Every answer's status, first tries and retries."""
    retries: int = 0
    transport_errors: int = 0
    surprises: list[str] = field(default_factory=list)
    """Answers a client would not expect (a 500, a 4xx on a first try)."""

    async def call(self, bot: int, method: str, path: str, body: Any = None) -> httpx.Response:
        """The first answer that is neither a 503 nor a lost connection (tried on the bots
        in turn, from `bot`); every try counted."""
        for attempt in range(400):
            client = self.bots[(bot + attempt) % len(self.bots)]
            if attempt:
                self.retries += 1
                await asyncio.sleep(min(0.05 * attempt, 0.5))  # a client's backoff
            try:
                answer = await client.request(method, path, json=body, headers=HEADERS)
            except httpx.TransportError:
                self.transport_errors += 1
                continue
            self.statuses[answer.status_code] += 1
            if answer.status_code >= 500:
                if answer.status_code != 503:
                    self.surprises.append(f"{method} {path}: {answer.status_code} {answer.text}")
                continue
            return answer
        raise AssertionError(f"{method} {path} got no answer but 5xx in 400 tries")

    async def start(self, number: int) -> None:
        """Start a run asking to refund order o-<number>-<try>: a start that failed may have
        started its run all the same, so each try asks for another order (the run a failed
        try started is found and decided by `decide_pending`)."""
        for attempt in range(100):
            order_id = f"o-{number}-{attempt}"
            body = {"agent": "ledger", "input": f"refund {order_id} {number + 1}"}
            try:
                answer = await self.bots[number % 2].post("/runs", json=body, headers=HEADERS)
            except httpx.TransportError:
                self.transport_errors += 1
                self.retries += 1
                continue
            self.statuses[answer.status_code] += 1
            if answer.status_code == 201:
                await self.decide_run(number + 1, answer.json())
                return
            if answer.status_code != 503:
                self.surprises.append(f"POST /runs: {answer.status_code} {answer.text}")
            self.retries += 1
            await asyncio.sleep(min(0.05 * (attempt + 1), 0.5))
        raise AssertionError(f"the run of o-{number} could not be started")

    async def decide_run(self, bot: int, run: dict[str, Any]) -> None:
        """Decide the review `run` waits for, on the bot that did not start it."""
        while not run["pending"] and run["status"] not in ("finished", "failed"):
            run = (await self.call(bot, "GET", f"/runs/{run['run_id']}?wait=5")).json()
        for approval in run["pending"]:
            await self.decide(bot, approval)

    async def decide(self, bot: int, approval: dict[str, Any]) -> None:
        order_id = approval["arguments"]["order_id"]
        if denied(order_id):
            body = {"action": "deny", "reason": "not this one"}
        else:
            body = {"action": "approve"}
        path = f"/approvals/{approval['approval_id']}/decide"
        tries = self.retries + self.transport_errors
        answer = await self.call(bot, "POST", path, body)
        # A 409 after a retry: an earlier try was recorded and its answer lost.
        retried = self.retries + self.transport_errors > tries
        if answer.status_code != 200 and not (answer.status_code == 409 and retried):
            self.surprises.append(f"POST {path}: {answer.status_code} {answer.text}")

    async def decide_pending(self) -> int:
        """Decide every review left pending (runs started by a start that failed); how many."""
        answer = await self.call(0, "GET", "/approvals?status=pending&limit=500")
        pending = answer.json()
        for approval in pending:
            await self.decide(1, approval)
        return len(pending)


async def terminating(admin: asyncpg.Connection, database: str, ended: list[int]) -> None:
    """End every session of `database` (its server says goodbye to each, as in a restart)
    every `TERMINATE_EVERY` seconds on average, until cancelled; how many each time is
    appended to `ended`."""
    chosen = random.Random(SEED)
    while True:
        await asyncio.sleep(chosen.expovariate(1 / TERMINATE_EVERY))
        sessions = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
        ended.append(len(sessions))


# What the database says once things settle.


async def unsettled(admin: asyncpg.Connection) -> dict[str, int]:
    """What is not done yet: runs, reviews and deliveries still under way."""
    counts = {
        "runs running or waiting": "SELECT count(*) FROM runs "
        "WHERE status IN ('running', 'waiting')",
        "reviews pending": "SELECT count(*) FROM approvals WHERE status = 'pending'",
        "reviews approved, unfinished": "SELECT count(*) FROM approvals "
        "WHERE status = 'approved' AND finished_at IS NULL",
        "deliveries due": "SELECT count(*) FROM deliveries WHERE status = 'due'",
        # A review decided a moment ago may not have its outcome announced yet (the outbox
        # lane does it after the decision's commit): its delivery is to come.
        "reviews decided, outcome not yet announced": "SELECT count(*) FROM approvals a "
        "WHERE a.status <> 'pending' AND NOT EXISTS (SELECT 1 FROM deliveries d "
        "WHERE d.approval_id = a.approval_id AND d.kind = 'outcome')",
    }
    found = {what: int(await admin.fetchval(query)) for what, query in counts.items()}
    return {what: count for what, count in found.items() if count}


async def dump(admin: asyncpg.Connection, path: Path) -> None:
    """Write the rows of runs, reviews, their events and deliveries to `path` (JSON), for
    whoever looks into a failure once the test's database is dropped."""
    tables = {
        "runs": "SELECT run_id, status, version, claimed_by, lease_until, created_at, "
        "updated_at, error FROM runs ORDER BY seq",
        "approvals": "SELECT approval_id, run_id, status, arguments, decision, created_at, "
        "decided_at, consumed_at, finished_at, outcome FROM approvals ORDER BY seq",
        "events": "SELECT approval_id, kind, at, actor, detail FROM events ORDER BY seq",
        "deliveries": "SELECT * FROM deliveries ORDER BY seq",
    }
    rows = {name: [dict(row) for row in await admin.fetch(query)] for name, query in tables.items()}
    path.write_text(json.dumps(rows, default=str, indent=1))  # noqa: ASYNC240 (a failure's)


async def received(client: httpx.AsyncClient) -> list[list[Any]]:
    answer = await client.get("/received")
    answer.raise_for_status()
    found: list[list[Any]] = answer.json()
    return found


def figures(proxy: FaultProxy, client: Client, seconds: float) -> str:
    faults = proxy.faults
    return (
        f"{APPROVALS} approvals in {seconds:.1f} s; faults: {faults.drops} drops, "
        f"{faults.stalls} stalls ({faults.long_stalls} longer than the lease, "
        f"{faults.stalled:.0f} s in all), {faults.refusals} refusals ({faults.refused} "
        f"connections refused), over {faults.connections} connections; client: "
        f"{client.retries} retries, {client.transport_errors} lost connections, "
        f"statuses {dict(sorted(client.statuses.items()))}"
    )


@pytest.mark.postgres
async def test_two_replicas_through_a_network_that_breaks(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    began = time.monotonic()
    async with postgres_database() as url, contextlib.AsyncExitStack() as stack:
        address = urlsplit(url)
        assert address.hostname is not None and address.port is not None
        proxy = await stack.enter_async_context(proxying(address.hostname, address.port, seed=SEED))
        hook = await stack.enter_async_context(receiver_process(tmp_path / "receiver.log"))
        bots = [
            await stack.enter_async_context(
                nodbot_serve(
                    config(tmp_path, proxy.url(url), name, f"{hook}/hook"),
                    NODBOT_TEST_LEDGER=str(ledger),
                )
            )
            for name in ("a", "b")
        ]
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=bot.url, timeout=30))
            for bot in bots
        ]
        hooks = await stack.enter_async_context(httpx.AsyncClient(base_url=hook))
        admin = await asyncpg.connect(url)  # the test's own look, not through the proxy
        stack.push_async_callback(admin.close)
        client = Client(clients)
        ended: list[int] = []  # sessions terminated, a count per round

        # Faults all along: while runs start, reviews open and decisions land.
        chaos = asyncio.create_task(proxy.inject(CHAOS))
        terminator = asyncio.create_task(terminating(admin, address.path.lstrip("/"), ended))
        slots = asyncio.Semaphore(AT_ONCE)

        async def approval(number: int) -> None:
            async with slots:
                await client.start(number)

        try:
            await asyncio.gather(*(approval(number) for number in range(APPROVALS)))
        finally:
            for task in (chaos, terminator):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            proxy.heal()
        decided = time.monotonic()

        # Settled: what was under way when the faults stopped ends, by itself but for the
        # reviews of runs whose start failed after starting them, which a person decides.
        async def settled() -> bool:
            left = await unsettled(admin)
            if left.get("reviews pending"):
                await client.decide_pending()
            return not left

        problems: list[str] = []
        try:
            await eventually(settled, "settled", within=SETTLE, every=0.5)
        except AssertionError:
            problems.append(f"not settled within {SETTLE:.0f} s: {await unsettled(admin)}")
        seconds = time.monotonic() - began
        print(
            f"\n{figures(proxy, client, seconds)}; {sum(ended)} sessions terminated in "
            f"{len(ended)} rounds; settled in {time.monotonic() - decided:.1f} s"
        )
        await dump(admin, tmp_path / "database.json")
        reviews = await admin.fetch("SELECT * FROM approvals ORDER BY seq")
        runs = {r["run_id"]: r for r in await admin.fetch("SELECT * FROM runs")}
        deliveries = await admin.fetch("SELECT * FROM deliveries WHERE status <> 'sent'")
        # Once nothing is due, nothing is sent again: a repeat would have arrived by now.
        posted = await received(hooks)

    problems += checked(reviews, runs, ledger.read_text().splitlines(), posted)
    problems += [f"delivery not sent: {dict(row)}" for row in deliveries]
    problems += [f"the client saw {surprise}" for surprise in client.surprises]
    for name in ("a", "b"):
        stderr = (tmp_path / f"{name}.log").read_text()
        problems += [
            f"bot {name} wrote {line[:300]}"
            for line in stderr.splitlines()
            if any(broken in line for broken in BROKEN) and TOLD not in line
        ]
    # All at once: a run of this test is long, and each problem tells about the others.
    assert not problems, (
        f"{len(problems)} problems (the database's rows in {tmp_path / 'database.json'}, "
        f"the bots' logs beside it):\n" + "\n".join(problems)
    )


def checked(
    reviews: list[asyncpg.Record],
    runs: dict[str, asyncpg.Record],
    ledger: list[str],
    posted: list[list[Any]],
) -> list[str]:
    """What is wrong with the outcome: runs not finished, calls reviewed more than once,
    reviews not decided as asked, refunds run other than once if approved (or at all if
    denied), results that are not what was decided, reviews posted other than once."""
    problems = []
    orders = {r["approval_id"]: json.loads(r["arguments"])["order_id"] for r in reviews}
    per_run = collections.defaultdict(list)
    for review in reviews:
        per_run[review["run_id"]].append(review)
    ran = collections.Counter(line.split()[0] for line in ledger)
    problems += [
        f"refund of {order} ran with no review" for order in set(ran) - set(orders.values())
    ]
    problems += [
        f"run {run_id} {run['status']}"
        for run_id, run in runs.items()
        if run["status"] != "finished"
    ]
    for run_id, asked in per_run.items():
        said = [(r["approval_id"], orders[r["approval_id"]], r["status"]) for r in asked]
        if len(asked) != 1:
            problems.append(f"run {run_id}: its call reviewed {len(asked)} times: {said}")
        for review in asked:
            approval_id, order = review["approval_id"], orders[review["approval_id"]]
            wanted = "denied" if denied(order) else "approved"
            if review["status"] != wanted:
                problems.append(f"review {approval_id} ({order}): {review['status']}, not {wanted}")
            if review["status"] == "approved" and review["finished_at"] is None:
                problems.append(f"review {approval_id} ({order}): approved, never finished")
        # The run's last review says what happened to its call.
        last = asked[-1]
        order = orders[last["approval_id"]]
        once = last["status"] == "approved"
        if ran[order] != once:
            problems.append(f"run {run_id} {said}: its refund ran {ran[order]} times")
        messages = json.loads(runs[run_id]["messages"]) if run_id in runs else []
        results = [m["status"] for m in messages if m["role"] == "tool"]
        if results != ["ok" if once else "error"]:
            problems.append(f"run {run_id} {said}: its tool results {results}")
    times_posted = collections.Counter((event, approval_id) for event, approval_id, *_ in posted)
    for event in ("approval.pending", "approval.decided"):
        problems += [
            f"review {approval_id} ({orders[approval_id]}): {event} posted "
            f"{times_posted[event, approval_id]} times"
            for approval_id in orders
            if times_posted[event, approval_id] != 1
        ]
    problems += [f"a post not signed: {post}" for post in posted if not post[-1]]
    return problems
