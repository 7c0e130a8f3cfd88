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
| respond  | `ToolDenied(message=<the reviewer's answer>)`         | the model reads the answer as |
|          |                                                       | the call's result             |

A respond (the reviewer answers in the tool's place) has no result of its own in pydantic-ai
(an approval's result is `ToolApproved` or `ToolDenied`; `DeferredToolResults.calls` takes
only external calls): the bridge sends it as the denial whose message is the answer, which
pydantic-ai gives the model, word for word, as the call's return (a `ToolReturnPart` with
`outcome="denied"`, an ordinary result for the model, not an error). The tool does not run.

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

## A hosted agent

`HostedPydanticAI(agent)` lets the bot run a pydantic-ai agent itself (`bridges.hosted`):
name it in `nodbot.yml` as `framework_agents: {support: "shop.agents:hosted"}`, where
`shop.agents.hosted` is a `HostedPydanticAI` (or a zero-argument callable returning one).

```python
from pydantic_ai import Agent
from nodbot.core.bridges.pydantic_ai import HostedPydanticAI

agent = Agent("openai:gpt-5")

@agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: float) -> str:
    ...

hosted = HostedPydanticAI(agent)  # deps=..., and agent.run options such as usage_limits=...
```

`start(text, run_id=...)` runs the agent on `text` with `DeferredToolRequests` added to its
output type (unless it declares it already), and `resume(state, resolutions, run_id=...)`
runs it again on the stored history with the `DeferredToolResults` built from the bot's
resolutions as `resolve_deferred` builds them. Each returns a `HostedStep`: the pending
approvals (keyed by `tool_call_id`, with the argument schema of the agent's own function
tools), or, once the run ends, its output as `final_text` (a structured output as JSON).
The state is the run's message history (`ModelMessagesTypeAdapter`, as JSON) and the ids of
the calls it paused for: nothing is kept in memory between steps.

Limits of the hosted agent:
- A `resume` is refused with `StaleResume` when the resolutions do not answer the calls the
  state paused for (same ids, in order, same tools and arguments), and with `ValueError`
  when the state is not this adapter's (not JSON, another kind or version, another run, a
  run that has finished).
- A call without a `tool_call_id` is resumed denied (`NO_CALL_ID`), whatever its resolution.
- pydantic-ai's own `run_id` is new for each step (it refuses one already in the history);
  the bot's run id is kept in the state and checked on `resume`.
- An agent with output validators must declare `DeferredToolRequests` in its own output type
  (pydantic-ai refuses a run's `output_type` then).
- A run that waits for external tool calls (`DeferredToolRequests.calls`) cannot be hosted:
  the step raises `RuntimeError`, since the bot has no results to give them.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
import pydantic_core
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.agent import AbstractAgent, AgentRunResult
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
)
from pydantic_ai.output import OutputSpec
from pydantic_ai.toolsets import FunctionToolset

from nodbot.core.bridges.common import (
    NO_CALL_ID,
    PendingCall,
    Resolution,
    Reviews,
    StaleResume,
    resolve_calls,
)
from nodbot.core.bridges.hosted import HostedStep

__all__ = ["HostedPydanticAI", "resolve_deferred", "run_with_reviews", "tool_schemas"]

STATE_KIND = "nodbot.pydantic_ai"
STATE_VERSION = 1


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


class HostedPydanticAI:
    """A pydantic-ai agent the bot runs itself (`bridges.hosted.HostedAgent`; see the module).

    `deps` and `options` (e.g. `usage_limits`, `model_settings`) go to every `agent.run`."""

    def __init__(self, agent: AbstractAgent[Any, Any], *, deps: Any = None, **options: Any):
        self.agent = agent
        self.deps = deps
        self.options = options
        self._output_type = _with_deferred(agent.output_type)

    async def start(self, text: str, *, run_id: str) -> HostedStep:
        """Run the agent on `text` until it ends or pauses for approvals. Raises
        `RuntimeError` when it waits for external tool calls."""
        result = await self.agent.run(
            text, output_type=self._output_type, deps=self.deps, **self.options
        )
        return self._step(result, run_id)

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep:
        """Resume the run kept in `state` with one resolution per call it paused for, in order.
        Raises `ValueError` when `state` is not this adapter's (or is another run's, or of a
        finished run), `StaleResume` when `resolutions` do not answer its calls or its history
        no longer holds them open, `RuntimeError` as `start` does."""
        messages, call_ids = _load(state, run_id)
        _check_answers(call_ids, resolutions)
        _check_fresh(messages, [resolution.call for resolution in resolutions])
        results = DeferredToolResults(
            approvals={
                call_id: _result(resolution)
                for call_id, resolution in zip(call_ids, resolutions, strict=True)
            }
        )
        result = await self.agent.run(
            message_history=messages,
            deferred_tool_results=results,
            output_type=self._output_type,
            deps=self.deps,
            **self.options,
        )
        return self._step(result, run_id)

    def _step(self, result: AgentRunResult[Any], run_id: str) -> HostedStep:
        output = result.output
        messages = result.all_messages()
        if not isinstance(output, DeferredToolRequests):
            text = output if isinstance(output, str) else pydantic_core.to_json(output).decode()
            return HostedStep(state=_dump(run_id, messages, []), final_text=text)
        if output.calls:
            raise RuntimeError(
                f"the agent waits for external tool calls"
                f" ({', '.join(part.tool_name for part in output.calls)}),"
                " which a hosted agent cannot answer"
            )
        schemas = tool_schemas(self.agent)
        ids = [part.tool_call_id for part in output.approvals]
        return HostedStep(
            state=_dump(run_id, messages, ids),
            pending=tuple(_pending(part, schemas) for part in output.approvals),
        )


def _with_deferred(declared: OutputSpec[Any]) -> OutputSpec[Any] | None:
    """The run's output type: the agent's with `DeferredToolRequests` added, or None (the
    agent's own) when it has it already."""
    if DeferredToolRequests in _outputs(declared):
        return None
    if isinstance(declared, Sequence):
        return [*declared, DeferredToolRequests]
    return [declared, DeferredToolRequests]


def _outputs(spec: Any) -> list[Any]:
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return [item for member in spec for item in _outputs(member)]
    if typing.get_origin(spec) in (typing.Union, types.UnionType):
        return list(typing.get_args(spec))
    return [spec]


def _dump(run_id: str, messages: Sequence[ModelMessage], call_ids: Sequence[str]) -> str:
    return json.dumps(
        {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "run_id": run_id,
            "pending": list(call_ids),
            "messages": ModelMessagesTypeAdapter.dump_python(list(messages), mode="json"),
        }
    )


def _load(state: str, run_id: str) -> tuple[list[ModelMessage], list[str]]:
    """The history and pending call ids kept in `state`; `ValueError` unless it is this
    adapter's state of run `run_id`, paused."""
    try:
        kept = json.loads(state)
    except ValueError:
        kept = None
    if not isinstance(kept, dict) or kept.get("kind") != STATE_KIND:
        raise ValueError("not the state of a hosted pydantic-ai agent")
    if kept.get("version") != STATE_VERSION:
        raise ValueError(
            f"hosted pydantic-ai state of version {kept.get('version')!r};"
            f" this adapter reads version {STATE_VERSION}"
        )
    if kept.get("run_id") != run_id:
        raise ValueError(
            f"the hosted pydantic-ai state is of run {kept.get('run_id')!r}, not {run_id!r}"
        )
    call_ids = kept.get("pending")
    if not isinstance(call_ids, list) or not all(isinstance(i, str) for i in call_ids):
        raise ValueError("the hosted pydantic-ai state holds no list of pending call ids")
    if not call_ids:
        raise ValueError(f"the hosted pydantic-ai run {run_id!r} has finished: nothing to resume")
    try:
        messages = ModelMessagesTypeAdapter.validate_python(kept.get("messages"))
    except pydantic.ValidationError as error:
        raise ValueError(
            f"the hosted pydantic-ai state holds no valid message history: {error}"
        ) from error
    return messages, call_ids


def _check_answers(call_ids: Sequence[str], resolutions: Sequence[Resolution]) -> None:
    """Raise `StaleResume` unless `resolutions` answer exactly the calls `call_ids`, in order."""
    answered = [resolution.call.call_id or "" for resolution in resolutions]
    if answered != list(call_ids):
        raise StaleResume(
            f"the resolutions answer calls {answered!r}, but the run paused for {list(call_ids)!r}"
        )


def _pending(part: ToolCallPart, schemas: Mapping[str, dict[str, Any]]) -> PendingCall:
    return PendingCall(
        tool=part.tool_name,
        # a copy: the history holds the same part, and what was reviewed must not change
        arguments=copy.deepcopy(part.args_as_dict()),
        call_id=part.tool_call_id or None,
        schema=schemas.get(part.tool_name),
    )


def _result(resolution: Resolution) -> ToolApproved | ToolDenied:
    if resolution.call.call_id is None:
        return ToolDenied(message=NO_CALL_ID)  # no decision can be bound to it, whatever it says
    if resolution.response is not None:
        # pydantic-ai has no result for an approval but these two; a denial's message is the
        # call's result as the model reads it (an ordinary one: outcome `denied`, no error).
        return ToolDenied(message=resolution.response)
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
