"""LangChain / LangGraph: the pauses of `HumanInTheLoopMiddleware` reviewed in nodbot, and
the resume `Command` built from the reviewers' decisions.

`resolve_interruptions(graph, config, reviews, *, within, requested_by=None, tools=())`
reads the paused thread (`graph.aget_state(config)`), opens one review per paused tool call
through `reviews` (a `core.client.ApprovalClient`), keyed by the model's own tool call id with
the thread id as run id, waits (at most `within` seconds) until every one is decided, takes
each decision once, and returns the `langgraph.types.Command` that resumes the thread that
way. `resolve_and_resume` (same arguments) also runs the graph with it
(`graph.ainvoke(command, config)`) and returns what the graph returns. `tools`, the agent's
tools, give each review its tool's argument schema: without one the bot lets reviewers only
approve or deny a call of a tool it does not have, so pass them when edits are allowed.

```python
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langgraph.checkpoint.memory import InMemorySaver

from nodbot.core.bridges.langgraph import resolve_and_resume
from nodbot.core.client import ApprovalClient

agent = create_agent(
    model,
    tools=[send_email],
    middleware=[HumanInTheLoopMiddleware(interrupt_on={"send_email": True})],
    checkpointer=InMemorySaver(),
)
config = {"configurable": {"thread_id": "support-42"}}
await agent.ainvoke({"messages": [{"role": "user", "content": "Email Bob"}]}, config)
async with ApprovalClient("http://127.0.0.1:8080", token=os.environ["NODBOT_TOKEN"]) as nodbot:
    result = await resolve_and_resume(agent, config, nodbot, within=3600, tools=[send_email])
```

Both interrupt modes of the middleware are understood:

- `interrupt_mode="batched"` (the default): one interrupt lists every gated call of the
  model's turn (`action_requests`, `review_configs`). Each call's id is recovered from the
  last `AIMessage`'s `tool_calls`, matched in order by name and arguments. The resume is
  `Command(resume={"decisions": [...]})`, one decision per call in the middleware's order.
- `interrupt_mode="per_call"`: one interrupt per gated call, carrying its `tool_call_id`
  (checked against the last `AIMessage`). The resume is `Command(resume={interrupt_id:
  decision, ...})`; when `tools` are not given, the tool's argument schema is taken from
  the interrupt's `response_schema`.

How decisions become the middleware's: an approval is `{"type": "approve"}`; an edit is
`{"type": "edit", "edited_action": {"name": <the same tool>, "args": <the reviewed
arguments>}}`; a denial is `{"type": "reject", "message": <the reviewer's reason>}`; a
respond (the reviewer's answer in the tool's place) is the middleware's own `{"type":
"respond", "message": <the answer>}`: the tool does not run, and the model gets the answer
as the call's result (a `ToolMessage` with status `success`). A decision the tool's review
config does not allow is never sent: an edit of a tool that does not allow edits is sent as a
rejection naming the edited arguments (the tool does not run); an approval of a tool that
allows only edits is sent as an edit with the same arguments; a rejection of a tool that
allows `respond` but not `reject` is sent as a `respond` saying the call was not run; a
respond to a tool that does not allow it is sent as a rejection whose message gives the
answer (`bridges.common.RESPONDED`). Reviewers see the middleware's description of the call
and the decisions it allows (`interrupt_on={"tool": True}` allows all four).

Refusals:

- `StaleResume` when the thread moved on since it was read (its latest checkpoint or its
  pending interrupts are no longer those the reviews were opened for; checked again right
  before the command is returned), or when `config` names a checkpoint other than the
  thread's latest (a fork or time travel; refused before anyone is asked). Decisions taken
  before the thread was found moved on are spent, and nothing is resumed: calling again
  opens new reviews of whatever the thread is paused on then.
- `UnanswerableInterrupt` when the thread is not paused, when a pending interrupt is not the
  middleware's, or when a tool's review allows no way to refuse it (neither `reject` nor
  `respond`); nobody is asked then.
- A call without a tool call id (or one the last `AIMessage` does not hold) gets no review:
  it is rejected with `bridges.common.NO_CALL_ID`.

Limits: the graph is the agent itself (a top-level graph with a checkpointer, as
`create_agent` builds it), not a subgraph of another graph; the time between the command
being returned and the graph being invoked with it is not covered by the check (invoke at
once, or use `resolve_and_resume`); only the async graph API is used.

Hosted by the bot: `HostedLangGraph(build, *, tools=(), serde=None)` is a
`bridges.hosted.HostedAgent`, for agents the bot runs itself. `build` makes the agent around a
checkpointer it is given (`lambda checkpointer: create_agent(..., checkpointer=checkpointer)`);
each step runs on a fresh `InMemorySaver`, so the adapter keeps nothing between steps: the
thread (run id = thread id) goes into `HostedStep.state` as JSON (its checkpoints, their pending
writes and channel values, each as LangGraph's checkpoint serializer wrote it, in base64).
`start(text, run_id=...)` runs the agent on the user's text; when the middleware pauses it,
`pending` lists the paused calls as `resolve_interruptions` reads them (native call ids; the
argument schemas of `tools`, as above); once it finishes, `final_text` is the text of its
last `AIMessage`. `resume(state, resolutions, run_id=...)` rebuilds the thread from `state`,
checks that the resolutions are for the very calls it is paused on, and resumes it with the
`Command` built from them as above. Name an instance (or a zero-argument callable returning one) in
`nodbot.yml`:

```python
# shop/agents.py
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware

from nodbot.core.bridges.langgraph import HostedLangGraph

hosted = HostedLangGraph(
    lambda checkpointer: create_agent(
        model,
        tools=[send_email],
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"send_email": True})],
        checkpointer=checkpointer,
    ),
    tools=[send_email],
)
```

```yaml
framework_agents:
  support: "shop.agents:hosted"
```

Its refusals: `ValueError` when a state is not one of `HostedLangGraph` (not its JSON, another
format version, another run's thread, or bytes the serializer cannot read); `StaleResume` when
the resolutions are not, in order, for the calls the state is paused on (tool, call id,
arguments); `UnanswerableInterrupt` (a `ValueError`) as above, and when the state has finished.
The state holds the thread's whole lineage of checkpoints (the parent chain of the latest
one, which LangGraph's delta channels may need to rebuild the messages): it grows with the
conversation. `build` must make the same agent every time (same tools, same middleware); the
model must not rely on anything kept in memory between steps. The state is read with
LangGraph's `JsonPlusSerializer` unless `serde` is given (an `EncryptedSerializer`, or one
whose `allowed_msgpack_modules` is narrowed, for a state kept where others may write it).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.pregel.protocol import PregelProtocol
from langgraph.types import Command, Interrupt, StateSnapshot
from pydantic import BaseModel, ConfigDict, ValidationError

from nodbot.core.bridges.common import (
    PendingCall,
    Resolution,
    Reviews,
    StaleResume,
    resolve_calls,
)
from nodbot.core.bridges.hosted import HostedStep

__all__ = [
    "HostedLangGraph",
    "UnanswerableInterrupt",
    "resolve_and_resume",
    "resolve_interruptions",
]

Graph = PregelProtocol[Any, Any, Any, Any]
"""A compiled LangGraph graph, such as `create_agent` returns."""

ALL_DECISIONS = ("approve", "edit", "reject")
MAX_DESCRIPTION = 2_000
"""The longest description the bot keeps with a review."""


class UnanswerableInterrupt(ValueError):
    """The thread's pause is not one this bridge can answer: it is not paused, an interrupt is
    not `HumanInTheLoopMiddleware`'s, or a tool's review allows no refusal."""


@dataclass(frozen=True)
class _Action:
    """One paused call, where its decision goes, and which decisions it may take."""

    interrupt_id: str
    batched: bool
    call: PendingCall
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class _Paused:
    """What identifies the paused state the reviews are opened for."""

    checkpoint_id: str | None
    interrupts: list[tuple[str, Any]]
    tool_calls: list[dict[str, Any]]


async def resolve_interruptions(
    graph: Graph,
    config: RunnableConfig,
    reviews: Reviews,
    *,
    within: float,
    requested_by: str | None = None,
    tools: Sequence[BaseTool] = (),
) -> Command[Any]:
    """Review the calls the thread of `config` is paused on and return the `Command` that
    resumes it with the decisions (see the module). `tools` (the agent's) give the argument
    schemas that go with the reviews, so that reviewers may edit the calls. Raises `StaleResume`,
    `UnanswerableInterrupt`, and `core.client.DecisionTimeout` when some call is not decided
    within `within` seconds (nothing is taken then)."""
    thread_id = _thread_id(config)
    snapshot = await _latest(graph, config)
    paused = _paused(snapshot)
    actions = _actions(snapshot.interrupts, paused.tool_calls, _schemas(tools))
    resolutions = await resolve_calls(
        reviews,
        thread_id,
        [action.call for action in actions],
        within=within,
        requested_by=requested_by,
    )
    if _paused(await _latest(graph, config)) != paused:
        raise StaleResume(
            f"thread {thread_id!r} moved on while its calls were reviewed (its checkpoint or "
            "pending interrupts changed): it is not resumed with those decisions"
        )
    return _command(actions, resolutions)


async def resolve_and_resume(
    graph: Graph,
    config: RunnableConfig,
    reviews: Reviews,
    *,
    within: float,
    requested_by: str | None = None,
    tools: Sequence[BaseTool] = (),
) -> Any:
    """`resolve_interruptions`, then the graph run with the command; returns what
    `graph.ainvoke` returns."""
    command = await resolve_interruptions(
        graph, config, reviews, within=within, requested_by=requested_by, tools=tools
    )
    return await graph.ainvoke(command, config)


def _thread_id(config: RunnableConfig) -> str:
    thread_id = (config.get("configurable") or {}).get("thread_id")
    if not thread_id:
        raise UnanswerableInterrupt("the config names no thread (configurable.thread_id)")
    return str(thread_id)


async def _latest(graph: Graph, config: RunnableConfig) -> StateSnapshot:
    """The thread's latest state; `StaleResume` when `config` names an older checkpoint."""
    configurable = dict(config.get("configurable") or {})
    named = configurable.pop("checkpoint_id", None)
    snapshot = await graph.aget_state({**config, "configurable": configurable})
    latest = _checkpoint_id(snapshot)
    if named and named != latest:
        raise StaleResume(
            f"the config names checkpoint {named!r}, not the thread's latest ({latest!r}): "
            "a fork or an older state of the thread is not resumed"
        )
    return snapshot


def _checkpoint_id(snapshot: StateSnapshot) -> str | None:
    found = (snapshot.config.get("configurable") or {}).get("checkpoint_id")
    return str(found) if found else None


def _paused(snapshot: StateSnapshot) -> _Paused:
    return _Paused(
        checkpoint_id=_checkpoint_id(snapshot),
        interrupts=[(found.id, found.value) for found in snapshot.interrupts],
        tool_calls=_last_tool_calls(snapshot.values),
    )


def _last_tool_calls(values: Any) -> list[dict[str, Any]]:
    messages = values.get("messages") if isinstance(values, dict) else None
    for message in reversed(messages or []):
        if isinstance(message, AIMessage):
            return [dict(call) for call in message.tool_calls]
    return []


def _schemas(tools: Sequence[BaseTool]) -> dict[str, dict[str, Any]]:
    """Each tool's argument schema, as the model sees it."""
    return {tool.name: convert_to_openai_tool(tool)["function"]["parameters"] for tool in tools}


def _actions(
    interrupts: Sequence[Interrupt],
    tool_calls: list[dict[str, Any]],
    schemas: dict[str, dict[str, Any]],
) -> list[_Action]:
    if not interrupts:
        raise UnanswerableInterrupt("the thread is not paused: no interrupt is pending")
    actions: list[_Action] = []
    for found in interrupts:
        value = found.value
        if isinstance(value, dict) and isinstance(value.get("action_requests"), list):
            actions += _batched(found, value, tool_calls, schemas)
        elif isinstance(value, dict) and value.get("type") == "tool_approval":
            actions.append(_per_call(found, value, tool_calls, schemas))
        else:
            raise UnanswerableInterrupt(
                f"interrupt {found.id!r} is not one of HumanInTheLoopMiddleware's"
            )
    for action in actions:
        if "reject" not in action.allowed and "respond" not in action.allowed:
            raise UnanswerableInterrupt(
                f"the review of {action.call.tool!r} allows {list(action.allowed)}: "
                "a denial could not be sent"
            )
    return _unique_ids(actions)


def _batched(
    found: Interrupt,
    value: dict[str, Any],
    tool_calls: list[dict[str, Any]],
    schemas: dict[str, dict[str, Any]],
) -> list[_Action]:
    configs = value.get("review_configs") or []
    actions = []
    start = 0
    for index, request in enumerate(value["action_requests"]):
        name, args = str(request.get("name")), dict(request.get("args") or {})
        # The middleware lists the gated calls in the order of the message's tool calls.
        at = next(
            (
                i
                for i in range(start, len(tool_calls))
                if tool_calls[i].get("name") == name and tool_calls[i].get("args") == args
            ),
            None,
        )
        call_id = None
        if at is not None:
            start = at + 1
            call_id = tool_calls[at].get("id")
        config = configs[index] if index < len(configs) else {}
        allowed = tuple(config.get("allowed_decisions") or ALL_DECISIONS)
        call = _pending(name, args, call_id, request.get("description"), allowed, schemas.get(name))
        actions.append(_Action(found.id, True, call, allowed))
    return actions


def _per_call(
    found: Interrupt,
    value: dict[str, Any],
    tool_calls: list[dict[str, Any]],
    schemas: dict[str, dict[str, Any]],
) -> _Action:
    name, args = str(value.get("name")), dict(value.get("args") or {})
    claimed = value.get("tool_call_id")
    held = any(
        call.get("id") == claimed and call.get("name") == name and call.get("args") == args
        for call in tool_calls
    )
    allowed, schema = _from_response_schema(found.response_schema, name)
    schema = schemas.get(name, schema)
    call = _pending(
        name, args, claimed if held else None, value.get("description"), allowed, schema
    )
    return _Action(found.id, False, call, allowed)


def _from_response_schema(schema: Any, tool: str) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """The decisions a per-call interrupt allows, and the tool's argument schema if edits are
    among them."""
    if not isinstance(schema, dict):
        return ALL_DECISIONS, None
    mapping = (schema.get("discriminator") or {}).get("mapping")
    if isinstance(mapping, dict):
        allowed = tuple(str(kind) for kind in mapping)
    else:
        only = ((schema.get("properties") or {}).get("type") or {}).get("const")
        allowed = (str(only),) if only else ALL_DECISIONS
    arguments = (schema.get("$defs") or {}).get(tool)
    if "edit" in allowed and isinstance(arguments, dict) and arguments.get("type") == "object":
        return allowed, arguments
    return allowed, None


def _pending(
    tool: str,
    arguments: dict[str, Any],
    call_id: Any,
    description: Any,
    allowed: tuple[str, ...],
    schema: dict[str, Any] | None,
) -> PendingCall:
    told = f"{description}\n\n" if description else ""
    told += f"Allowed decisions: {', '.join(allowed)}"
    return PendingCall(
        tool=tool,
        arguments=arguments,
        call_id=str(call_id) if call_id else None,
        schema=schema,
        description=told[:MAX_DESCRIPTION],
    )


def _unique_ids(actions: list[_Action]) -> list[_Action]:
    """A call id given to two calls binds neither: both are denied by the bridge."""
    ids = [action.call.call_id for action in actions if action.call.call_id]
    twice = {call_id for call_id in ids if ids.count(call_id) > 1}
    return [
        replace(action, call=replace(action.call, call_id=None))
        if action.call.call_id in twice
        else action
        for action in actions
    ]


def _command(actions: list[_Action], resolutions: list[Resolution]) -> Command[Any]:
    batches: dict[str, list[dict[str, Any]]] = {}
    answers: dict[str, Any] = {}
    for action, resolution in zip(actions, resolutions, strict=True):
        decision = _decision(action, resolution)
        if action.batched:
            batches.setdefault(action.interrupt_id, []).append(decision)
        else:
            answers[action.interrupt_id] = decision
    if len(batches) == 1 and not answers:
        [decisions] = batches.values()
        return Command(resume={"decisions": decisions})
    for interrupt_id, decisions in batches.items():
        answers[interrupt_id] = {"decisions": decisions}
    return Command(resume=answers)


def _decision(action: _Action, resolution: Resolution) -> dict[str, Any]:
    """The middleware's decision for one call, only of a type its review allows."""
    allowed, tool = action.allowed, action.call.tool
    if resolution.response is not None:
        if "respond" in allowed:
            return {"type": "respond", "message": resolution.response}
        return _refusal(allowed, resolution.responded())
    if resolution.approved:
        if not resolution.edited and "approve" in allowed:
            return {"type": "approve"}
        if "edit" in allowed:
            return {"type": "edit", "edited_action": {"name": tool, "args": resolution.arguments}}
        if resolution.edited:
            edited = json.dumps(resolution.arguments, ensure_ascii=False, default=str)
            return _refusal(
                allowed,
                f"a reviewer approved this call only with other arguments ({edited}), and "
                f"edits of {tool} are not allowed here: it was not run",
            )
        return _refusal(allowed, f"the review of {tool} allows no approval: it was not run")
    return _refusal(allowed, resolution.message)


def _refusal(allowed: tuple[str, ...], message: str | None) -> dict[str, Any]:
    if "reject" in allowed:
        return {"type": "reject", "message": message} if message else {"type": "reject"}
    # Checked when the pause was read: a tool that allows no rejection allows `respond`.
    return {"type": "respond", "message": f"The call was not run: {message or 'denied'}"}


# --- Hosted by the bot -------------------------------------------------------------------

GraphFactory = Callable[[InMemorySaver], Graph]
"""Makes the agent around the checkpointer it is given (see the module)."""

STATE_FORMAT = "nodbot.langgraph.hosted"
STATE_VERSION = 1
ROOT = ""
"""The checkpoint namespace of the top-level graph."""

Typed = tuple[str, str]
"""A value as the checkpoint serializer wrote it: its type, and its bytes in base64."""


class _SavedCheckpoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ns: str
    id: str
    parent: str | None
    checkpoint: Typed
    metadata: Typed


class _SavedWrite(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    value: Typed
    task_path: str


class _SavedBlob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ns: str
    channel: str
    version: str | int | float
    value: Typed


class _SavedThread(BaseModel):
    """A hosted thread, as `HostedStep.state` holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["nodbot.langgraph.hosted"]
    version: Literal[1]
    thread_id: str
    checkpoint_id: str
    """The thread's latest checkpoint (where it paused, or finished)."""
    checkpoints: list[_SavedCheckpoint]
    writes: list[_SavedWrite]
    blobs: list[_SavedBlob]


class HostedLangGraph:
    """A `create_agent` agent (paused by `HumanInTheLoopMiddleware`) run by the bot: a
    `bridges.hosted.HostedAgent` whose state is the whole thread (see the module)."""

    def __init__(
        self,
        build: GraphFactory,
        *,
        tools: Sequence[BaseTool] = (),
        serde: SerializerProtocol | None = None,
    ) -> None:
        """`build` makes the agent around the checkpointer it is given, the same agent every
        time; `tools` (the agent's) give the reviews their argument schemas; `serde` reads
        and writes the checkpoints (LangGraph's `JsonPlusSerializer` when None)."""
        self._build = build
        self._schemas = _schemas(tools)
        self._serde = serde

    async def start(self, text: str, *, run_id: str) -> HostedStep:
        """Run the agent on `text` in thread `run_id` until it finishes or pauses. Raises
        `UnanswerableInterrupt` when it pauses on something other than the middleware."""
        saver = InMemorySaver(serde=self._serde)
        graph = self._build(saver)
        await graph.ainvoke({"messages": [{"role": "user", "content": text}]}, _config(run_id))
        return await self._step(graph, saver, run_id)

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep:
        """Resume thread `run_id` from `state` with one resolution per pending call, in their
        order. Raises `ValueError` when `state` is not this adapter's (of this run),
        `StaleResume` when the resolutions are not for the calls it is paused on, and
        `UnanswerableInterrupt` when it is not paused."""
        saved = _load(state, run_id)
        saver = InMemorySaver(serde=self._serde)
        _seed(saver, saved)
        graph = self._build(saver)
        snapshot = await graph.aget_state(_config(run_id))
        if _checkpoint_id(snapshot) != saved.checkpoint_id:
            raise ValueError(
                f"the state of run {run_id!r} does not end at its checkpoint "
                f"{saved.checkpoint_id!r}: it is not resumed"
            )
        actions = _actions(snapshot.interrupts, _last_tool_calls(snapshot.values), self._schemas)
        _check_resolutions(run_id, actions, resolutions)
        await graph.ainvoke(_command(actions, list(resolutions)), _config(run_id))
        return await self._step(graph, saver, run_id)

    async def _step(self, graph: Graph, saver: InMemorySaver, run_id: str) -> HostedStep:
        snapshot = await graph.aget_state(_config(run_id))
        state = _dump(saver, run_id, _checkpoint_id(snapshot))
        if snapshot.interrupts:
            actions = _actions(
                snapshot.interrupts, _last_tool_calls(snapshot.values), self._schemas
            )
            return HostedStep(state=state, pending=tuple(action.call for action in actions))
        if snapshot.next:
            raise UnanswerableInterrupt(
                f"thread {run_id!r} stopped before {list(snapshot.next)} with no interrupt"
            )
        return HostedStep(state=state, final_text=_final_text(snapshot.values))


def _config(run_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": run_id}}


def _final_text(values: Any) -> str | None:
    messages = values.get("messages") if isinstance(values, dict) else None
    for message in reversed(messages or []):
        if isinstance(message, AIMessage):
            return message.text
    return None


def _check_resolutions(
    run_id: str, actions: Sequence[_Action], resolutions: Sequence[Resolution]
) -> None:
    """The resolutions answer, in order, the very calls the thread is paused on."""
    paused = [(a.call.tool, a.call.call_id, a.call.arguments) for a in actions]
    given = [(r.call.tool, r.call.call_id, r.call.arguments) for r in resolutions]
    if given != paused:
        raise StaleResume(
            f"the resolutions given for run {run_id!r} are not for the calls its state is "
            f"paused on ({[(tool, call_id) for tool, call_id, _ in paused]}): it is not resumed"
        )


def _typed(value: tuple[str, bytes]) -> Typed:
    return value[0], base64.b64encode(value[1]).decode("ascii")


def _untyped(value: Typed) -> tuple[str, bytes]:
    return value[0], base64.b64decode(value[1], validate=True)


def _lineage(stored: dict[str, tuple[Any, Any, str | None]]) -> list[str]:
    """The latest checkpoint of a namespace and its ancestors."""
    chain: list[str] = []
    at: str | None = max(stored, default=None)
    while at is not None and at in stored and at not in chain:
        chain.append(at)
        at = stored[at][2]
    return chain


def _dump(saver: InMemorySaver, thread_id: str, checkpoint_id: str | None) -> str:
    """The thread's latest lineage (of the top-level graph; subgraphs' whole), as JSON."""
    if checkpoint_id is None:
        raise UnanswerableInterrupt(f"thread {thread_id!r} saved no checkpoint")
    checkpoints: list[_SavedCheckpoint] = []
    for ns, stored in saver.storage.get(thread_id, {}).items():
        for cid in _lineage(stored) if ns == ROOT else sorted(stored):
            checkpoint, metadata, parent = stored[cid]
            checkpoints.append(
                _SavedCheckpoint(
                    ns=ns,
                    id=cid,
                    parent=parent,
                    checkpoint=_typed(checkpoint),
                    metadata=_typed(metadata),
                )
            )
    kept = {(c.ns, c.id) for c in checkpoints}
    writes = [
        _SavedWrite(
            ns=ns,
            checkpoint_id=cid,
            task_id=task_id,
            idx=idx,
            channel=channel,
            value=_typed(value),
            task_path=task_path,
        )
        for (thread, ns, cid), stored_writes in saver.writes.items()
        if thread == thread_id and (ns, cid) in kept
        for (_, idx), (task_id, channel, value, task_path) in stored_writes.items()
    ]
    versions = {
        (c.ns, channel, version)
        for c in checkpoints
        for channel, version in saver.serde.loads_typed(_untyped(c.checkpoint))[
            "channel_versions"
        ].items()
    }
    blobs = [
        _SavedBlob(ns=ns, channel=channel, version=version, value=_typed(value))
        for (thread, ns, channel, version), value in saver.blobs.items()
        if thread == thread_id and (ns, channel, version) in versions
    ]
    saved = _SavedThread(
        format=STATE_FORMAT,
        version=STATE_VERSION,
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
        checkpoints=checkpoints,
        writes=writes,
        blobs=blobs,
    )
    return saved.model_dump_json()


def _load(state: str, run_id: str) -> _SavedThread:
    """The thread `state` holds; `ValueError` when it is not a `HostedLangGraph` state of
    run `run_id`."""
    try:
        data = json.loads(state)
    except (json.JSONDecodeError, TypeError) as error:
        raise ValueError(f"not a HostedLangGraph state: not JSON ({error})") from error
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise ValueError(f"not a HostedLangGraph state: its format is not {STATE_FORMAT!r}")
    if data.get("version") != STATE_VERSION:
        raise ValueError(
            f"a HostedLangGraph state of version {data.get('version')!r}: this version of "
            f"the bridge reads version {STATE_VERSION} only"
        )
    try:
        saved = _SavedThread.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"a malformed HostedLangGraph state: {error}") from error
    if saved.thread_id != run_id:
        raise ValueError(
            f"the state is of run {saved.thread_id!r}, not of run {run_id!r}: it is not resumed"
        )
    return saved


def _seed(saver: InMemorySaver, saved: _SavedThread) -> None:
    """Put the saved thread into an empty `saver`, and read it back once (so that a state
    the serializer cannot read is refused here, with `ValueError`)."""
    thread = saved.thread_id
    try:
        for c in saved.checkpoints:
            saver.storage[thread][c.ns][c.id] = (
                _untyped(c.checkpoint),
                _untyped(c.metadata),
                c.parent,
            )
        for w in saved.writes:
            saver.writes[(thread, w.ns, w.checkpoint_id)][(w.task_id, w.idx)] = (
                w.task_id,
                w.channel,
                _untyped(w.value),
                w.task_path,
            )
        for b in saved.blobs:
            saver.blobs[(thread, b.ns, b.channel, b.version)] = _untyped(b.value)
        readable = list(saver.list({"configurable": {"thread_id": thread}}))
    except binascii.Error as error:
        raise ValueError(f"a malformed HostedLangGraph state: {error}") from error
    except Exception as error:  # the serializer's errors are of many kinds
        raise ValueError(f"a HostedLangGraph state its serializer cannot read: {error}") from error
    if not any(
        found.config["configurable"]["checkpoint_id"] == saved.checkpoint_id
        for found in readable
        if found.config["configurable"]["checkpoint_ns"] == ROOT
    ):
        raise ValueError(f"a HostedLangGraph state without its checkpoint {saved.checkpoint_id!r}")
