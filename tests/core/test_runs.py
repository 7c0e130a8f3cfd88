"""Durable runs: pause, wait for every decision, be claimed by a worker, resume once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeAlias

import pytest
from pydantic import TypeAdapter

from nodbot.core import (
    Agent,
    ApprovalRecord,
    ApprovalStore,
    ChatResponse,
    DeferredApproval,
    Executor,
    HumanMessage,
    MemoryApprovalStore,
    MemoryRunStore,
    Message,
    RunConflict,
    RunNotFound,
    RunRecord,
    RunStore,
    ScriptedChat,
    SqlApprovalStore,
    ToolCall,
    ToolMessage,
    ToolRegistry,
    ToolSpec,
    advance_run,
)
from nodbot.core.runs import DEFAULT_LEASE
from tests.core.store.conftest import BACKENDS, database_url
from tests.support import eventually

MESSAGES = TypeAdapter(list[Message])


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def refund_turn(*call_ids: str) -> ChatResponse:
    calls = [
        ToolCall(id=call_id, name="refund", arguments={"order_id": "A-1", "amount": 120.0})
        for call_id in call_ids
    ]
    return ChatResponse(tool_calls=calls)


class Bot:
    """A support agent whose refunds need review, and a store of its approvals and runs."""

    def __init__(
        self,
        approvals: ApprovalStore,
        runs: RunStore,
        clock: Clock,
        script: list[ChatResponse | str] | None = None,
    ) -> None:
        self.approvals, self.runs, self.clock = approvals, runs, clock
        self.refunds: list[float] = []
        tools = ToolRegistry()

        @tools.tool(confirm=True)
        def refund(order_id: str, amount: float) -> str:
            self.refunds.append(amount)
            return f"refunded {amount} on {order_id}"

        script = script if script is not None else [refund_turn("call_1"), "The refund is done."]
        self.agent = Agent(ScriptedChat(script), tools)
        self.executor = self.agent.executor(approval=DeferredApproval(approvals))

    async def start(self, text: str = "Refund order A-1", run_id: str = "run_1") -> RunRecord:
        run = await self.runs.create_run(
            agent="support",
            messages=[HumanMessage(content=text)],
            worker="w1",
            requested_by="carol",
            run_id=run_id,
        )
        return await advance_run(run, agent=self.agent, executor=self.executor, runs=self.runs)

    async def pending_ids(self, run_id: str = "run_1") -> list[str]:
        return [r.approval_id for r in await self.approvals.list(run_id=run_id, status="pending")]

    async def resume_ready(self, worker: str = "w2") -> list[RunRecord]:
        claimed = await self.runs.claim_ready(worker=worker)
        return [
            await advance_run(run, agent=self.agent, executor=self.executor, runs=self.runs)
            for run in claimed
        ]


MakeBot: TypeAlias = Callable[..., Awaitable[Bot]]


@pytest.fixture(params=BACKENDS)
async def make_bot(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeBot]:
    """Builds bots whose approvals and runs live in a fresh store of each backend."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(script: list[ChatResponse | str] | None = None) -> Bot:
            clock = Clock()
            if request.param == "memory":
                approvals = MemoryApprovalStore(clock=clock)
                return Bot(approvals, MemoryRunStore(approvals, clock=clock), clock, script)
            url = await stack.enter_async_context(database_url(request.param, tmp_path))
            store = await stack.enter_async_context(SqlApprovalStore(url, clock=clock))
            return Bot(store, store, clock, script)

        yield make


async def test_a_run_waits_for_review_then_a_worker_finishes_it_once(make_bot: MakeBot) -> None:
    bot = await make_bot()
    waiting = await bot.start()
    assert waiting.status == "waiting"
    assert waiting.claimed_by is None
    assert bot.refunds == []
    assert await bot.runs.claim_ready(worker="w2") == []  # still pending

    [approval_id] = await bot.pending_ids()
    await bot.executor.decide(approval_id, True, decided_by="ana")
    [finished] = await bot.resume_ready()
    assert finished.status == "finished"
    assert finished.final_text == "The refund is done."
    assert bot.refunds == [120.0]
    assert await bot.resume_ready() == []  # nothing left to do
    assert (await bot.runs.get_run("run_1")).status == "finished"


async def test_a_run_resumes_only_when_every_pending_call_is_decided(make_bot: MakeBot) -> None:
    bot = await make_bot(script=[refund_turn("call_1", "call_2"), "Both refunds are done."])
    await bot.start()
    first, second = await bot.pending_ids()
    await bot.executor.decide(first, True)
    assert await bot.runs.claim_ready(worker="w2") == []
    await bot.executor.decide(second, {"action": "deny", "message": "one is enough"})
    [finished] = await bot.resume_ready()
    assert finished.status == "finished"
    assert bot.refunds == [120.0]
    denial = [m for m in finished.messages if getattr(m, "status", None) == "error"]
    assert "one is enough" in denial[0].content  # type: ignore[union-attr]


async def test_a_claim_is_exclusive_until_its_lease_runs_out(make_bot: MakeBot) -> None:
    bot = await make_bot()
    await bot.start()
    [approval_id] = await bot.pending_ids()
    await bot.executor.decide(approval_id, True)
    [claimed] = await bot.runs.claim_ready(worker="w2", lease=60)
    assert (claimed.status, claimed.claimed_by) == ("running", "w2")
    assert await bot.runs.claim_ready(worker="w3") == []
    bot.clock.advance(61)  # w2 died: its lease ran out
    [taken_over] = await bot.runs.claim_ready(worker="w3")
    assert taken_over.claimed_by == "w3"
    with pytest.raises(RunConflict, match="saved by someone else"):
        await advance_run(claimed, agent=bot.agent, executor=bot.executor, runs=bot.runs)
    assert bot.refunds == []  # w2 came back too late: it ran nothing
    done = await advance_run(taken_over, agent=bot.agent, executor=bot.executor, runs=bot.runs)
    assert done.status == "finished"
    assert bot.refunds == [120.0]


class Watching:
    """A chat model that asks for a refund, then, on the turn after it ran, looks at the
    store's record of its review (`seen`) and answers; `then` runs at that moment too."""

    def __init__(self, approvals: ApprovalStore, then: Callable[[], Awaitable[None]]) -> None:
        self.approvals, self.then = approvals, then
        self.seen: list[ApprovalRecord] = []

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if not any(isinstance(message, ToolMessage) for message in messages):
            return refund_turn("call_1")
        [record] = await self.approvals.list(run_id="run_1")
        self.seen.append(record)
        await self.then()
        return ChatResponse(content="The refund is done.")


async def nothing() -> None:
    return None


async def test_a_review_is_finished_by_the_save_of_the_step_that_ran_its_call(
    make_bot: MakeBot,
) -> None:
    """The step's save records the review finished, in its transaction: while the step goes
    on after the tool ran, the review is spent (no second call may take it) but not yet
    finished; once saved, it is finished with the call's outcome, and the run holds the
    result."""
    bot = await make_bot()
    chat = Watching(bot.approvals, nothing)
    bot.agent = Agent(chat, bot.agent.tools)
    await bot.start()
    [approval_id] = await bot.pending_ids()
    await bot.executor.decide(approval_id, True, decided_by="ana")
    [finished] = await bot.resume_ready()
    [during] = chat.seen
    assert (during.consumed, during.finished) == (True, False)
    record = await bot.approvals.get(approval_id)
    assert (record.finished, record.outcome) == (True, "ok")
    assert finished.status == "finished" and bot.refunds == [120.0]
    assert any(isinstance(m, ToolMessage) and m.status == "ok" for m in finished.messages)
    kinds = [event.kind for event in await bot.approvals.events(approval_id)]
    assert kinds == ["created", "voted", "decided", "consumed", "finished"]


async def test_a_step_taken_over_after_its_call_ran_hands_its_result_to_the_next(
    make_bot: MakeBot,
) -> None:
    """The worker's lease runs out after the tool ran and another worker claims the run: the
    late save is refused (`RunConflict`) and finishes nothing, but the call's result is kept
    with its review; the worker that took over answers the call with it (the tool does not
    run again), and its save finishes the review."""
    bot = await make_bot()

    async def taken_over() -> None:
        bot.clock.advance(DEFAULT_LEASE + 1)  # past the lease advance_run renewed
        [_] = await bot.runs.claim_ready(worker="w3")

    bot.agent = Agent(Watching(bot.approvals, taken_over), bot.agent.tools)
    await bot.start()
    [approval_id] = await bot.pending_ids()
    await bot.executor.decide(approval_id, True, decided_by="ana")
    [claimed] = await bot.runs.claim_ready(worker="w2", lease=60)
    with pytest.raises(RunConflict):
        await advance_run(claimed, agent=bot.agent, executor=bot.executor, runs=bot.runs)
    record = await bot.approvals.get(approval_id)
    assert (record.consumed, record.finished) == (True, False)
    assert bot.refunds == [120.0]
    events = await bot.approvals.events(approval_id)
    [kept] = [event for event in events if event.kind == "kept"]
    assert kept.detail["result"]["status"] == "ok"

    bot.agent = Agent(Watching(bot.approvals, nothing), bot.agent.tools)
    taker = await bot.runs.get_run(claimed.run_id)
    assert taker.claimed_by == "w3"
    finished = await advance_run(taker, agent=bot.agent, executor=bot.executor, runs=bot.runs)
    assert finished.status == "finished"
    assert bot.refunds == [120.0]  # answered with the kept result: not run again
    [answer] = [m for m in finished.messages if isinstance(m, ToolMessage)]
    assert answer.status == "ok" and answer.arguments == {"order_id": "A-1", "amount": 120.0}
    assert answer.content == '{"result":"refunded 120.0 on A-1"}'
    record = await bot.approvals.get(approval_id)
    assert (record.finished, record.outcome) == (True, "ok")


async def test_an_expired_claim_cannot_be_renewed_even_before_a_takeover(make_bot: MakeBot) -> None:
    bot = await make_bot()
    await bot.start()
    [approval_id] = await bot.pending_ids()
    await bot.executor.decide(approval_id, True)
    [claimed] = await bot.runs.claim_ready(worker="w2", lease=60)
    renewed = await bot.runs.renew_claim(claimed, lease=60)
    assert renewed.lease_until is not None and renewed.lease_until > bot.clock()
    bot.clock.advance(61)
    with pytest.raises(RunConflict, match="the claim of w2 has expired"):
        await bot.runs.renew_claim(renewed)
    assert bot.refunds == []


async def test_a_failing_model_fails_the_run_and_keeps_its_conversation(make_bot: MakeBot) -> None:
    bot = await make_bot(script=[])  # the model has nothing to say
    failed = await bot.start()
    assert failed.status == "failed"
    assert failed.error is not None and "ScriptedChat has 0 responses" in failed.error
    assert [m.role for m in failed.messages] == ["user"]


async def test_a_run_cut_off_by_max_turns_fails_with_the_reason(make_bot: MakeBot) -> None:
    bot = await make_bot(script=[refund_turn("call_1"), "done"])
    run = await bot.runs.create_run(
        agent="support", messages=[HumanMessage(content="hi")], worker="w1"
    )
    cut = await advance_run(run, agent=bot.agent, executor=bot.executor, runs=bot.runs, max_turns=1)
    assert cut.status == "failed"
    assert cut.error == "stopped after 1 model turns"


async def test_runs_are_kept_as_json_ready_messages(make_bot: MakeBot) -> None:
    bot = await make_bot()
    waiting = await bot.start()
    again = MESSAGES.validate_json(MESSAGES.dump_json(waiting.messages))
    assert again == waiting.messages


async def test_unknown_run_and_duplicate_run_id(make_bot: MakeBot) -> None:
    bot = await make_bot()
    with pytest.raises(RunNotFound, match="run_x"):
        await bot.runs.get_run("run_x")
    await bot.start(run_id="run_1")
    with pytest.raises(RunConflict):
        await bot.start(run_id="run_1")


async def test_a_save_must_name_the_version_it_read(make_bot: MakeBot) -> None:
    bot = await make_bot()
    run = await bot.runs.create_run(agent="support", messages=[], worker="w1")
    saved = await bot.runs.save_run(run, status="waiting", messages=[])
    assert (saved.version, saved.claimed_by) == (run.version + 1, None)
    with pytest.raises(RunConflict) as raised:
        await bot.runs.save_run(run, status="finished", messages=[])
    assert (raised.value.expected, raised.value.found) == (run.version, saved.version)
    assert (await bot.runs.get_run(run.run_id)).status == "waiting"


async def test_the_same_executor_serves_any_run_id(make_bot: MakeBot) -> None:
    bot = await make_bot()
    await bot.start(run_id="run_a")
    await bot.start(run_id="run_b")
    for approval_id in await bot.pending_ids("run_a") + await bot.pending_ids("run_b"):
        await bot.executor.decide(approval_id, True)
    finished = await bot.resume_ready()
    assert sorted(run.run_id for run in finished) == ["run_a", "run_b"]
    assert bot.refunds == [120.0, 120.0]
    assert isinstance(bot.executor, Executor)


async def test_concurrent_claims_hand_each_run_to_one_worker(make_bot: MakeBot) -> None:
    bot = await make_bot()
    for _ in range(6):
        run = await bot.runs.create_run(agent="support", messages=[], worker="w0")
        await bot.runs.save_run(run, status="waiting", messages=[])
    claims = await asyncio.gather(
        *(bot.runs.claim_ready(worker=f"w{n}", limit=2) for n in range(1, 5))
    )
    assert all(len(claim) <= 2 for claim in claims)
    claimed = [run.run_id for claim in claims for run in claim]
    assert len(claimed) == 6
    assert len(set(claimed)) == 6  # nobody got a run twice


async def test_a_run_keeps_who_started_it_for_its_requester(make_bot: MakeBot) -> None:
    bot = await make_bot()
    run = await bot.runs.create_run(
        agent="support",
        messages=[HumanMessage(content="Refund order A-1")],
        worker="w1",
        requested_by="carol",
        started_by="frontend",
    )
    assert (run.requested_by, run.started_by) == ("carol", "frontend")
    saved = await bot.runs.save_run(run, status="waiting", messages=run.messages)
    assert saved.started_by == "frontend"
    assert (await bot.runs.get_run(run.run_id)).started_by == "frontend"


async def test_a_call_that_ran_while_the_database_was_locked_is_recorded_not_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's writes fail (another process holds SQLite's write lock past the store's
    `lock_timeout`) just after the tool ran: its approval is settled and the run saved once
    the lock is let go, so the run finishes with the tool's result, the tool ran once, and
    the run is never marked failed."""
    path = tmp_path / "nodbot.db"
    # Another process, as far as SQLite can tell; used from the tool's worker thread too.
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    ran_under_lock = asyncio.Event()
    refunds: list[float] = []
    tools = ToolRegistry()

    @tools.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        refunds.append(amount)
        holder.execute("BEGIN IMMEDIATE")  # from now on, every write of the store fails
        ran_under_lock.set()
        return f"refunded {amount} on {order_id}"

    agent = Agent(ScriptedChat([refund_turn("call_1"), "The refund is done."]), tools)
    async with SqlApprovalStore(f"sqlite:///{path}", lock_timeout=0.05) as store:
        executor = agent.executor(approval=DeferredApproval(store))
        run = await store.create_run(
            agent="support", messages=[HumanMessage(content="Refund order A-1")], worker="w1"
        )
        waiting = await advance_run(run, agent=agent, executor=executor, runs=store)
        [pending] = await store.list(run_id=run.run_id, status="pending")
        await executor.decide(pending.approval_id, True, decided_by="ana")
        [claimed] = await store.claim_ready(worker="w2")
        caplog.set_level(logging.WARNING, logger="nodbot.core.retrying")
        advancing = asyncio.create_task(
            advance_run(claimed, agent=agent, executor=executor, runs=store)
        )
        async with asyncio.timeout(30):
            await ran_under_lock.wait()

        async def retried() -> bool:
            return any("trying again" in r.getMessage() for r in caplog.records)

        await eventually(retried, "a write tried again while the database is locked")
        holder.execute("ROLLBACK")
        async with asyncio.timeout(30):
            finished = await advancing
        holder.close()
        record = await store.get(pending.approval_id)
    assert waiting.status == "waiting"
    assert finished.status == "finished", finished.error
    assert finished.final_text == "The refund is done."
    assert refunds == [120.0]
    assert (record.outcome, record.finished_at is not None) == ("ok", True)
