"""pydantic-ai bridge: a run's deferred tool approvals, decided by people through nodbot.

A pydantic-ai agent whose tools are declared with `requires_approval=True` (or raise
`ApprovalRequired`) and whose output type includes `DeferredToolRequests` ends a run with a
`DeferredToolRequests` instead of calling those tools. `resolve_deferred` puts each call in
its `approvals` to the bot (one review per call, keyed by pydantic-ai's `tool_call_id`), waits
until all are decided, takes each decision once, and returns the `DeferredToolResults` to
resume the run with:

| reviewer | result for the call                                   | then                          |
|----------|-------------------------------------------------------|-------------------------------|
| approve  | `ToolApproved()`                                      | the tool runs, once           |
| edit     | `ToolApproved(override_args=<the edited arguments>)`  | it runs once with those       |
| deny     | `ToolDenied(message=<the reviewer's reason>)`         | the model sees the reason     |

```python
from pydantic_ai import Agent, DeferredToolRequests
from nodbot.core.bridges.pydantic_ai import resolve_deferred
from nodbot.core.client import ApprovalClient

agent = Agent("openai:gpt-5", output_type=[str, DeferredToolRequests])

@agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: float) -> str:
    ...

async with ApprovalClient(url, token=token) as nodbot:
    result = await agent.run("refund order o-7")
    while isinstance(result.output, DeferredToolRequests):
        history = result.all_messages()
        decided = await resolve_deferred(result.output, nodbot, run_id="support-42",
                                         messages=history, within=3600)
        result = await agent.run(message_history=history, deferred_tool_results=decided)
```

`run_with_reviews(agent, prompt, nodbot, run_id=..., within=...)` is that loop (bounded by
`rounds`), with the tools' argument schemas read from the agent (`tool_schemas`) so that
reviewers get a typed edit form.

Limits:
- Only approvals are this bridge's: `DeferredToolRequests.calls` (external tools, questions)
  are left out of the results; give their results yourself (`DeferredToolResults.update`),
  and `run_with_reviews` hands such a result back unresolved.
- A call without a `tool_call_id` is denied by the bridge (pydantic-ai assigns one to every
  call, so this only happens to requests built or stored by hand).
- Pass `messages`, the history you will resume with: right before returning, the bridge
  checks that its last model response still holds every reviewed call (same id, tool and
  arguments) and that none was answered since; otherwise it raises `StaleResume` (the
  decisions are spent then, and a resume of those calls opens new reviews).
- Calls are keyed by `tool_call_id`: two calls sharing one id in a response share one result.
- A decision answers one call once: resolving the same requests again opens new reviews.
- `schemas` is only known for the agent's own function tools (`tool_schemas`); toolsets
  built at run time (MCP servers, `@agent.toolset`) are reviewed without a schema.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.agent import AbstractAgent, AgentRunResult
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart
from pydantic_ai.toolsets import FunctionToolset

from nodbot.core.bridges.common import (
    PendingCall,
    Resolution,
    Reviews,
    StaleResume,
    resolve_calls,
)

__all__ = ["resolve_deferred", "run_with_reviews", "tool_schemas"]


async def resolve_deferred(
    requests: DeferredToolRequests,
    reviews: Reviews,
    *,
    run_id: str,
    messages: Sequence[ModelMessage] | None = None,
    within: float,
    requested_by: str | None = None,
    schemas: Mapping[str, dict[str, Any]] | None = None,
) -> DeferredToolResults:
    """Review every call of `requests.approvals` (run `run_id`) through `reviews`, wait at most
    `within` seconds for all decisions, take each once, and return them as the
    `DeferredToolResults` to resume the run with (`approvals` only, keyed by `tool_call_id`;
    `requests.calls`, external tools, are left out).

    `schemas` maps tool names to their arguments' JSON schema (see `tool_schemas`).
    `messages` is the history the run will be resumed with; when given, it is checked before
    the reviews open and again right before returning.

    Raises `StaleResume` when `messages` no longer ends in a response holding those calls
    unanswered, and `core.client.DecisionTimeout` when some call is not decided in time.
    """
    calls = [_pending(part, schemas or {}) for part in requests.approvals]
    if messages is not None:
        _check_fresh(messages, calls)
    resolutions = await resolve_calls(
        reviews, run_id, calls, within=within, requested_by=requested_by
    )
    if messages is not None:
        _check_fresh(messages, calls)  # the history may have moved on meanwhile
    return DeferredToolResults(
        approvals={
            part.tool_call_id: _result(resolution)
            for part, resolution in zip(requests.approvals, resolutions, strict=True)
        }
    )


async def run_with_reviews(
    agent: AbstractAgent[Any, Any],
    prompt: str,
    reviews: Reviews,
    *,
    run_id: str,
    within: float,
    requested_by: str | None = None,
    rounds: int = 10,
    **options: Any,
) -> AgentRunResult[Any]:
    """Run `agent` on `prompt` (`options` go to every `agent.run`, e.g. `deps`), and while its
    output is `DeferredToolRequests`, resolve the approvals through `reviews` and resume it
    with them, at most `rounds` times; the last result is returned. A result that also waits
    for external calls is returned as it is (resolve it with `resolve_deferred` and your own
    results). Raises what `resolve_deferred` raises."""
    schemas = tool_schemas(agent)
    result = await agent.run(prompt, **options)
    for _ in range(rounds):
        requests = result.output
        if not isinstance(requests, DeferredToolRequests) or requests.calls:
            break
        history = result.all_messages()
        decided = await resolve_deferred(
            requests,
            reviews,
            run_id=run_id,
            messages=history,
            within=within,
            requested_by=requested_by,
            schemas=schemas,
        )
        result = await agent.run(message_history=history, deferred_tool_results=decided, **options)
    return result


def tool_schemas(agent: AbstractAgent[Any, Any]) -> dict[str, dict[str, Any]]:
    """The arguments' JSON schema of each function tool registered on `agent`, by tool name."""
    return {
        name: dict(tool.tool_def.parameters_json_schema)
        for toolset in agent.toolsets
        if isinstance(toolset, FunctionToolset)
        for name, tool in toolset.tools.items()
    }


def _pending(part: ToolCallPart, schemas: Mapping[str, dict[str, Any]]) -> PendingCall:
    return PendingCall(
        tool=part.tool_name,
        # a copy: the history holds the same part, and what was reviewed must not change
        arguments=copy.deepcopy(part.args_as_dict()),
        call_id=part.tool_call_id or None,
        schema=schemas.get(part.tool_name),
    )


def _result(resolution: Resolution) -> ToolApproved | ToolDenied:
    if not resolution.approved:
        return ToolDenied(message=resolution.message or ToolDenied().message)
    if resolution.edited:
        return ToolApproved(override_args=dict(resolution.arguments))
    return ToolApproved()


def _check_fresh(messages: Sequence[ModelMessage], reviewed: Sequence[PendingCall]) -> None:
    """Raise `StaleResume` unless the last model response of `messages` holds each reviewed
    call (same id, tool and arguments) and no later request answers it."""
    at = next((i for i in range(len(messages) - 1, -1, -1) if _is_response(messages[i])), -1)
    last = messages[at] if at >= 0 else None
    if not isinstance(last, ModelResponse):
        raise StaleResume("the message history holds no model response to resume")
    open_calls = {part.tool_call_id: part for part in last.tool_calls}
    answered = {
        getattr(part, "tool_call_id", None)
        for message in messages[at + 1 :]
        if isinstance(message, ModelRequest)
        for part in message.parts
    }
    for call in reviewed:
        if call.call_id is None:
            continue  # denied by the bridge: nothing can run on it
        found = open_calls.get(call.call_id)
        if found is None or call.call_id in answered:
            raise StaleResume(
                f"the run moved on: call {call.call_id!r} of {call.tool!r} is no longer open"
                " in the last model response of the message history"
            )
        if found.tool_name != call.tool or found.args_as_dict() != call.arguments:
            raise StaleResume(
                f"the run was changed: call {call.call_id!r} in the message history is not"
                f" the {call.tool!r} call with the arguments reviewed"
            )


def _is_response(message: ModelMessage) -> bool:
    return isinstance(message, ModelResponse)
