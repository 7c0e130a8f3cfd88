"""Microsoft Agent Framework bridge: a run's function approval requests, decided by people
through nodbot.

An `Agent` whose tool is declared with `@tool(approval_mode="always_require")` ends a run with
a `function_approval_request` `Content` for each call of it (in `response.user_input_requests`)
instead of calling it. `resolve_approvals` puts each of those calls to the bot (one review per
call, keyed by the model's `function_call.call_id`), waits until all are decided, takes each
decision once, and returns the `Message` to resume the run with, holding one
`function_approval_response` per request:

| reviewer | response for the call                              | then                  |
|----------|----------------------------------------------------|-----------------------|
| approve  | `approved=True`                                    | the tool runs, once   |
| edit     | `approved=False`, reason: the edited call, by name | the tool does not run |
| deny     | `approved=False`, reason: the reviewer's message   | the tool does not run |

```python
from agent_framework import Agent, tool
from nodbot.core.bridges.agent_framework import resolve_approvals
from nodbot.core.client import ApprovalClient

@tool(approval_mode="always_require")
def refund(order_id: str, amount: float) -> str:
    ...

agent = Agent(client, tools=[refund])
session = agent.create_session()
async with ApprovalClient(url, token=token) as nodbot:
    response = await agent.run("refund order o-7", session=session)
    while any(r.type == "function_approval_request" for r in response.user_input_requests):
        resume = await resolve_approvals(response.user_input_requests, nodbot,
                                         run_id=session.session_id, session=session,
                                         within=3600)
        response = await agent.run(resume, session=session)
```

Pass `schemas=tool_schemas(agent)` to give reviewers an edit form typed by the tool's
arguments (the bot checks an edit against it).

Limits:
- Edits cannot run: Agent Framework runs an approved call with the arguments it recorded when
  it asked (it rebinds every response to its own copy of the request), so a reviewer's edit is
  answered as a denial whose reason names the edited call and the arguments the reviewer set.
  Reviewers are told so in the review's description.
- The model never sees a reviewer's message: Agent Framework answers every rejected call with
  the same result ("Error: Tool call invocation was rejected by user."). The reason of each
  denial is in its response's `additional_properties["reason"]` (the framework's field for an
  approval's reason); to tell the model, put it in your next user message after the resume
  (not in the resume: a text there would land between the call and its result).
- Pass the `session` you resume with (Agent Framework only honours responses to requests its
  session recorded as pending), and `messages` when the history is not the session's built-in
  in-memory one. Before asking and again right before returning, the bridge checks that every
  request is still pending in the session (same id, call id, tool and arguments) and that the
  history's last turn still holds it, unanswered and with nothing said since; otherwise it
  raises `StaleResume` (decisions already taken are spent then, and resolving those requests
  again opens new reviews).
- A call without a provider call id is denied by the bridge: Agent Framework then uses its own
  occurrence id (`function_call.id`) as the call id, so a call whose `call_id` is empty or equal
  to its `id` counts as having none.
- Only function approvals are this bridge's: other user input requests (such as OAuth consent)
  are left out of the resume; answer them yourself.
- A decision answers one call once: resolving the same requests again opens new reviews.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent_framework import (
    AgentSession,
    Content,
    FunctionTool,
    InMemoryHistoryProvider,
    Message,
    RawAgent,
)

# Agent Framework 1.23 keeps the requests it will accept responses to in the session state, and
# reads them with this function; the bridge reads the same record instead of guessing its layout.
from agent_framework._tools import _load_pending_approval_requests

from nodbot.core.bridges.common import PendingCall, Resolution, Reviews, StaleResume, resolve_calls

__all__ = ["EDITS_NOT_RUN", "resolve_approvals", "tool_schemas"]

EDITS_NOT_RUN = (
    "This agent cannot run edited arguments: an edit denies this call (it does not run), and "
    "the arguments you set are handed back to the agent's application with the denial."
)
"""The description of every review this bridge opens."""


async def resolve_approvals(
    requests: Sequence[Content],
    reviews: Reviews,
    *,
    run_id: str,
    within: float,
    session: AgentSession | None = None,
    messages: Sequence[Message] | None = None,
    requested_by: str | None = None,
    schemas: Mapping[str, dict[str, Any]] | None = None,
) -> Message:
    """Review each `function_approval_request` of `requests` (other contents are left out)
    through `reviews` as calls of run `run_id`, wait at most `within` seconds for all
    decisions, take each once, and return the user `Message` that answers every request.
    `schemas` maps tool names to their arguments' JSON schema (see `tool_schemas`), which the
    bot needs to check a reviewer's edit.

    Raises `StaleResume` when a request is no longer pending in `session` or in the last turn
    of the history (`messages`, else the session's in-memory history), before asking and right
    before returning; `ValueError` for a request without a function call;
    `core.client.DecisionTimeout` when some are not decided in time."""
    asked = [request for request in requests if request.type == "function_approval_request"]
    calls = [_pending_call(request, schemas or {}) for request in asked]
    await _check_pending(asked, session, messages)
    resolutions = await resolve_calls(
        reviews, run_id, calls, within=within, requested_by=requested_by
    )
    await _check_pending(asked, session, messages)
    responses = [
        _response(request, resolution)
        for request, resolution in zip(asked, resolutions, strict=True)
    ]
    return Message(role="user", contents=responses)


def _function_call(request: Content) -> Content:
    call = request.function_call
    if call is None or not call.name:
        raise ValueError(f"approval request {request.id!r} holds no function call")
    return call


def _native_call_id(call: Content) -> str | None:
    # A call the model sent without an id gets the framework's occurrence id as its call id.
    if not call.call_id or call.call_id == call.id:
        return None
    return call.call_id


def tool_schemas(agent: RawAgent[Any]) -> dict[str, dict[str, Any]]:
    """The arguments' JSON schema of each function tool given to `agent`, by tool name (tools
    of MCP servers and tools passed to one `run` only are not known)."""
    return {
        tool.name: dict(tool.parameters())
        for tool in agent.default_options.get("tools", [])
        if isinstance(tool, FunctionTool)
    }


def _pending_call(request: Content, schemas: Mapping[str, dict[str, Any]]) -> PendingCall:
    call = _function_call(request)
    tool = str(call.name)
    return PendingCall(
        tool=tool,
        # a copy: the history holds the same call, and what was reviewed must not change
        arguments=copy.deepcopy(dict(call.parse_arguments() or {})),
        call_id=_native_call_id(call),
        schema=schemas.get(tool),
        description=EDITS_NOT_RUN,
    )


def _response(request: Content, resolution: Resolution) -> Content:
    approved = resolution.approved and not resolution.edited
    response = request.to_function_approval_response(approved)
    if resolution.edited:
        response.additional_properties["reason"] = _edited(resolution)
    elif not approved and resolution.message:
        response.additional_properties["reason"] = resolution.message
    return response


def _edited(resolution: Resolution) -> str:
    call = resolution.call
    arguments = json.dumps(resolution.arguments, sort_keys=True, default=str)
    return (
        f"the reviewer edited the call {call.tool} (call id {call.call_id}) to {arguments}; "
        "edited arguments cannot be run here, so the call was not run"
    )


def _identity(request: Content) -> tuple[str | None, str | None, str | None, str]:
    call = _function_call(request)
    arguments = json.dumps(call.parse_arguments() or {}, sort_keys=True, default=str)
    return request.id, call.call_id, call.name, arguments


async def _check_pending(
    requests: Sequence[Content], session: AgentSession | None, messages: Sequence[Message] | None
) -> None:
    if session is not None:
        recorded = _load_pending_approval_requests(session)
        _check_all_in(requests, list(recorded.values()), "pending in the session")
    history = list(messages) if messages is not None else await _session_history(session)
    if history is not None:
        _check_all_in(requests, _last_turn_requests(history), "open in the history's last turn")


async def _session_history(session: AgentSession | None) -> list[Message] | None:
    if session is None:
        return None
    state = session.state.get(InMemoryHistoryProvider.DEFAULT_SOURCE_ID)
    if not isinstance(state, dict):
        return None  # another history provider: pass `messages`
    return await InMemoryHistoryProvider().get_messages(session.session_id, state=state)


def _last_turn_requests(history: Sequence[Message]) -> list[Content]:
    """The approval requests of the assistant messages since the last user or tool message."""
    turn: list[Message] = []
    for message in reversed(history):
        if message.role != "assistant":
            break
        turn.append(message)
    return [
        content
        for message in turn
        for content in message.contents
        if content.type == "function_approval_request"
    ]


def _check_all_in(requests: Sequence[Content], pending: Sequence[Content], where: str) -> None:
    open_ = {_identity(request) for request in pending if request.function_call is not None}
    for request in requests:
        if _identity(request) not in open_:
            call = _function_call(request)
            raise StaleResume(
                f"approval request {request.id!r} ({call.name}, call id {call.call_id!r}) is no "
                f"longer {where}: the thread moved on since it was read; nothing was resumed"
            )
