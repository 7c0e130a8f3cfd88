"""Agents of other frameworks run by the bot itself, like its own: named under
`framework_agents:` in `nodbot.yml`, started by `POST /runs`, their calls reviewed by the
rules, and resumed by the bot's workers once every call is decided, with the framework's
state kept in the bot's store between steps.

A framework's adapter implements `HostedAgent`:

- `start(text, run_id=...)` runs the agent on the user's text until it finishes or pauses,
  and returns a `HostedStep`: the framework's state as text (JSON, say: what the framework
  needs to resume this run, and nothing the bot must read), the calls it paused for
  (`PendingCall`, each with the framework's native call id), and the final text once done.
- `resume(state, resolutions, run_id=...)` resumes it from that state with one
  `Resolution` per pending call, in the order `start` (or the previous `resume`) gave them,
  and returns the next `HostedStep`.

The bot keeps the state, opens one review per pending call (keyed by its native call id,
in the run), and once none is pending takes each decision once and calls `resume`. An
adapter builds the framework's resume only from the resolutions, as every bridge does
(`bridges.common`). `start` and `resume` may run tools (the approved ones): the bot calls
each at most once per step, and a step whose worker died is not run again (its decisions
were taken: the run fails, closed, rather than run a tool twice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nodbot.core.bridges.common import PendingCall, Resolution

__all__ = ["HostedAgent", "HostedStep", "RunStates"]


@dataclass(frozen=True)
class HostedStep:
    """Where a hosted agent got to."""

    state: str
    """The framework's state, as text the bot stores and gives back to `resume`."""
    pending: Sequence[PendingCall] = field(default_factory=tuple)
    """The calls it paused for; empty once it has finished."""
    final_text: str | None = None
    """Its answer, once finished."""


@runtime_checkable
class HostedAgent(Protocol):
    """An agent of another framework the bot runs (see the module)."""

    async def start(self, text: str, *, run_id: str) -> HostedStep: ...

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep: ...


@runtime_checkable
class RunStates(Protocol):
    """Where the bot keeps hosted agents' states between steps (a SQL store's
    `run_states`)."""

    async def get(self, run_id: str) -> str | None: ...

    async def put(self, run_id: str, state: str) -> None: ...

    async def drop(self, run_id: str) -> None: ...
