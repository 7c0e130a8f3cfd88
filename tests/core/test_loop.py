"""The tool loop: risky calls pause for review, and a resumed run runs each call at most once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import TypeAdapter

from nodbot.core import (
    Agent,
    ApprovalPort,
    AssistantMessage,
    ChatResponse,
    ConfigurationError,
    DeferredApproval,
    Executor,
    HumanMessage,
    InterruptRule,
    LoopResult,
    MemoryApprovalStore,
    Message,
    PendingCall,
    ScriptedChat,
    SystemMessage,
    ToolCall,
    ToolContext,
    ToolDecision,
    ToolMessage,
    ToolRegistry,
    ToolSpec,
    gt,
    run_tool_loop,
)

RUN_ID = "support-1"
DONE = "The refund is done."
RULES = (InterruptRule(tool="refund", match=gt("amount", 100)),)
MESSAGES = TypeAdapter(list[Message])


# --- tools that count their calls -------------------------------------------------------------


@dataclass
class Tools:
    """A registry whose tools record every time they actually run."""

    registry: ToolRegistry = field(default_factory=ToolRegistry)
    refunds: list[dict[str, Any]] = field(default_factory=list)
    lookups: list[dict[str, Any]] = field(default_factory=list)
    deletions: list[dict[str, Any]] = field(default_factory=list)


def make_tools() -> Tools:
    tools = Tools()

    @tools.registry.tool
    def refund(order_id: str, amount: float) -> str:
        """Refund an amount on an order."""
        tools.refunds.append({"order_id": order_id, "amount": amount})
        return f"refunded {amount} on {order_id}"

    @tools.registry.tool
    def lookup_order(order_id: str, detailed: bool = False) -> dict[str, Any]:
        """Look an order up."""
        tools.lookups.append({"order_id": order_id, "detailed": detailed})
        return {"order_id": order_id, "status": "shipped"}

    @tools.registry.tool(confirm=True, effects="destructive")
    def delete_order(order_id: str, reason: str = "customer request") -> str:
        """Delete an order."""
        tools.deletions.append({"order_id": order_id, "reason": reason})
        return f"deleted {order_id}"

    return tools


@pytest.fixture
def tools() -> Tools:
    return make_tools()


@pytest.fixture
def store() -> MemoryApprovalStore:
    return MemoryApprovalStore()


# --- scripts and a chat model that remembers what it was shown --------------------------------


class RecordingChat(ScriptedChat):
    """A `ScriptedChat` that keeps every conversation it was asked to answer."""

    def __init__(self, responses: Sequence[ChatResponse | str]) -> None:
        super().__init__(responses)
        self.seen: list[list[Message]] = []

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        self.seen.append(list(messages))
        return await super().respond(messages, tools)


def refund_call(amount: float, call_id: str = "call_1", order_id: str = "A-1001") -> ToolCall:
    return ToolCall(id=call_id, name="refund", arguments={"order_id": order_id, "amount": amount})


def lookup_call(call_id: str = "call_2", order_id: str = "A-1001") -> ToolCall:
    return ToolCall(id=call_id, name="lookup_order", arguments={"order_id": order_id})


def turn(*calls: ToolCall) -> ChatResponse:
    return ChatResponse(tool_calls=list(calls))


def refund_script(amount: float = 120.0) -> list[ChatResponse | str]:
    return [turn(refund_call(amount)), DONE]


# --- a run: agent, executor and context -------------------------------------------------------


@dataclass
class Session:
    agent: Agent
    chat: RecordingChat
    executor: Executor
    ctx: ToolContext

    async def start(self, text: str = "Refund order A-1001") -> LoopResult:
        return await self.agent.run(text, self.ctx)

    async def resume(self, result: LoopResult) -> LoopResult:
        return await run_tool_loop(self.chat, result.messages, self.ctx)

    async def decide(self, pending: PendingCall, answer: object) -> None:
        await self.executor.decide(pending.approval_id, answer, decided_by="ana")


def session(
    tools: Tools,
    script: Sequence[ChatResponse | str],
    store: MemoryApprovalStore | None,
    *,
    rules: Sequence[InterruptRule] = RULES,
    system_prompt: str | None = None,
) -> Session:
    """A run over `tools`; without a store the executor has no approval port."""
    chat = RecordingChat(script)
    agent = Agent(chat, tools.registry, system_prompt=system_prompt)
    approval: ApprovalPort | None = None if store is None else DeferredApproval(store)
    executor = agent.executor(approval=approval, rules=rules)
    return Session(agent, chat, executor, executor.context(run_id=RUN_ID))


def tool_messages(messages: Sequence[Message]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def tool_message(result: LoopResult, call_id: str) -> ToolMessage:
    [message] = [m for m in tool_messages(result.messages) if m.tool_call_id == call_id]
    return message


def only_pending(result: LoopResult) -> PendingCall:
    assert result.finish == "pending"
    [pending] = result.pending
    return pending


def assert_finished(result: LoopResult, final_text: str = DONE) -> None:
    assert result.finish == "stop"
    assert result.final_text == final_text
    assert result.pending == []
    assert result.messages[-1] == AssistantMessage(content=final_text)


# --- runs that need no review -----------------------------------------------------------------


async def test_run_without_risky_call_finishes_with_compact_json_result(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(amount=20.0), store)

    result = await run.start()

    assert_finished(result)
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    message = tool_message(result, "call_1")
    assert message.name == "refund"
    assert message.status == "ok"
    assert message.content == '{"result":"refunded 20.0 on A-1001"}'
    assert message.arguments == {"order_id": "A-1001", "amount": 20.0}
    assert tools.refunds == [{"order_id": "A-1001", "amount": 20.0}]
    assert await store.list() == []


async def test_tool_message_holds_structured_result_and_validated_arguments(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, [turn(lookup_call()), "Shipped."], store)

    result = await run.start()

    assert_finished(result, "Shipped.")
    message = tool_message(result, "call_2")
    assert message.content == '{"result":{"order_id":"A-1001","status":"shipped"}}'
    assert json.loads(message.content) == {"result": {"order_id": "A-1001", "status": "shipped"}}
    # The default the tool ran with is part of the recorded arguments.
    assert message.arguments == {"order_id": "A-1001", "detailed": False}
    assert tools.lookups == [{"order_id": "A-1001", "detailed": False}]


# --- pausing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "ran"),
    [
        (refund_call(120.0), "refunds"),
        (
            ToolCall(
                id="call_1",
                name="delete_order",
                arguments={"order_id": "A-1001", "reason": "duplicate"},
            ),
            "deletions",
        ),
    ],
    ids=["interrupt-rule", "confirm-true"],
)
async def test_call_that_needs_review_pauses_without_running(
    tools: Tools, store: MemoryApprovalStore, call: ToolCall, ran: str
) -> None:
    run = session(tools, [turn(call), DONE], store)

    result = await run.start()

    pending = only_pending(result)
    assert result.final_text is None
    assert pending.interrupt.tool_name == call.name
    assert pending.interrupt.tool_call_id == "call_1"
    assert pending.interrupt.arguments == call.arguments
    assert result.interrupts == {"approve_call_1": pending}
    record = await store.get(pending.approval_id)
    assert record.status == "pending"
    assert (record.request.run_id, record.request.call_id) == (RUN_ID, "call_1")
    assert record.request.tool == call.name
    assert await store.list(status="pending") == [record]
    assert getattr(tools, ran) == []
    assert tool_messages(result.messages) == []
    assert result.messages[-1] == AssistantMessage(tool_calls=[call])


async def test_interrupt_key_escapes_unsafe_call_id(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, [turn(refund_call(120.0, call_id="call.1/é")), DONE], store)

    result = await run.start()

    assert list(result.interrupts) == ["approve_call.2e1.2f.c3.a9"]


async def test_pending_interrupt_shows_validated_arguments_like_the_store(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    call = ToolCall(id="call_1", name="delete_order", arguments={"order_id": "A-1001"})
    run = session(tools, [turn(call), DONE], store)

    pending = only_pending(await run.start())

    record = await store.get(pending.approval_id)
    assert record.request.arguments == {"order_id": "A-1001", "reason": "customer request"}
    assert pending.interrupt == record.request.interrupt


# --- resuming after a decision ----------------------------------------------------------------


@pytest.mark.parametrize("via", ["run_tool_loop", "agent.run"])
async def test_resume_after_approve_runs_the_tool_once(
    tools: Tools, store: MemoryApprovalStore, via: str
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()
    pending = only_pending(paused)
    await run.decide(pending, ToolDecision(action="approve"))

    if via == "agent.run":
        done = await run.agent.run(paused.messages, run.ctx)
    else:
        done = await run.resume(paused)

    assert_finished(done)
    assert tools.refunds == [{"order_id": "A-1001", "amount": 120.0}]
    message = tool_message(done, "call_1")
    assert message.status == "ok"
    assert message.content == '{"result":"refunded 120.0 on A-1001"}'
    assert message.arguments == {"order_id": "A-1001", "amount": 120.0}
    record = await store.get(pending.approval_id)
    assert (record.status, record.consumed, record.finished, record.outcome) == (
        "approved",
        True,
        True,
        "ok",
    )


async def test_resume_after_edit_runs_with_merged_arguments(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()
    edit = ToolDecision(action="edit", arguments={"amount": 100.0})
    await run.decide(only_pending(paused), edit)

    done = await run.resume(paused)

    assert_finished(done)
    assert tools.refunds == [{"order_id": "A-1001", "amount": 100.0}]
    assert done.messages[2] == tool_message(done, "call_1")
    assert done.messages[2].content == '{"result":"refunded 100.0 on A-1001"}'
    assert tool_message(done, "call_1").arguments == {"order_id": "A-1001", "amount": 100.0}


async def test_resume_after_deny_tells_the_model_the_reason(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()
    pending = only_pending(paused)
    await run.decide(pending, ToolDecision(action="deny", message="too much"))

    done = await run.resume(paused)

    assert_finished(done)
    assert tools.refunds == []
    message = tool_message(done, "call_1")
    assert message.status == "error"
    assert message.arguments is None
    assert "approval denied for tool" in message.content
    assert "too much" in message.content
    assert json.loads(message.content) == {"error": "approval denied for tool 'refund': too much"}
    # The model was asked again with the denial in its conversation.
    assert message in run.chat.seen[-1]
    assert (await store.get(pending.approval_id)).status == "denied"


async def test_resume_while_undecided_stays_pending(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()

    again = await run.resume(paused)

    assert only_pending(again).approval_id == only_pending(paused).approval_id
    assert again.messages == paused.messages
    assert tools.refunds == []
    assert len(run.chat.seen) == 1
    assert len(await store.list()) == 1


async def test_stale_paused_messages_resumed_twice_do_not_rerun_the_tool(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()
    first = only_pending(paused)
    await run.decide(first, True)
    assert_finished(await run.resume(paused))

    again = await run.resume(paused)

    # The decision is spent: the same call asked again opens a new review, it does not run.
    assert only_pending(again).approval_id != first.approval_id
    assert tools.refunds == [{"order_id": "A-1001", "amount": 120.0}]


async def test_concurrent_resume_runs_the_approved_call_once(
    store: MemoryApprovalStore,
) -> None:
    tools = Tools()
    started, release = asyncio.Event(), asyncio.Event()

    @tools.registry.tool(confirm=True)
    async def refund(order_id: str, amount: float) -> str:
        """Refund; the first call waits until released, so a second one overlaps it."""
        if not started.is_set():
            started.set()
            await release.wait()
        tools.refunds.append({"order_id": order_id, "amount": amount})
        return "refunded"

    run = session(tools, refund_script(), store, rules=())
    paused = await run.start()
    await run.decide(only_pending(paused), True)

    winner = asyncio.create_task(run.resume(paused))
    in_tool = asyncio.create_task(started.wait())
    await asyncio.wait({winner, in_tool}, return_when=asyncio.FIRST_COMPLETED)
    assert in_tool.done(), "the approved call never reached the tool"
    loser = await run.resume(paused)
    release.set()
    won = await winner

    assert_finished(won)
    assert_finished(loser)
    assert tool_message(won, "call_1").status == "ok"
    lost = tool_message(loser, "call_1")
    assert lost.status == "error"
    assert "approval already used by a concurrent request" in lost.content
    assert tools.refunds == [{"order_id": "A-1001", "amount": 120.0}]


# --- several calls in one turn ----------------------------------------------------------------


async def test_several_calls_each_get_their_own_review(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    calls = [refund_call(120.0, "call_a"), lookup_call("call_b"), refund_call(150.0, "call_c")]
    run = session(tools, [turn(*calls), DONE], store)

    paused = await run.start()

    assert paused.finish == "pending"
    assert set(paused.interrupts) == {"approve_call_a", "approve_call_c"}
    ids = {p.approval_id for p in paused.pending}
    assert len(ids) == 2
    assert {r.approval_id for r in await store.list(status="pending")} == ids
    # The call that needs no review ran at once; the risky ones did not.
    assert [m.tool_call_id for m in tool_messages(paused.messages)] == ["call_b"]
    assert len(tools.lookups) == 1
    assert tools.refunds == []

    await run.decide(paused.interrupts["approve_call_a"], True)
    partial = await run.resume(paused)

    left = only_pending(partial)
    assert left == paused.interrupts["approve_call_c"]
    assert tools.refunds == [{"order_id": "A-1001", "amount": 120.0}]
    assert len(tools.lookups) == 1

    await run.decide(left, ToolDecision(action="edit", arguments={"amount": 90.0}))
    done = await run.resume(partial)

    assert_finished(done)
    assert sorted(m.tool_call_id for m in tool_messages(done.messages)) == [
        "call_a",
        "call_b",
        "call_c",
    ]
    assert tools.refunds == [
        {"order_id": "A-1001", "amount": 120.0},
        {"order_id": "A-1001", "amount": 90.0},
    ]
    assert len(tools.lookups) == 1
    assert len(run.chat.seen) == 2


# --- resuming in another process --------------------------------------------------------------


async def test_run_resumes_in_another_process_from_serialized_messages(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    first = session(tools, refund_script(), store)
    paused = await first.start()
    approval_id = only_pending(paused).approval_id
    saved = MESSAGES.dump_json(paused.messages)

    # Another process: a new chat over the same script, a new executor over the same store.
    chat = ScriptedChat(refund_script())
    executor = Executor(tools.registry, approval=DeferredApproval(store), rules=RULES)
    await executor.decide(approval_id, True, decided_by="ana")
    messages = MESSAGES.validate_json(saved)
    assert messages == paused.messages

    done = await run_tool_loop(chat, messages, executor.context(run_id=RUN_ID))

    assert_finished(done)
    assert tools.refunds == [{"order_id": "A-1001", "amount": 120.0}]
    assert tool_message(done, "call_1").status == "ok"


async def test_resume_with_another_run_id_does_not_take_the_decision(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()
    first = only_pending(paused)
    await run.decide(first, True)

    other = await run_tool_loop(run.chat, paused.messages, run.executor.context(run_id="other"))

    assert only_pending(other).approval_id != first.approval_id
    assert tools.refunds == []
    assert (await store.get(first.approval_id)).consumed is False


async def test_replaying_answered_calls_runs_nothing(
    tools: Tools, store: MemoryApprovalStore
) -> None:
    run = session(tools, refund_script(), store)
    paused = await run.start()
    await run.decide(only_pending(paused), True)
    done = await run.resume(paused)
    records = await store.list()

    # Everything up to the last tool message: the call is answered, so only the model is asked.
    replay = await run_tool_loop(run.chat, done.messages[:-1], run.ctx)

    assert_finished(replay)
    assert replay.messages == done.messages
    assert tools.refunds == [{"order_id": "A-1001", "amount": 120.0}]
    assert await store.list() == records


# --- the chat model and the turn limit --------------------------------------------------------


async def test_scripted_chat_out_of_responses_names_the_turn(tools: Tools) -> None:
    run = session(tools, [turn(lookup_call())], None)

    with pytest.raises(ConfigurationError, match="1 responses; turn 2 was asked for"):
        await run.start()

    assert len(tools.lookups) == 1


async def test_max_turns_cuts_the_run_off_and_it_can_go_on(tools: Tools) -> None:
    script: list[ChatResponse | str] = [
        turn(lookup_call("call_1")),
        turn(lookup_call("call_2")),
        "Shipped.",
    ]
    run = session(tools, script, None)

    cut = await run.agent.run("Where is A-1001?", run.ctx, max_turns=2)

    assert cut.finish == "max_turns"
    assert cut.final_text is None
    assert cut.pending == []
    assert [m.tool_call_id for m in tool_messages(cut.messages)] == ["call_1"]
    assert len(tools.lookups) == 1

    done = await run.resume(cut)

    assert_finished(done, "Shipped.")
    assert len(tools.lookups) == 2


async def test_agent_puts_the_system_prompt_first(tools: Tools) -> None:
    run = session(tools, ["Hello."], None, system_prompt="Be careful.")

    result = await run.start("Hi")

    assert_finished(result, "Hello.")
    start = [SystemMessage(content="Be careful."), HumanMessage(content="Hi")]
    assert result.messages[:2] == start
    assert run.chat.seen == [start]


async def test_agent_without_system_prompt_starts_from_the_text(tools: Tools) -> None:
    run = session(tools, ["Hello."], None)

    result = await run.start("Hi")

    assert result.messages == [HumanMessage(content="Hi"), AssistantMessage(content="Hello.")]


# --- calls that cannot run --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "mentions"),
    [
        (ToolCall(id="call_1", name="wire_money", arguments={"to": "x"}), "'wire_money'"),
        (ToolCall(id="call_1", name="refund", arguments={"order_id": "A-1"}), "amount"),
        (
            ToolCall(id="call_1", name="refund", arguments={"order_id": "A-1", "amount": "lots"}),
            "amount",
        ),
    ],
    ids=["unknown-tool", "missing-field", "invalid-field"],
)
async def test_unusable_call_reaches_the_model_as_error_and_records_nothing(
    tools: Tools, store: MemoryApprovalStore, call: ToolCall, mentions: str
) -> None:
    # Every call would need review, so recording anything would show validation came late.
    run = session(tools, [turn(call), "Sorry."], store, rules=[InterruptRule(tool="*")])

    result = await run.start()

    assert_finished(result, "Sorry.")
    message = tool_message(result, "call_1")
    assert message.status == "error"
    assert message.arguments is None
    assert mentions in json.loads(message.content)["error"]
    assert message in run.chat.seen[-1]
    assert await store.list() == []
    assert tools.refunds == []


async def test_unknown_tool_message_lists_the_registered_tools(tools: Tools) -> None:
    call = ToolCall(id="call_1", name="wire_money")
    run = session(tools, [turn(call), "Sorry."], None)

    result = await run.start()

    error = json.loads(tool_message(result, "call_1").content)["error"]
    assert error.startswith("unknown tool 'wire_money'")
    assert "'refund'" in error


async def test_failing_approved_tool_reaches_the_model_and_spends_the_decision(
    store: MemoryApprovalStore,
) -> None:
    tools = Tools()

    @tools.registry.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund that always fails."""
        tools.refunds.append({"order_id": order_id, "amount": amount})
        raise ValueError("gateway down")

    run = session(tools, refund_script(), store, rules=())
    paused = await run.start()
    pending = only_pending(paused)
    await run.decide(pending, True)

    done = await run.resume(paused)

    assert_finished(done)
    message = tool_message(done, "call_1")
    assert message.status == "error"
    assert "ValueError: gateway down" in message.content
    assert (await store.get(pending.approval_id)).outcome == "tool-failed"
    assert len(tools.refunds) == 1


async def test_without_approval_port_risky_call_is_denied(tools: Tools) -> None:
    run = session(tools, refund_script(), None)

    result = await run.start()

    assert_finished(result)
    message = tool_message(result, "call_1")
    assert message.status == "error"
    assert "no approval port configured" in message.content
    assert tools.refunds == []
