"""`POST /runs` and `POST /approvals` with an `Idempotency-Key`: a request sent again with
the same key makes nothing more, on SQLite and PostgreSQL, whether the first answer was lost
on its way (a proxy that drops it) or never given (the database cut off after the run was
written, a 503); the same key with another body is a 409; the Python client retries with one
key. The bot is served in-process over real HTTP; the faults are real connections and a real
PostgreSQL outage (`ALTER DATABASE ... ALLOW_CONNECTIONS false`, `pg_terminate_backend`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from nodbot.bot.serve import Served, serving
from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    SqlApprovalStore,
    ToolCall,
    ToolSpec,
)
from nodbot.core.client import ApprovalClient, ApprovalClientError, SyncApprovalClient
from nodbot.core.sqlstore.engine import normalize_url
from nodbot.core.store import IdempotencyKey, IdempotencyKeyUsed
from tests.bot.ledger_agent import tools as ledger_tools
from tests.bot.test_database_faults import Database, administered
from tests.core.store.conftest import database_url
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {
    "ana": "token-of-ana-0000000000",
    "bob": "token-of-bob-0000000000",
    "lead@example.com": "token-of-the-lead-00000",
}
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]

CUTS: list[Callable[[], Awaitable[None]]] = []
"""What the next model turn of the support agent does first (a test cutting the database)."""


class SupportChat:
    """Asks for a refund of 120 on the order the run's input ends with, then says it is done.
    A turn first runs the next of `CUTS`, when a test has put one there."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if CUTS:
            await CUTS.pop(0)()
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        [asked] = [m for m in messages if isinstance(m, HumanMessage)]
        order_id = asked.content.split()[-1]
        call = ToolCall(id="call_1", name="refund", arguments={"order_id": order_id, "amount": 120})
        return ChatResponse(tool_calls=[call])


support = Agent(SupportChat(), ledger_tools)

CONFIG = """
store: {{url: "{url}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: ana, token: {ana}, scopes: [runs:write, approvals:read, approvals:request]}}
    - {{name: bob, token: {bob}, scopes: [runs:write, approvals:read, approvals:request]}}
    - {{name: lead@example.com, token: {lead}, scopes: [approvals:read, approvals:decide]}}
agents:
  support: tests.bot.test_idempotency:support
external_tools: [send_email]
rules:
  - tool: refund
    reviewers: [lead@example.com]
  - tool: send_email
    reviewers: [lead@example.com]
"""


def auth(name: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {TOKENS[name]}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return headers


def start(order_id: str = "A-1001") -> dict[str, Any]:
    return {"agent": "support", "input": f"Refund order {order_id}"}


def email(call_id: str = "call_1", to: str = "ops@example.com") -> dict[str, Any]:
    return {
        "tool": "send_email",
        "arguments": {"to": to, "subject": "hello"},
        "run_id": "thread-7",
        "call_id": call_id,
    }


@dataclass
class Bot:
    served: Served
    url: str
    """The store's URL (with its password)."""
    http: httpx.AsyncClient

    async def count(self, table: str) -> int:
        """The rows of `table` in the bot's database."""
        engine = create_async_engine(normalize_url(self.url))
        try:
            async with engine.connect() as connection:
                found = await connection.scalar(text(f"SELECT count(*) FROM {table}"))
        finally:
            await engine.dispose()
        return int(found or 0)


@contextlib.asynccontextmanager
async def bot_on(url: str, tmp_path: Path) -> AsyncIterator[Bot]:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        CONFIG.format(
            url=url, ana=TOKENS["ana"], bob=TOKENS["bob"], lead=TOKENS["lead@example.com"]
        )
    )
    async with (
        serving(str(path)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        assert served.service.agents["support"] is support  # this module, not a copy of it
        yield Bot(served, url, http)


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # where tests.bot.* is imported from
    CUTS.clear()


@pytest.fixture(params=BACKENDS)
async def bot(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bot]:
    async with database_url(request.param, tmp_path) as url, bot_on(url, tmp_path) as served:
        yield served


# --- POST /runs ------------------------------------------------------------------------------


async def test_a_start_sent_again_with_its_key_makes_one_run(bot: Bot) -> None:
    first = await bot.http.post("/runs", json=start(), headers=auth("ana", "start-A-1001"))
    assert first.status_code == 201, first.text
    run = first.json()
    assert run["status"] == "waiting" and len(run["pending"]) == 1

    again = await bot.http.post("/runs", json=start(), headers=auth("ana", "start-A-1001"))
    assert again.status_code == 201, again.text
    assert again.json()["run_id"] == run["run_id"]
    assert again.json()["pending"] == run["pending"]  # the run as it is now: still waiting
    assert await bot.count("runs") == 1
    assert await bot.count("approvals") == 1

    # Keys are the token's own: another token's same key is another request.
    bobs = await bot.http.post("/runs", json=start(), headers=auth("bob", "start-A-1001"))
    assert bobs.status_code == 201 and bobs.json()["run_id"] != run["run_id"]
    # Without the header, nothing changed: each request starts a run.
    for _ in range(2):
        plain = await bot.http.post("/runs", json=start(), headers=auth("ana"))
        assert plain.status_code == 201
    assert await bot.count("runs") == 4


async def test_a_start_sent_again_answers_the_run_as_it_is_now(bot: Bot) -> None:
    key = "start-A-7"
    run = (await bot.http.post("/runs", json=start("A-7"), headers=auth("ana", key))).json()
    [pending] = run["pending"]
    decided = await bot.http.post(
        f"/approvals/{pending['approval_id']}/decide",
        json={"action": "approve"},
        headers=auth("lead@example.com"),
    )
    assert decided.status_code == 200, decided.text
    finished = await bot.http.get(f"/runs/{run['run_id']}?wait=20", headers=auth("ana"))
    assert finished.json()["status"] == "finished"

    again = await bot.http.post("/runs", json=start("A-7"), headers=auth("ana", key))
    assert again.status_code == 201
    assert again.json()["run_id"] == run["run_id"] and again.json()["status"] == "finished"
    assert again.json()["final_text"] == "done"
    assert await bot.count("runs") == 1


async def test_starts_sent_at_once_with_one_key_make_one_run(bot: Bot) -> None:
    answers = await asyncio.gather(
        *(bot.http.post("/runs", json=start(), headers=auth("ana", "at-once")) for _ in range(6))
    )
    assert {answer.status_code for answer in answers} == {201}
    assert len({answer.json()["run_id"] for answer in answers}) == 1
    assert await bot.count("runs") == 1
    assert await bot.count("approvals") == 1


async def test_a_key_sent_again_with_another_body_is_a_409_naming_the_header(bot: Bot) -> None:
    first = await bot.http.post("/runs", json=start("A-1"), headers=auth("ana", "k-1"))
    assert first.status_code == 201
    other = await bot.http.post("/runs", json=start("A-2"), headers=auth("ana", "k-1"))
    assert other.status_code == 409
    assert "Idempotency-Key" in other.json()["error"]
    assert other.json()["details"] == {"header": "Idempotency-Key", "key": "k-1"}

    asked = await bot.http.post("/approvals", json=email(), headers=auth("ana", "k-1"))
    assert asked.status_code == 201  # another route: another request
    other = await bot.http.post("/approvals", json=email("call_2"), headers=auth("ana", "k-1"))
    assert other.status_code == 409 and "Idempotency-Key" in other.json()["error"]
    assert await bot.count("runs") == 1 and await bot.count("approvals") == 2


@pytest.mark.parametrize(
    "headers",
    [
        [("Idempotency-Key", "x" * 201)],
        [("Idempotency-Key", "")],
        [("Idempotency-Key", "caf\xe9".encode("latin-1"))],
        [("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
    ],
    ids=["too-long", "empty", "not-ascii", "twice"],
)
async def test_a_malformed_key_is_a_400_naming_the_header(
    tmp_path: Path, headers: list[tuple[str, Any]]
) -> None:
    async with bot_on(f"sqlite:///{tmp_path / 'nodbot.db'}", tmp_path) as bot:
        for path, body in (("/runs", start()), ("/approvals", email())):
            answer = await bot.http.post(path, json=body, headers=[*auth("ana").items(), *headers])
            assert answer.status_code == 400, answer.text
            assert answer.json()["details"] == {"header": "Idempotency-Key"}
        assert await bot.count("runs") == 0 and await bot.count("approvals") == 0


# --- POST /approvals -------------------------------------------------------------------------


async def test_a_request_sent_again_with_its_key_answers_its_approval_even_once_consumed(
    bot: Bot,
) -> None:
    asked = await bot.http.post("/approvals", json=email(), headers=auth("ana", "ask-1"))
    assert asked.status_code == 201, asked.text
    approval_id = asked.json()["approval_id"]
    again = await bot.http.post("/approvals", json=email(), headers=auth("ana", "ask-1"))
    assert again.status_code == 200 and again.json()["approval_id"] == approval_id

    decided = await bot.http.post(
        f"/approvals/{approval_id}/decide",
        json={"action": "approve"},
        headers=auth("lead@example.com"),
    )
    assert decided.status_code == 200, decided.text
    taken = await bot.http.post(f"/approvals/{approval_id}/consume", headers=auth("ana"))
    assert taken.status_code == 200, taken.text

    # The call's record is history: without the key the same call is a new review...
    repeat = await bot.http.post("/approvals", json=email(), headers=auth("ana", "ask-1"))
    assert repeat.status_code == 200 and repeat.json()["approval_id"] == approval_id
    assert repeat.json()["status"] == "approved" and repeat.json()["consumed"] is True
    assert await bot.count("approvals") == 1
    replayed = await bot.http.post("/approvals", json=email(), headers=auth("ana"))
    assert replayed.status_code == 201 and replayed.json()["approval_id"] != approval_id
    # ...and a key sent first with an active record names that record from then on.
    named = await bot.http.post("/approvals", json=email(), headers=auth("ana", "ask-2"))
    assert named.status_code == 200
    assert named.json()["approval_id"] == replayed.json()["approval_id"]
    assert await bot.count("idempotency_keys") == 2


async def test_requests_sent_at_once_with_one_key_make_one_approval(bot: Bot) -> None:
    answers = await asyncio.gather(
        *(bot.http.post("/approvals", json=email(), headers=auth("ana", "k")) for _ in range(6))
    )
    assert {answer.status_code for answer in answers} <= {200, 201}
    assert len({answer.json()["approval_id"] for answer in answers}) == 1
    assert await bot.count("approvals") == 1


# --- lost answers: a proxy that drops them, a database cut off -------------------------------


class LosingProxy:
    """A loopback TCP proxy to the bot that loses the answers of its first `lose`
    connections: their requests reach the bot, and once the bot's answer has begun (the work
    is done) the proxy closes the client's connection without relaying it. `before` is
    awaited before an answer with a status among its keys is relayed."""

    def __init__(
        self,
        bot_url: str,
        *,
        lose: int = 1,
        before: dict[int, Callable[[], Awaitable[None]]] | None = None,
    ) -> None:
        self.port = int(bot_url.rsplit(":", 1)[1])
        self.lose = lose
        self.before = before or {}
        self.sent: list[bytes] = []
        """What clients sent, per connection."""
        self.url = ""

    @property
    def keys(self) -> list[str]:
        """The Idempotency-Key of each request forwarded, in order."""
        found = (re.findall(rb"(?im)^idempotency-key: *([^\r\n]*)", each) for each in self.sent)
        return [key.decode() for keys in found for key in keys]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LosingProxy]:
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()

    async def _connection(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        losing = self.lose > 0
        self.lose -= losing
        bot_in, bot_out = await asyncio.open_connection("127.0.0.1", self.port)
        index = len(self.sent)
        self.sent.append(b"")
        requests = asyncio.create_task(self._requests(client_in, bot_out, index))
        try:
            while data := await bot_in.read(65536):
                if losing:
                    return  # the answer has begun: the client never sees it
                status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
                if status in self.before:
                    await self.before.pop(status)()
                client_out.write(data)
                await client_out.drain()
        finally:
            requests.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await requests
            for writer in (client_out, bot_out):
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def _requests(
        self, client_in: asyncio.StreamReader, bot_out: asyncio.StreamWriter, index: int
    ) -> None:
        while data := await client_in.read(65536):
            self.sent[index] += data
            bot_out.write(data)
            await bot_out.drain()
        bot_out.close()


async def test_the_client_sends_a_start_whose_answer_was_lost_again_with_its_key(
    bot: Bot,
) -> None:
    proxy = LosingProxy(bot.served.url)
    async with (
        proxy.running(),
        ApprovalClient(proxy.url, token=TOKENS["ana"]) as nodbot,
    ):
        run = await nodbot.start_run("support", "Refund order A-1001")
    assert run.status == "waiting" and [each.tool for each in run.pending] == ["refund"]
    [first, second] = proxy.keys  # sent twice, with one key
    assert first == second and len(first) >= 32
    assert await bot.count("runs") == 1  # the first try's run, answered to the second
    shown = await bot.http.get(f"/runs/{run.run_id}", headers=auth("ana"))
    assert shown.json()["pending"][0]["approval_id"] == run.pending[0].approval_id


async def test_the_sync_client_sends_a_request_whose_answer_was_lost_again_with_its_key(
    bot: Bot,
) -> None:
    proxy = LosingProxy(bot.served.url)
    async with proxy.running():

        def ask() -> str:
            with SyncApprovalClient(proxy.url, token=TOKENS["ana"]) as nodbot:
                return nodbot.request(**email()).approval_id

        approval_id = await asyncio.to_thread(ask)
    [first, second] = proxy.keys
    assert first == second
    assert await bot.count("approvals") == 1
    assert await bot.count("idempotency_keys") == 1
    shown = await bot.http.get(f"/approvals/{approval_id}", headers=auth("ana"))
    assert shown.json()["status"] == "pending"


async def test_a_client_that_tries_once_reports_the_lost_answer(bot: Bot) -> None:
    proxy = LosingProxy(bot.served.url)
    async with (
        proxy.running(),
        ApprovalClient(proxy.url, token=TOKENS["ana"]) as nodbot,
    ):
        with pytest.raises(ApprovalClientError) as lost:
            await nodbot.start_run("support", "Refund order A-1001", tries=1)
    assert lost.value.status == 0 and "could not be reached" in str(lost.value)
    assert len(proxy.keys) == 1
    assert await bot.count("runs") == 1  # started all the same: a retry would have said which


def cut_off(database: Database) -> Callable[[], Awaitable[None]]:
    """Refuse new connections to the database and end the ones it has."""

    async def cut() -> None:
        await database.allow_connections(False)
        await database.terminate()

    return cut


@pytest.mark.postgres
async def test_a_start_answered_503_after_its_run_was_written_is_found_by_its_retry(
    tmp_path: Path,
) -> None:
    async with (
        database_url("postgresql", tmp_path) as url,
        administered(url) as database,
        bot_on(url, tmp_path) as bot,
    ):
        # The run and its key are written; then, in its first step, the database goes away.
        CUTS.append(cut_off(database))
        lost = await bot.http.post("/runs", json=start(), headers=auth("ana", "outage"))
        assert lost.status_code == 503, lost.text
        assert CUTS == []
        failed = await bot.http.post("/runs", json=start(), headers=auth("ana", "outage"))
        assert failed.status_code == 503  # the key cannot be looked up: nothing is started

        await database.allow_connections(True)
        assert await bot.count("runs") == 1  # written before the cut, with its key
        found = await bot.http.post("/runs", json=start(), headers=auth("ana", "outage"))
        assert found.status_code == 201, found.text
        run_id = found.json()["run_id"]
        assert await bot.count("runs") == 1

        async def waiting() -> bool:  # the workers take the step on again
            shown = (await bot.http.get(f"/runs/{run_id}", headers=auth("ana"))).json()
            return bool(shown["status"] == "waiting" and shown["pending"])

        await eventually(waiting, "the run waiting for its review", within=30)
        assert await bot.count("approvals") == 1


@pytest.mark.postgres
async def test_the_client_retries_a_503_with_its_key_once_the_database_is_back(
    tmp_path: Path,
) -> None:
    async with (
        database_url("postgresql", tmp_path) as url,
        administered(url) as database,
        bot_on(url, tmp_path) as bot,
    ):
        CUTS.append(cut_off(database))

        written: list[int] = []

        async def back() -> None:
            await database.allow_connections(True)
            written.append(await bot.count("runs"))  # before the client hears of the 503

        proxy = LosingProxy(bot.served.url, lose=0, before={503: back})
        async with (
            proxy.running(),
            ApprovalClient(proxy.url, token=TOKENS["ana"]) as nodbot,
        ):
            run = await nodbot.start_run("support", "Refund order A-1001")
        assert len(set(proxy.keys)) == 1 and len(proxy.keys) >= 2
        assert written == [1] and await bot.count("runs") == 1
        shown = await bot.http.get(f"/runs/{run.run_id}", headers=auth("ana"))
        assert shown.status_code == 200


# --- keys kept a day -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_keys_are_kept_a_day_then_pruned_by_a_later_keyed_write(
    backend: str, tmp_path: Path
) -> None:
    now = [datetime(2026, 12, 5, 9, 0, tzinfo=UTC)]
    key = IdempotencyKey(token_name="ana", route="POST /runs", key="k", body_digest="d")
    async with (
        database_url(backend, tmp_path) as url,
        SqlApprovalStore(url, clock=lambda: now[0]) as store,
    ):
        run = await store.create_run(agent="a", messages=[], worker="w", idempotency=key)
        with pytest.raises(IdempotencyKeyUsed) as used:
            await store.create_run(agent="a", messages=[], worker="w", idempotency=key)
        assert used.value.kept is not None and used.value.kept.target_id == run.run_id

        now[0] += timedelta(hours=23)
        other = IdempotencyKey(token_name="ana", route="POST /runs", key="k2", body_digest="d")
        await store.create_run(agent="a", messages=[], worker="w", idempotency=other)
        assert await store.find_key(key) is not None  # less than a day old

        now[0] += timedelta(hours=2)
        again = await store.create_run(agent="a", messages=[], worker="w", idempotency=key)
        assert again.run_id != run.run_id  # pruned first: the key is new again
        kept = await store.find_key(key)
        assert kept is not None and kept.target_id == again.run_id
        assert await store.find_key(other) is not None


# --- the docs ------------------------------------------------------------------------------


def readme_section() -> str:
    readme = (ROOT / "docs" / "api.md").read_text()
    return readme.split("### Idempotent starts and requests\n", 1)[1].split("\n### ", 1)[0]


def curl_requests(block: str, url: str, environment: dict[str, str]) -> list[dict[str, Any]]:
    """The curl commands of a shell block as httpx request arguments."""
    commands = block.replace("\\\n", " ").splitlines()
    found = []
    for command in commands:
        command = command.split("  #", 1)[0]
        for name, value in environment.items():
            command = command.replace(f"${name}", value)
        words = shlex.split(command)
        assert words[0] == "curl", command
        request: dict[str, Any] = {"method": "GET", "headers": {}}
        rest = iter(words[1:])
        for word in rest:
            if word == "-X":
                request["method"] = next(rest)
            elif word == "-H":
                name, _, value = next(rest).partition(": ")
                request["headers"][name] = value
            elif word == "-d":
                request["content"] = next(rest)
            elif word != "-s":
                request["url"] = word.replace("localhost:8080", url)
        found.append(request)
    return found


async def test_the_readme_examples_start_one_run(bot: Bot, monkeypatch: pytest.MonkeyPatch) -> None:
    section = readme_section()
    [shell] = re.findall(r"```sh\n(.*?)```", section, re.S)
    requests = curl_requests(shell, bot.served.url, {"NODBOT_TOKEN_ANA": TOKENS["ana"]})
    assert len(requests) == 2 and all("Idempotency-Key" in r["headers"] for r in requests)
    answers = [await bot.http.request(**request) for request in requests]
    assert [answer.status_code for answer in answers] == [201, 201]
    assert answers[0].json()["run_id"] == answers[1].json()["run_id"]
    assert await bot.count("runs") == 1

    [python] = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.setenv("NODBOT_TOKEN", TOKENS["ana"])
    code = python.replace("http://127.0.0.1:8080", bot.served.url)
    namespace: dict[str, Any] = {"ApprovalClient": ApprovalClient, "os": __import__("os")}
    exec(f"async def example():\n{textwrap.indent(code, '    ')}", namespace)
    await namespace["example"]()
    assert await bot.count("runs") == 2
