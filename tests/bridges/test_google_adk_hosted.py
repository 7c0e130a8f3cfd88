"""`HostedGoogleADK`, as the bot drives it, without the bot: an ADK agent on a scripted model
(a `BaseLlm` answering from a list: no network) pauses on tools needing confirmation, the
decisions are built by hand as `Resolution`s, and every `resume` is made by a NEW adapter (on
a NEW agent) from the state as plain text, so nothing can stay in memory between steps."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from nodbot.core.bridges.common import NO_CALL_ID, PendingCall, Resolution, StaleResume
from nodbot.core.bridges.google_adk import NO_EDITS, HostedGoogleADK
from nodbot.core.bridges.hosted import HostedAgent, HostedStep
from tests.bridges.test_google_adk import REFUND_SCHEMA, ScriptedModel, text

RUN = "support-42"
REVIEWER = "lead@example.com"
HINT = (
    "Please approve or reject the tool call refund() by responding with a FunctionResponse "
    "with an expected ToolConfirmation payload."
)


def refund_call(call_id: str, order_id: str = "o-7", amount: float = 500) -> types.Part:
    args = {"order_id": order_id, "amount": amount}
    return types.Part(function_call=types.FunctionCall(name="refund", args=args, id=call_id))


def turn(*parts: types.Part) -> types.Content:
    return types.Content(role="model", parts=list(parts))


@dataclass
class Shop:
    """One scripted model, and every real run of `refund`, shared by the adapters built."""

    replies: list[types.Content]
    refunds: list[tuple[str, float]] = field(default_factory=list)
    model: ScriptedModel = field(init=False)

    def __post_init__(self) -> None:
        self.model = ScriptedModel(replies=list(self.replies))

    def hosted(self, tool: str = "plain", **options: Any) -> HostedGoogleADK:
        """A new adapter on a new agent, as a restarted process would build them."""
        tools = {
            "plain": lambda: FunctionTool(self._refund(), require_confirmation=True),
            "payload": lambda: FunctionTool(self._payload_refund(), require_confirmation=True),
            "itself": lambda: FunctionTool(self._confirming_refund()),
        }
        agent = LlmAgent(name="support", model=self.model, tools=[tools[tool]()])
        return HostedGoogleADK(agent, schemas={"refund": REFUND_SCHEMA}, **options)

    def _refund(self) -> Callable[[str, float], str]:
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.refunds.append((order_id, amount))
            return f"refunded {amount} on {order_id}"

        return refund

    def _payload_refund(self) -> Callable[[str, float, ToolContext], str]:
        run = self._refund()

        def refund(order_id: str, amount: float, tool_context: ToolContext) -> str:
            """Refund an order, with the arguments its confirmation carries."""
            confirmation = tool_context.tool_confirmation
            if confirmation is not None and isinstance(confirmation.payload, dict):
                return run(confirmation.payload["order_id"], confirmation.payload["amount"])
            return run(order_id, amount)

        return refund

    def _confirming_refund(self) -> Callable[[str, float, ToolContext], dict[str, Any]]:
        run = self._refund()

        def refund(order_id: str, amount: float, tool_context: ToolContext) -> dict[str, Any]:
            """Refund an order, once confirmed (the tool asks for it itself)."""
            confirmation = tool_context.tool_confirmation
            if confirmation is None:
                tool_context.request_confirmation(hint=f"refund {amount} on {order_id}?")
                return {"status": "awaiting confirmation"}
            if not confirmation.confirmed:
                payload = confirmation.payload if isinstance(confirmation.payload, dict) else {}
                return {"error": payload.get("message", "denied")}
            return {"result": run(order_id, amount)}

        return refund

    def told(self) -> list[dict[str, Any]]:
        """What the model was told of the tool calls, on its last turn."""
        last = self.model.requests[-1].contents[-1]
        return [
            dict(part.function_response.response or {})
            for part in last.parts or []
            if part.function_response is not None
        ]


def stored(step: HostedStep) -> str:
    """The state as the bot's store gives it back: plain text, parsed and written anew."""
    assert isinstance(step.state, str)
    return json.dumps(json.loads(step.state))


def approve(call: PendingCall) -> Resolution:
    return Resolution(call, True, call.arguments, False, None, REVIEWER, None)


def deny(call: PendingCall, reason: str) -> Resolution:
    return Resolution(call, False, call.arguments, False, reason, REVIEWER, None)


def edit(call: PendingCall, **changes: Any) -> Resolution:
    return Resolution(call, True, {**call.arguments, **changes}, True, None, REVIEWER, None)


async def test_start_pauses_with_the_native_calls_and_runs_nothing() -> None:
    shop = Shop([turn(refund_call("call_1"))])
    hosted = shop.hosted()
    step = await hosted.start("refund order o-7", run_id=RUN)

    assert isinstance(hosted, HostedAgent)
    assert step.pending == (
        PendingCall(
            tool="refund",
            arguments={"order_id": "o-7", "amount": 500},
            call_id="call_1",
            schema=REFUND_SCHEMA,
            description=f"{HINT}\n\n{NO_EDITS}",
        ),
    )
    assert step.final_text is None
    kept = json.loads(step.state)
    assert (kept["app_name"], kept["user_id"], kept["run_id"]) == ("support", "nodbot", RUN)
    assert json.loads(kept["session"])["id"] == kept["session_id"]
    assert shop.refunds == []


async def test_an_approved_call_runs_once_and_the_run_finishes() -> None:
    shop = Shop([turn(refund_call("call_1")), text("refunded")])
    paused = await shop.hosted().start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    done = await shop.hosted().resume(stored(paused), [approve(call)], run_id=RUN)
    with pytest.raises(StaleResume, match="the state has finished"):
        await shop.hosted().resume(stored(done), [], run_id=RUN)

    assert shop.refunds == [("o-7", 500)]
    assert done.pending == () and done.final_text == "refunded"
    assert shop.told() == [{"result": "refunded 500 on o-7"}]
    assert len(shop.model.requests) == 2


async def test_a_denied_call_never_runs() -> None:
    shop = Shop([turn(refund_call("call_1")), text("not refunded")])
    paused = await shop.hosted().start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    no = deny(call, "refund policy: max 100")
    done = await shop.hosted().resume(stored(paused), [no], run_id=RUN)

    assert shop.refunds == []
    assert done.pending == () and done.final_text == "not refunded"
    # ADK's FunctionTool tells the model its own words, not the reason
    assert shop.told() == [{"error": "This tool call is rejected."}]


async def test_a_tool_confirming_itself_gets_the_reason_for_the_model() -> None:
    # the tool answers "awaiting confirmation" and the model has its say before the pause
    shop = Shop([turn(refund_call("call_1")), text("asked"), text("not refunded")])
    paused = await shop.hosted("itself").start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    assert call.call_id == "call_1" and paused.final_text is None
    assert call.description == f"refund 500 on o-7?\n\n{NO_EDITS}"
    no = deny(call, "refund policy: max 100")
    done = await shop.hosted("itself").resume(stored(paused), [no], run_id=RUN)

    assert shop.refunds == []
    assert done.final_text == "not refunded"
    assert shop.told() == [{"error": "refund policy: max 100"}]


async def test_an_edit_runs_a_payload_tool_once_with_the_edited_arguments() -> None:
    shop = Shop([turn(refund_call("call_1")), text("refunded 45")])
    paused = await shop.hosted("payload", payload_edits=["refund"]).start("refund", run_id=RUN)
    [call] = paused.pending
    assert call.description == HINT  # edits apply: no notice
    changed = edit(call, amount=45.0)
    again = shop.hosted("payload", payload_edits=["refund"])
    done = await again.resume(stored(paused), [changed], run_id=RUN)

    assert shop.refunds == [("o-7", 45.0)]
    assert done.final_text == "refunded 45"
    assert shop.told() == [{"result": "refunded 45.0 on o-7"}]


async def test_an_edit_of_any_other_tool_is_denied() -> None:
    shop = Shop([turn(refund_call("call_1")), text("not refunded")])
    paused = await shop.hosted("payload").start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    done = await shop.hosted("payload").resume(stored(paused), [edit(call, amount=45)], run_id=RUN)

    assert shop.refunds == []
    assert done.final_text == "not refunded"
    assert shop.told() == [{"error": "This tool call is rejected."}]


async def test_two_calls_of_one_turn_are_decided_each_on_its_own() -> None:
    shop = Shop(
        [turn(refund_call("call_1", "o-1", 20), refund_call("call_2", "o-2", 900)), text("one")]
    )
    paused = await shop.hosted().start("refund o-1 and o-2", run_id=RUN)
    first, second = paused.pending
    assert [first.call_id, second.call_id] == ["call_1", "call_2"]
    decided = [approve(first), deny(second, "too much")]
    done = await shop.hosted().resume(stored(paused), decided, run_id=RUN)

    assert shop.refunds == [("o-1", 20)]
    assert done.pending == () and done.final_text == "one"
    assert shop.told() == [
        {"result": "refunded 20 on o-1"},
        {"error": "This tool call is rejected."},
    ]


async def test_a_call_denied_by_the_bot_for_want_of_an_id_never_runs() -> None:
    # the tool answers "awaiting confirmation" and the model has its say before the pause
    shop = Shop([turn(refund_call("call_1")), text("asked"), text("not refunded")])
    paused = await shop.hosted("itself").start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    no = Resolution(call, False, call.arguments, False, NO_CALL_ID, None, None)
    await shop.hosted("itself").resume(stored(paused), [no], run_id=RUN)

    assert shop.refunds == []
    assert shop.told() == [{"error": NO_CALL_ID}]


async def test_a_run_that_needs_no_confirmation_finishes_at_once() -> None:
    shop = Shop([text("nothing to refund")])
    done = await shop.hosted().start("hello", run_id=RUN)

    assert done.pending == () and done.final_text == "nothing to refund"
    with pytest.raises(StaleResume, match="the state has finished"):
        await shop.hosted().resume(stored(done), [], run_id=RUN)


async def test_the_session_state_is_kept_between_steps() -> None:
    shop = Shop([turn(refund_call("call_1")), text("refunded")])
    seen: list[Any] = []

    def refund(order_id: str, amount: float, tool_context: ToolContext) -> str:
        """Refund an order, noting it in the session's state."""
        seen.append(tool_context.state.get("noted"))
        shop.refunds.append((order_id, amount))
        return "refunded"

    def hosted() -> HostedGoogleADK:
        tool = FunctionTool(refund, require_confirmation=True)
        agent = LlmAgent(name="support", model=shop.model, tools=[tool])
        return HostedGoogleADK(agent)

    paused = await hosted().start("refund order o-7", run_id=RUN)
    kept = json.loads(paused.state)
    session = json.loads(kept["session"])
    session["state"] = {"noted": "o-7 asked for"}  # as a callback of the agent would set it
    kept["session"] = json.dumps(session)
    [call] = paused.pending
    await hosted().resume(json.dumps(kept), [approve(call)], run_id=RUN)

    assert seen == ["o-7 asked for"]
    assert shop.refunds == [("o-7", 500)]


async def test_decisions_that_do_not_answer_the_state_are_stale_and_run_nothing() -> None:
    shop = Shop([turn(refund_call("call_1")), turn(refund_call("call_2", amount=450))])
    paused = await shop.hosted().start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    again = await shop.hosted().resume(stored(paused), [deny(call, "no")], run_id=RUN)
    [new] = again.pending
    other_arguments = PendingCall("refund", {"order_id": "o-7", "amount": 1}, "call_2")
    moved_on = shop.hosted()
    for decided in (
        [approve(call)],  # the previous step's decision, on the next step's state
        [approve(other_arguments)],  # the same call id with other arguments
        [approve(new), approve(new)],  # one decision too many
        [],  # none at all
    ):
        with pytest.raises(StaleResume, match="do not answer the state's pending calls"):
            await moved_on.resume(stored(again), decided, run_id=RUN)

    assert shop.refunds == []
    assert len(shop.model.requests) == 2  # the model was not run again either


def envelope(state: str, **changes: Any) -> str:
    return json.dumps({**json.loads(state), **changes})


async def test_a_state_that_is_not_the_adapters_is_refused() -> None:
    shop = Shop([turn(refund_call("call_1"))])
    paused = await shop.hosted().start("refund order o-7", run_id=RUN)
    [call] = paused.pending
    session = json.loads(paused.state)["session"]
    refused = {
        "not json {": "it is not JSON",
        "[1, 2]": "it names no such adapter",
        session: "it names no such adapter",  # ADK's session, bare
        envelope(paused.state, kind="another.Adapter"): "it names no such adapter",
        envelope(paused.state, version=2): "of version 2: this version reads only version 1",
        envelope(paused.state, run_id="another-run"): "of run_id 'another-run', not 'support-42'",
        envelope(paused.state, agent="billing"): "of agent 'billing', not 'support'",
        envelope(paused.state, app_name="billing"): "of app_name 'billing', not 'support'",
        envelope(paused.state, session=None): "no session in it",
        envelope(paused.state, session="{}"): "no valid ADK session",
        envelope(paused.state, session_id="another"): "not the one it names",
    }
    adapter = shop.hosted()
    for state, message in refused.items():
        with pytest.raises(ValueError, match=message):
            await adapter.resume(state, [approve(call)], run_id=RUN)

    assert shop.refunds == []
    assert len(shop.model.requests) == 1
