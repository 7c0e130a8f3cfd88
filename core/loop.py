"""The tool loop: a chat model asks for tool calls, the executor runs them, until an answer.

```python
result = await run_tool_loop(chat, messages, ctx)
if result.finish == "pending":
    ...  # reviewers decide; then, in this process or another:
    result = await run_tool_loop(chat, result.messages, ctx)  # same messages, same run id
```

The messages are the whole state of a run: a run resumed from them answers the calls that
were waiting and goes on. Calls already answered are never run again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_jsonable_python

from nodbot.core.calls import ToolCall, ToolContext, ToolResult
from nodbot.core.decisions import ToolInterrupt
from nodbot.core.errors import ConfigurationError
from nodbot.core.executor import Executor
from nodbot.core.ports import ApprovalPort
from nodbot.core.rules import InterruptRule
from nodbot.core.tools import ToolRegistry, ToolSpec

__all__ = [
    "Agent",
    "AssistantMessage",
    "ChatModel",
    "ChatResponse",
    "HumanMessage",
    "LoopResult",
    "Message",
    "PendingCall",
    "ScriptedChat",
    "SystemMessage",
    "ToolMessage",
    "run_tool_loop",
]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SystemMessage(_Message):
    """Instructions for the model."""

    role: Literal["system"] = "system"
    content: str


class HumanMessage(_Message):
    """What the person who started the run said."""

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(_Message):
    """A model's turn: text, tool calls, or both."""

    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolMessage(_Message):
    """The result of one tool call, as the model reads it."""

    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str
    content: str
    """Compact JSON: `{"result": value}` or `{"error": message}`."""
    status: Literal["ok", "error"]
    arguments: dict[str, Any] | None = None
    """The arguments the tool ran with (after any reviewer edit); None if it did not run."""


Message: TypeAlias = Annotated[
    SystemMessage | HumanMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class ChatResponse(BaseModel):
    """A chat model's reply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


@runtime_checkable
class ChatModel(Protocol):
    """Anything that answers a conversation, given the tools it may call."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        """The model's next turn."""
        ...


class ScriptedChat:
    """A chat model that plays a script, for examples and tests.

    The next response is picked from the conversation so far (one per assistant turn already
    in it), so a run resumed in another process continues the script where it was.
    """

    def __init__(self, responses: Sequence[ChatResponse | str]) -> None:
        self.responses = [ChatResponse(content=r) if isinstance(r, str) else r for r in responses]

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        turn = sum(isinstance(message, AssistantMessage) for message in messages)
        if turn >= len(self.responses):
            raise ConfigurationError(
                f"ScriptedChat has {len(self.responses)} responses; turn {turn + 1} was asked for"
            )
        return self.responses[turn]


@dataclass(frozen=True)
class PendingCall:
    """A call of the run that waits for a decision."""

    approval_id: str
    interrupt: ToolInterrupt


@dataclass(frozen=True)
class LoopResult:
    """Where a run of the tool loop stopped."""

    finish: Literal["stop", "pending", "max_turns"]
    """`stop`: the model answered. `pending`: calls wait for review. `max_turns`: cut off."""
    messages: list[Message]
    """The whole conversation; pass it back to resume."""
    pending: list[PendingCall] = field(default_factory=list)
    final_text: str | None = None

    @property
    def interrupts(self) -> dict[str, PendingCall]:
        """The pending calls by interrupt key (`approve_<call id>`)."""
        return {call.interrupt.key: call for call in self.pending}


async def run_tool_loop(
    chat: ChatModel, messages: Sequence[Message], ctx: ToolContext, *, max_turns: int = 20
) -> LoopResult:
    """Alternate model turns and tool calls until the model answers without calls.

    Every call goes through `ctx.executor`. Several calls in one turn each get their own
    review; the ones that need none run at once. A denial reaches the model as a tool message
    carrying the reason.
    """
    conversation: list[Message] = list(messages)
    tools = ctx.executor.registry.specs()
    for _ in range(max_turns):
        pending = await _answer_open_calls(conversation, ctx)
        if pending:
            return LoopResult("pending", conversation, pending=pending)
        response = await chat.respond(conversation, tools)
        conversation.append(
            AssistantMessage(content=response.content, tool_calls=response.tool_calls)
        )
        if not response.tool_calls:
            return LoopResult("stop", conversation, final_text=response.content)
    return LoopResult("max_turns", conversation)


async def _answer_open_calls(conversation: list[Message], ctx: ToolContext) -> list[PendingCall]:
    """Run the calls of the last assistant turn that have no tool message yet."""
    turn = next(
        (
            i
            for i in range(len(conversation) - 1, -1, -1)
            if isinstance(conversation[i], AssistantMessage)
        ),
        None,
    )
    if turn is None:
        return []
    last = conversation[turn]
    assert isinstance(last, AssistantMessage)
    answered = {m.tool_call_id for m in conversation[turn + 1 :] if isinstance(m, ToolMessage)}
    pending = []
    for call in last.tool_calls:
        if call.id in answered:
            continue
        result = await ctx.executor.run_call(call, ctx)
        if result.status == "pending":
            assert result.error is not None
            assert result.arguments is not None
            interrupt = ToolInterrupt(call.name, call.id, result.arguments)
            pending.append(PendingCall(result.error.details["approval_id"], interrupt))
        else:
            conversation.append(_tool_message(call, result))
    return pending


def _tool_message(call: ToolCall, result: ToolResult) -> ToolMessage:
    if result.status == "ok":
        body: dict[str, Any] = {"result": to_jsonable_python(result.value, fallback=str)}
        status: Literal["ok", "error"] = "ok"
    else:
        assert result.error is not None
        body, status = {"error": result.error.message}, "error"
    return ToolMessage(
        tool_call_id=call.id,
        name=call.name,
        content=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        status=status,
        arguments=result.arguments,
    )


@dataclass
class Agent:
    """What a run needs: a chat model, its tools and an optional system prompt.

    The bot loads agents by import path and gives each run an executor with its own port.
    """

    chat: ChatModel
    tools: ToolRegistry
    system_prompt: str | None = None

    def executor(
        self, *, approval: ApprovalPort | None = None, rules: Sequence[InterruptRule] = ()
    ) -> Executor:
        """An executor over this agent's tools."""
        return Executor(self.tools, approval=approval, rules=rules)

    def first_messages(self, text: str) -> list[Message]:
        """The conversation a run starts with."""
        start: list[Message] = []
        if self.system_prompt:
            start.append(SystemMessage(content=self.system_prompt))
        start.append(HumanMessage(content=text))
        return start

    async def run(
        self, input: str | Sequence[Message], ctx: ToolContext, *, max_turns: int = 20
    ) -> LoopResult:
        """Start a run from text, or resume one from its messages."""
        messages = self.first_messages(input) if isinstance(input, str) else input
        return await run_tool_loop(self.chat, messages, ctx, max_turns=max_turns)
