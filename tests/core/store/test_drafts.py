"""Drafts (`core/sqlstore/drafts.py`): a run the bot starts is written by its first save, with
the reviews its first step opened, in one transaction. Until then nobody else sees it; an
operation of this process that names it writes it first; a draft never saved leaves nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from nodbot.core import (
    Agent,
    ApprovalRecord,
    ApprovalRequest,
    ChatResponse,
    Decision,
    DeferredApproval,
    HumanMessage,
    Message,
    NewDelivery,
    RunNotFound,
    RunRecord,
    SqlApprovalStore,
    ToolCall,
    ToolRegistry,
    ToolSpec,
    advance_run,
    arguments_digest,
)
from nodbot.core.outbox import Announcer
from nodbot.core.sqlstore.audit import verify
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=SQL_BACKENDS)
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with database_url(request.param, tmp_path) as found:
        yield found


def refund(call_id: str, amount: float) -> ToolCall:
    return ToolCall(id=call_id, name="refund", arguments={"order_id": "A-1", "amount": amount})


class Chat:
    """Two refunds that need review and a lookup that needs none, in one turn."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        calls = [refund("call_1", 10.0), refund("call_2", 20.0), ToolCall(id="c3", name="lookup")]
        return ChatResponse(tool_calls=calls)


class Start:
    """A run drafted in `store` and its first step, whose lookup calls `look(run_id)` after
    both refunds have asked for review."""

    def __init__(self, store: SqlApprovalStore, look: Callable[[str], Awaitable[None]]) -> None:
        self.store = store
        self.run_id = ""
        tools = ToolRegistry()

        @tools.tool(confirm=True)
        def refund(order_id: str, amount: float) -> str:
            return f"refunded {amount} on {order_id}"

        @tools.tool(blocking=False)
        async def lookup() -> str:
            await look(self.run_id)
            return "looked"

        self.agent = Agent(Chat(), tools)
        self.executor = self.agent.executor(approval=DeferredApproval(store))

    async def draft(self, announcer: Announcer | None = None) -> RunRecord:
        run = await self.store.draft_run(
            agent="support",
            messages=[HumanMessage(content="refund A-1")],
            worker="w1",
            announcer=announcer,
        )
        self.run_id = run.run_id
        return run

    async def step(self, run: RunRecord) -> RunRecord:
        return await advance_run(run, agent=self.agent, executor=self.executor, runs=self.store)


async def test_a_started_run_and_its_reviews_are_written_by_its_first_save(url: str) -> None:
    seen: list[tuple[bool, int]] = []
    async with SqlApprovalStore(url) as store, SqlApprovalStore(url) as other:

        async def look(run_id: str) -> None:  # another process, in the middle of the step
            try:
                await other.get_run(run_id)
                exists = True
            except RunNotFound:
                exists = False
            seen.append((exists, len(await other.list(run_id=run_id))))

        start = Start(store, look)
        waiting = await start.step(await start.draft())
        assert seen == [(False, 0)]
        assert (waiting.status, waiting.version, waiting.claimed_by) == ("waiting", 2, None)
        run = await other.get_run(start.run_id)
        assert (run.status, run.version) == ("waiting", 2)
        reviews = await other.list(run_id=start.run_id, status="pending")
        assert [r.request.call_id for r in reviews] == ["call_1", "call_2"]
        for review in reviews:
            assert [e.kind for e in await other.events(review.approval_id)] == ["created"]
        # The run waits on both (its pending count came with them), then is ready.
        await other.decide(reviews[0].approval_id, APPROVE)
        assert await other.claim_ready(worker="w2") == []
        await other.decide(reviews[1].approval_id, APPROVE)
        [claimed] = await other.claim_ready(worker="w2")
        assert claimed.run_id == start.run_id
    assert (await verify(url)).ok


async def test_an_operation_naming_a_draft_writes_it_first(url: str) -> None:
    async with SqlApprovalStore(url) as store, SqlApprovalStore(url) as other:
        found: list[int] = []

        async def look(run_id: str) -> None:  # this process asks: the draft is written now
            found.append(len(await store.list(run_id=run_id, status="pending")))
            run = await other.get_run(run_id)
            assert (run.status, run.version, run.claimed_by) == ("running", 1, "w1")

        start = Start(store, look)
        waiting = await start.step(await start.draft())
        assert found == [2]
        assert (waiting.status, waiting.version) == ("waiting", 2)
        assert len(await other.list(run_id=start.run_id)) == 2  # written once
        for review in await other.list(run_id=start.run_id):
            await other.decide(review.approval_id, APPROVE)
        [claimed] = await other.claim_ready(worker="w2")
        assert claimed.run_id == start.run_id
    assert (await verify(url)).ok


async def test_a_draft_never_saved_leaves_nothing(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        start = Start(store, lambda run_id: _nothing())
        run = await start.draft()
        arguments = {"order_id": "A-1", "amount": 1.0}
        request = ApprovalRequest(
            run_id=run.run_id,
            call_id="call_1",
            tool="refund",
            arguments=arguments,
            digest=arguments_digest(arguments),
        )
        assert (await store.claim(request, actor="w1")).outcome == "pending"
        store.forget_draft(run.run_id)  # its start was cancelled
        with pytest.raises(RunNotFound):
            await store.get_run(run.run_id)
        assert await store.list() == []


APPROVE = Decision(approved=True, decided_by="ana")


async def _nothing() -> None:
    return None


async def test_a_review_a_draft_opens_is_the_record_written(url: str) -> None:
    # The record a draft's claim returns is made from the request; it must be what is written.
    async with SqlApprovalStore(url) as store:
        run = await store.draft_run(
            agent="support", messages=[HumanMessage(content="refund A-1")], worker="w1"
        )
        arguments = {"order_id": "A-1", "amount": 10.0}
        request = ApprovalRequest(
            run.run_id,
            "call_1",
            "refund",
            arguments,
            arguments_digest(arguments),
            requested_by="ana",
            policy={"reviewers": ["bob"]},
        )
        claim = await store.claim(request)
        assert claim.outcome == "pending"
        # Reading the review writes the draft first.
        assert await store.get(claim.record.approval_id) == claim.record


async def test_the_reviews_a_first_save_wrote_are_known_without_a_read(url: str) -> None:
    async with SqlApprovalStore(url) as store, SqlApprovalStore(url) as other:
        start = Start(store, lambda run_id: _nothing())
        waiting = await start.step(await start.draft())
        assert waiting.status == "waiting"
        opened = store.opened_reviews(start.run_id)
        assert opened is not None and opened.deliveries is None  # no announcer: not announced
        reviews = opened.reviews
        assert reviews == await other.list(run_id=start.run_id)  # as written, in their order
        assert [review.request.call_id for review in reviews] == ["call_1", "call_2"]
        assert store.opened_reviews(start.run_id) is None  # asked once
        assert other.opened_reviews(start.run_id) is None  # another store did not write it


async def test_a_draft_written_before_its_first_save_leaves_its_reviews_to_a_read(
    url: str,
) -> None:
    # Written by an operation that named it, in the middle of the step: its first save is
    # an update like any other, and what it opened is listed, not known.
    async with SqlApprovalStore(url) as store:

        async def look(run_id: str) -> None:
            await store.get_run(run_id)

        start = Start(store, look)
        assert (await start.step(await start.draft())).status == "waiting"
        assert store.opened_reviews(start.run_id) is None
        assert len(await store.list(run_id=start.run_id)) == 2


class Announcing:
    """An announcer: a request to `webhook:ops` at once and a reminder an hour later for
    each review, those due at once claimed by w1; or a channel's bug, while `broken`."""

    worker = "w1"
    lease = 60.0

    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken

    def opening(self, record: ApprovalRecord) -> list[NewDelivery]:
        if self.broken:
            raise RuntimeError("the channel's bug")
        later = record.created_at + timedelta(hours=1)
        return [
            NewDelivery("request", "webhook:ops"),
            NewDelivery("escalation", "webhook:ops", later),
        ]


async def test_a_first_save_announces_the_reviews_it_writes_with_them(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        start = Start(store, lambda run_id: _nothing())
        run = await start.draft(Announcing())
        assert (await start.step(run)).status == "waiting"
        opened = store.opened_reviews(run.run_id)
        assert opened is not None
        if url.startswith("postgresql"):  # one statement: left to the outbox
            assert opened.deliveries is None
            assert len(await store.unannounced()) == 2
            return
        assert await store.unannounced() == []  # announced in the save's transaction
        assert opened.deliveries is not None
        for review in opened.reviews:
            stored = await store.deliveries(review.approval_id)
            assert [d for d in opened.deliveries if d.approval_id == review.approval_id] == stored
            request, escalation = stored
            assert (request.kind, request.claimed_by) == ("request", "w1")
            assert request.lease_until is not None and request.status == "due"
            assert (escalation.kind, escalation.claimed_by) == ("escalation", None)
            assert escalation.due_at == review.created_at + timedelta(hours=1)
        # Claimed: nobody else takes the request meanwhile; the escalation is not due yet.
        assert await store.claim_deliveries(worker="w2") == []
    assert (await verify(url)).ok


async def test_reviews_whose_announcer_fails_are_left_to_the_outbox(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        start = Start(store, lambda run_id: _nothing())
        run = await start.draft(Announcing(broken=True))
        assert (await start.step(run)).status == "waiting"  # the run is written all the same
        opened = store.opened_reviews(run.run_id)
        assert opened is not None and opened.deliveries is None
        assert [a.record for a in await store.unannounced()] == opened.reviews
