"""`HostedLangGraph`: a `create_agent` agent paused by `HumanInTheLoopMiddleware`, run step by
step as the bot runs it, with nothing kept between steps but the state string: each step is
taken by a NEW adapter (new graph, new model, new tool objects) from the state read back from
a file. The model is LangChain's fake chat model, playing its turns from the conversation it
is given (as a real model would), not from a script position kept in memory. Resolutions are
built by hand (the bot takes the decisions; these tests do without it). Each tool runs once,
or never."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware, InterruptOnConfig
from langchain.agents.middleware.human_in_the_loop import InterruptMode
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolCall, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import add_messages

from nodbot.core.bridges.common import NO_CALL_ID, PendingCall, Resolution, StaleResume
from nodbot.core.bridges.hosted import HostedAgent, HostedStep
from nodbot.core.bridges.langgraph import Graph, HostedLangGraph, UnanswerableInterrupt
from tests.bridges.test_langgraph import EDITABLE, SEED_HITL, ToolCallingFakeModel, email_call

EMAIL_SCHEMA_REQUIRED = ["to", "subject", "body"]


class ConversationModel(ToolCallingFakeModel):
    """The fake chat model, its answer chosen by the conversation alone: with n answers of
    its own in it, it makes the calls of `turns[n]`; after the last turn it says "Done."
    followed by what the tools answered its last calls."""

    turns: list[list[ToolCall]]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        said = [i for i, m in enumerate(messages) if isinstance(m, AIMessage)]
        if len(said) < len(self.turns):
            answer = AIMessage(content="", tool_calls=self.turns[len(said)])
        else:
            told = [str(m.content) for m in messages[said[-1] :] if isinstance(m, ToolMessage)]
            answer = AIMessage(content=" | ".join(["Done.", *told]))
        return ChatResult(generations=[ChatGeneration(message=answer)])


def hosted_agent(
    turns: Sequence[Sequence[ToolCall]],
    interrupt_on: dict[str, bool | InterruptOnConfig],
    sent: list[dict[str, str]],
    *,
    mode: InterruptMode = "batched",
    state_schema: type[AgentState[Any]] | None = None,
) -> HostedLangGraph:
    """A new adapter of an agent making the calls of `turns`, one model turn each; `sent`
    gets the emails its tool really sends."""

    @tool
    def send_email(to: str, subject: str, body: str) -> str:
        """Send an email to the specified recipient."""
        sent.append({"to": to, "subject": subject, "body": body})
        return f"Email sent to {to} with subject '{subject}'"

    @tool
    def get_current_time() -> str:
        """Get the current time."""
        return "2025-01-01T09:00:00"

    tools: list[BaseTool] = [get_current_time, send_email]

    def build(checkpointer: InMemorySaver) -> Graph:
        model = ConversationModel(messages=iter(()), turns=[list(turn) for turn in turns])
        middleware: HumanInTheLoopMiddleware[Any, Any, Any] = HumanInTheLoopMiddleware(
            interrupt_on=interrupt_on, interrupt_mode=mode
        )
        return create_agent(
            model,
            tools,
            system_prompt="You are a helpful assistant.",
            middleware=[middleware],
            checkpointer=checkpointer,
            state_schema=state_schema,
        )

    return HostedLangGraph(build, tools=tools)


def kept(step: HostedStep, tmp_path: Path) -> str:
    """The step's state as the bot's store gives it back: a plain string, through a file."""
    assert isinstance(step.state, str)
    path = tmp_path / "state.json"
    path.write_text(step.state, encoding="utf-8")
    return path.read_text(encoding="utf-8")


def approve(call: PendingCall) -> Resolution:
    return Resolution(
        call=call,
        approved=True,
        arguments=call.arguments,
        edited=False,
        message=None,
        decided_by="lead@example.com",
        consumed=None,
    )


def edit(call: PendingCall, **changes: str) -> Resolution:
    return Resolution(
        call=call,
        approved=True,
        arguments={**call.arguments, **changes},
        edited=True,
        message=None,
        decided_by="lead@example.com",
        consumed=None,
    )


def deny(call: PendingCall, reason: str) -> Resolution:
    return Resolution(
        call=call,
        approved=False,
        arguments=call.arguments,
        edited=False,
        message=reason,
        decided_by="lead@example.com",
        consumed=None,
    )


async def test_an_approved_call_runs_once_and_the_run_finishes(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [[email_call("toolu_01U8", "bob@example.com")]]
    agent = hosted_agent(turns, SEED_HITL, sent)
    assert isinstance(agent, HostedAgent)
    step = await agent.start("Email Bob", run_id="run-approve")
    assert sent == [] and step.final_text is None
    [call] = step.pending
    assert (call.tool, call.call_id) == ("send_email", "toolu_01U8")
    assert call.arguments == {"to": "bob@example.com", "subject": "Hello", "body": "Hello!"}
    assert call.schema is not None and call.schema["required"] == EMAIL_SCHEMA_REQUIRED
    assert call.description == "Review email before sending\n\nAllowed decisions: approve, reject"

    again = hosted_agent(turns, SEED_HITL, sent)  # another process, say
    done = await again.resume(kept(step, tmp_path), [approve(call)], run_id="run-approve")
    assert sent == [{"to": "bob@example.com", "subject": "Hello", "body": "Hello!"}]
    assert done.pending == ()
    assert done.final_text == "Done. | Email sent to bob@example.com with subject 'Hello'"


async def test_a_denied_call_never_runs_and_the_model_is_told_why(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [[email_call("toolu_0181", "carol@example.com", "Meeting", "See you at 10am")]]
    step = await hosted_agent(turns, SEED_HITL, sent).start("Email Carol", run_id="run-deny")
    [call] = step.pending
    resolution = deny(call, "not to customers")
    done = await hosted_agent(turns, SEED_HITL, sent).resume(
        kept(step, tmp_path), [resolution], run_id="run-deny"
    )
    assert sent == []
    assert done.pending == ()
    assert done.final_text == (
        "Done. | User rejected the tool call for `send_email` with reason: not to customers"
    )


async def test_an_edit_runs_once_with_the_edited_arguments(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [[email_call("toolu_edit", "bob@example.com")]]
    step = await hosted_agent(turns, EDITABLE, sent).start("Email Bob", run_id="run-edit")
    [call] = step.pending
    resolution = edit(call, to="robert@example.com")
    done = await hosted_agent(turns, EDITABLE, sent).resume(
        kept(step, tmp_path), [resolution], run_id="run-edit"
    )
    assert sent == [{"to": "robert@example.com", "subject": "Hello", "body": "Hello!"}]
    assert done.final_text is not None and "Email sent to robert@example.com" in done.final_text


async def test_two_calls_of_one_turn_are_pending_in_order_and_decided_apart(
    tmp_path: Path,
) -> None:
    sent: list[dict[str, str]] = []
    turns = [
        [
            email_call("toolu_018h", "alice@example.com", "Hi", "Hi"),
            ToolCall(name="get_current_time", args={}, id="toolu_time"),
            email_call("toolu_01PX", "bob@example.com", "Hello", "Hello"),
        ]
    ]
    step = await hosted_agent(turns, SEED_HITL, sent).start("Email both", run_id="run-two")
    # In the middleware's order; get_current_time is not gated.
    assert [c.call_id for c in step.pending] == ["toolu_018h", "toolu_01PX"]
    alice, bob = step.pending
    done = await hosted_agent(turns, SEED_HITL, sent).resume(
        kept(step, tmp_path), [approve(alice), deny(bob, "not Bob")], run_id="run-two"
    )
    assert sent == [{"to": "alice@example.com", "subject": "Hi", "body": "Hi"}]
    assert done.final_text is not None
    assert sorted(done.final_text.split(" | ")) == [
        "2025-01-01T09:00:00",
        "Done.",
        "Email sent to alice@example.com with subject 'Hi'",
        "User rejected the tool call for `send_email` with reason: not Bob",
    ]


async def test_per_call_interrupts_take_an_approval_and_an_edit(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [
        [
            email_call("call_alice", "alice@example.com", "Hi", "Hi"),
            email_call("call_bob", "bob@example.com", "Hello", "Hello"),
        ]
    ]
    interrupt_on: dict[str, bool | InterruptOnConfig] = {"send_email": True}
    step = await hosted_agent(turns, interrupt_on, sent, mode="per_call").start(
        "Email both", run_id="run-per-call"
    )
    alice, bob = sorted(step.pending, key=lambda c: c.call_id or "")
    assert (alice.call_id, bob.call_id) == ("call_alice", "call_bob")
    decided = {"call_alice": approve(alice), "call_bob": edit(bob, subject="Hi Bob")}
    done = await hosted_agent(turns, interrupt_on, sent, mode="per_call").resume(
        kept(step, tmp_path),
        [decided[c.call_id or ""] for c in step.pending],  # in the order of `pending`
        run_id="run-per-call",
    )
    assert sorted(sent, key=lambda e: e["to"]) == [
        {"to": "alice@example.com", "subject": "Hi", "body": "Hi"},
        {"to": "bob@example.com", "subject": "Hi Bob", "body": "Hello"},
    ]
    assert done.pending == () and done.final_text is not None


async def test_a_resume_may_pause_again_and_the_next_resume_goes_on(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [
        [email_call("call_first", "alice@example.com")],
        [email_call("call_second", "bob@example.com")],
    ]
    first = await hosted_agent(turns, SEED_HITL, sent).start("Email both", run_id="run-steps")
    [call] = first.pending
    second = await hosted_agent(turns, SEED_HITL, sent).resume(
        kept(first, tmp_path), [approve(call)], run_id="run-steps"
    )
    assert second.final_text is None
    [call] = second.pending
    assert call.call_id == "call_second"
    assert [e["to"] for e in sent] == ["alice@example.com"]
    done = await hosted_agent(turns, SEED_HITL, sent).resume(
        kept(second, tmp_path), [approve(call)], run_id="run-steps"
    )
    assert [e["to"] for e in sent] == ["alice@example.com", "bob@example.com"]
    assert done.final_text == "Done. | Email sent to bob@example.com with subject 'Hello'"
    with pytest.raises(UnanswerableInterrupt, match="not paused"):
        await hosted_agent(turns, SEED_HITL, sent).resume(
            kept(done, tmp_path), [approve(call)], run_id="run-steps"
        )
    assert len(sent) == 2


async def test_a_call_without_an_id_is_pending_without_one(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [[email_call("toolu_with_id", "alice@example.com"), email_call("", "bob@example.com")]]
    step = await hosted_agent(turns, SEED_HITL, sent).start("Email both", run_id="run-no-id")
    alice, bob = step.pending
    assert (alice.call_id, bob.call_id) == ("toolu_with_id", None)  # the bot denies bob's
    done = await hosted_agent(turns, SEED_HITL, sent).resume(
        kept(step, tmp_path), [approve(alice), deny(bob, NO_CALL_ID)], run_id="run-no-id"
    )
    assert sent == [{"to": "alice@example.com", "subject": "Hello", "body": "Hello!"}]
    assert done.final_text is not None and NO_CALL_ID in done.final_text


async def test_resolutions_for_other_calls_are_refused(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [[email_call("toolu_stale", "bob@example.com")]]
    step = await hosted_agent(turns, SEED_HITL, sent).start("Email Bob", run_id="run-stale")
    [call] = step.pending
    state = kept(step, tmp_path)
    other_id = PendingCall(tool=call.tool, arguments=call.arguments, call_id="toolu_other")
    other_args = PendingCall(
        tool=call.tool, arguments={**call.arguments, "to": "eve@example.com"}, call_id=call.call_id
    )
    for resolutions in ([approve(other_id)], [approve(other_args)], [], [approve(call)] * 2):
        with pytest.raises(StaleResume, match="not for the calls its state is paused on"):
            await hosted_agent(turns, SEED_HITL, sent).resume(
                state, resolutions, run_id="run-stale"
            )
    assert sent == []


def altered(state: str, change: dict[str, Any]) -> str:
    return json.dumps({**json.loads(state), **change})


async def test_a_state_that_is_not_the_adapters_is_refused(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [[email_call("toolu_bad", "bob@example.com")]]
    step = await hosted_agent(turns, SEED_HITL, sent).start("Email Bob", run_id="run-bad")
    [call] = step.pending
    state = kept(step, tmp_path)
    saved = json.loads(state)
    unreadable = base64.b64encode(b"\xc1").decode()  # a byte msgpack never writes
    refused = {
        "garbage": ("not JSON", "garbage"),
        "another format": ("format is not", json.dumps({"format": "other", "version": 1})),
        "another version": ("of version 2", altered(state, {"version": 2})),
        "another run": ("of run 'run-bad', not of run 'run-other'", state),
        "malformed": ("malformed", altered(state, {"checkpoints": "nope"})),
        "not base64": (
            "malformed",
            altered(
                state,
                {
                    "checkpoints": [
                        dict(c, checkpoint=["msgpack", "***"]) for c in saved["checkpoints"]
                    ]
                },
            ),
        ),
        "unreadable bytes": (
            "cannot read",
            altered(
                state,
                {
                    "checkpoints": [
                        dict(c, checkpoint=["msgpack", unreadable]) for c in saved["checkpoints"]
                    ]
                },
            ),
        ),
        "no checkpoint": ("without its checkpoint", altered(state, {"checkpoint_id": "1"})),
    }
    for name, (message, bad) in refused.items():
        run_id = "run-other" if name == "another run" else "run-bad"
        with pytest.raises(ValueError, match=message):
            await hosted_agent(turns, SEED_HITL, sent).resume(bad, [approve(call)], run_id=run_id)
    assert sent == []
    # The state itself is still good.
    done = await hosted_agent(turns, SEED_HITL, sent).resume(
        state, [approve(call)], run_id="run-bad"
    )
    assert len(sent) == 1 and done.final_text is not None


def fold(messages: Any, writes: Sequence[Any]) -> Any:
    for write in writes:
        messages = add_messages(messages or [], write)
    return messages


class DeltaState(AgentState[Any]):
    """The agent's state with its messages in a `DeltaChannel`: a checkpoint holds only the
    new messages; the others are read back along its ancestors."""

    messages: Annotated[list[AnyMessage], DeltaChannel(fold)]


async def test_a_thread_with_delta_channels_resumes_from_its_lineage(tmp_path: Path) -> None:
    sent: list[dict[str, str]] = []
    turns = [
        [email_call("call_first", "alice@example.com")],
        [email_call("call_second", "bob@example.com")],
    ]

    def agent() -> HostedLangGraph:
        return hosted_agent(turns, SEED_HITL, sent, state_schema=DeltaState)

    first = await agent().start("Email both", run_id="run-delta")
    [call] = first.pending
    second = await agent().resume(kept(first, tmp_path), [approve(call)], run_id="run-delta")
    [call] = second.pending
    assert call.call_id == "call_second"  # the AIMessage was found in the ancestors' writes
    done = await agent().resume(kept(second, tmp_path), [approve(call)], run_id="run-delta")
    assert [e["to"] for e in sent] == ["alice@example.com", "bob@example.com"]
    assert done.final_text == "Done. | Email sent to bob@example.com with subject 'Hello'"
