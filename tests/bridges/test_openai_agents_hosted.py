"""`HostedOpenAIAgent`, as the bot drives it, without the bot: an agent on the SDK's own
scripted model (`agents.testing.ScriptedModel`) pauses on a `needs_approval` tool, the
decisions are built by hand as `Resolution`s, and every `resume` is made by a NEW adapter
from the state as plain text, so nothing can stay in memory between steps."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunConfig, function_tool
from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call

from nodbot.core.bridges.common import PendingCall, Resolution, StaleResume
from nodbot.core.bridges.hosted import HostedAgent, HostedStep
from nodbot.core.bridges.openai_agents import EDIT_NOTICE, HostedOpenAIAgent

RUN = "support-42"
REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"title": "Order Id", "type": "string"},
        "amount": {"title": "Amount", "type": "number"},
    },
    "required": ["order_id", "amount"],
    "title": "refund_args",
    "additionalProperties": False,
}


def refund_tool(ran: list[dict[str, Any]]) -> FunctionTool:
    @function_tool(needs_approval=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append({"order_id": order_id, "amount": amount})
        return f"refunded {amount} on {order_id}"

    return refund


def hosted(model: ScriptedModel, ran: list[dict[str, Any]]) -> HostedOpenAIAgent:
    """A new adapter (and agent) each time, as a restarted process would build it."""
    return HostedOpenAIAgent(Agent(name="support", model=model, tools=[refund_tool(ran)]))


def stored(step: HostedStep) -> str:
    """The state as the bot's store gives it back: text, and nothing else."""
    return step.state.encode("utf-8").decode("utf-8")


def outputs(call: ModelCall) -> dict[str, str]:
    """The tool outputs the model is given in `call`, by call id."""
    return {
        item["call_id"]: item["output"]
        for item in call.input
        if isinstance(item, Mapping) and item.get("type") == "function_call_output"
    }


def approve(call: PendingCall) -> Resolution:
    return Resolution(call, True, call.arguments, False, None, "lead@example.com", None)


def deny(call: PendingCall, reason: str) -> Resolution:
    return Resolution(call, False, call.arguments, False, reason, "lead@example.com", None)


def edit(call: PendingCall, changes: dict[str, Any], note: str) -> Resolution:
    arguments = {**call.arguments, **changes}
    return Resolution(call, True, arguments, True, note, "lead@example.com", None)


async def test_start_pauses_with_the_native_calls_and_runs_nothing() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [[function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")]]
    )
    adapter = hosted(model, ran)
    step = await adapter.start("refund o-7", run_id=RUN)

    assert isinstance(adapter, HostedAgent)
    assert step.pending == (
        PendingCall(
            tool="refund",
            arguments={"order_id": "o-7", "amount": 500},
            call_id="call_1",
            schema=REFUND_SCHEMA,
            description=EDIT_NOTICE,
        ),
    )
    assert step.final_text is None and isinstance(json.loads(step.state), dict)
    assert ran == []
    assert adapter.run_config.tracing_disabled  # no trace export may try the network


async def test_an_approved_call_runs_once_and_the_run_finishes() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [assistant_message("refunded")],
        ]
    )
    paused = await hosted(model, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    done = await hosted(model, ran).resume(stored(paused), [approve(call)], run_id=RUN)
    with pytest.raises(StaleResume, match="the state has finished"):
        await hosted(model, ran).resume(stored(done), [], run_id=RUN)

    assert ran == [{"order_id": "o-7", "amount": 500}]
    assert done.pending == () and done.final_text == "refunded"
    assert outputs(model.calls[1]) == {"call_1": "refunded 500.0 on o-7"}
    assert len(model.calls) == 2


async def test_a_denied_call_never_runs_and_the_model_gets_the_reason() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-9", "amount": 900}, call_id="call_1")],
            [assistant_message("not refunded")],
        ]
    )
    paused = await hosted(model, ran).start("refund o-9", run_id=RUN)
    [call] = paused.pending
    no = deny(call, "refund policy: max 500")
    done = await hosted(model, ran).resume(stored(paused), [no], run_id=RUN)

    assert ran == []
    assert done.pending == () and done.final_text == "not refunded"
    assert outputs(model.calls[1]) == {"call_1": "refund policy: max 500"}


async def test_two_calls_of_one_turn_are_decided_each_on_its_own() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [
                function_call("refund", {"order_id": "o-1", "amount": 20}, call_id="call_1"),
                function_call("refund", {"order_id": "o-2", "amount": 2000}, call_id="call_2"),
            ],
            [assistant_message("one refunded")],
        ]
    )
    paused = await hosted(model, ran).start("refund o-1 and o-2", run_id=RUN)
    first, second = paused.pending
    assert [first.call_id, second.call_id] == ["call_1", "call_2"]
    decided = [approve(first), deny(second, "too much")]
    done = await hosted(model, ran).resume(stored(paused), decided, run_id=RUN)

    assert ran == [{"order_id": "o-1", "amount": 20}]
    assert done.pending == () and done.final_text == "one refunded"
    assert outputs(model.calls[1]) == {"call_1": "refunded 20.0 on o-1", "call_2": "too much"}


async def test_an_edit_is_a_denial_naming_the_edited_call_which_is_a_new_pending_call() -> None:
    ran: list[dict[str, Any]] = []
    edited = {"order_id": "o-7", "amount": 450}
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [function_call("refund", edited, call_id="call_2")],  # the model makes the edit
            [assistant_message("refunded 450")],
        ]
    )
    paused = await hosted(model, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    changed = edit(call, {"amount": 450}, "max 450")
    again = await hosted(model, ran).resume(stored(paused), [changed], run_id=RUN)
    assert ran == []  # not with the original arguments, nor with the edited ones yet
    [new] = again.pending
    assert (new.call_id, new.tool, new.arguments) == ("call_2", "refund", edited)
    assert again.final_text is None
    done = await hosted(model, ran).resume(stored(again), [approve(new)], run_id=RUN)

    assert ran == [edited]
    assert done.pending == () and done.final_text == "refunded 450"
    told = outputs(model.calls[1])["call_1"]
    assert "did not run" in told and "call `refund` with these arguments: " in told
    named = told.split("with these arguments: ", 1)[1].split(" (the reviewer's note", 1)[0]
    assert json.loads(named) == edited
    assert told.endswith("(the reviewer's note: max 450)")


async def test_decisions_that_do_not_answer_the_state_are_stale_and_run_nothing() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [function_call("refund", {"order_id": "o-7", "amount": 450}, call_id="call_2")],
        ]
    )
    paused = await hosted(model, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    again = await hosted(model, ran).resume(stored(paused), [deny(call, "no")], run_id=RUN)
    [new] = again.pending
    moved_on = hosted(model, ran)
    other_arguments = PendingCall("refund", {"order_id": "o-7", "amount": 1}, "call_2")
    for decided in (
        [approve(call)],  # the previous step's decision, on the next step's state
        [approve(other_arguments)],  # the same call id with other arguments
        [approve(new), approve(new)],  # one decision too many
        [],  # none at all
    ):
        with pytest.raises(StaleResume, match="do not answer the state's pending calls"):
            await moved_on.resume(stored(again), decided, run_id=RUN)

    assert ran == []
    assert len(model.calls) == 2  # the model was not run again either


def envelope(state: str, **changes: Any) -> str:
    return json.dumps({**json.loads(state), **changes})


async def test_a_state_that_is_not_the_adapters_is_refused() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [[function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")]]
    )
    paused = await hosted(model, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    sdk_state = json.loads(paused.state)["run_state"]
    refused = {
        "not json {": "it is not JSON",
        "[1, 2]": "it names no such adapter",
        json.dumps(sdk_state): "it names no such adapter",  # the SDK's state, bare
        envelope(paused.state, kind="another.Adapter"): "it names no such adapter",
        envelope(paused.state, version=2): "of version 2: this version reads only version 1",
        envelope(paused.state, run_id="another-run"): "of run 'another-run', not 'support-42'",
        envelope(paused.state, agent="billing"): "of agent 'billing', not 'support'",
        envelope(paused.state, run_state=None): "no run state in it",
        envelope(
            paused.state, run_state={**sdk_state, "$schemaVersion": "0.1"}
        ): "the SDK cannot restore: Run state schema version is not supported",
    }
    adapter = hosted(model, ran)
    for state, message in refused.items():
        with pytest.raises(ValueError, match=message):
            await adapter.resume(state, [approve(call)], run_id=RUN)

    assert ran == []
    assert len(model.calls) == 1


async def test_a_call_whose_arguments_are_not_an_object_is_denied_without_a_pause() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", '["o-7", 500]', call_id="call_1")],
            [assistant_message("not refunded")],
        ]
    )
    done = await hosted(model, ran).start("refund o-7", run_id=RUN)

    assert ran == []
    assert done.pending == () and done.final_text == "not refunded"
    assert "not a JSON object" in outputs(model.calls[1])["call_1"]


async def test_a_call_whose_arguments_are_not_an_object_is_denied_beside_a_pending_one() -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [
                function_call("refund", '["o-1", 20]', call_id="call_1"),
                function_call("refund", {"order_id": "o-2", "amount": 20}, call_id="call_2"),
            ],
            [assistant_message("one refunded")],
        ]
    )
    paused = await hosted(model, ran).start("refund o-1 and o-2", run_id=RUN)
    [call] = paused.pending
    assert call.call_id == "call_2"
    done = await hosted(model, ran).resume(stored(paused), [approve(call)], run_id=RUN)

    assert ran == [{"order_id": "o-2", "amount": 20}]
    assert done.pending == () and done.final_text == "one refunded"
    told = outputs(model.calls[1])
    assert "not a JSON object" in told["call_1"] and told["call_2"] == "refunded 20.0 on o-2"


async def test_a_run_config_of_your_own_is_used_as_given() -> None:
    config = RunConfig(tracing_disabled=True, workflow_name="support")
    agent = Agent(name="support", model=ScriptedModel([]), tools=[])
    assert HostedOpenAIAgent(agent, run_config=config).run_config is config
