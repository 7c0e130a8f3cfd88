"""Seed 001's resume checks where they apply to nodbot's tool loop: answers given on resume
by key (`approve_<call id>`) must name calls the paused run waits on, and a paused run takes
no new input; both are checked before anything is recorded or run. A resume that leaves
calls undecided stays pending, as it always has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.core import (
    Agent,
    ApprovalStore,
    AutoDeny,
    ChatResponse,
    ConfigurationError,
    DeferredApproval,
    Executor,
    HumanMessage,
    InvalidArgumentsError,
    InvalidDecisionError,
    LoopResult,
    MemoryApprovalStore,
    NodbotError,
    NotPendingError,
    ResumeError,
    RunPausedError,
    ScriptedChat,
    SystemMessage,
    ToolCall,
    ToolRegistry,
    run_tool_loop,
)


def refund_call(call_id: str, amount: float = 500) -> ToolCall:
    return ToolCall(name="refund", arguments={"order_id": "o-7", "amount": amount}, id=call_id)


@dataclass
class Run:
    """An agent whose model asks for two reviewed refunds in one turn, then answers."""

    store: MemoryApprovalStore = field(default_factory=MemoryApprovalStore)
    paid: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        tools = ToolRegistry()

        @tools.tool(confirm=True, effects="destructive")
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.paid.append(amount)
            return f"refunded {amount} on {order_id}"

        turn = ChatResponse(tool_calls=[refund_call("call_1"), refund_call("call_2", 20)])
        self.chat = ScriptedChat([turn, "Done."])
        self.agent = Agent(self.chat, tools)
        self.executor = Executor(tools, approval=DeferredApproval(self.store))
        self.ctx = self.executor.context("run_1")

    async def start(self) -> LoopResult:
        paused = await self.agent.run("Refund o-7", self.ctx)
        assert paused.finish == "pending"
        return paused

    async def resume(self, paused: LoopResult, answers: dict[str, Any]) -> LoopResult:
        return await run_tool_loop(
            self.chat, paused.messages, self.ctx, answers=answers, decided_by="ana"
        )

    async def statuses(self) -> list[str]:
        return [record.status for record in await self.store.list(run_id="run_1")]


@pytest.fixture
def run() -> Run:
    return Run()


async def test_answers_by_key_decide_and_the_run_goes_on(run: Run) -> None:
    paused = await run.start()
    assert sorted(paused.interrupts) == ["approve_call_1", "approve_call_2"]
    done = await run.resume(paused, {"approve_call_1": True, "approve_call_2": False})
    assert (done.finish, done.final_text) == ("stop", "Done.")
    assert run.paid == [500.0]
    record = await run.store.find("run_1", "call_1")
    assert record is not None and record.decision is not None
    assert record.decision.decided_by == "ana"
    decided = [e for e in await run.store.events(record.approval_id) if e.kind == "decided"]
    assert [(e.actor, e.channel) for e in decided] == [("ana", "resume")]


async def test_a_resume_that_leaves_calls_undecided_stays_pending_on_them(run: Run) -> None:
    paused = await run.start()
    again = await run.resume(paused, {"approve_call_2": {"type": "approve"}})
    assert again.finish == "pending"
    assert sorted(again.interrupts) == ["approve_call_1"]
    assert run.paid == [20.0]
    # With no answers at all, as ever: nothing changes, and it is no error.
    still = await run_tool_loop(run.chat, again.messages, run.ctx)
    assert (still.finish, sorted(still.interrupts)) == ("pending", ["approve_call_1"])


async def test_an_answer_for_a_key_that_is_not_pending_is_refused_and_nothing_recorded(
    run: Run,
) -> None:
    paused = await run.start()
    with pytest.raises(NotPendingError) as refused:
        await run.resume(paused, {"approve_call_1": True, "approve_call_9": True})
    assert refused.value.keys == ["approve_call_9"]
    assert refused.value.pending == ["approve_call_1", "approve_call_2"]
    assert refused.value.kind == "not-pending" and refused.value.run_id == "run_1"
    assert "'approve_call_9'" in refused.value.message
    assert await run.statuses() == ["pending", "pending"]  # call_1's answer was not recorded
    assert run.paid == []


async def test_an_answer_for_a_call_decided_already_is_refused(run: Run) -> None:
    paused = await run.start()
    await run.executor.decide(paused.interrupts["approve_call_1"].approval_id, True)
    with pytest.raises(NotPendingError) as refused:
        await run.resume(paused, {"approve_call_1": False})
    assert refused.value.pending == ["approve_call_2"]
    record = await run.store.find("run_1", "call_1")
    assert record is not None and record.status == "approved"
    assert run.paid == []


async def test_answers_on_a_run_with_nothing_pending_are_refused(run: Run) -> None:
    paused = await run.start()
    done = await run.resume(paused, {"approve_call_1": True, "approve_call_2": True})
    assert done.finish == "stop"
    with pytest.raises(NotPendingError) as refused:
        await run.resume(done, {"approve_call_1": True})
    assert refused.value.pending == []
    assert run.paid == [500.0, 20.0]


async def test_an_answer_of_no_known_form_records_none_of_them(run: Run) -> None:
    paused = await run.start()
    with pytest.raises(InvalidDecisionError):
        await run.resume(paused, {"approve_call_1": True, "approve_call_2": {"decision": "yes"}})
    edit = {"action": "edit", "arguments": {"amount": "lots"}}
    with pytest.raises(InvalidArgumentsError):
        await run.resume(paused, {"approve_call_1": True, "approve_call_2": edit})
    assert await run.statuses() == ["pending", "pending"]
    assert run.paid == []


@pytest.mark.parametrize("new", [HumanMessage(content="also o-8"), SystemMessage(content="hurry")])
async def test_new_input_on_a_paused_run_is_refused(run: Run, new: Any) -> None:
    paused = await run.start()
    with pytest.raises(RunPausedError) as refused:
        await run_tool_loop(run.chat, [*paused.messages, new], run.ctx)
    assert refused.value.waiting == ["approve_call_1", "approve_call_2"]
    assert refused.value.kind == "run-paused"
    assert f"a {new.role} message came after the turn whose calls wait" in refused.value.message
    with pytest.raises(RunPausedError):  # with answers too: checked before they are recorded
        await run.agent.run(
            [*paused.messages, new], run.ctx, answers={"approve_call_1": True}, decided_by="ana"
        )
    assert await run.statuses() == ["pending", "pending"]
    assert run.paid == []


async def test_new_input_after_some_calls_answered_is_refused_too(run: Run) -> None:
    paused = await run.start()
    half = await run.resume(paused, {"approve_call_2": True})
    assert run.paid == [20.0]
    with pytest.raises(RunPausedError) as refused:
        await run_tool_loop(run.chat, [*half.messages, HumanMessage(content="?")], run.ctx)
    assert refused.value.waiting == ["approve_call_1"]


async def test_new_text_under_the_id_of_a_paused_run_is_refused(run: Run) -> None:
    await run.start()
    with pytest.raises(RunPausedError) as refused:
        await run.agent.run("Refund o-8 instead", run.ctx)
    assert refused.value.waiting == ["approve_call_1", "approve_call_2"]
    assert len(await run.store.list()) == 2  # nothing new asked, nothing ran
    assert run.paid == []
    # Another run id is another run.
    other = await run.agent.run("Refund o-8 instead", run.executor.context("run_2"))
    assert other.finish == "pending"


async def test_a_run_decided_but_not_resumed_is_still_paused(run: Run) -> None:
    paused = await run.start()
    for pending in paused.pending:
        await run.executor.decide(pending.approval_id, True, decided_by="ana")
    with pytest.raises(RunPausedError):  # its calls would take the decisions of the first
        await run.agent.run("Refund o-7", run.ctx)
    assert run.paid == []
    done = await run_tool_loop(run.chat, paused.messages, run.ctx)  # the resume takes them
    assert done.finish == "stop" and sorted(run.paid) == [20.0, 500.0]
    # Once every review is taken, the run id may start over.
    again = await run.agent.run("Refund o-7", run.ctx)
    assert again.finish == "pending"


async def test_input_after_the_model_answered_is_a_new_turn_not_a_paused_run(run: Run) -> None:
    paused = await run.start()
    done = await run.resume(paused, {"approve_call_1": True, "approve_call_2": True})
    chat = ScriptedChat([*run.chat.responses, "And o-8 is fine."])
    more = await run_tool_loop(chat, [*done.messages, HumanMessage(content="o-8?")], run.ctx)
    assert (more.finish, more.final_text) == ("stop", "And o-8 is fine.")


async def test_answers_need_a_deferred_approval_port(run: Run) -> None:
    paused = await run.start()
    denying = Executor(run.agent.tools, approval=AutoDeny())
    ctx = denying.context("run_1")
    with pytest.raises(ConfigurationError, match="DeferredApproval"):
        await run_tool_loop(run.chat, paused.messages, ctx, answers={"approve_call_1": True})


def test_the_resume_errors_are_nodbot_errors_with_their_own_kinds() -> None:
    not_pending = NotPendingError(run_id="r", keys=["k" * 500], pending=[])
    paused = RunPausedError(run_id="r", waiting=["approve_c"], reason="why")
    for error in (not_pending, paused):
        assert isinstance(error, ResumeError) and isinstance(error, NodbotError)
    assert len(not_pending.message) < 300  # a long key is cut in the message ...
    assert not_pending.details()["keys"] == ["k" * 500]  # ... and kept whole in the details
    assert paused.details() == {"run_id": "r", "waiting": ["approve_c"]}
    assert {NotPendingError.kind, RunPausedError.kind, ResumeError.kind} == {
        "not-pending",
        "run-paused",
        "resume-error",
    }


@given(keys=st.lists(st.text(max_size=40), min_size=1, max_size=4, unique=True))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_any_key_the_run_does_not_wait_on_is_refused_and_nothing_recorded(
    keys: list[str],
) -> None:
    run = Run()
    paused = await run.start()
    unknown = [key for key in keys if key not in paused.interrupts]
    answers: dict[str, Any] = dict.fromkeys(keys, True)
    if not unknown:
        return  # only real keys: the checks pass (shown above)
    with pytest.raises(NotPendingError) as refused:
        await run.resume(paused, answers)
    assert refused.value.keys == unknown
    assert await run.statuses() == ["pending", "pending"]
    assert run.paid == []


async def test_a_durable_store_takes_answers_the_same_way(tmp_path: Any) -> None:
    from nodbot.core.sqlstore import SqlApprovalStore

    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        run = Run()
        run.executor = Executor(run.agent.tools, approval=DeferredApproval(store))
        run.ctx = run.executor.context("run_1")
        paused = await run.start()
        with pytest.raises(NotPendingError):
            await run.resume(paused, {"approve_call_3": True})
        done = await run.resume(paused, {"approve_call_1": True, "approve_call_2": True})
        assert done.finish == "stop" and sorted(run.paid) == [20.0, 500.0]
        assert isinstance(store, ApprovalStore)
