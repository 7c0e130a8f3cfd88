"""OpenAI Agents SDK bridge: a run's pending tool approvals, decided by people through nodbot.

An agent whose tools are declared with `function_tool(needs_approval=True)` stops before it
calls them: `Runner.run` returns a `RunResult` whose `interruptions` list the calls awaiting
approval (`ToolApprovalItem`s). `resolve_interruptions` puts each of them to the bot (one
review per call, keyed by the SDK's native `call_id`), waits until all are decided, takes each
decision once, records it on the run's `RunState` and returns that state, to resume the run
with `Runner.run(agent, state)`:

| reviewer | recorded on the state                                  | then                        |
|----------|--------------------------------------------------------|-----------------------------|
| approve  | `state.approve(item)`                                  | the tool runs, once         |
| edit     | `state.reject(item, rejection_message=<edited call>)`  | the model is told the call  |
|          |                                                        | to make instead (see below) |
| deny     | `state.reject(item, rejection_message=<the reason>)`   | the model sees the reason   |
| respond  | `state.reject(item, rejection_message=<the answer>)`   | the model reads the answer  |
|          |                                                        | as the call's output        |

```python
from agents import Agent, Runner, function_tool
from nodbot.core.bridges.openai_agents import resolve_interruptions
from nodbot.core.client import ApprovalClient

@function_tool(needs_approval=True)
def refund(order_id: str, amount: float) -> str:
    ...

agent = Agent(name="support", tools=[refund])

async with ApprovalClient(url, token=token) as nodbot:
    result = await Runner.run(agent, "refund order o-7")
    while result.interruptions:
        state = await resolve_interruptions(result, nodbot, run_id="support-42", within=3600)
        result = await Runner.run(agent, state)
```

`result_or_state` is a `RunResult` (or `RunResultStreaming`), whose `to_state()` is taken once,
or a `RunState` (for instance one restored with `RunState.from_string`), which is decided in
place and returned. A state with no pending approvals is returned as it is.

Limits:
- The SDK cannot change a paused call's arguments. An edit is therefore sent back to the model
  as a denial naming the edited call (the tool and the edited arguments as JSON, with the
  reviewer's note); if the model then makes that call, it is a new call and a new review.
  Reviewers are told so in the review's description.
- A denial's reason reaches the model as the call's output (`rejection_message`).
- The SDK has no decision that answers in a tool's place: a respond (the reviewer's answer
  instead of the tool) is recorded as a rejection whose message is the answer, which the SDK
  sends, word for word, as the call's output. The tool does not run; the SDK's own records
  (and its tracing) call the call rejected.
- A call without a native `call_id` is denied by the bridge, with no review. The SDK records
  no decision for such a call and runs none either (it requires a call id to execute a tool),
  so a resumed run stops at it again. The SDK makes no such calls itself: they come only from
  states built or edited by hand.
- A call whose arguments are not a JSON object (or that has none to show, as some hosted
  and shell tool calls) is denied by the bridge, with no review.
- Right before it records the decisions, the bridge checks that the state's pending approvals
  are still exactly the reviewed ones (same call ids, tools and arguments); if the state was
  resumed or changed meanwhile it raises `StaleResume` and records nothing (the decisions are
  spent then, and asking about those calls again opens new reviews).
- Only per-call decisions are the bridge's: do not use `always_approve` / `always_reject` on
  a state you resolve this way, since such a decision is not a reviewer's.
- A decision answers one call once: resolving the same result again opens new reviews.
- Reviewers get a typed edit form for the agent's own `FunctionTool`s; other tools (MCP, hosted)
  are reviewed without a schema.

## Run by the bot: `HostedOpenAIAgent`

The bot can run an SDK agent itself (`bridges.hosted`): name an instance of
`HostedOpenAIAgent` (or a zero-argument callable returning one) under `framework_agents:` in
`nodbot.yml`, and `POST /runs` starts it; its calls are reviewed by the rules, and the bot
resumes it once every call is decided.

```python
# shop/agents.py
from agents import Agent
from nodbot.core.bridges.openai_agents import HostedOpenAIAgent

hosted = HostedOpenAIAgent(Agent(name="support", tools=[refund]))
# HostedOpenAIAgent(agent, run_config=None, max_turns=None): both passed to each Runner.run
```

```yaml
# nodbot.yml
framework_agents:
  support: "shop.agents:hosted"
```

- `start(text, run_id=...)` runs `Runner.run(agent, text)` and returns a `HostedStep`: the
  paused run's `RunState` (`RunState.to_json()`, in an envelope naming the adapter, its
  version, the run id and the agent) as `state`, one `PendingCall` per call awaiting approval
  (the SDK's native `call_id`, the tool, its arguments, and the `FunctionTool`'s JSON schema),
  or `final_text` (the run's `final_output`, as text) once it finished.
- `resume(state, resolutions, run_id=...)` restores the `RunState` with
  `RunState.from_json(agent, ...)`, records each resolution as `resolve_interruptions` does
  (approve; an edit as a denial naming the edited call; a denial with its reason; a
  respond as a denial whose message is the answer), and runs
  `Runner.run(agent, state)` again, returning the next `HostedStep`.

Nothing stays in memory between steps: `resume` may run in another process, with another
instance built the same way (the same agent name, tools and handoffs). Limits, besides the
ones above:
- Runs use `RunConfig(tracing_disabled=True)` unless you pass your own `run_config` (traces
  would otherwise be exported to OpenAI), and have no context object (`context=None`).
- `resume` raises `ValueError` for a state that is not this adapter's (not JSON, another
  adapter's or version's, another run's or agent's, or one the SDK cannot restore), and
  `StaleResume` when the resolutions do not answer exactly the state's pending calls (same
  call ids, tools and arguments, in order), for instance the previous step's decisions given
  with this step's state, or when the state has finished; it runs nothing then.
- The state is plain text, so the adapter cannot tell whether a state was resumed already:
  resuming the same state twice would run its approved calls twice. The bot resumes each step
  at most once and takes each decision once; if you call `resume` yourself, do the same.
- A pending call whose arguments are not a JSON object is not put to the bot: it is denied,
  and when a turn has only such calls the run goes on at once.
- Structured outputs (`output_type`) are given as `str(final_output)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    Runner,
    RunResult,
    RunResultStreaming,
    RunState,
    ToolApprovalItem,
)
from agents.exceptions import AgentsException, ModelBehaviorError

from nodbot.core.bridges.common import PendingCall, Resolution, Reviews, StaleResume, resolve_calls
from nodbot.core.bridges.hosted import HostedStep

__all__ = ["EDIT_NOTICE", "HostedOpenAIAgent", "resolve_interruptions"]

EDIT_NOTICE = "edits are sent back to the agent as a denial naming the edited call"
"""The description of every review: the SDK cannot run a paused call with other arguments."""

_EDITED = (
    "The reviewer did not approve this call as made, so it did not run: they edited it. "
    "To go ahead, call `{tool}` with these arguments: {arguments}"
)
_DENIED = "The reviewer denied this call, so it did not run."
_NOT_AN_OBJECT = "the call's arguments are not a JSON object: denied by the bridge"

_Identity = tuple[str | None, str | None, str | None, str | None]


async def resolve_interruptions(
    result_or_state: RunResult | RunResultStreaming | RunState[Any],
    reviews: Reviews,
    *,
    run_id: str,
    within: float,
    requested_by: str | None = None,
) -> RunState[Any]:
    """Review every pending tool approval of `result_or_state` through `reviews` (as run
    `run_id`, waiting at most `within` seconds in all), record each decision on the run's state
    and return that state, to resume with `Runner.run(agent, state)`.

    Raises `StaleResume` when the state's pending approvals changed while they were reviewed
    (nothing is recorded then), and `core.client.DecisionTimeout` when some are not decided
    in time (none is taken then: asking again later finds the same reviews)."""
    state = result_or_state if isinstance(result_or_state, RunState) else result_or_state.to_state()
    items = state.get_interruptions()
    if not items:
        return state
    reviewed = [_identity(item) for item in items]
    calls = [_pending_call(item) for item in items]
    asked = [call for call in calls if call is not None]
    resolutions = iter(
        await resolve_calls(reviews, run_id, asked, within=within, requested_by=requested_by)
    )
    current = state.get_interruptions()
    if [_identity(item) for item in current] != reviewed:
        raise StaleResume(
            f"run {run_id!r}: the run's pending tool approvals changed while they were "
            "reviewed (it was resumed or altered meanwhile); its decisions are not recorded"
        )
    # No await from the check to the end: nothing can change the state in between.
    for item, call in zip(current, calls, strict=True):
        if call is None:
            _reject(state, item, _NOT_AN_OBJECT)
        else:
            _record(state, item, next(resolutions))
    return state


def _record(state: RunState[Any], item: ToolApprovalItem, resolution: Resolution) -> None:
    call = resolution.call
    if resolution.response is not None:
        # The SDK sends a rejection's message, word for word, as the call's output.
        _reject(state, item, resolution.response)
    elif not resolution.approved:
        _reject(state, item, resolution.message or _DENIED)
    elif resolution.arguments != call.arguments:
        edited = _EDITED.format(tool=call.tool, arguments=json.dumps(resolution.arguments))
        note = f" (the reviewer's note: {resolution.message})" if resolution.message else ""
        _reject(state, item, edited + note)
    else:
        state.approve(item)


def _reject(state: RunState[Any], item: ToolApprovalItem, message: str) -> None:
    try:
        state.reject(item, rejection_message=message)
    except ModelBehaviorError:
        if _call_id(item) is not None:
            raise
        # The SDK records no decision for a call without a call id, and never runs one.


def _pending_call(item: ToolApprovalItem) -> PendingCall | None:
    """The call as reviewers see it; None when its arguments are not a JSON object."""
    text = item.arguments
    if text is None:
        return None  # a call that carries no arguments the reviewer could be shown
    try:
        arguments = json.loads(text) if text.strip() else {}
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    return PendingCall(
        tool=item.tool_name or "",
        arguments=arguments,
        call_id=_call_id(item),
        schema=_schema(item),
        description=EDIT_NOTICE,
    )


def _call_id(item: ToolApprovalItem) -> str | None:
    """The raw call's own `call_id` (not the item id the SDK falls back to)."""
    raw = item.raw_item
    value = raw.get("call_id") if isinstance(raw, Mapping) else getattr(raw, "call_id", None)
    return value if isinstance(value, str) and value else None


def _schema(item: ToolApprovalItem) -> dict[str, Any] | None:
    for tool in item.agent.tools:
        if isinstance(tool, FunctionTool) and tool.name == item.tool_name:
            return dict(tool.params_json_schema)
    return None


def _identity(item: ToolApprovalItem) -> _Identity:
    return (_call_id(item), item.tool_name, item.tool_namespace, item.arguments)


_KIND = "nodbot.bridges.openai_agents.HostedOpenAIAgent"
_VERSION = 1


class HostedOpenAIAgent:
    """An SDK agent the bot runs itself (`bridges.hosted.HostedAgent`; see the module)."""

    def __init__(
        self,
        agent: Agent[Any],
        *,
        run_config: RunConfig | None = None,
        max_turns: int | None = None,
    ) -> None:
        self.agent = agent
        """The agent every run starts with (and the one states are restored against)."""
        self.run_config = run_config or RunConfig(tracing_disabled=True)
        """How each run is configured; tracing is off unless you pass your own."""
        self.max_turns = max_turns
        """The SDK's turn limit for each step; None for the SDK's default."""

    async def start(self, text: str, *, run_id: str) -> HostedStep:
        """Run the agent on `text` until it finishes or pauses for approvals."""
        return await self._advance(await self._run(text), run_id)

    async def resume(
        self, state: str, resolutions: Sequence[Resolution], *, run_id: str
    ) -> HostedStep:
        """Record `resolutions` (one per pending call of `state`, in order) on the restored run
        and run it on until it finishes or pauses again.

        Raises `ValueError` when `state` is not this adapter's state of run `run_id`, and
        `StaleResume` when `resolutions` do not answer exactly its pending calls (nothing is
        recorded or run then)."""
        restored = await self._restore(state, run_id)
        items = restored.get_interruptions()
        calls = [_pending_call(item) for item in items]
        if not items:
            raise StaleResume(f"run {run_id!r}: the state has finished; nothing is resumed")
        answered = [call for call in calls if call is not None]
        if [_key(call) for call in answered] != [_key(r.call) for r in resolutions]:
            raise StaleResume(
                f"run {run_id!r}: the decisions do not answer the state's pending calls "
                "(they belong to another step, or to other calls); nothing is resumed"
            )
        decided = iter(resolutions)
        for item, call in zip(items, calls, strict=True):
            if call is None:
                _reject(restored, item, _NOT_AN_OBJECT)
            else:
                _record(restored, item, next(decided))
        return await self._advance(await self._run(restored), run_id)

    async def _run(self, source: str | RunState[Any]) -> RunResult:
        if self.max_turns is None:
            return await Runner.run(self.agent, source, run_config=self.run_config)
        return await Runner.run(
            self.agent, source, run_config=self.run_config, max_turns=self.max_turns
        )

    async def _advance(self, result: RunResult, run_id: str) -> HostedStep:
        state = result.to_state()
        items = state.get_interruptions()
        calls = [_pending_call(item) for item in items]
        while items and all(call is None for call in calls):
            # Nothing to put to the bot: deny them all and go on, as `resume` would.
            for item in items:
                _reject(state, item, _NOT_AN_OBJECT)
            result = await self._run(state)
            state = result.to_state()
            items = state.get_interruptions()
            calls = [_pending_call(item) for item in items]
        pending = tuple(call for call in calls if call is not None)
        final = None if items else _text(result.final_output)
        return HostedStep(state=self._dump(state, run_id), pending=pending, final_text=final)

    def _dump(self, state: RunState[Any], run_id: str) -> str:
        envelope = {
            "kind": _KIND,
            "version": _VERSION,
            "run_id": run_id,
            "agent": self.agent.name,
            "run_state": state.to_json(),
        }
        return json.dumps(envelope)

    async def _restore(self, text: str, run_id: str) -> RunState[Any]:
        try:
            envelope = json.loads(text)
        except ValueError:
            raise ValueError("not a HostedOpenAIAgent state: it is not JSON") from None
        if not isinstance(envelope, dict) or envelope.get("kind") != _KIND:
            raise ValueError("not a HostedOpenAIAgent state: it names no such adapter")
        if envelope.get("version") != _VERSION:
            raise ValueError(
                f"a HostedOpenAIAgent state of version {envelope.get('version')!r}: this "
                f"version reads only version {_VERSION}"
            )
        if envelope.get("run_id") != run_id:
            raise ValueError(
                f"a HostedOpenAIAgent state of run {envelope.get('run_id')!r}, not {run_id!r}"
            )
        if envelope.get("agent") != self.agent.name:
            raise ValueError(
                f"a HostedOpenAIAgent state of agent {envelope.get('agent')!r}, not "
                f"{self.agent.name!r}"
            )
        run_state = envelope.get("run_state")
        if not isinstance(run_state, dict):
            raise ValueError("a HostedOpenAIAgent state with no run state in it")
        try:
            return await RunState.from_json(self.agent, run_state)
        except (AgentsException, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"a HostedOpenAIAgent state the SDK cannot restore: {error}") from None


def _key(call: PendingCall) -> tuple[str | None, str, dict[str, Any]]:
    return (call.call_id, call.tool, call.arguments)


def _text(output: Any) -> str | None:
    if output is None or isinstance(output, str):
        return output
    return str(output)
