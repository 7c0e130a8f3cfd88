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
| respond  | `approved=False`, reason: the answer (`RESPONDED`) | the tool does not run |
|          | and `response`: the answer itself                  |                       |

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
- Agent Framework has no way to give the model a tool's result without running it: a respond
  (the reviewer's answer in the tool's place) is answered as a rejection, whose response
  holds the answer in `additional_properties["response"]` and, worded as
  `bridges.common.RESPONDED`, in `additional_properties["reason"]`. The model is told the
  fixed rejection text; to give it the answer, put it in your next user message.
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

## Run by the bot: `HostedAgentFramework`

The bot can run an Agent Framework agent itself (`bridges.hosted`): name an instance of
`HostedAgentFramework` (or a zero-argument callable returning one) under `framework_agents:`
in `nodbot.yml`, and `POST /runs` starts it; its calls are reviewed by the rules, and the bot
resumes it once every call is decided.

```python
# shop/agents.py
from agent_framework import Agent
from nodbot.core.bridges.agent_framework import HostedAgentFramework

hosted = HostedAgentFramework(Agent(client, name="support", tools=[refund]))
```

```yaml
# nodbot.yml
framework_agents:
  support: "shop.agents:hosted"
```

- `start(text, run_id=...)` runs the agent on `text` in a new `AgentSession` (whose
  `session_id` is the run id) and returns a `HostedStep`: the session serialized with
  `AgentSession.to_dict()` (its history and the approval requests it recorded as pending, in
  an envelope naming the adapter, its version, the run id, the agent's name and the pending
  requests' ids) as `state`; one `PendingCall` per `function_approval_request` of the response
  (the model's `call_id`, the tool, its arguments and the tool's JSON schema); or
  `final_text` (the response's text) once the run finished.
- `resume(state, resolutions, run_id=...)` restores the session with
  `AgentSession.from_dict`, builds the approval response `Message` from the resolutions as
  `resolve_approvals` does (approve; an edit as a denial naming the edited call; a denial with
  its reason; a respond as a denial holding the answer), and runs the agent with it in the
  restored session, returning the next
  `HostedStep`.

Nothing stays in memory between steps: `resume` may run in another process, with another
instance built the same way (same name and tools). Limits, besides the ones above (edits do not
run, and the model is told the framework's fixed rejection text, not the reviewer's reason:
that reason, or the edited call, stays in the session's history with its approval response,
under `additional_properties["reason"]`, so the next state holds it):
- The session must keep its history in itself, as the agent's default in-memory history does;
  with a service-side history (a `service_session_id`) only the id is kept, and the service
  must still hold the conversation when the run resumes. Every value of the session's state
  must be serializable by `AgentSession.to_dict()` to JSON (else `start` or `resume` raises
  `ValueError`).
- `resume` raises `ValueError` for a state that is not this adapter's (not JSON, another
  adapter's or version's, another run's or agent's, or one the framework cannot restore), and
  `StaleResume` when the resolutions do not answer exactly the state's pending calls (same
  call ids, tools and arguments, in order), when those requests are no longer pending in the
  restored session or open in its history's last turn, or when the state has finished; it
  runs nothing then.
- The state is plain text, so the adapter cannot tell whether a state was resumed already:
  resuming the same state twice would run its approved calls twice. The bot resumes each step
  at most once and takes each decision once; if you call `resume` yourself, do the same.
- A run that stops for user input other than function approvals (OAuth consent, say) raises
  `RuntimeError`: the bot cannot answer it (the run fails).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent_framework import (
    AgentResponse,
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
from nodbot.core.bridges.hosted import HostedStep

__all__ = ["EDITS_NOT_RUN", "HostedAgentFramework", "resolve_approvals", "tool_schemas"]

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
    if resolution.response is not None:
        # No way to give the model a result without running the tool: a rejection, whose
        # record says the answer (the model is told the framework's fixed rejection text).
        response.additional_properties["reason"] = resolution.responded()
        response.additional_properties["response"] = resolution.response
    elif resolution.edited:
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


_KIND = "nodbot.bridges.agent_framework.HostedAgentFramework"
_VERSION = 1


class HostedAgentFramework:
    """An Agent Framework agent the bot runs itself (`bridges.hosted.HostedAgent`; see the
    module)."""

    def __init__(self, agent: RawAgent[Any]) -> None:
        self.agent = agent
        """The agent every run starts with (and the one sessions are resumed with)."""

    async def start(self, text: str, *, run_id: str) -> HostedStep:
        """Run the agent on `text` in a new session until it finishes or pauses for approvals.

        Raises `RuntimeError` when it stops for input other than function approvals, and
        `ValueError` when its session cannot be serialized."""
        session = self.agent.create_session(session_id=run_id)
        response = await self.agent.run(text, session=session)
        return self._step(response, session, run_id)

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep:
        """Answer the restored session's pending requests with `resolutions` (one per pending
        call of `state`, in order) and run the agent on until it finishes or pauses again.

        Raises `ValueError` when `state` is not this adapter's state of run `run_id`, and
        `StaleResume` when `resolutions` do not answer exactly its pending calls, or those are
        no longer pending in the session (nothing is run then)."""
        session, ids = self._restore(state, run_id)
        if not ids:
            raise StaleResume(f"run {run_id!r}: the state has finished; nothing is resumed")
        recorded = _load_pending_approval_requests(session)
        requests = [recorded[id_] for id_ in ids if id_ in recorded]
        if len(requests) != len(ids):
            raise StaleResume(
                f"run {run_id!r}: the session no longer holds the state's pending requests; "
                "nothing is resumed"
            )
        await _check_pending(requests, session, None)
        calls = [_pending_call(request, {}) for request in requests]
        if [_key(call) for call in calls] != [_key(r.call) for r in resolutions]:
            raise StaleResume(
                f"run {run_id!r}: the decisions do not answer the state's pending calls "
                "(they belong to another step, or to other calls); nothing is resumed"
            )
        answer = Message(
            role="user",
            contents=[
                _response(request, resolution)
                for request, resolution in zip(requests, resolutions, strict=True)
            ],
        )
        response = await self.agent.run(answer, session=session)
        return self._step(response, session, run_id)

    def _step(self, response: AgentResponse[Any], session: AgentSession, run_id: str) -> HostedStep:
        requests = list(response.user_input_requests)
        others = [
            request.type for request in requests if request.type != "function_approval_request"
        ]
        if others:
            raise RuntimeError(
                f"run {run_id!r}: the agent stopped for input the bot cannot give ({others}); "
                "only function approvals are reviewed"
            )
        schemas = tool_schemas(self.agent)
        pending = tuple(_pending_call(request, schemas) for request in requests)
        ids = [str(request.id) for request in requests]
        state = self._dump(session, ids, run_id)
        return HostedStep(state=state, pending=pending, final_text=None if ids else response.text)

    def _dump(self, session: AgentSession, ids: Sequence[str], run_id: str) -> str:
        envelope = {
            "kind": _KIND,
            "version": _VERSION,
            "run_id": run_id,
            "agent": self.agent.name,
            "requests": list(ids),
            "session": session.to_dict(),
        }
        try:
            return json.dumps(envelope)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"run {run_id!r}: the agent's session cannot be stored as JSON: {error}"
            ) from None

    def _restore(self, text: str, run_id: str) -> tuple[AgentSession, list[str]]:
        try:
            envelope = json.loads(text)
        except ValueError:
            raise ValueError("not a HostedAgentFramework state: it is not JSON") from None
        if not isinstance(envelope, dict) or envelope.get("kind") != _KIND:
            raise ValueError("not a HostedAgentFramework state: it names no such adapter")
        if envelope.get("version") != _VERSION:
            raise ValueError(
                f"a HostedAgentFramework state of version {envelope.get('version')!r}: this "
                f"version reads only version {_VERSION}"
            )
        if envelope.get("run_id") != run_id:
            raise ValueError(
                f"a HostedAgentFramework state of run {envelope.get('run_id')!r}, not {run_id!r}"
            )
        if envelope.get("agent") != self.agent.name:
            raise ValueError(
                f"a HostedAgentFramework state of agent {envelope.get('agent')!r}, not "
                f"{self.agent.name!r}"
            )
        ids = envelope.get("requests")
        data = envelope.get("session")
        if not isinstance(ids, list) or not all(isinstance(id_, str) for id_ in ids):
            raise ValueError("a HostedAgentFramework state with no list of pending requests")
        if not isinstance(data, dict) or data.get("session_id") != run_id:
            raise ValueError("a HostedAgentFramework state with no session of this run in it")
        try:
            session = AgentSession.from_dict(data)
            _load_pending_approval_requests(session)  # the record must be readable too
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(
                f"a HostedAgentFramework state the framework cannot restore: {error}"
            ) from None
        return session, ids


def _key(call: PendingCall) -> tuple[str | None, str, dict[str, Any]]:
    return (call.call_id, call.tool, call.arguments)
