"""`POST /approvals/decide`: several reviews approved or denied in one request, each one
authorized, recorded and answered on its own; over real HTTP (uvicorn on a loopback port,
httpx), on SQLite and PostgreSQL, with reviews made pending by a configuration's rules and
the bot's own authorizer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.bulk import MAX_ITEMS
from nodbot.bot.config import ApiToken, load_config
from nodbot.bot.http import create_app
from nodbot.bot.http.approvals import STARTS_FOR_OTHERS_REASON
from nodbot.bot.http.schemas import BulkDecideView
from nodbot.bot.policy.authorize import NOT_A_REVIEWER, Verdict, authorizer_for
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rules_executor
from nodbot.core import (
    ApprovalRecord,
    Decision,
    Executor,
    SqlApprovalStore,
    ToolCall,
    ToolRegistry,
)
from nodbot.core.sqlstore.audit import verify
from tests.core.store.conftest import database_url
from tests.core.store.test_sql_errors import hold_write_lock
from tests.support import postgres_server_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
KEY = "the audit key of the bulk tests"
LEAD = "lead@example.com"
ANA = "ana@example.com"
CAROL = "carol@example.com"
FRONT = "front@example.com"
READER = "reader@example.com"

CONFIG = f"""
rules:
  - tool: refund
    reviewers: [{LEAD}, {ANA}, {FRONT}]
  - tool: send_email
    reviewers: [{ANA}]
  - tool: pay
    reviewers: [{LEAD}, {ANA}]
    approvals_required: 2
"""

SECRETS = {
    LEAD: "token-of-lead-000000",
    ANA: "token-of-ana-0000000",
    FRONT: "token-of-front-00000",
    READER: "token-of-reader-0000",
}
DECIDES = ["approvals:read", "approvals:decide"]
SCOPES = {
    LEAD: DECIDES,
    ANA: DECIDES,
    FRONT: [*DECIDES, "runs:write", "runs:write-as"],
    READER: ["approvals:read"],
}
EDITS = "edits are one at a time: use POST /approvals/{id}/decide"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


def registry() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        return f"refunded {amount} on {order_id}"

    @tools.tool
    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        return "sent"

    @tools.tool
    def pay(to: str, amount: float) -> str:
        """Pay someone."""
        return "paid"

    return tools


ARGUMENTS = {
    "refund": {"order_id": "o-7", "amount": 50.0},
    "send_email": {"to": "x@example.com", "subject": "hi"},
    "pay": {"to": "acme", "amount": 900.0},
}


@dataclass
class Bot:
    """A served API over a store, with the executor a run uses."""

    client: httpx.AsyncClient
    store: SqlApprovalStore
    executor: Executor
    url: str
    runs: itertools.count[int]

    async def pending(self, tool: str = "refund", *, requested_by: str = CAROL) -> str:
        """A call of a new run that the rules made wait for review: its approval id."""
        call = ToolCall(name=tool, arguments=ARGUMENTS[tool], id="c1")
        run_id = f"run_{next(self.runs)}"
        result = await self.executor.run_call(
            call, self.executor.context(run_id=run_id, requested_by=requested_by)
        )
        assert result.status == "pending" and result.error is not None, result
        return str(result.error.details["approval_id"])

    async def bulk(self, who: str, body: Any) -> httpx.Response:
        return await self.client.post("/approvals/decide", json=body, headers=auth(who))

    async def decide_many(
        self, who: str, ids: Sequence[str], action: str = "approve", **body: Any
    ) -> BulkDecideView:
        response = await self.bulk(who, {"approval_ids": list(ids), "action": action, **body})
        assert response.status_code == 200, response.text
        return BulkDecideView.model_validate(response.json())

    async def events(self, approval_id: str) -> list[tuple[str, str | None, str | None]]:
        return [(e.kind, e.actor, e.channel) for e in await self.store.events(approval_id)]

    async def all_events(self, ids: Sequence[str]) -> dict[str, list[Any]]:
        return {approval_id: await self.store.events(approval_id) for approval_id in ids}


Fault: TypeAlias = Callable[[ApprovalRecord], Awaitable[None]]
"""Something a test does once a review has been authorized, before it is recorded."""


@contextlib.asynccontextmanager
async def served(
    url: str, tmp_path: Path, *, fault: Fault | None = None, lock_timeout: float = 5.0
) -> AsyncIterator[Bot]:
    """The approvals API over a fresh store at `url`, authorized as `nodbot serve` does
    (and then, with `fault`, that done)."""
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG)
    config = load_config(path)
    tools = registry()
    tokens = [
        ApiToken.model_validate({"name": name, "token": secret, "scopes": SCOPES[name]})
        for name, secret in SECRETS.items()
    ]
    async with SqlApprovalStore(url, audit_key=KEY, lock_timeout=lock_timeout) as store:
        authorizer = authorizer_for(config, runs=store)

        async def authorize(handle: str, record: ApprovalRecord, decision: Decision) -> Verdict:
            verdict = await authorizer(handle, record, decision)
            if fault is not None:
                await fault(record)
            return verdict

        app = create_app(store=store, registry=tools, tokens=tokens, authorize_decision=authorize)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            for _ in range(500):  # bounded: at most 5 s
                if server.started or task.done():
                    break
                await asyncio.sleep(0.01)
            assert server.started, "uvicorn did not start"
            port = server.servers[0].sockets[0].getsockname()[1]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                executor = rules_executor(tools, config, store)
                yield Bot(client, store, executor, url, itertools.count(1))
        finally:
            server.should_exit = True
            await task


@contextlib.asynccontextmanager
async def bot_on(backend: str, tmp_path: Path) -> AsyncIterator[Bot]:
    async with database_url(backend, tmp_path) as url, served(url, tmp_path) as bot:
        yield bot


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    async with bot_on("sqlite", tmp_path) as found:
        yield found


# --- a mix of items ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_mix_is_answered_item_by_item_and_each_decision_recorded_on_its_own(
    backend: str, tmp_path: Path
) -> None:
    async with bot_on(backend, tmp_path) as bot:
        allowed = await bot.pending()
        own = await bot.pending(requested_by=LEAD)  # the lead's own run
        stranger = await bot.pending("send_email")  # the lead reviews no mail
        earlier = await bot.pending()
        quorum = await bot.pending("pay")
        last = await bot.pending()
        assert (await bot.decide_many(ANA, [earlier], "deny")).decided == 1
        before = await bot.all_events([earlier])
        unknown = "apr_unknown"
        order = [allowed, own, stranger, earlier, unknown, quorum, last]

        answer = await bot.decide_many(LEAD, order, reason="checked")

        assert [(r.approval_id, r.status) for r in answer.results] == [
            (allowed, "decided"),
            (own, "refused"),
            (stranger, "refused"),
            (earlier, "already_decided"),
            (unknown, "not_found"),
            (quorum, "decided"),
            (last, "decided"),
        ]
        errors = {r.approval_id: r.error for r in answer.results}
        assert errors == {
            allowed: None,
            own: SELF_APPROVAL_REASON,
            stranger: NOT_A_REVIEWER,
            earlier: f"this approval was already decided by {ANA}",
            unknown: "no approval has this id",
            quorum: None,
            last: None,
        }
        assert (answer.decided, answer.not_decided) == (3, 4)
        metrics = (await bot.client.get("/metrics")).text.splitlines()
        assert "nodbot_decisions_total 4" in metrics  # ana's deny first, then these three
        views = {r.approval_id: r.approval for r in answer.results}
        assert views[unknown] is None
        for approval_id in (allowed, last):
            view = views[approval_id]
            assert view is not None and view.status == "approved"
            assert view.decision is not None
            assert (view.decision.decided_by, view.decision.reason) == (LEAD, "checked")
            record = await bot.store.get(approval_id)
            assert record.decision is not None and record.decision.decided_by == LEAD
            events = await bot.store.events(approval_id)
            [decided] = [e for e in events if e.kind == "decided"]
            assert (decided.actor, decided.channel) == (LEAD, "api")
            assert decided.detail["evidence"] == {"token": LEAD}
        quorum_view = views[quorum]
        assert quorum_view is not None
        assert (quorum_view.status, quorum_view.approvals, quorum_view.approvals_required) == (
            "pending",
            1,
            2,
        )
        assert await bot.events(quorum) == [("created", CAROL, None), ("voted", LEAD, "api")]
        for approval_id, reason in ((own, SELF_APPROVAL_REASON), (stranger, NOT_A_REVIEWER)):
            assert (await bot.store.get(approval_id)).status == "pending"
            events = await bot.store.events(approval_id)
            assert [(e.kind, e.actor, e.channel) for e in events][1:] == [("refused", LEAD, "api")]
            assert events[-1].detail["reason"] == reason
        assert await bot.all_events([earlier]) == before  # nothing more on a decided review

        # A second reviewer's vote decides the quorum; the lead's second vote is refused.
        again = await bot.decide_many(LEAD, [quorum])
        assert [(r.status, r.error) for r in again.results] == [
            ("already_voted", "you have voted on this approval already")
        ]
        second = await bot.decide_many(ANA, [quorum])
        [item] = second.results
        assert item.status == "decided" and item.approval is not None
        assert (item.approval.status, item.approval.approvals) == ("approved", 2)

        report = await verify(bot.url, KEY)
    assert report.ok, report.problems
    assert report.reviews == 6


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_runs_write_as_token_may_deny_in_bulk_but_not_approve(
    backend: str, tmp_path: Path
) -> None:
    async with bot_on(backend, tmp_path) as bot:
        ids = [await bot.pending(), await bot.pending()]
        refused = await bot.decide_many(FRONT, ids, "approve")
        assert [(r.status, r.error) for r in refused.results] == [
            ("refused", STARTS_FOR_OTHERS_REASON)
        ] * 2
        for approval_id in ids:
            assert (await bot.store.get(approval_id)).status == "pending"
            assert (await bot.events(approval_id))[-1] == ("refused", FRONT, "api")
        denied = await bot.decide_many(FRONT, ids, "deny", reason="not today")
        assert [r.status for r in denied.results] == ["decided", "decided"]
        for approval_id in ids:
            record = await bot.store.get(approval_id)
            assert record.status == "denied" and record.decision is not None
            assert (record.decision.decided_by, record.decision.reason) == (FRONT, "not today")


# --- a store that fails midway ------------------------------------------------------------


class Outage:
    """The store's database made unusable from outside, as another process or an operator
    would: SQLite's write lock held by another connection; PostgreSQL's sessions of the
    database ended and new ones refused."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite: sqlite3.Connection | None = None
        self.admin: asyncpg.Connection | None = None
        self.name = urlsplit(url).path.lstrip("/")

    @property
    def started(self) -> bool:
        return self.sqlite is not None or self.admin is not None

    async def start(self) -> None:
        if self.url.startswith("sqlite:///"):
            self.sqlite = hold_write_lock(Path(self.url.removeprefix("sqlite:///")))
            return
        server = postgres_server_url()
        assert server is not None
        self.admin = await asyncpg.connect(server)
        await self.admin.execute(f'ALTER DATABASE "{self.name}" WITH ALLOW_CONNECTIONS false')
        await self.admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            self.name,
        )

    async def end(self) -> None:
        if self.sqlite is not None:
            self.sqlite.execute("ROLLBACK")
            self.sqlite.close()
        if self.admin is not None:
            await self.admin.execute(f'ALTER DATABASE "{self.name}" WITH ALLOW_CONNECTIONS true')
            await self.admin.close()


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_store_failing_midway_is_503_and_the_reviews_before_stay_decided(
    backend: str, tmp_path: Path
) -> None:
    async with database_url(backend, tmp_path) as url:
        outage = Outage(url)
        ids: list[str] = []

        async def third_breaks(record: ApprovalRecord) -> None:
            if record.approval_id == ids[2] and not outage.started:
                await outage.start()

        async with served(url, tmp_path, fault=third_breaks, lock_timeout=0.2) as bot:
            ids += [await bot.pending() for _ in range(4)]
            try:
                failed = await bot.bulk(LEAD, {"approval_ids": ids, "action": "approve"})
            finally:
                await outage.end()
            assert failed.status_code == 503, failed.text
            assert failed.json()["error"] == "the approval store cannot be used now"
            statuses = [(await bot.store.get(approval_id)).status for approval_id in ids]
            assert statuses == ["approved", "approved", "pending", "pending"]
            for approval_id in ids[2:]:
                assert [e.kind for e in await bot.store.events(approval_id)] == ["created"]

            again = await bot.decide_many(LEAD, ids)
            assert [r.status for r in again.results] == ["already_decided"] * 2 + ["decided"] * 2
            report = await verify(url, KEY)
    assert report.ok, report.problems


# --- bad requests ------------------------------------------------------------------------------


def bad_bodies(ids: list[str]) -> list[tuple[Any, str, str]]:
    """(body, the error, the field named) of requests refused whole."""
    many = [f"apr_{n}" for n in range(MAX_ITEMS + 1)]
    return [
        ({"approval_ids": [], "action": "approve"}, "no reviews are listed", "approval_ids"),
        (
            {"approval_ids": many, "action": "approve"},
            f"{MAX_ITEMS + 1} reviews are listed; at most {MAX_ITEMS} are decided at once",
            "approval_ids",
        ),
        (
            {"approval_ids": [ids[0], ids[1], ids[0]], "action": "approve"},
            f"{ids[0]!r} is listed twice",
            "approval_ids",
        ),
        (
            {"approval_ids": [ids[0], " "], "action": "deny"},
            "item 1 is an empty id",
            "approval_ids",
        ),
        ({"approval_ids": ids, "action": "edit", "arguments": {"amount": 1}}, EDITS, "action"),
        ({"approval_ids": ids, "action": "hold"}, "", "action"),
        ({"approval_ids": ids}, "", "action"),
        ({"approval_ids": ids, "action": "approve", "remember": True}, "", "remember"),
        ({"approval_ids": ids, "action": "deny", "reason": "x" * 2001}, "", "reason"),
        ({"approval_ids": ids[0], "action": "approve"}, "", "approval_ids"),
        ({"approval_ids": [ids[0], 7], "action": "approve"}, "", "approval_ids.1"),
        ([ids[0]], "", "(body)"),
    ]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_list_that_is_not_accepted_is_422_naming_what_and_records_nothing(
    backend: str, tmp_path: Path
) -> None:
    async with bot_on(backend, tmp_path) as bot:
        ids = [await bot.pending(), await bot.pending()]
        before = await bot.all_events(ids)
        for body, message, field in bad_bodies(ids):
            response = await bot.bulk(LEAD, body)
            assert response.status_code == 422, (body, response.text)
            answer = response.json()
            fields = [error["field"] for error in answer["details"]["errors"]]
            assert field in fields, (body, answer)
            if message:
                assert message in [error["message"] for error in answer["details"]["errors"]]
            if field == "action" and message == EDITS:
                assert answer["error"] == EDITS
            else:
                assert answer["error"].startswith("invalid bulk decision: ")
        assert await bot.all_events(ids) == before
        for approval_id in ids:
            assert (await bot.store.get(approval_id)).status == "pending"


async def test_deciding_in_bulk_needs_the_decide_scope(bot: Bot) -> None:
    ids = [await bot.pending()]
    before = await bot.all_events(ids)
    read_only = await bot.bulk(READER, {"approval_ids": ids, "action": "approve"})
    assert (read_only.status_code, read_only.json()["error"]) == (
        403,
        "this token lacks the scope approvals:decide",
    )
    nobody = await bot.client.post(
        "/approvals/decide", json={"approval_ids": ids, "action": "approve"}
    )
    assert nobody.status_code == 401
    assert await bot.all_events(ids) == before


async def test_the_route_is_in_the_openapi_document_with_its_schemas(bot: Bot) -> None:
    document = (await bot.client.get("/openapi.json")).json()
    operation = document["paths"]["/approvals/decide"]["post"]
    assert operation["description"] == "Needs a token with the scope `approvals:decide`."
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/BulkDecideBody"}
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/BulkDecideView"}
    assert {"401", "403", "413", "422", "503"} <= set(operation["responses"])
    schemas = document["components"]["schemas"]
    ids = schemas["BulkDecideBody"]["properties"]["approval_ids"]
    assert (ids["minItems"], ids["maxItems"]) == (1, MAX_ITEMS)
    assert schemas["BulkDecideBody"]["properties"]["action"]["enum"] == ["approve", "deny"]
    item = schemas["BulkItemView"]["properties"]
    assert set(item) == {"approval_id", "status", "error", "approval"}
    assert set(item["status"]["enum"]) == {
        "decided", "refused", "not_found", "already_decided", "already_voted", "invalid",
    }  # fmt: skip
    ids_seen = [await bot.pending()]
    answered = (await bot.bulk(LEAD, {"approval_ids": ids_seen, "action": "deny"})).json()
    assert set(answered) == set(schemas["BulkDecideView"]["properties"])
    assert set(answered["results"][0]) == set(item)
    assert set(answered["results"][0]["approval"]) == set(schemas["ApprovalView"]["properties"])


# --- any mix, in any order ---------------------------------------------------------------------

KINDS = ["allowed", "own", "stranger", "decided", "unknown", "quorum"]


def expected(kind: str, action: str) -> str:
    """What an item of `kind` is answered, decided by the lead."""
    if kind == "own":
        return "refused" if action == "approve" else "decided"  # the requester may deny
    return {
        "allowed": "decided",
        "stranger": "refused",
        "decided": "already_decided",
        "unknown": "not_found",
        "quorum": "decided",
    }[kind]


@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=8), approve=st.booleans())
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_any_mix_in_any_order_is_answered_in_order_each_decided_at_most_once(
    bot: Bot, kinds: list[str], approve: bool
) -> None:
    # Each example makes reviews of its own in the shared store.
    action = "approve" if approve else "deny"
    ids = []
    for n, kind in enumerate(kinds):
        if kind == "unknown":
            ids.append(f"apr_unknown_{next(bot.runs)}_{n}")
        elif kind == "decided":
            approval_id = await bot.pending()
            assert (await bot.decide_many(ANA, [approval_id], "deny")).decided == 1
            ids.append(approval_id)
        else:
            tool = {"stranger": "send_email", "quorum": "pay"}.get(kind, "refund")
            ids.append(await bot.pending(tool, requested_by=LEAD if kind == "own" else CAROL))

    answer = await bot.decide_many(LEAD, ids, action)

    statuses = [expected(kind, action) for kind in kinds]
    assert [r.approval_id for r in answer.results] == ids
    assert [r.status for r in answer.results] == statuses
    assert answer.decided == statuses.count("decided")
    assert answer.not_decided == len(ids) - answer.decided
    for kind, approval_id, item in zip(kinds, ids, answer.results, strict=True):
        if kind == "unknown":
            continue
        events = await bot.store.events(approval_id)
        decided = [e for e in events if e.kind == "decided"]
        assert len(decided) <= 1
        mine = [e for e in events if e.actor == LEAD and e.kind != "created"]
        if item.status == "decided":
            assert [e.channel for e in mine] == ["api"] * len(mine) and mine
            if kind == "quorum" and approve:
                assert decided == [] and (await bot.store.get(approval_id)).status == "pending"
            else:
                assert [(e.actor, e.channel) for e in decided] == [(LEAD, "api")]
        elif item.status == "refused":
            assert [e.kind for e in mine] == ["refused"]
        else:
            assert mine == []
