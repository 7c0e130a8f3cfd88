"""The tool loop: a chat model asks for tool calls, the executor runs them, until an answer.

```python
result = await run_tool_loop(chat, messages, ctx)
if result.finish == "pending":
    ...  # reviewers decide; then, in this process or another:
    result = await run_tool_loop(chat, result.messages, ctx)  # same messages, same run id
```

The messages are the whole state of a run: a run resumed from them answers the calls that
were waiting and goes on. Calls already answered are never run again.

A resume may bring the reviewers' answers itself, by key (seed 001's `Resume(answers=...)`):
`run_tool_loop(chat, result.messages, ctx, answers={"approve_call_1": True},
decided_by="ana")` records each on the review of its call before the loop goes on. The
resume checks come first, and nothing is recorded or run when one fails:

- an answer for a key that is not pending in the run (no open call of the paused turn has
  it, or its review is decided already) raises `NotPendingError`, naming it;
- new input on a paused run (a message after the turn whose calls wait, or `Agent.run`
  with text under the run id of a run whose reviews no call has taken yet: pending, or
  decided and waiting for the resume) raises `RunPausedError`;
- an answer of no known form raises `InvalidDecisionError`, an edit the tool's model
  refuses `InvalidArgumentsError`.

A call that asked a person (`ctx.ask`) waits on its question: its key answers the question,
with the answer as text (`answers={"approve_call_1": "Porto"}`) or a respond; an answer that
is none of its choices, or an approval, raises `InvalidDecisionError`.

A resume that leaves pending calls unanswered is no error: those calls stay pending, and
the result is `pending` again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_jsonable_python

from nodbot.core.calls import ToolCall, ToolContext, ToolResult
from nodbot.core.decisions import ToolInterrupt, approval_interrupt_id, as_decision, merge_edit
from nodbot.core.errors import (
    ConfigurationError,
    InvalidDecisionError,
    NodbotError,
    NotPendingError,
    RunPausedError,
)
from nodbot.core.executor import Executor
from nodbot.core.ports import ApprovalPort, DeferredApproval
from nodbot.core.questions import answer_problem, is_question
from nodbot.core.rules import InterruptRule
from nodbot.core.store import ApprovalRecord
from nodbot.core.tools import ToolRegistry, ToolSpec, arguments_digest

__all__ = [
    "RESUME_CHANNEL",
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

RESUME_CHANNEL = "resume"
"""The channel through which answers given on resume (`answers=`) are recorded."""


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
    chat: ChatModel,
    messages: Sequence[Message],
    ctx: ToolContext,
    *,
    max_turns: int = 20,
    answers: Mapping[str, object] | None = None,
    decided_by: str | None = None,
) -> LoopResult:
    """Alternate model turns and tool calls until the model answers without calls.

    Every call goes through `ctx.executor`. Several calls in one turn each get their own
    review; the ones that need none run at once. A denial reaches the model as a tool message
    carrying the reason. The calls are the model's: a caller's own approval
    (`ToolContext.approval`) covers none of them (the loop's context carries none).

    `answers` decides, as `decided_by`, calls of the paused turn by their key
    (`LoopResult.interrupts`), any form `as_decision` takes, before the loop goes on (see
    the module). Raises `NotPendingError` and `RunPausedError` (see the module),
    `InvalidDecisionError` and `InvalidArgumentsError` for an answer that is not well
    formed, and `ConfigurationError` for answers without a `DeferredApproval` port; all
    before anything is recorded or run.
    """
    conversation: list[Message] = list(messages)
    if ctx.approval is not None:
        ctx = replace(ctx, approval=None)  # never the loop's: see `ToolContext.approval`
    _refuse_new_input(conversation, ctx.run_id)
    if answers:
        await _record_answers(conversation, ctx, answers, decided_by)
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


def _open_turn(conversation: Sequence[Message]) -> tuple[int, list[ToolCall]]:
    """The index of the last assistant turn (-1: none) and its calls that have no tool
    message yet, in order."""
    turn = next(
        (
            i
            for i in range(len(conversation) - 1, -1, -1)
            if isinstance(conversation[i], AssistantMessage)
        ),
        None,
    )
    if turn is None:
        return -1, []
    last = conversation[turn]
    assert isinstance(last, AssistantMessage)
    answered = {m.tool_call_id for m in conversation[turn + 1 :] if isinstance(m, ToolMessage)}
    return turn, [call for call in last.tool_calls if call.id not in answered]


def _refuse_new_input(conversation: Sequence[Message], run_id: str) -> None:
    """Raise `RunPausedError` when a message other than a call's result follows the turn
    whose calls wait: a paused run takes only answers."""
    turn, open_calls = _open_turn(conversation)
    if not open_calls:
        return
    later = [m for m in conversation[turn + 1 :] if not isinstance(m, ToolMessage)]
    if later:
        raise RunPausedError(
            run_id=run_id,
            waiting=[approval_interrupt_id(call.id) for call in open_calls],
            reason=f"a {later[0].role} message came after the turn whose calls wait",
        )


async def _pending_reviews(
    conversation: Sequence[Message], ctx: ToolContext, port: DeferredApproval
) -> dict[str, ApprovalRecord]:
    """The reviews the run waits on, by key: those of the open calls of its paused turn
    that are pending, made for that very call (its tool and validated arguments)."""
    pending: dict[str, ApprovalRecord] = {}
    questions: list[ApprovalRecord] | None = None  # the run's pending questions, read once
    for call in _open_turn(conversation)[1]:
        record = await port.store.find(ctx.run_id, call.id)
        if record is None:
            # A call that asked a person (`ctx.ask`) waits on its question instead.
            if questions is None:
                waiting = await port.store.list(run_id=ctx.run_id, status="pending")
                questions = [found for found in waiting if is_question(found.request)]
            asked = _asked_by(call, questions)
            if asked is not None:
                pending[approval_interrupt_id(call.id)] = asked
            continue
        if record.decision is not None or record.request.tool != call.name:
            continue
        try:
            canonical = ctx.executor.registry.get(call.name).validate(call.arguments).canonical
        except NodbotError:
            continue  # a call that cannot run waits on nothing
        if record.request.digest == arguments_digest(canonical):
            pending[approval_interrupt_id(call.id)] = record
    return pending


def _asked_by(call: ToolCall, questions: Sequence[ApprovalRecord]) -> ApprovalRecord | None:
    """Of `questions` (pending), the one `call` asked (`ctx.ask`: stored under the call id
    `<call id>.ask_<key>`), the newest if it asked several; None when it asked none."""
    prefix = f"{call.id}.ask_"
    asked = [
        record
        for record in questions
        if record.request.call_id.startswith(prefix)
        and record.request.arguments.get("asked_by") == call.name
    ]
    return asked[-1] if asked else None


async def _record_answers(
    conversation: Sequence[Message],
    ctx: ToolContext,
    answers: Mapping[str, object],
    decided_by: str | None,
) -> None:
    """Record each answer on the pending review its key names (see `run_tool_loop`),
    once every one of them is checked."""
    port = ctx.executor.approval
    if not isinstance(port, DeferredApproval):
        raise ConfigurationError("answers on resume need an executor with a DeferredApproval port")
    pending = await _pending_reviews(conversation, ctx, port)
    wrong = [str(key) for key in answers if key not in pending]
    if wrong:
        raise NotPendingError(run_id=ctx.run_id, keys=wrong, pending=list(pending))
    answers = {
        # A question's answer may be given bare, as seed 001's `Resume(value)` gives it.
        key: {"action": "respond", "message": answer}
        if isinstance(answer, str) and is_question(pending[key].request)
        else answer
        for key, answer in answers.items()
    }
    for key, answer in answers.items():  # checked, all of them, before any is recorded
        request = pending[key].request
        decision = as_decision(answer, decided_by=decided_by, tool=request.tool)
        if is_question(request) and decision.approved:
            raise InvalidDecisionError(
                f"the question of {key} is answered (a text, or a respond) or declined, "
                "not approved",
                errors=[{"field": key, "message": "not an answer"}],
            )
        if decision.response is not None and is_question(request):
            problem = answer_problem(request, decision.response)
            if problem is not None:
                raise InvalidDecisionError(
                    f"not an answer to the question of {key}: {problem}",
                    errors=[{"field": key, "message": problem}],
                )
        if decision.edited_args is not None:
            merged = merge_edit(request.arguments, decision.edited_args)
            ctx.executor.registry.get(request.tool).validate(merged, source="edited arguments")
    for key, answer in answers.items():
        await ctx.executor.decide(
            pending[key].approval_id, answer, decided_by=decided_by, channel=RESUME_CHANNEL
        )


async def _refuse_restart(ctx: ToolContext) -> None:
    """Raise `RunPausedError` when the run of `ctx` has reviews in the executor's store that
    no call has taken yet (pending, or decided and waiting for the resume): new text would
    start another conversation under its id, whose calls could take them."""
    port = ctx.executor.approval
    if not isinstance(port, DeferredApproval):
        return  # nothing of the run is stored: nothing waits
    records = await port.store.list(run_id=ctx.run_id)
    waiting = [record for record in records if not record.consumed]
    if waiting:
        raise RunPausedError(
            run_id=ctx.run_id,
            waiting=[record.request.interrupt.key for record in waiting],
            reason="new text would start another conversation under its id",
        )


async def _answer_open_calls(conversation: list[Message], ctx: ToolContext) -> list[PendingCall]:
    """Run the calls of the last assistant turn that have no tool message yet."""
    pending = []
    for call in _open_turn(conversation)[1]:
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
        self,
        input: str | Sequence[Message],
        ctx: ToolContext,
        *,
        max_turns: int = 20,
        answers: Mapping[str, object] | None = None,
        decided_by: str | None = None,
    ) -> LoopResult:
        """Start a run from text, or resume one from its messages (with `answers`, as
        `run_tool_loop` takes them). Text under the run id of a run with reviews in the
        executor's store that no call has taken yet raises `RunPausedError`: a paused run
        takes only answers."""
        if isinstance(input, str):
            await _refuse_restart(ctx)
            messages = self.first_messages(input)
        else:
            messages = list(input)
        return await run_tool_loop(
            self.chat, messages, ctx, max_turns=max_turns, answers=answers, decided_by=decided_by
        )
