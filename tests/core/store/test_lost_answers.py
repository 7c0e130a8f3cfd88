"""A write that committed though its answer was lost (the connection dropped as PostgreSQL
answered, by a proxy at the network seam: `tests/fakes/pgproxy.py`), and what the retry
then finds: a durable run's claim of its decision. The run's worker finds the decision
consumed by itself, takes it (nothing ran: nothing runs before a claim answers), and the
tool runs once (before, the call was denied as "approval already used by a concurrent
request", and the approved refund never ran); a denial, which its taking finished, answers
the call (before, the call was asked about again: a second review).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from nodbot.core import (
    Agent,
    AssistantMessage,
    ChatResponse,
    Decision,
    DeferredApproval,
    Executor,
    HumanMessage,
    InterruptRule,
    Message,
    SqlApprovalStore,
    StoreError,
    ToolCall,
    ToolMessage,
    ToolRegistry,
    ToolSpec,
    advance_run,
)
from tests.fakes.pgproxy import FaultProxy, proxying
from tests.support import postgres_database

pytestmark = pytest.mark.postgres

WORKER = "host-a:101"


class Refunding:
    """Asks for one refund, then answers."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(m, AssistantMessage) for m in messages):
            return ChatResponse(content="done")
        call = ToolCall(id="call_1", name="refund", arguments={"order_id": "A-1", "amount": 5})
        return ChatResponse(tool_calls=[call])


@pytest.fixture
async def proxied() -> AsyncIterator[tuple[FaultProxy, str, str]]:
    """The proxy, the database's URL through it, and its URL direct."""
    async with postgres_database() as url, proxying("127.0.0.1", 5432) as proxy:
        yield proxy, proxy.url(url), url


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
async def test_a_claim_whose_answer_was_lost_is_taken_by_its_own_worker(
    proxied: tuple[FaultProxy, str, str], approved: bool
) -> None:
    proxy, through, direct = proxied
    refunds: list[float] = []
    tools = ToolRegistry()

    @tools.tool
    def refund(order_id: str, amount: float) -> str:
        refunds.append(amount)
        return f"refunded {amount} on {order_id}"

    agent = Agent(Refunding(), tools)
    rules = [InterruptRule(tool="refund")]
    async with SqlApprovalStore(direct) as admin:
        opening = Executor(tools, approval=DeferredApproval(admin), rules=rules)
        run = await admin.create_run(
            agent="a", messages=[HumanMessage(content="refund")], worker="opener"
        )
        run = await advance_run(run, agent=agent, executor=opening, runs=admin)
        assert run.status == "waiting"
        [review] = await admin.list(run_id=run.run_id)
        decision = Decision(approved=approved, reason=None if approved else "no", decided_by="ana")
        await admin.vote(review.approval_id, decision)
    # A worker of its own connections, through the proxy: its claim is prepared, then run.
    async with SqlApprovalStore(through) as store, SqlApprovalStore(direct) as admin:
        port = DeferredApproval(store, actor=WORKER, in_flight_wait=30)
        executor = Executor(tools, approval=port, rules=rules)
        [claimed] = await store.claim_ready(worker=WORKER)
        proxy.lose_answer_to = b"SET consumed_at"
        with pytest.raises(StoreError):
            await advance_run(claimed, agent=agent, executor=executor, runs=store)
        assert proxy.faults.lost_answers == 1
        consumed = await admin.get(review.approval_id)
        assert consumed.consumed and refunds == []  # the claim committed; nothing ran
        again = await store.get_run(run.run_id)  # still this worker's: its step again
        finished = await advance_run(again, agent=agent, executor=executor, runs=store)
        assert finished.status == "finished"
        [answer] = [m for m in finished.messages if isinstance(m, ToolMessage)]
        if approved:
            assert refunds == [5.0] and answer.status == "ok", answer
        else:  # the denial the lost claim took (and finished), not a second review
            assert refunds == [] and answer.status == "error", answer
            assert "no" in answer.content
        assert [r.approval_id for r in await admin.list(run_id=run.run_id)] == [review.approval_id]
        done = await admin.get(review.approval_id)
        assert done.finished and done.outcome == ("ok" if approved else "denied")
