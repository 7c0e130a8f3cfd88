"""The approval client's `guard` against a real bot: served in-process (`bridged_bot`) for the
async and the sync client, and `nodbot serve` with the agent in a process of its own."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.core.client import (
    ApprovalClient,
    ApprovalClientError,
    CallDenied,
    DecisionTimeout,
    SyncApprovalClient,
)
from nodbot.core.errors import ApprovalDenied, InvalidArgumentsError
from nodbot.core.tools import arguments_digest
from tests.bot.processes import nodbot_serve
from tests.bridges.support import AGENT_TOKEN, REVIEWER, REVIEWER_TOKEN, Bridged, bridged_bot
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"order_id": "o-7", "amount": 500}


@pytest.fixture
def run_id() -> str:
    """A run of its own per test: derived call ids count the calls per run in this process."""
    return f"run-{uuid.uuid4().hex[:12]}"


def derived_id(arguments: dict[str, Any], number: int = 1) -> str:
    return f"refund-{arguments_digest(arguments)[:24]}-{number}"


def async_refund(
    client: ApprovalClient, ran: list[tuple[str, float]], run_id: str, **options: Any
) -> Callable[..., Any]:
    @client.guard(run_id=run_id, within=options.pop("within", 20), **options)
    async def refund(order_id: str, amount: float) -> str:
        ran.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    return refund


def sync_refund(
    client: SyncApprovalClient, ran: list[tuple[str, float]], run_id: str, **options: Any
) -> Callable[..., str]:
    @client.guard(run_id=run_id, within=options.pop("within", 20), **options)
    def refund(order_id: str, amount: float) -> str:
        ran.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    return refund


async def test_an_approved_async_call_runs_once_with_its_arguments(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        refund = async_refund(bot.client, ran, run_id)
        called = asyncio.create_task(refund("o-7", amount=500))
        [review] = await bot.when_pending(1)
        assert (review["tool"], review["run_id"]) == ("refund", run_id)
        assert review["arguments"] == ORDER
        assert review["call_id"] == derived_id(ORDER)
        assert ran == []
        await bot.decide(review["approval_id"], "approve")
        assert await called == "refunded 500.0 on o-7"  # run with the signature's types
    assert ran == [("o-7", 500.0)]


async def test_an_edited_async_call_runs_with_the_edit_checked_by_the_schema(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        called = asyncio.create_task(async_refund(bot.client, ran, run_id)("o-7", 500))
        [review] = await bot.when_pending(1)
        path = f"/approvals/{review['approval_id']}/decide"
        for wrong in ({"amount": "lots"}, {"note": "x"}):  # the derived schema reached the bot
            body = {"action": "edit", "arguments": wrong}
            refused = await bot.reviewer.post(path, json=body)
            assert refused.status_code == 422, refused.text
        await bot.decide(review["approval_id"], "edit", arguments={"amount": 450})
        assert await called == "refunded 450.0 on o-7"
    assert ran == [("o-7", 450.0)]


async def test_a_denied_async_call_raises_the_reason_and_does_not_run(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        called = asyncio.create_task(async_refund(bot.client, ran, run_id)("o-7", 500))
        [review] = await bot.when_pending(1)
        await bot.decide(review["approval_id"], "deny", reason="refund policy: max 100")
        with pytest.raises(CallDenied, match="refund policy: max 100") as denied:
            await called
    assert isinstance(denied.value, ApprovalDenied)
    assert denied.value.reason == "refund policy: max 100"
    assert denied.value.decided_by == REVIEWER
    assert denied.value.approval_id == review["approval_id"]
    assert ran == []


async def test_a_timed_out_call_is_retried_on_its_review_and_runs_once(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        impatient = async_refund(bot.client, ran, run_id, within=0.2)
        with pytest.raises(DecisionTimeout):
            await impatient("o-7", 500)
        [review] = await bot.when_pending(1)
        assert ran == []
        retried = asyncio.create_task(async_refund(bot.client, ran, run_id)("o-7", 500))
        await bot.decide(review["approval_id"], "approve")  # the review the first call opened
        assert await retried == "refunded 500.0 on o-7"
        assert [r["call_id"] for r in await bot.pending()] == []
        # The decision is spent: the same call again is a call of its own, reviewed anew.
        again = asyncio.create_task(async_refund(bot.client, ran, run_id)("o-7", 500))
        [anew] = await bot.when_pending(1)
        assert anew["approval_id"] != review["approval_id"]
        assert anew["call_id"] == derived_id(ORDER, 2)
        await bot.decide(anew["approval_id"], "deny", reason="once is enough")
        with pytest.raises(CallDenied):
            await again
    assert ran == [("o-7", 500.0)]


async def test_a_given_call_id_replayed_after_its_decision_opens_a_new_review(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        refund = async_refund(
            bot.client, ran, run_id, call_id=lambda arguments: f"refund-{arguments['order_id']}"
        )
        first = asyncio.create_task(refund("o-7", 500))
        [review] = await bot.when_pending(1)
        assert review["call_id"] == "refund-o-7"
        await bot.decide(review["approval_id"], "approve")
        await first
        replayed = asyncio.create_task(refund("o-7", 500))  # as after a crash past the consume
        [anew] = await bot.when_pending(1)
        assert (anew["call_id"], anew["approval_id"] != review["approval_id"]) == (
            "refund-o-7",
            True,
        )
        assert ran == [("o-7", 500.0)]  # the first decision did not run it again
        await bot.decide(anew["approval_id"], "deny", reason="already refunded")
        with pytest.raises(CallDenied, match="already refunded"):
            await replayed
    assert ran == [("o-7", 500.0)]


async def test_identical_calls_at_once_are_reviewed_one_by_one(tmp_path: Path, run_id: str) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        refund = async_refund(bot.client, ran, run_id)
        calls = [asyncio.create_task(refund("o-7", 500)) for _ in range(2)]
        reviews = await bot.when_pending(2)
        assert sorted(r["call_id"] for r in reviews) == [derived_id(ORDER, 1), derived_id(ORDER, 2)]
        for review in reviews:
            await bot.decide(review["approval_id"], "approve")
        assert await asyncio.gather(*calls) == ["refunded 500.0 on o-7"] * 2
    assert ran == [("o-7", 500.0)] * 2


async def sync_call(bot: Bridged, ran: list[tuple[str, float]], run_id: str, **options: Any) -> Any:
    """The sync client's guarded refund of ORDER, called in a thread, as a task."""

    def call() -> str:
        with SyncApprovalClient(bot.served.url, token=AGENT_TOKEN) as client:
            return sync_refund(client, ran, run_id, **options)("o-7", amount=500)

    return asyncio.create_task(asyncio.to_thread(call))


@pytest.mark.parametrize(
    ("action", "edit", "ran_with"),
    [("approve", None, 500.0), ("edit", {"amount": 450}, 450.0)],
)
async def test_a_sync_call_runs_once_approved_or_edited(
    tmp_path: Path, run_id: str, action: str, edit: dict[str, Any] | None, ran_with: float
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        called = await sync_call(bot, ran, run_id)
        [review] = await bot.when_pending(1)
        assert (review["run_id"], review["arguments"]) == (run_id, ORDER)
        assert ran == []
        await bot.decide(review["approval_id"], action, arguments=edit)
        assert await called == f"refunded {ran_with} on o-7"
    assert ran == [("o-7", ran_with)]


async def test_a_sync_call_denied_raises_and_one_timed_out_raises(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        called = await sync_call(bot, ran, run_id, call_id="call-1")
        [review] = await bot.when_pending(1)
        await bot.decide(review["approval_id"], "deny", reason="not this order")
        with pytest.raises(CallDenied, match="not this order") as denied:
            await called
        assert denied.value.decided_by == REVIEWER
        with pytest.raises(DecisionTimeout):
            await (await sync_call(bot, ran, run_id, call_id="call-2", within=0.2))
        [waiting] = await bot.pending()
        assert (waiting["call_id"], waiting["status"]) == ("call-2", "pending")
    assert ran == []


async def test_calls_that_cannot_be_asked_about_raise_before_asking(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        refund = async_refund(bot.client, ran, run_id)
        with pytest.raises(TypeError, match="argument amount is a complex, not a JSON value"):
            await refund("o-7", complex(1, 2))
        with pytest.raises(TypeError, match=r"argument amount is nan"):
            await refund("o-7", float("nan"))
        with pytest.raises(InvalidArgumentsError, match="amount"):
            await refund("o-7", "lots")
        with pytest.raises(TypeError, match="missing a required argument"):
            await refund("o-7")
        assert await bot.pending() == []

        def blocking(order_id: str) -> None: ...

        def spread(*orders: str) -> None: ...

        with pytest.raises(TypeError, match=r"use SyncApprovalClient\.guard"):
            bot.client.guard(run_id=run_id, within=1)(blocking)  # type: ignore[arg-type]

        with (
            pytest.raises(TypeError, match=r"\*orders cannot be shown to a reviewer"),
            SyncApprovalClient(bot.served.url, token=AGENT_TOKEN) as client,
        ):
            client.guard(run_id=run_id, within=1)(spread)
    assert ran == []


async def test_a_wrong_token_and_an_unreachable_bot_are_client_errors(
    tmp_path: Path, run_id: str
) -> None:
    ran: list[tuple[str, float]] = []
    async with bridged_bot(tmp_path, ["refund"]) as bot:
        async with ApprovalClient(bot.served.url, token="not-the-agent-token-0000") as wrong:
            with pytest.raises(ApprovalClientError, match="the bearer token is not valid") as no:
                await async_refund(wrong, ran, run_id)("o-7", 500)
        assert no.value.status == 401
        assert await bot.pending() == []
    # A loopback port nobody listens on, outside the ephemeral range: a port there could be
    # the client's own local port, and a connection to itself would be answered.
    port = free_port()
    async with ApprovalClient(f"http://127.0.0.1:{port}", token=AGENT_TOKEN) as away:
        with pytest.raises(ApprovalClientError, match="could not be reached") as unreachable:
            await async_refund(away, ran, run_id)("o-7", 500)
    assert unreachable.value.status == 0
    assert ran == []


# --- an agent in a process of its own, against `nodbot serve` ---------------------------------

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: agent, token: "${{NODBOT_CLIENT_AGENT}}", scopes: [approvals:request]}}
    - {{name: {reviewer}, token: "${{NODBOT_CLIENT_REVIEWER}}",
        scopes: [approvals:read, approvals:decide]}}
external_tools: [refund]
rules:
  - tool: refund
    reviewers: [{reviewer}]
"""


async def pending_of(reviewer: httpx.AsyncClient, within: float = 30) -> list[dict[str, Any]]:
    """The pending reviews, once there is one."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        found: list[dict[str, Any]] = (
            await reviewer.get("/approvals", params={"status": "pending"})
        ).json()
        if found:
            return found
        assert asyncio.get_running_loop().time() < deadline, "no review opened"
        await asyncio.sleep(0.05)  # polling the bot for an outcome, with a deadline


async def test_an_agent_process_guarded_by_nodbot_serve_refunds_once(
    tmp_path: Path, run_id: str
) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(CONFIG.format(db=tmp_path / "nodbot.db", reviewer=REVIEWER))
    ledger = tmp_path / "refunds.jsonl"
    tokens = {"NODBOT_CLIENT_AGENT": AGENT_TOKEN, "NODBOT_CLIENT_REVIEWER": REVIEWER_TOKEN}
    async with (
        nodbot_serve(path, **tokens) as bot,
        httpx.AsyncClient(
            base_url=bot.url, headers={"Authorization": f"Bearer {REVIEWER_TOKEN}"}, timeout=30
        ) as reviewer,
    ):
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "tests" / "bot" / "client_process.py"),
            bot.url,
            run_id,
            str(ledger),
            cwd=ROOT,
            env={"NODBOT_CLIENT_TOKEN": AGENT_TOKEN, "PATH": ""},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            [review] = await pending_of(reviewer)
            assert (review["run_id"], review["arguments"]) == (run_id, ORDER)
            assert not ledger.exists()
            body = {"action": "edit", "arguments": {"amount": 450}}
            decided = await reviewer.post(f"/approvals/{review['approval_id']}/decide", json=body)
            assert decided.status_code == 200, decided.text
            out, err = await asyncio.wait_for(agent.communicate(), 30)
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
        assert agent.returncode == 0, err.decode()
        assert out.decode().strip() == "refunded 450.0 on o-7"
        approval = (await reviewer.get(f"/approvals/{review['approval_id']}")).json()
        assert approval["consumed"] is True
    lines = ledger.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"order_id": "o-7", "amount": 450.0}]
