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
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.adk.events.event import Event
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

__all__ = [
    "REQUEST_CONFIRMATION",
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
