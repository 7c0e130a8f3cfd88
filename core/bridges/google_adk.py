"""Google ADK bridge: a session's pending tool confirmations, decided by people through nodbot.

An ADK tool that needs confirmation (`FunctionTool(func, require_confirmation=True)`, or a
tool that calls `tool_context.request_confirmation(...)`) does not run: the runner yields an
`adk_request_confirmation` function call carrying the original call (its name, arguments and
id) and the tool's hint, and the invocation ends. `resolve_confirmations` puts each pending
confirmation of the session's latest turn to the bot (one review per call, keyed by the
original call's id, with the tool's hint as the description), waits until all are decided,
takes each decision once, and returns the user message that answers them: one
`FunctionResponse` per confirmation (for the `adk_request_confirmation` call's id) holding a
`ToolConfirmation`:

| reviewer | `ToolConfirmation`                                         | then                   |
|----------|------------------------------------------------------------|------------------------|
| approve  | `confirmed=True`                                           | the tool runs, once    |
| edit     | `confirmed=True, payload=<the edited arguments>` (a tool   | it runs once, with the |
|          | named in `payload_edits`)                                  | payload's arguments    |
| edit     | `confirmed=False, payload={"message": ...}` naming the     | the tool does not run  |
|          | edited call (any other tool)                               |                        |
| deny     | `confirmed=False, payload={"message": <the reason>}`       | the tool does not run  |
| respond  | `confirmed=False, payload={"message": <the answer, as      | the tool does not run  |
|          | `RESPONDED`>, "response": <the answer>}`                   |                        |

```python
from google.adk.runners import InMemoryRunner
from google.genai import types
from nodbot.core.bridges.google_adk import pending_confirmations, resolve_confirmations
from nodbot.core.client import ApprovalClient

runner = InMemoryRunner(agent=agent, app_name="shop")   # agent with FunctionTool(refund,
session = await runner.session_service.create_session(   #   require_confirmation=True)
    app_name="shop", user_id="u-1")
message = types.Content(role="user", parts=[types.Part(text="refund order o-7")])
async with ApprovalClient(url, token=token) as nodbot:
    while message is not None:
        async for event in runner.run_async(user_id="u-1", session_id=session.id,
                                            new_message=message):
            ...
        session = await runner.session_service.get_session(
            app_name="shop", user_id="u-1", session_id=session.id)
        message = None
        if pending_confirmations(session):
            message = await resolve_confirmations(
                session, nodbot, run_id=session.id, within=3600,
                session_service=runner.session_service)
```

Edited arguments: ADK re-runs a confirmed tool with the model's own arguments (it checks
them against the session), so an edit can only reach a tool that reads
`tool_context.tool_confirmation.payload` itself. Name such tools in `payload_edits`: when
approved, their payload is the arguments to run with (the reviewer's edit merged in, or the
original ones). For every other tool an edit denies the call, and its reviewers are told so
in the description.

Limits:
- ADK's `ToolConfirmation` has no field for a reason: a denial's reason travels as
  `payload={"message": ...}`, which a tool handling its own confirmation can read; ADK's
  `FunctionTool` ignores it and tells the model "This tool call is rejected."
- ADK has no confirmation that answers in the tool's place: a respond (the reviewer's answer
  instead of the tool) is a refusal whose payload holds the answer (`"response"`, and worded
  as `bridges.common.RESPONDED` in `"message"`). A tool that handles its own confirmation can
  return `payload["response"]` as its result when `confirmed` is false; ADK's `FunctionTool`
  tells the model "This tool call is rejected."
- A confirmation whose original call has no id is denied by the bridge (ADK gives every
  call an id, so this only happens to events built or stored by hand); one whose own
  `adk_request_confirmation` call has no id cannot be answered and gets no response.
- Pending means: in the session's latest turn (the events after its last user event). Pass
  the `Session` and `session_service` (for instance `runner.session_service`): the bridge
  re-reads the session before asking and again before answering, and raises `StaleResume`
  when it moved on (another event, or other pending confirmations) since it was read. The
  decisions are spent then, and the calls are reviewed again when confirmed anew. With a
  list of events, or without `session_service`, only the events given are checked.
- A decision answers one call once: resolving the same confirmations again opens new reviews.
- The bridge cannot read a tool's argument schema from ADK (its declarations are not public
  API): pass `schemas` (tool name -> JSON schema) for reviewers to get an edit form; the bot
  lets reviewers edit a tool it does not have only with a schema (approve or deny
  otherwise).

## Run by the bot: `HostedGoogleADK`

The bot can run an ADK agent itself (`bridges.hosted`): name an instance of
`HostedGoogleADK` (or a zero-argument callable returning one) under `framework_agents:` in
`nodbot.yml`, and `POST /runs` starts it; its calls are reviewed by the rules, and the bot
resumes it once every call is decided.

```python
# shop/agents.py
from google.adk.agents import LlmAgent
from google.adk.tools.function_tool import FunctionTool
from nodbot.core.bridges.google_adk import HostedGoogleADK

agent = LlmAgent(name="support", model="gemini-2.5-flash",
                 tools=[FunctionTool(refund, require_confirmation=True)])
hosted = HostedGoogleADK(agent)
# HostedGoogleADK(agent, app_name=None, user_id="nodbot", payload_edits=(), schemas=None,
#                 run_config=None)
```

```yaml
# nodbot.yml
framework_agents:
  support: "shop.agents:hosted"
```

- `start(text, run_id=...)` creates a session (app `app_name`, the agent's name by default;
  user `user_id`) in a fresh `InMemoryRunner` and runs `Runner.run_async` with `text` as the
  new message, until the agent finishes or yields `adk_request_confirmation` calls. It returns
  a `HostedStep`: the session as `state` (`Session.model_dump_json()`: its events and state,
  in an envelope naming the adapter, its version, the run id, the agent, the app name, user id
  and session id), one `PendingCall` per pending confirmation (as `pending_confirmations`
  reads them: the original call's id, tool and arguments; the tool's hint as the description,
  with the edit notice for a tool not in `payload_edits`; the schema from `schemas`), or
  `final_text` (the text of the agent's last final response) once no confirmation is pending.
- `resume(state, resolutions, run_id=...)` restores the session (`Session.model_validate_json`)
  into a fresh runner's `InMemorySessionService` (`create_session` with its id and state, then
  `append_event` for each of its events), answers each confirmation as
  `resolve_confirmations` does (the table above; `payload_edits` alike), sends the answers as
  the new message and returns the next `HostedStep`.

Nothing stays in memory between steps: `resume` may run in another process, with another
instance built the same way (the same agent name, app name and tools). Limits, besides the
ones above:
- Only the session is kept: artifacts and memory (the runner's in-memory services) do not
  outlive a step, and `app:` / `user:` state is kept as the session saw it, per run.
- `resume` raises `ValueError` for a state that is not this adapter's (not JSON, another
  adapter's or version's, another run's, agent's or app's, or a session ADK cannot read), and
  `StaleResume` when the resolutions do not answer exactly the session's pending
  confirmations (same call ids, tools and arguments, in order), for instance the previous
  step's decisions given with this step's state, or when the session has finished; it runs
  nothing then.
- The state is plain text, so the adapter cannot tell whether a state was resumed already:
  resuming the same state twice would run its approved calls twice. The bot resumes each step
  at most once and takes each decision once; if you call `resume` yourself, do the same.
- A denial's reason reaches the model only through a tool that reads its confirmation's
  payload and returns it; ADK's `FunctionTool` tells the model "This tool call is rejected."
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.run_config import RunConfig
from google.adk.events.event import Event
from google.adk.runners import InMemoryRunner
from google.adk.sessions.base_session_service import BaseSessionService
from google.adk.sessions.session import Session
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from nodbot.core.bridges.common import (
    PendingCall,
    Resolution,
    Reviews,
    StaleResume,
    resolve_calls,
)
from nodbot.core.bridges.hosted import HostedStep

__all__ = [
    "REQUEST_CONFIRMATION",
    "HostedGoogleADK",
    "PendingConfirmation",
    "pending_confirmations",
    "resolve_confirmations",
]

REQUEST_CONFIRMATION = "adk_request_confirmation"
"""The name of the function call ADK yields for a tool confirmation (ADK 2.13)."""

NO_EDITS = "Edits cannot be applied to this tool: an edited call is denied."
EDIT_DENIED = (
    "the reviewer edited the call {tool} (call id {call_id}), and this tool cannot run with "
    "arguments other than the model's: denied"
)


@dataclass(frozen=True)
class PendingConfirmation:
    """One `adk_request_confirmation` call of the session, not answered yet."""

    request_id: str | None
    """The id of the `adk_request_confirmation` call: the id its answer must carry."""
    call: PendingCall
    """The original tool call, keyed by its own id."""


async def resolve_confirmations(
    events_or_session: Session | Sequence[Event],
    reviews: Reviews,
    *,
    run_id: str,
    within: float,
    requested_by: str | None = None,
    payload_edits: Collection[str] = (),
    schemas: Mapping[str, dict[str, Any]] | None = None,
    session_service: BaseSessionService | None = None,
) -> types.Content:
    """Review the pending tool confirmations of `events_or_session` (run `run_id`) through
    `reviews`, waiting at most `within` seconds, and return the user message answering them
    (send it as `new_message` to `Runner.run_async`). `payload_edits`: the tools that read
    edited arguments from their confirmation's payload; `schemas`: the JSON schemas of
    tools' arguments, by tool name, for reviewers' edit forms; `session_service`: where to
    re-read a `Session` before asking and before answering. Raises `ValueError` when
    nothing is pending, `StaleResume` when the session moved on, and
    `core.client.DecisionTimeout` when some call is not decided in time."""
    pending = pending_confirmations(events_or_session)
    if not pending:
        raise ValueError("no pending tool confirmation in these events")
    await _check_current(events_or_session, session_service, pending)
    calls = [_described(item.call, payload_edits, schemas or {}) for item in pending]
    resolutions = await resolve_calls(
        reviews, run_id, calls, within=within, requested_by=requested_by
    )
    await _check_current(events_or_session, session_service, pending)
    parts = [
        _answer(item.request_id, resolution, payload_edits)
        for item, resolution in zip(pending, resolutions, strict=True)
        if item.request_id
    ]
    return types.Content(role="user", parts=parts)


def pending_confirmations(
    events_or_session: Session | Sequence[Event],
) -> list[PendingConfirmation]:
    """The `adk_request_confirmation` calls of the latest turn (the events after the last
    user event), in order. Raises `ValueError` when two of them confirm the same call."""
    events = _events(events_or_session)
    start = max((i + 1 for i, event in enumerate(events) if event.author == "user"), default=0)
    found: list[PendingConfirmation] = []
    for event in events[start:]:
        for function_call in event.get_function_calls():
            if function_call.name == REQUEST_CONFIRMATION:
                found.append(_pending(function_call))
    ids = [item.call.call_id for item in found if item.call.call_id]
    if len(ids) != len(set(ids)):
        raise ValueError("two pending confirmations are for the same call")
    return found


def _events(events_or_session: Session | Sequence[Event]) -> list[Event]:
    if isinstance(events_or_session, Session):
        return list(events_or_session.events)
    return list(events_or_session)


def _pending(function_call: types.FunctionCall) -> PendingConfirmation:
    args = function_call.args or {}
    original = args.get("originalFunctionCall")
    original = original if isinstance(original, dict) else {}
    confirmation = args.get("toolConfirmation")
    hint = confirmation.get("hint") if isinstance(confirmation, dict) else None
    arguments = original.get("args")
    tool = str(original.get("name") or "")
    call = PendingCall(
        tool=tool,
        arguments=dict(arguments) if isinstance(arguments, dict) else {},
        # without its tool's name a call is as unanswerable as without an id: denied
        call_id=str(original["id"]) if original.get("id") and tool else None,
        description=str(hint) if hint else None,
    )
    return PendingConfirmation(request_id=function_call.id or None, call=call)


def _described(
    call: PendingCall, payload_edits: Collection[str], schemas: Mapping[str, dict[str, Any]]
) -> PendingCall:
    description = call.description
    if call.tool not in payload_edits:
        description = f"{description}\n\n{NO_EDITS}" if description else NO_EDITS
    return PendingCall(
        tool=call.tool,
        arguments=call.arguments,
        call_id=call.call_id,
        schema=schemas.get(call.tool),
        description=description,
    )


async def _check_current(
    given: Session | Sequence[Event],
    session_service: BaseSessionService | None,
    pending: list[PendingConfirmation],
) -> None:
    """Raise `StaleResume` unless the session's latest events are still the ones read."""
    if session_service is None or not isinstance(given, Session):
        return
    current = await session_service.get_session(
        app_name=given.app_name, user_id=given.user_id, session_id=given.id
    )
    if current is None:
        raise StaleResume(f"session {given.id} no longer exists: nothing is resumed")
    if _last_event_id(current.events) != _last_event_id(given.events):
        raise StaleResume(
            f"session {given.id} moved on since its confirmations were read: nothing is "
            "resumed (confirm the calls anew to review them again)"
        )
    if pending_confirmations(current) != pending:
        raise StaleResume(
            f"session {given.id} no longer holds the confirmations read: nothing is resumed"
        )


def _last_event_id(events: Sequence[Event]) -> str | None:
    return events[-1].id if events else None


def _answer(request_id: str, resolution: Resolution, payload_edits: Collection[str]) -> types.Part:
    call = resolution.call
    reads_payload = call.tool in payload_edits
    if resolution.approved and (reads_payload or not resolution.edited):
        payload = resolution.arguments if reads_payload else None
        confirmation = ToolConfirmation(confirmed=True, payload=payload)
    elif resolution.approved:
        message = EDIT_DENIED.format(tool=call.tool, call_id=call.call_id)
        confirmation = ToolConfirmation(confirmed=False, payload={"message": message})
    elif resolution.response is not None:
        # ADK has no confirmation that answers in the tool's place: a refusal, whose payload
        # a tool handling its own confirmation may return as its result.
        payload = {"message": resolution.responded(), "response": resolution.response}
        confirmation = ToolConfirmation(confirmed=False, payload=payload)
    else:
        confirmation = ToolConfirmation(
            confirmed=False, payload={"message": resolution.message or "denied"}
        )
    response: dict[str, Any] = confirmation.model_dump(by_alias=True, exclude_none=True)
    return types.Part(
        function_response=types.FunctionResponse(
            name=REQUEST_CONFIRMATION, id=request_id, response=response
        )
    )


_KIND = "nodbot.bridges.google_adk.HostedGoogleADK"
_VERSION = 1
_CallKey = tuple[str | None, str, dict[str, Any]]


class HostedGoogleADK:
    """An ADK agent the bot runs itself (`bridges.hosted.HostedAgent`; see the module)."""

    def __init__(
        self,
        agent: BaseAgent,
        *,
        app_name: str | None = None,
        user_id: str = "nodbot",
        payload_edits: Collection[str] = (),
        schemas: Mapping[str, dict[str, Any]] | None = None,
        run_config: RunConfig | None = None,
    ) -> None:
        self.agent = agent
        """The root agent every step runs (and the one states are restored for)."""
        self.app_name = app_name or agent.name
        """The ADK app name of every session; the agent's name unless given."""
        self.user_id = user_id
        """The ADK user id of every session."""
        self.payload_edits = frozenset(payload_edits)
        """The tools that read edited arguments from their confirmation's payload."""
        self.schemas = dict(schemas or {})
        """The JSON schemas of tools' arguments, by tool name, for reviewers' edit forms."""
        self.run_config = run_config
        """Passed to every `Runner.run_async`; None for ADK's default."""

    async def start(self, text: str, *, run_id: str) -> HostedStep:
        """Run the agent on `text` in a new session until it finishes or pauses for
        confirmations."""
        runner = self._runner()
        session = await runner.session_service.create_session(
            app_name=self.app_name, user_id=self.user_id
        )
        message = types.Content(role="user", parts=[types.Part(text=text)])
        return await self._run(runner, session, message, run_id)

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep:
        """Answer the session's pending confirmations with `resolutions` (one per pending
        call of `state`, in order) and run the agent on until it finishes or pauses again.

        Raises `ValueError` when `state` is not this adapter's state of run `run_id`, and
        `StaleResume` when `resolutions` do not answer exactly its pending calls, or it has
        finished (nothing runs then)."""
        saved = self._load(state, run_id)
        pending = pending_confirmations(saved)
        if not pending:
            raise StaleResume(f"run {run_id!r}: the state has finished; nothing is resumed")
        if [_call_key(item.call) for item in pending] != [_call_key(r.call) for r in resolutions]:
            raise StaleResume(
                f"run {run_id!r}: the decisions do not answer the state's pending calls "
                "(they belong to another step, or to other calls); nothing is resumed"
            )
        parts = [
            _answer(item.request_id, resolution, self.payload_edits)
            for item, resolution in zip(pending, resolutions, strict=True)
            if item.request_id
        ]
        if not parts:
            raise ValueError(
                f"run {run_id!r}: no pending confirmation of the state has an id to answer"
            )
        runner = self._runner()
        session = await _restore(runner.session_service, saved)
        return await self._run(runner, session, types.Content(role="user", parts=parts), run_id)

    def _runner(self) -> InMemoryRunner:
        # A fresh in-memory runner each step: the session lives in the state, not here. It is
        # not closed, since closing a runner closes the agent's toolsets, which later steps
        # (and other runs) use.
        return InMemoryRunner(agent=self.agent, app_name=self.app_name)

    async def _run(
        self, runner: InMemoryRunner, session: Session, message: types.Content, run_id: str
    ) -> HostedStep:
        events = [
            event
            async for event in runner.run_async(
                user_id=session.user_id,
                session_id=session.id,
                new_message=message,
                run_config=self.run_config,
            )
        ]
        current = await runner.session_service.get_session(
            app_name=session.app_name, user_id=session.user_id, session_id=session.id
        )
        if current is None:  # cannot be: nothing deletes it
            raise RuntimeError(f"run {run_id!r}: the ADK session {session.id} is gone")
        pending = pending_confirmations(current)
        calls = tuple(_described(item.call, self.payload_edits, self.schemas) for item in pending)
        final = None if pending else _final_text(events)
        return HostedStep(state=self._dump(current, run_id), pending=calls, final_text=final)

    def _dump(self, session: Session, run_id: str) -> str:
        envelope = {
            "kind": _KIND,
            "version": _VERSION,
            "run_id": run_id,
            "agent": self.agent.name,
            "app_name": session.app_name,
            "user_id": session.user_id,
            "session_id": session.id,
            "session": session.model_dump_json(),
        }
        return json.dumps(envelope)

    def _load(self, state: str, run_id: str) -> Session:
        """The session kept in `state`; `ValueError` unless it is this adapter's state of
        run `run_id`."""
        try:
            envelope = json.loads(state)
        except ValueError:
            raise ValueError("not a HostedGoogleADK state: it is not JSON") from None
        if not isinstance(envelope, dict) or envelope.get("kind") != _KIND:
            raise ValueError("not a HostedGoogleADK state: it names no such adapter")
        if envelope.get("version") != _VERSION:
            raise ValueError(
                f"a HostedGoogleADK state of version {envelope.get('version')!r}: this "
                f"version reads only version {_VERSION}"
            )
        expected = {"run_id": run_id, "agent": self.agent.name, "app_name": self.app_name}
        for key, value in expected.items():
            if envelope.get(key) != value:
                raise ValueError(
                    f"a HostedGoogleADK state of {key} {envelope.get(key)!r}, not {value!r}"
                )
        kept = envelope.get("session")
        if not isinstance(kept, str):
            raise ValueError("a HostedGoogleADK state with no session in it")
        try:
            session = Session.model_validate_json(kept)
        except pydantic.ValidationError as error:
            raise ValueError(
                f"a HostedGoogleADK state with no valid ADK session: {error}"
            ) from None
        named = (envelope.get("app_name"), envelope.get("user_id"), envelope.get("session_id"))
        if (session.app_name, session.user_id, session.id) != named:
            raise ValueError("a HostedGoogleADK state whose session is not the one it names")
        return session


async def _restore(service: BaseSessionService, saved: Session) -> Session:
    """`saved`, imported into the (empty) `service`: created with its id and state, then
    each of its events appended, in order."""
    session = await service.create_session(
        app_name=saved.app_name, user_id=saved.user_id, state=saved.state, session_id=saved.id
    )
    for event in saved.events:
        # Each event's state delta is applied again on top of the saved state: the last
        # delta of each key is its saved value, so the state comes out as it was saved.
        await service.append_event(session, event)
    return session


def _call_key(call: PendingCall) -> _CallKey:
    return (call.call_id, call.tool, call.arguments)


def _final_text(events: Sequence[Event]) -> str | None:
    """The text of the last final response of `events` (thoughts left out)."""
    for event in reversed(events):
        if event.author != "user" and event.is_final_response() and event.content:
            texts = [
                part.text or ""
                for part in event.content.parts or []
                if part.text and not part.thought
            ]
            if texts:
                return "".join(texts)
    return None
