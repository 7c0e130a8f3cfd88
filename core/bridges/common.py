"""What every bridge does between a framework's pause and its resume: each pending call is put
to the bot (one review per call, keyed by the framework's native call id), the decisions are
awaited, and each is taken once, as a checked one-use token (`core.approval_tokens`): a
`Resolution` is what the token's signed claims say, for the call as the framework paused it
(`core.client.UntrustedDecision` is raised otherwise, and nothing is resumed).

A bridge turns the framework's pending calls into `PendingCall`s, calls `resolve_calls`, and
builds the framework's resume from the `Resolution`s, in the same order: an approval only
from `Resolution.approved` (whose token was checked against that very call), an edit only
from `Resolution.arguments`, a denial with `Resolution.message`, and a respond (a reviewer's
answer in the tool's place: a denial, the tool does not run) from `Resolution.response`, the
answer as the token's signed claims carry it. Anything a framework says about approval by
itself counts for nothing.

How a respond reaches each framework (`RESPONDED` words it where the framework frames it as a
refusal, or shows the model nothing):

| bridge          | a respond becomes                                                         |
|-----------------|---------------------------------------------------------------------------|
| LangChain       | the middleware's own `{"type": "respond", "message": <answer>}` (a        |
|                 | `reject` whose message is `RESPONDED` when the tool does not allow it)   |
| pydantic-ai     | `ToolDenied(message=<answer>)`: the model reads the answer as the result |
| OpenAI Agents   | `state.reject(item, rejection_message=<answer>)`: the call's output      |
| Agent Framework | a rejection whose `reason` is `RESPONDED` and `response` the answer (the |
|                 | model is told the framework's fixed rejection text)                       |
| Google ADK      | `ToolConfirmation(confirmed=False, payload={"message": RESPONDED,         |
|                 | "response": <answer>})` (ADK's `FunctionTool` tells the model it is       |
|                 | rejected)                                                                 |
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nodbot.core.client import Approval, Consumed

__all__ = [
    "NO_CALL_ID",
    "RESPONDED",
    "PendingCall",
    "Resolution",
    "Reviews",
    "StaleResume",
    "resolve_calls",
]

NO_CALL_ID = (
    "the call has no native call id, so no decision can be bound to it: denied by the bridge"
)
RESPONDED = "A reviewer answered in the tool's place, so it did not run. Their answer: {response}"
"""A respond, as the message of a denial (`.format(response=...)`), for the frameworks whose
denial is all a bridge can send: the model (or whoever reads the framework's record) learns
both that the tool did not run and what the reviewer answered."""


class StaleResume(Exception):
    """The run or thread moved on (or forked) since its calls were reviewed: resuming it with
    those decisions is refused."""


class Reviews(Protocol):
    """What a bridge needs of nodbot: `core.client.ApprovalClient` is one."""

    async def request(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        run_id: str,
        call_id: str,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Approval: ...

    async def wait(self, approval_id: str, *, within: float) -> Approval: ...

    async def consume(self, approval: Approval) -> Consumed: ...


@dataclass(frozen=True)
class PendingCall:
    """One call a framework paused, as the bridge read it."""

    tool: str
    arguments: dict[str, Any]
    call_id: str | None
    """The framework's native id of the call; None when it has none (then it is denied)."""
    schema: dict[str, Any] | None = None
    """The JSON schema of the tool's arguments, when the framework knows it."""
    description: str | None = None
    """What the framework says about the call (shown to reviewers)."""


@dataclass(frozen=True)
class Resolution:
    """How one pending call was decided."""

    call: PendingCall
    approved: bool
    arguments: dict[str, Any]
    """The arguments to run it with (a reviewer's edit merged in); the original ones when
    denied."""
    edited: bool
    message: str | None
    """The reviewer's reason (for a denial, what the model is told), or the bridge's."""
    decided_by: str | None
    consumed: Consumed | None
    """The decision as handed out, with its checked token; None when the bridge denied."""
    response: str | None = None
    """A respond: the reviewer's answer, to give the model as the call's result in the
    tool's place (`approved` is false: the tool does not run); None for any other decision."""

    def responded(self) -> str | None:
        """`RESPONDED` with the answer of a respond; None for any other decision."""
        return None if self.response is None else RESPONDED.format(response=self.response)


async def resolve_calls(
    reviews: Reviews,
    run_id: str,
    calls: Sequence[PendingCall],
    *,
    within: float,
    requested_by: str | None = None,
) -> list[Resolution]:
    """Review each of `calls` of run `run_id` through `reviews`, wait (at most `within`
    seconds in all) until all are decided, and take each decision once; in the order given.
    Raises `core.client.DecisionTimeout` when some are not decided in time (none is taken
    then: asking again later finds the same reviews), and `core.client.UntrustedDecision`
    when a decision's token is not for its call or the answer disagrees with the token."""
    asked = await asyncio.gather(*(_ask(reviews, run_id, call, requested_by) for call in calls))
    async with asyncio.timeout(within + 5):
        decided = await asyncio.gather(
            *(reviews.wait(a.approval_id, within=within) for a in asked if a is not None)
        )
    by_id = {approval.approval_id: approval for approval in decided}
    resolutions = []
    for call, approval in zip(calls, asked, strict=True):
        if approval is None:
            resolutions.append(_denied(call, NO_CALL_ID))
            continue
        taken = await reviews.consume(by_id[approval.approval_id])
        # Bound to the call as the framework paused it, not as the bot's answer repeated it.
        taken.answers(run_id=run_id, call_id=call.call_id, tool=call.tool, arguments=call.arguments)
        resolutions.append(
            Resolution(
                call=call,
                approved=taken.approved,
                arguments=taken.arguments if taken.approved else call.arguments,
                edited=taken.edited,
                message=taken.reason,
                decided_by=taken.decided_by,
                consumed=taken,
                # Signed with the rest of the claims: a respond is never read from the copy.
                response=taken.claims.response,
            )
        )
    return resolutions


async def _ask(
    reviews: Reviews, run_id: str, call: PendingCall, requested_by: str | None
) -> Approval | None:
    if not call.call_id:
        return None
    return await reviews.request(
        call.tool,
        call.arguments,
        run_id=run_id,
        call_id=call.call_id,
        schema=call.schema,
        requested_by=requested_by,
        description=call.description,
    )


def _denied(call: PendingCall, message: str) -> Resolution:
    return Resolution(
        call=call,
        approved=False,
        arguments=call.arguments,
        edited=False,
        message=message,
        decided_by=None,
        consumed=None,
    )
