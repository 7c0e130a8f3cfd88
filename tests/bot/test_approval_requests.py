"""The approval request API (`POST /approvals`, `GET /approvals/{id}?wait=N`, `POST
/approvals/{id}/consume`) of a bot served in-process: the rules decide a call at once or open
a review, the same call asked twice is one approval, the same call id with other arguments is
refused, a decision is handed out once with a one-use token bound to the call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.serve import Served, serving
from nodbot.core.approval_tokens import ApprovalToken, InvalidApprovalToken, token_key
from nodbot.core.client import ApprovalClient, DecisionAlreadyTaken, DecisionTimeout

ROOT = Path(__file__).resolve().parents[2]
AGENT_TOKEN = "token-of-the-agent-0000000000000"
AGENT = {"Authorization": f"Bearer {AGENT_TOKEN}"}
LEAD = {"Authorization": "Bearer token-of-the-lead-00000000000"}

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: {agent}, scopes: [approvals:request]}}
    - {{name: lead@example.com, token: token-of-the-lead-00000000000,
        scopes: [approvals:read, approvals:decide]}}
external_tools: [lookup, wire, refund]
rules:
  - tool: lookup
    decision: approve
  - tool: wire
    decision: deny
    description: wires are never sent by agents
  - tool: refund
    reviewers: [lead@example.com]
    editable: [amount]
"""


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db", agent=AGENT_TOKEN))
    async with serving(str(path)) as served:
        yield served


@pytest.fixture
async def client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db", agent=AGENT_TOKEN))
    async with (
        serving(str(path)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as http,
    ):
        yield http


def call(tool: str = "refund", call_id: str = "call_1", **arguments: Any) -> dict[str, Any]:
    properties = {"order_id": {"type": "string"}, "amount": {"type": "number"}}
    if arguments:  # another tool: a schema of what it is given
        properties = {name: {} for name in arguments}
    return {
        "tool": tool,
        "arguments": arguments or {"order_id": "o-1", "amount": 120},
        "run_id": "thread-7",
        "call_id": call_id,
        "schema": {"type": "object", "properties": properties, "required": list(properties)},
        "description": "the customer asked for a refund",
    }


async def test_a_reviewed_call_is_decided_and_handed_out_once(client: httpx.AsyncClient) -> None:
    asked = await client.post("/approvals", json=call(), headers=AGENT)
    assert asked.status_code == 201, asked.text
    approval = asked.json()
    assert approval["status"] == "pending" and approval["requested_by"] == "agent"
    approval_id = approval["approval_id"]
    again = await client.post("/approvals", json=call(), headers=AGENT)
    assert again.status_code == 200 and again.json()["approval_id"] == approval_id
    early = await client.post(f"/approvals/{approval_id}/consume", headers=AGENT)
    assert early.status_code == 409 and "not decided yet" in early.json()["error"]

    waiting = asyncio.create_task(client.get(f"/approvals/{approval_id}?wait=20", headers=AGENT))
    decided = await client.post(
        f"/approvals/{approval_id}/decide",
        json={"action": "edit", "arguments": {"amount": 100}},
        headers=LEAD,
    )
    assert decided.status_code == 200, decided.text
    seen = await waiting
    assert seen.json()["status"] == "approved"

    taken = await client.post(f"/approvals/{approval_id}/consume", headers=AGENT)
    assert taken.status_code == 200, taken.text
    consumed = taken.json()
    assert consumed["approved"] is True and consumed["edited"] is True
    assert consumed["arguments"] == {"order_id": "o-1", "amount": 100}
    token = ApprovalToken.verify(consumed["token"], token_key(AGENT_TOKEN))
    token.check(
        run_id="thread-7",
        call_id="call_1",
        tool="refund",
        arguments={"order_id": "o-1", "amount": 120},
        final=consumed["arguments"],
    )
    with pytest.raises(InvalidApprovalToken, match="other arguments"):
        token.check(run_id="thread-7", call_id="call_1", tool="refund", arguments={"amount": 5})
    original = {"order_id": "o-1", "amount": 120}
    # An edit naming another tool, another call or another run: the token answers none.
    for other, field in (
        ({"tool": "delete_account"}, "tool"),
        ({"call_id": "call_2"}, "call id"),
        ({"run_id": "thread-8"}, "run"),
    ):
        where = {"run_id": "thread-7", "call_id": "call_1", "tool": "refund", **other}
        with pytest.raises(InvalidApprovalToken, match=f"is for {field}"):
            token.check(**where, arguments=original)
    with pytest.raises(InvalidApprovalToken, match="not the ones decided"):
        token.check(
            run_id="thread-7", call_id="call_1", tool="refund", arguments=original, final=original
        )
    with pytest.raises(InvalidApprovalToken, match="no native call id"):
        token.check(run_id="thread-7", call_id=None, tool="refund", arguments=original)
    with pytest.raises(InvalidApprovalToken, match="not issued to this client"):
        ApprovalToken.verify(consumed["token"], token_key("someone-else's-token-000000"))

    replayed = await client.post(f"/approvals/{approval_id}/consume", headers=AGENT)
    assert replayed.status_code == 409 and "handed out already" in replayed.json()["error"]
    # The same call once more, after its decision was spent: a new review, not a rerun.
    anew = await client.post("/approvals", json=call(), headers=AGENT)
    assert anew.status_code == 201 and anew.json()["approval_id"] != approval_id


async def test_the_rules_decide_at_once(client: httpx.AsyncClient) -> None:
    allowed = await client.post("/approvals", json=call("lookup", order_id="o-1"), headers=AGENT)
    assert allowed.status_code == 201 and allowed.json()["status"] == "approved"
    denied = await client.post("/approvals", json=call("wire", "call_2", to="x"), headers=AGENT)
    assert denied.json()["status"] == "denied"
    taken = await client.post(f"/approvals/{denied.json()['approval_id']}/consume", headers=AGENT)
    assert taken.json()["approved"] is False
    assert taken.json()["reason"] == "wires are never sent by agents"


async def test_the_same_call_id_with_other_arguments_is_refused(client: httpx.AsyncClient) -> None:
    first = await client.post("/approvals", json=call(), headers=AGENT)
    other = await client.post("/approvals", json=call(order_id="o-2", amount=999), headers=AGENT)
    assert other.status_code == 409 and "another tool or other arguments" in other.json()["error"]
    assert other.json()["details"]["approval_id"] == first.json()["approval_id"]


async def test_scopes_are_required(client: httpx.AsyncClient) -> None:
    assert (await client.post("/approvals", json=call(), headers=LEAD)).status_code == 403
    assert (await client.post("/approvals", json=call())).status_code == 401
    bad = await client.post("/approvals", json={**call(), "call_id": "has space"}, headers=AGENT)
    assert bad.status_code == 422


async def test_the_client_asks_waits_and_takes_the_decision_once(bot: Served) -> None:
    arguments = {"order_id": "o-9", "amount": 300}
    async with (
        ApprovalClient(bot.url, token=AGENT_TOKEN) as nodbot,
        httpx.AsyncClient(base_url=bot.url) as lead,
    ):
        asked = await nodbot.request("refund", arguments, run_id="thread-9", call_id="c-1")
        assert asked.status == "pending"
        with pytest.raises(DecisionTimeout):
            await nodbot.wait(asked.approval_id, within=0.2)
        deny = {"action": "deny", "reason": "no receipt"}
        decided = await lead.post(f"/approvals/{asked.approval_id}/decide", json=deny, headers=LEAD)
        assert decided.status_code == 200
        seen = await nodbot.wait(asked.approval_id, within=10)
        answer = await nodbot.consume(seen)
        assert (answer.approved, answer.reason, answer.decided_by) == (
            False,
            "no receipt",
            "lead@example.com",
        )
        assert answer.claims.call_id == "c-1"
        with pytest.raises(DecisionAlreadyTaken):
            await nodbot.consume(seen)
