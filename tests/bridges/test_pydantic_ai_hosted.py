"""The hosted pydantic-ai agent without the bot: an agent on pydantic-ai's `FunctionModel`
calls `requires_approval=True` tools, `start` pauses with the calls as `PendingCall`s, the
state goes through a plain `str` to a NEW adapter on a NEW agent, and `resume` runs it on with
`Resolution`s built by hand (as the bot builds them once its decisions are taken)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nodbot.core.bridges.common import NO_CALL_ID, PendingCall, Resolution, StaleResume
from nodbot.core.bridges.hosted import HostedAgent, HostedStep
from nodbot.core.bridges.pydantic_ai import HostedPydanticAI

RUN = "support-42"
REVIEWER = "lead@example.com"


@dataclass
class Shop:
    """A model that asks for `turns[n]` in its n-th response, then answers with what the tools
    said; `refunds` records every real run of the `refund` tool, across agents."""

    turns: list[list[ToolCallPart]]
    refunds: list[dict[str, Any]] = field(default_factory=list)

    def agent(self, output_type: Any = str) -> Agent[None, Any]:
        agent: Agent[None, Any] = Agent(FunctionModel(self._reply), output_type=output_type)

        @agent.tool_plain(requires_approval=True)
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.refunds.append({"order_id": order_id, "amount": amount})
            return f"refunded {amount} on {order_id}"

        @agent.tool_plain
        def ship(order_id: str) -> str:
            """Ship an order, by a service answering later."""
            raise CallDeferred

        return agent

    def hosted(self, output_type: Any = str) -> HostedPydanticAI:
        """A new adapter on a new agent: nothing is shared with an earlier one but `refunds`."""
        return HostedPydanticAI(self.agent(output_type))

    def _reply(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(message, ModelResponse) for message in messages)
        if done < len(self.turns):
            return ModelResponse(parts=list(self.turns[done]))
        said = [str(part.content) for part in _returns(messages)]
        return ModelResponse(parts=[TextPart("done: " + "; ".join(said))])


def refund_call(call_id: str, amount: float = 500, order_id: str = "o-7") -> ToolCallPart:
    return ToolCallPart("refund", {"order_id": order_id, "amount": amount}, tool_call_id=call_id)


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def kept(step: HostedStep) -> str:
    """The state as the bot's store gives it back: plain text, parsed and written anew."""
    assert isinstance(step.state, str)
    return json.dumps(json.loads(step.state))


def approve(call: PendingCall) -> Resolution:
    return Resolution(call, True, call.arguments, False, None, REVIEWER, None)


def edit(call: PendingCall, **changes: Any) -> Resolution:
    return Resolution(call, True, {**call.arguments, **changes}, True, None, REVIEWER, None)


def deny(call: PendingCall, reason: str) -> Resolution:
    return Resolution(call, False, call.arguments, False, reason, REVIEWER, None)


def messages_of(state: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(state)["messages"]
    return found


def told(state: str) -> dict[str, tuple[str, str]]:
    """What the model was told of each call, by call id: (content, outcome)."""
    return {
        part["tool_call_id"]: (part["content"], part["outcome"])
        for message in messages_of(state)
        if message["kind"] == "request"
        for part in message["parts"]
        if part["part_kind"] == "tool-return"
    }


async def test_start_pauses_with_the_calls_to_review() -> None:
    shop = Shop([[refund_call("call_1")]])
    hosted = shop.hosted()
    assert isinstance(hosted, HostedAgent)
    step = await hosted.start("refund order o-7", run_id=RUN)
    assert step.final_text is None
    [call] = step.pending
    assert (call.call_id, call.tool, call.arguments) == (
        "call_1",
        "refund",
        {"order_id": "o-7", "amount": 500},
    )
    assert call.schema is not None
    assert call.schema["properties"] == {
        "order_id": {"type": "string"},
        "amount": {"type": "number"},
    }
    assert shop.refunds == []


async def test_approve_runs_the_tool_once_and_finishes() -> None:
    shop = Shop([[refund_call("call_1")]])
    step = await shop.hosted().start("refund order o-7", run_id=RUN)
    state = kept(step)
    done = await shop.hosted().resume(state, [approve(step.pending[0])], run_id=RUN)
    assert shop.refunds == [{"order_id": "o-7", "amount": 500}]
    assert done.pending == ()
    assert done.final_text == "done: refunded 500.0 on o-7"
    assert told(done.state) == {"call_1": ("refunded 500.0 on o-7", "success")}


async def test_deny_never_runs_the_tool_and_tells_the_model_the_reason() -> None:
    shop = Shop([[refund_call("call_1")]])
    step = await shop.hosted().start("refund order o-7", run_id=RUN)
    resolution = deny(step.pending[0], "refund policy: max 400")
    done = await shop.hosted().resume(kept(step), [resolution], run_id=RUN)
    assert shop.refunds == []
    assert told(done.state) == {"call_1": ("refund policy: max 400", "denied")}
    assert done.final_text == "done: refund policy: max 400"
    assert done.pending == ()


async def test_an_edit_runs_once_with_the_edited_arguments() -> None:
    shop = Shop([[refund_call("call_1", 500)]])
    step = await shop.hosted().start("refund order o-7", run_id=RUN)
    resolution = edit(step.pending[0], amount=450)
    done = await shop.hosted().resume(kept(step), [resolution], run_id=RUN)
    assert shop.refunds == [{"order_id": "o-7", "amount": 450}]
    assert done.final_text == "done: refunded 450.0 on o-7"


async def test_two_calls_in_one_turn_are_resolved_each_its_own_way() -> None:
    shop = Shop([[refund_call("call_1", 50, "o-1"), refund_call("call_2", 900, "o-2")]])
    step = await shop.hosted().start("refund o-1 and o-2", run_id=RUN)
    assert [call.call_id for call in step.pending] == ["call_1", "call_2"]
    first, second = step.pending
    resolutions = [approve(first), deny(second, "too much")]
    done = await shop.hosted().resume(kept(step), resolutions, run_id=RUN)
    assert shop.refunds == [{"order_id": "o-1", "amount": 50}]
    assert told(done.state) == {
        "call_1": ("refunded 50.0 on o-1", "success"),
        "call_2": ("too much", "denied"),
    }
    assert done.final_text == "done: refunded 50.0 on o-1; too much"


async def test_a_run_pausing_again_gives_the_next_calls() -> None:
    shop = Shop([[refund_call("call_1", 50, "o-1")], [refund_call("call_2", 60, "o-2")]])
    step = await shop.hosted().start("refund o-1, then o-2", run_id=RUN)
    again = await shop.hosted().resume(kept(step), [approve(step.pending[0])], run_id=RUN)
    assert [(call.call_id, call.arguments) for call in again.pending] == [
        ("call_2", {"order_id": "o-2", "amount": 60})
    ]
    assert again.final_text is None
    assert shop.refunds == [{"order_id": "o-1", "amount": 50}]
    done = await shop.hosted().resume(kept(again), [approve(again.pending[0])], run_id=RUN)
    assert shop.refunds == [{"order_id": "o-1", "amount": 50}, {"order_id": "o-2", "amount": 60}]
    assert done.final_text == "done: refunded 50.0 on o-1; refunded 60.0 on o-2"


async def test_a_run_without_risky_calls_finishes_at_start() -> None:
    shop = Shop([])
    step = await shop.hosted().start("hello", run_id=RUN)
    assert (step.pending, step.final_text) == ((), "done: ")
    with pytest.raises(ValueError, match="has finished"):
        await shop.hosted().resume(kept(step), [], run_id=RUN)


@dataclass
class Refunded:
    total: float


async def test_an_agent_declaring_deferred_output_and_a_structured_output() -> None:
    shop = Shop([[refund_call("call_1")], [ToolCallPart("final_result", {"total": 500})]])
    hosted = shop.hosted(output_type=[Refunded, DeferredToolRequests])
    step = await hosted.start("refund order o-7", run_id=RUN)
    assert [call.call_id for call in step.pending] == ["call_1"]
    fresh = HostedPydanticAI(shop.agent(output_type=[Refunded, DeferredToolRequests]))
    done = await fresh.resume(kept(step), [approve(step.pending[0])], run_id=RUN)
    assert shop.refunds == [{"order_id": "o-7", "amount": 500}]
    assert done.final_text is not None and json.loads(done.final_text) == {"total": 500}


@pytest.mark.parametrize("decide", [lambda call: deny(call, NO_CALL_ID), approve])
async def test_a_call_without_an_id_is_denied(decide: Any) -> None:
    shop = Shop([[refund_call("")]])
    step = await shop.hosted().start("refund order o-7", run_id=RUN)
    [call] = step.pending
    assert call.call_id is None  # so the bot opens no review and denies it
    done = await shop.hosted().resume(kept(step), [decide(call)], run_id=RUN)
    assert shop.refunds == []
    assert told(done.state) == {"": (NO_CALL_ID, "denied")}


async def test_external_calls_cannot_be_hosted() -> None:
    shop = Shop([[ToolCallPart("ship", {"order_id": "o-7"}, tool_call_id="call_1")]])
    with pytest.raises(RuntimeError, match=r"external tool calls \(ship\)"):
        await shop.hosted().start("ship order o-7", run_id=RUN)


def _state(**changes: Any) -> str:
    state = {"kind": "nodbot.pydantic_ai", "version": 1, "run_id": RUN, "pending": ["call_1"]}
    state["messages"] = []
    return json.dumps({**state, **changes})


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("not json at all", "not the state of a hosted pydantic-ai agent"),
        ("[1, 2]", "not the state of a hosted pydantic-ai agent"),
        (_state(kind="nodbot.langgraph"), "not the state of a hosted pydantic-ai agent"),
        (_state(version=2), "of version 2; this adapter reads version 1"),
        (_state(run_id="support-7"), "of run 'support-7', not 'support-42'"),
        (_state(pending="call_1"), "no list of pending call ids"),
        (_state(messages=[{"kind": "letter"}]), "no valid message history"),
    ],
)
async def test_a_state_that_is_not_the_adapters_is_refused(state: str, reason: str) -> None:
    shop = Shop([[refund_call("call_1")]])
    call = PendingCall("refund", {"order_id": "o-7", "amount": 500}, "call_1")
    with pytest.raises(ValueError, match=reason):
        await shop.hosted().resume(state, [approve(call)], run_id=RUN)
    assert shop.refunds == []


def _other_call(call: PendingCall) -> Resolution:
    return approve(PendingCall(call.tool, call.arguments, "call_9"))


def _other_arguments(call: PendingCall) -> Resolution:
    return approve(PendingCall(call.tool, {**call.arguments, "amount": 5000}, call.call_id))


def _other_tool(call: PendingCall) -> Resolution:
    return approve(PendingCall("wire_money", call.arguments, call.call_id))


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda call: [], r"answer calls \[\], but the run paused for \['call_1'\]"),
        (lambda call: [approve(call), approve(call)], "but the run paused for"),
        (lambda call: [_other_call(call)], "answer calls \\['call_9'\\]"),
        (lambda call: [_other_arguments(call)], "was changed"),
        (lambda call: [_other_tool(call)], "was changed"),
    ],
)
async def test_resolutions_of_other_calls_resume_nothing(answer: Any, reason: str) -> None:
    shop = Shop([[refund_call("call_1")]])
    step = await shop.hosted().start("refund order o-7", run_id=RUN)
    with pytest.raises(StaleResume, match=reason):
        await shop.hosted().resume(kept(step), answer(step.pending[0]), run_id=RUN)
    assert shop.refunds == []


async def test_a_state_whose_history_moved_on_resumes_nothing() -> None:
    shop = Shop([[refund_call("call_1")]])
    step = await shop.hosted().start("refund order o-7", run_id=RUN)
    state = json.loads(step.state)
    answered = {
        "kind": "request",
        "parts": [
            {
                "part_kind": "tool-return",
                "tool_name": "refund",
                "content": "refunded elsewhere",
                "tool_call_id": "call_1",
            }
        ],
    }
    state["messages"].append(answered)
    with pytest.raises(StaleResume, match="moved on"):
        await shop.hosted().resume(json.dumps(state), [approve(step.pending[0])], run_id=RUN)
    assert shop.refunds == []
