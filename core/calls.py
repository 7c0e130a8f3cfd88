"""The values a tool call passes through: the call, its context and its result."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from nodbot.core.executor import Executor
    from nodbot.core.ports import Spent

__all__ = ["ToolCall", "ToolContext", "ToolError", "ToolResult", "new_id"]


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
