"""The values a tool call passes through: the call, its context and its result."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nodbot.core.errors import ConfigurationError

if TYPE_CHECKING:
    from nodbot.core.approval_tokens import TokenApproval
    from nodbot.core.decisions import Decision
    from nodbot.core.executor import Executor
    from nodbot.core.ports import Spent

__all__ = ["OneUseApproval", "ToolCall", "ToolContext", "ToolError", "ToolResult", "new_id"]


def new_id(prefix: str) -> str:
    """A unique id that sorts by creation time: `prefix` + 12 hex digits of ms + 16 random."""
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}"


class ToolCall(BaseModel):
    """A request, usually from a model, to run one tool with some arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The registered name of the tool."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The arguments as the caller gave them; validated by the tool before anything runs."""
    id: str = Field(default_factory=lambda: new_id("call_"))
    """The caller's id for this call. A resume must use the same id."""


class OneUseApproval:
    """The approval a caller set on a context (`ToolContext.approval`): `given`, a `Decision`
    or a `TokenApproval`, spent by the first call run with the context. Every copy of the
    context (`dataclasses.replace`) holds this same object, so a copy cannot run a second
    call on it.

    Raises `ConfigurationError` for anything else: a framework's "approved" (`True`, a
    dict, its own objects) never counts alone.
    """

    __slots__ = ("_spent", "given")

    def __init__(self, given: Decision | TokenApproval) -> None:
        from nodbot.core.approval_tokens import TokenApproval  # imports tools, which import us
        from nodbot.core.decisions import Decision

        if not isinstance(given, Decision | TokenApproval):
            raise ConfigurationError(
                "ToolContext.approval takes your own Decision or an adapter-issued "
                f"TokenApproval, not {type(given).__name__}: an approval of another kind "
                "never counts alone"
            )
        self.given = given
        """What the caller set."""
        self._spent = False

    @property
    def spent(self) -> bool:
        """Whether a call has taken it."""
        return self._spent

    def take(self) -> Decision | TokenApproval | None:
        """The approval, the first time; None after (it covers one call)."""
        if self._spent:
            return None
        self._spent = True
        return self.given

    def __repr__(self) -> str:
        state = "spent" if self._spent else "unspent"
        return f"OneUseApproval({type(self.given).__name__}, {state})"


@dataclass(frozen=True)
class ToolContext:
    """What a run passes to every call: keep `run_id` to resume the run later."""

    run_id: str
    """The run the calls belong to. A resume must use the same run id."""
    executor: Executor
    """The executor that made this context; the tool loop runs calls through it."""
    requested_by: str | None = None
    """Who started the run (a user id or address), shown to reviewers."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form values for tools and confirm rules; never shown to the model."""
    spent: list[Spent] | None = None
    """Where the approvals that calls of this context have spent are collected, to be
    recorded finished together (a durable run's step saves them with the run); None: each
    is recorded by the approval port as its call ends."""
    approval: OneUseApproval | None = None
    """An approval the caller set for exactly one call, instead of asking the approval port
    (seed 003's `ctx.approval`). Set it with `executor.context(approval=...)`, which
    holds it in a `OneUseApproval` (as `ToolContext(...)` and `dataclasses.replace` do
    with one given bare). It is:

    - your own trusted `Decision` (your code decided: `Decision(approved=True,
      decided_by="ops-script")`), which covers the first call run with this context,
      whichever it is; or
    - an adapter-issued one-use token (`core.approval_tokens.TokenApproval`: the token
      `POST /approvals/{id}/consume` handed out, with its key), which covers only the call
      it was issued for: same run id, call id, tool and digest of the arguments as given. A
      token for another call fails closed (`ApprovalMismatchError`) and nothing runs; an
      executor also refuses a token it has run a call on already.

    The first call of `run` / `run_call` with this context takes it, whatever its outcome
    (spent even when that call fails), so it never covers a second call: a later call goes
    to the approval port as usual (pending, or denied without a port). The context a tool
    receives, the one its confirm rule sees, and those of the tool loop (`run_tool_loop`)
    carry no approval at all, so a nested call (a tool calling `ctx.executor.run(...)`) and
    the model's calls are never covered by it. A denied `Decision` denies its call, with its
    reason. A covered call is not put to the port's rules; with a `DeferredApproval` port
    its review is recorded as decided by the caller (`decided_by` of the `Decision`, or of
    the token), through the channel `context`, then taken by the call as any decision is.
    """

    call: ToolCall | None = None
    """The call this context runs: set on the context a tool receives (None elsewhere). A
    question the tool asks (`ask`) belongs to it."""
    reviewed: bool = False
    """Whether a stored approval (a reviewer's decision) let the call of `call` run: such a
    tool may not `ask` (its approval covers one run of it)."""

    async def ask(
        self,
        question: str,
        *,
        choices: list[str] | None = None,
        id: str | None = None,
    ) -> str:
        """Ask a person `question` and return the answer (one of `choices`, when given; free
        text otherwise), as seed 001's `interrupt()`. Until someone answers, raises
        `QuestionPending`: the call that asked (or, outside a tool, the run) pauses, and the
        tool runs again from the top on resume, when this returns the answer. Raises
        `QuestionUnanswered` when the question was declined, timed out or could not be put
        to anyone, and `InvalidQuestionError` for a question that cannot be asked. See
        `core.questions`."""
        return await self.executor.ask(self, question, choices=choices, key=id)

    def __post_init__(self) -> None:
        if self.approval is not None and not isinstance(self.approval, OneUseApproval):
            # Given bare (a Decision or a TokenApproval): held once, for every copy.
            object.__setattr__(self, "approval", OneUseApproval(self.approval))


@dataclass(frozen=True)
class ToolError:
    """Why a call did not produce a value."""

    kind: str
    """A stable identifier: `approval-pending`, `approval-denied`, `unknown-tool`,
    `invalid-arguments`, `approval-mismatch`, `tool-failed`, ..."""
    message: str
    """A sentence for people (and the model) naming what went wrong."""
    details: dict[str, Any] = field(default_factory=dict)
    """Structured facts, such as `approval_id`, `tool` or the invalid fields."""


@dataclass(frozen=True)
class ToolResult:
    """The result of `Executor.run_call`: a value, an error, or a pending approval."""

    status: Literal["ok", "error", "pending"]
    """`ok` (the tool ran), `error` (it did not, or it raised) or `pending` (nothing ran)."""
    value: Any = None
    """What the tool returned, when `status == "ok"`."""
    error: ToolError | None = None
    """Why there is no value, when `status != "ok"`."""
    arguments: dict[str, Any] | None = None
    """The arguments the tool ran with (after validation and any reviewer edit); for a
    pending call, the validated arguments the reviewer is shown."""
