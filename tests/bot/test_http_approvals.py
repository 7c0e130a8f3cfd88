"""The approvals API over real HTTP: uvicorn on a loopback port, httpx as the client, a real
SQL store, and approvals made pending the way a run makes them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from nodbot.bot.config import ApiToken
from nodbot.bot.http import AuthorizeDecision, create_app
from nodbot.bot.policy.authorize import Verdict
from nodbot.core import (
    ApprovalRecord,
    ApprovalRequest,
    Decision,
    DeferredApproval,
    Executor,
    SqlApprovalStore,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from nodbot.core.tools import arguments_digest
from tests.core.store.conftest import database_url

SECRETS = {
    "ana": "token-of-ana-000000",
    "bob": "token-of-bob-000000",
    "carl": "token-of-carl-00000",
    "reader": "token-of-reader-000",
}
SCOPES = {"ana": ["approvals:read", "approvals:decide"], "reader": ["approvals:read"]}


def tokens() -> list[ApiToken]:
    return [
        ApiToken.model_validate(
            {"name": name, "token": secret, "scopes": SCOPES.get(name, SCOPES["ana"])}
        )
        for name, secret in SECRETS.items()
    ]


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


@dataclass
class Harness:
    """A served API with its store, and the executor a run uses."""

    client: httpx.AsyncClient
    store: SqlApprovalStore
    executor: Executor
    refunds: list[tuple[str, float]] = field(default_factory=list)

    async def pending(
        self, run_id: str, *, amount: float = 500.0, requested_by: str = "carl"
    ) -> tuple[ToolCall, ToolContext, str]:
        """A refund call of a new run that waits for review, and its approval id."""
        call = ToolCall(name="refund", arguments={"order_id": "o-7", "amount": amount}, id="c1")
        ctx = self.executor.context(run_id=run_id, requested_by=requested_by)
        result = await self.executor.run_call(call, ctx)
        assert result.status == "pending" and result.error is not None
        return call, ctx, result.error.details["approval_id"]

    async def decide(self, approval_id: str, who: str, **body: Any) -> httpx.Response:
        return await self.client.post(
            f"/approvals/{approval_id}/decide", json=body, headers=auth(who)
        )


def refund_registry(refunds: list[tuple[str, float]]) -> ToolRegistry:
    """A registry with one tool that always needs review; its calls land in `refunds`."""
    registry = ToolRegistry()

    @registry.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        refunds.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    return registry


@contextlib.asynccontextmanager
async def serve(
    store: SqlApprovalStore, authorize_decision: AuthorizeDecision | None = None
) -> AsyncIterator[Harness]:
    """The API over `store`, served by uvicorn on a free loopback port."""
    refunds: list[tuple[str, float]] = []
    registry = refund_registry(refunds)
    app = create_app(
        store=store, registry=registry, tokens=tokens(), authorize_decision=authorize_decision
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: at most 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            executor = Executor(registry, approval=DeferredApproval(store))
            yield Harness(client, store, executor, refunds)
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def served(backend: str, tmp_path: Path) -> AsyncIterator[Harness]:
    """The API over a fresh SQL store of `backend`."""
    async with (
        database_url(backend, tmp_path) as url,
        SqlApprovalStore(url) as store,
        serve(store) as harness,
    ):
        yield harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with served("sqlite", tmp_path) as harness:
        yield harness


# --- health ---------------------------------------------------------------------------------


async def test_healthz_needs_no_token(api: Harness) -> None:
    response = await api.client.get("/healthz")
    ok = {"status": "ok", "error": None, "problems": []}
    assert (response.status_code, response.json()) == (200, ok)


async def test_healthz_reports_a_store_that_cannot_be_used(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    store = SqlApprovalStore(f"sqlite:///{folder / 'nodbot.db'}")
    folder.rmdir()  # the store is built, then its folder disappears before it is opened
    try:
        async with serve(store) as broken:
            response = await broken.client.get("/healthz")
    finally:
        await store.close()
    assert response.status_code == 503
    problem = "the approval store cannot be used (store-unavailable)"
    assert response.json() == {"status": "unavailable", "error": problem, "problems": [problem]}


# --- reading --------------------------------------------------------------------------------


async def test_list_filters_by_status_and_run(api: Harness) -> None:
    _, _, first = await api.pending("run_a")
    _, _, second = await api.pending("run_b")
    assert (await api.decide(second, "ana", action="deny", reason="no")).status_code == 200

    async def ids(**params: Any) -> list[str]:
        response = await api.client.get("/approvals", params=params, headers=auth("reader"))
        assert response.status_code == 200, response.text
        return [view["approval_id"] for view in response.json()]

    assert await ids() == [first, second]
    assert await ids(status="pending") == [first]
    assert await ids(status="denied") == [second]
    assert await ids(run_id="run_b") == [second]
    assert await ids(run_id="run_b", status="pending") == []
    assert await ids(limit=1) == [first]


@pytest.mark.parametrize(
    ("params", "field"),
    [({"status": "waiting"}, "status"), ({"limit": "0"}, "limit"), ({"limit": "501"}, "limit")],
)
async def test_bad_query_values_are_422_naming_the_parameter(
    api: Harness, params: dict[str, str], field: str
) -> None:
    response = await api.client.get("/approvals", params=params, headers=auth("reader"))
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == f"invalid query parameters: {field}"
    assert [error["field"] for error in body["details"]["errors"]] == [field]


async def test_get_one_shows_the_call_and_its_events(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a", amount=250.0)
    response = await api.client.get(f"/approvals/{approval_id}", headers=auth("reader"))
    assert response.status_code == 200
    view = response.json()
    assert {key: view[key] for key in ("run_id", "call_id", "tool", "status")} == {
        "run_id": "run_a",
        "call_id": "c1",
        "tool": "refund",
        "status": "pending",
    }
    assert view["arguments"] == {"order_id": "o-7", "amount": 250.0}
    assert view["requested_by"] == "carl" and view["decision"] is None
    assert (view["consumed"], view["finished"], view["outcome"]) == (False, False, None)
    assert [(e["kind"], e["actor"]) for e in view["events"]] == [("created", "carl")]


async def test_an_unknown_id_is_404(api: Harness) -> None:
    got = await api.client.get("/approvals/apr_nope", headers=auth("reader"))
    decided = await api.decide("apr_nope", "ana", action="approve")
    for response in (got, decided):
        assert response.status_code == 404
        assert response.json() == {
            "error": "no approval has this id",
            "details": {"approval_id": "apr_nope"},
        }


# --- deadline and votes --------------------------------------------------------------------


async def view_three_ways(api: Harness, approval_id: str) -> list[dict[str, Any]]:
    """The approval as `GET /approvals/{id}` and `GET /approvals` show it."""
    one = await api.client.get(f"/approvals/{approval_id}", headers=auth("reader"))
    listed = await api.client.get("/approvals", headers=auth("reader"))
    [item] = [view for view in listed.json() if view["approval_id"] == approval_id]
    return [one.json(), item]


async def test_the_view_carries_the_deadline_and_the_votes_so_far_and_needed(
    api: Harness,
) -> None:
    arguments = {"order_id": "o-9", "amount": 900.0}
    request = ApprovalRequest(
        "run_q", "c1", "refund", arguments, arguments_digest(arguments),
        requested_by="carl", deadline=datetime(2031, 5, 4, 12, 0, tzinfo=UTC),
        on_timeout="approve", approvals_required=2,
    )  # fmt: skip
    approval_id = (await api.store.create(request)).approval_id
    expected = {
        "deadline": "2031-05-04T12:00:00Z",
        "timeout_decision": "approve",
        "approvals": 0,
        "approvals_required": 2,
    }
    for view in await view_three_ways(api, approval_id):
        assert {key: view[key] for key in expected} == expected
    first = await api.decide(approval_id, "ana", action="approve")
    assert first.status_code == 200, first.text
    expected["approvals"] = 1
    for view in [first.json(), *await view_three_ways(api, approval_id)]:
        assert {key: view[key] for key in expected} == expected
        assert view["status"] == "pending"
    second = await api.decide(approval_id, "bob", action="approve")
    assert (second.json()["status"], second.json()["approvals"]) == ("approved", 2)


async def test_a_review_without_deadline_says_so_and_needs_one_approval(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")
    expected = {
        "deadline": None,
        "timeout_decision": None,
        "approvals": 0,
        "approvals_required": 1,
    }
    for view in await view_three_ways(api, approval_id):
        assert {key: view[key] for key in expected} == expected
    decided = (await api.decide(approval_id, "ana", action="approve")).json()
    assert (decided["approvals"], decided["approvals_required"]) == (1, 1)


async def test_the_openapi_document_names_every_field_of_the_views(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")
    schemas = (await api.client.get("/openapi.json")).json()["components"]["schemas"]
    one, item = await view_three_ways(api, approval_id)
    decided = (await api.decide(approval_id, "ana", action="deny", reason="no")).json()
    for view, model in ((one, "ApprovalDetail"), (item, "ApprovalView"), (decided, "ApprovalView")):
        assert set(view) == set(schemas[model]["properties"])
        assert set(schemas[model]["required"]) <= set(view)
    deadline = schemas["ApprovalView"]["properties"]["deadline"]
    assert "expires" in deadline["description"]


# --- deciding -------------------------------------------------------------------------------


async def approve_then_resume(api: Harness) -> None:
    call, ctx, approval_id = await api.pending("run_a")
    response = await api.decide(approval_id, "ana", action="approve", reason="checked")
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["status"] == "approved"
    assert view["decision"] == {
        "approved": True,
        "edited_args": None,
        "reason": "checked",
        "decided_by": "ana",
        "response": None,
    }
    assert api.refunds == []  # deciding runs nothing; the resume does

    first = await api.executor.run_call(call, ctx)
    again = await api.executor.run_call(call, ctx)
    assert first.status == "ok" and first.value == "refunded 500.0 on o-7"
    assert again.status == "pending"  # a replay opens a new review, it never runs twice
    assert api.refunds == [("o-7", 500.0)]

    record = await api.store.get(approval_id)
    assert record.decision is not None and record.decision.decided_by == "ana"
    decided = [e for e in await api.store.events(approval_id) if e.kind == "decided"]
    assert [(e.actor, e.channel) for e in decided] == [("ana", "api")]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
async def test_approve_then_resume_runs_the_tool_once(backend: str, tmp_path: Path) -> None:
    async with served(backend, tmp_path) as harness:
        await approve_then_resume(harness)


async def test_an_invalid_edit_is_422_and_a_valid_one_runs(api: Harness) -> None:
    call, ctx, approval_id = await api.pending("run_a")
    bad = await api.decide(approval_id, "ana", action="edit", arguments={"amount": "lots"})
    assert bad.status_code == 422
    assert bad.json()["error"] == "the edited arguments are not valid for the tool"
    assert [error["field"] for error in bad.json()["details"]["errors"]] == ["amount"]
    assert (await api.store.get(approval_id)).status == "pending"

    good = await api.decide(approval_id, "ana", action="edit", arguments={"amount": 450})
    assert good.status_code == 200
    assert good.json()["decision"]["edited_args"] == {"amount": 450}
    result = await api.executor.run_call(call, ctx)
    assert (result.status, result.value) == ("ok", "refunded 450.0 on o-7")
    assert api.refunds == [("o-7", 450.0)]


async def test_a_deny_reaches_the_resumed_call_with_its_reason(api: Harness) -> None:
    call, ctx, approval_id = await api.pending("run_a")
    response = await api.decide(approval_id, "bob", action="deny", reason="refund policy")
    assert (response.status_code, response.json()["status"]) == (200, "denied")
    result: ToolResult = await api.executor.run_call(call, ctx)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "approval-denied"
    assert result.error.details["reason"] == "refund policy"
    assert result.error.details["decided_by"] == "bob"
    assert api.refunds == []


async def test_the_second_decision_is_409_naming_the_first_decider(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")
    assert (await api.decide(approval_id, "ana", action="approve")).status_code == 200
    second = await api.decide(approval_id, "bob", action="deny")
    assert second.status_code == 409
    assert second.json() == {
        "error": "this approval was already decided by ana",
        "details": {"approval_id": approval_id, "decided_by": "ana"},
    }
    record = await api.store.get(approval_id)
    assert record.decision is not None and record.decision.approved
    refused = [e for e in await api.store.events(approval_id) if e.kind == "refused"]
    assert [(e.actor, e.channel) for e in refused] == [("bob", "api")]


async def test_the_requester_may_deny_but_not_approve(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a", requested_by="carl")
    for body in ({"action": "approve"}, {"action": "edit", "arguments": {"amount": 1}}):
        response = await api.decide(approval_id, "carl", **body)
        assert response.status_code == 403
        assert response.json()["error"] == "you started this run, so you may not approve its calls"
        assert (await api.store.get(approval_id)).status == "pending"
    denied = await api.decide(approval_id, "carl", action="deny")
    assert (denied.status_code, denied.json()["status"]) == (200, "denied")


async def test_a_custom_authorize_hook_decides_who_may(tmp_path: Path) -> None:
    asked: list[tuple[str, str, bool]] = []

    async def only_bob(principal: str, record: ApprovalRecord, decision: Decision) -> Verdict:
        asked.append((principal, record.approval_id, decision.approved))
        return Verdict(f"name:{principal}", None if principal == "bob" else "only bob decides here")

    async with (
        SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store,
        serve(store, authorize_decision=only_bob) as api,
    ):
        _, _, approval_id = await api.pending("run_a", requested_by="bob")
        ana = await api.decide(approval_id, "ana", action="deny")
        assert (await api.store.get(approval_id)).status == "pending"
        bob = await api.decide(approval_id, "bob", action="approve")
    assert (ana.status_code, ana.json()["error"]) == (403, "only bob decides here")
    # bob started the run: the custom hook replaces the default self-approval check
    assert (bob.status_code, bob.json()["status"]) == (200, "approved")
    assert asked == [("ana", approval_id, False), ("bob", approval_id, True)]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"action": "approve", "by": "mallory"}, ["by"]),
        ({"action": "maybe"}, ["action"]),
        ({"action": "approve", "arguments": {"amount": 1}}, ["arguments"]),
        ({"action": "edit"}, ["arguments"]),
        ({"action": "hold", "extra": 1, "reason": 5}, ["action", "reason", "extra"]),
    ],
)
async def test_a_malformed_decision_is_422_listing_each_field(
    api: Harness, body: dict[str, Any], fields: list[str]
) -> None:
    _, _, approval_id = await api.pending("run_a")
    response = await api.decide(approval_id, "ana", **body)
    assert response.status_code == 422
    assert sorted(error["field"] for error in response.json()["details"]["errors"]) == sorted(
        fields
    )
    assert (await api.store.get(approval_id)).status == "pending"


async def test_a_body_that_is_not_json_is_422(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")
    response = await api.client.post(
        f"/approvals/{approval_id}/decide", content=b"approve", headers=auth("ana")
    )
    assert (response.status_code, response.json()["error"]) == (422, "the body is not valid JSON")


# --- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-known-token"}, {"Authorization": SECRETS["ana"]}],
)
async def test_no_or_a_wrong_token_is_401(api: Harness, headers: dict[str, str]) -> None:
    _, _, approval_id = await api.pending("run_a")
    for response in (
        await api.client.get("/approvals", headers=headers),
        await api.client.post(
            f"/approvals/{approval_id}/decide", json={"action": "approve"}, headers=headers
        ),
    ):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert set(response.json()) == {"error", "details"}
        assert SECRETS["ana"] not in response.text
    assert (await api.store.get(approval_id)).status == "pending"


async def test_a_read_only_token_cannot_decide(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")
    response = await api.decide(approval_id, "reader", action="approve")
    assert response.status_code == 403
    assert response.json() == {
        "error": "this token lacks the scope approvals:decide",
        "details": {"scope": "approvals:decide"},
    }
    assert (await api.store.get(approval_id)).status == "pending"


async def test_unknown_routes_answer_json_errors(api: Harness) -> None:
    response = await api.client.get("/nowhere")
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found", "details": {}}


async def test_an_unexpected_failure_answers_json_and_records_nothing(tmp_path: Path) -> None:
    async def broken(principal: str, record: ApprovalRecord, decision: Decision) -> Verdict:
        raise RuntimeError("policy service down")

    async with (
        SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store,
        serve(store, authorize_decision=broken) as api,
    ):
        _, _, approval_id = await api.pending("run_a")
        answer = await api.decide(approval_id, "ana", action="approve")
        assert (await api.store.get(approval_id)).status == "pending"
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "the bot failed to answer this request; it is logged",
        "details": {},
    }
