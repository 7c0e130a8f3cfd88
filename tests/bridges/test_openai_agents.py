"""The OpenAI Agents SDK bridge against a real bot: an agent on the SDK's own scripted model
(`agents.testing.ScriptedModel`) pauses on a `needs_approval` tool, the reviewer decides over
HTTP, and the run resumes from the state the bridge returns."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunConfig, Runner, RunResult, RunState, function_tool
from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call

from nodbot.core.bridges.common import StaleResume
from nodbot.core.bridges.openai_agents import EDIT_NOTICE, resolve_interruptions
from nodbot.core.client import Approval, ApprovalClient
from tests.bridges.support import Bridged, bridged_bot

RUN = "support-42"
NO_TRACES = RunConfig(tracing_disabled=True)  # no trace export may try the network


def refund_tool(ran: list[dict[str, Any]]) -> FunctionTool:
    @function_tool(needs_approval=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append({"order_id": order_id, "amount": amount})
        return f"refunded {amount} on {order_id}"

    return refund


def agent_of(model: ScriptedModel, ran: list[dict[str, Any]]) -> Agent[Any]:
    return Agent(name="support", model=model, tools=[refund_tool(ran)])


def outputs(call: ModelCall) -> dict[str, str]:
    """The tool outputs the model is given in `call`, by call id."""
    return {
        item["call_id"]: item["output"]
        for item in call.input
        if isinstance(item, Mapping) and item.get("type") == "function_call_output"
    }


async def decided(
    bridged: Bridged,
    source: RunResult | RunState[Any],
    decisions: Mapping[str, dict[str, Any]],
    reviews: Any = None,
    seen: list[dict[str, Any]] | None = None,
) -> RunState[Any]:
    """Resolve `source`, deciding each review (by call id) as `decisions` say (the reviews
    as the reviewer saw them are added to `seen`)."""
    resolving = asyncio.create_task(
        resolve_interruptions(source, reviews or bridged.client, run_id=RUN, within=20)
    )
    for review in await bridged.when_pending(len(decisions)):
        if seen is not None:
            seen.append(review)
        await bridged.decide(review["approval_id"], **decisions[review["call_id"]])
    return await resolving


@dataclasses.dataclass
class RecordingReviews:
    """The agent's client, keeping what each review was asked with."""

    client: ApprovalClient
    asked: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    async def request(self, tool: str, arguments: dict[str, Any], **more: Any) -> Approval:
        self.asked.append({"tool": tool, "arguments": arguments, **more})
        return await self.client.request(tool, arguments, **more)

    async def wait(self, approval_id: str, *, within: float) -> Approval:
        return await self.client.wait(approval_id, within=within)

    async def consume(self, approval: Approval) -> Any:
        return await self.client.consume(approval)


async def test_an_approved_call_runs_once_and_the_run_finishes(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [assistant_message("refunded")],
        ]
    )
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        paused = await Runner.run(agent, "refund o-7", run_config=NO_TRACES)
        state = await decided(bridged, paused, {"call_1": {"action": "approve"}})
        done = await Runner.run(agent, state, run_config=NO_TRACES)

    assert ran == [{"order_id": "o-7", "amount": 500}]
    assert done.interruptions == [] and done.final_output == "refunded"
    assert outputs(model.calls[1]) == {"call_1": "refunded 500.0 on o-7"}


async def test_a_denied_call_never_runs_and_the_model_gets_the_reason(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-9", "amount": 900}, call_id="call_1")],
            [assistant_message("not refunded")],
        ]
    )
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        paused = await Runner.run(agent, "refund o-9", run_config=NO_TRACES)
        no = {"action": "deny", "reason": "refund policy: max 500"}
        state = await decided(bridged, paused, {"call_1": no})
        done = await Runner.run(agent, state, run_config=NO_TRACES)

    assert ran == []
    assert done.interruptions == [] and done.final_output == "not refunded"
    assert outputs(model.calls[1]) == {"call_1": "refund policy: max 500"}


async def test_two_calls_of_one_turn_are_decided_each_on_its_own(tmp_path: Path) -> None:
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
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        paused = await Runner.run(agent, "refund o-1 and o-2", run_config=NO_TRACES)
        decisions = {
            "call_1": {"action": "approve"},
            "call_2": {"action": "deny", "reason": "too much"},
        }
        state = await decided(bridged, paused, decisions)
        done = await Runner.run(agent, state, run_config=NO_TRACES)

    assert ran == [{"order_id": "o-1", "amount": 20}]
    assert done.interruptions == [] and done.final_output == "one refunded"
    assert outputs(model.calls[1]) == {"call_1": "refunded 20.0 on o-1", "call_2": "too much"}


async def test_an_edit_is_a_denial_naming_the_edited_call_which_is_a_new_review(
    tmp_path: Path,
) -> None:
    ran: list[dict[str, Any]] = []
    edited = {"order_id": "o-7", "amount": 450}
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [function_call("refund", edited, call_id="call_2")],  # the model makes the edit
            [assistant_message("refunded 450")],
        ]
    )
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        reviews = RecordingReviews(bridged.client)
        seen: list[dict[str, Any]] = []
        paused = await Runner.run(agent, "refund o-7", run_config=NO_TRACES)
        edit = {"action": "edit", "arguments": {"amount": 450}, "reason": "max 450"}
        state = await decided(bridged, paused, {"call_1": edit}, reviews, seen)
        again = await Runner.run(agent, state, run_config=NO_TRACES)
        assert ran == []  # not with the original arguments, nor with the edited ones yet
        state = await decided(bridged, again, {"call_2": {"action": "approve"}}, reviews, seen)
        done = await Runner.run(agent, state, run_config=NO_TRACES)

    first, second = seen
    assert (first["call_id"], first["arguments"]) == ("call_1", {"order_id": "o-7", "amount": 500})
    assert (second["call_id"], second["arguments"]) == ("call_2", edited)
    assert second["approval_id"] != first["approval_id"]
    assert ran == [edited]
    assert done.interruptions == [] and done.final_output == "refunded 450"
    told = outputs(model.calls[1])["call_1"]
    assert "did not run" in told and "call `refund` with these arguments: " in told
    named = told.split("with these arguments: ", 1)[1].split(" (the reviewer's note", 1)[0]
    assert json.loads(named) == edited
    assert told.endswith("(the reviewer's note: max 450)")
    assert [asked["description"] for asked in reviews.asked] == [EDIT_NOTICE, EDIT_NOTICE]


async def test_a_state_resumed_while_under_review_is_stale(
    tmp_path: Path,
) -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")],
            [assistant_message("not refunded")],
        ]
    )
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        paused = await Runner.run(agent, "refund o-7", run_config=NO_TRACES)
        state = paused.to_state()
        resolving = asyncio.create_task(
            resolve_interruptions(state, bridged.client, run_id=RUN, within=20)
        )
        [review] = await bridged.when_pending(1)
        # Another worker resumes the same state while the call is under review.
        [item] = state.get_interruptions()
        state.reject(item, rejection_message="handled elsewhere")
        elsewhere = await Runner.run(agent, state, run_config=NO_TRACES)
        await bridged.decide(review["approval_id"], "approve")
        with pytest.raises(StaleResume, match="changed while they were reviewed"):
            await resolving

    assert ran == []
    assert elsewhere.interruptions == [] and elsewhere.final_output == "not refunded"
    assert state.get_interruptions() == []


async def test_a_call_without_a_call_id_is_denied_by_the_bridge(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [[function_call("refund", {"order_id": "o-7", "amount": 500}, call_id="call_1")]]
    )
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        paused = await Runner.run(agent, "refund o-7", run_config=NO_TRACES)
        # The SDK makes no call without a call id: this one is built by hand.
        [item] = paused.interruptions
        raw = item.raw_item.model_copy(update={"call_id": ""})  # type: ignore[union-attr]
        paused.interruptions = [dataclasses.replace(item, raw_item=raw)]
        state = await resolve_interruptions(paused, bridged.client, run_id=RUN, within=20)
        assert await bridged.pending() == []  # no review was opened
        again = await Runner.run(agent, state, run_config=NO_TRACES)

    assert ran == []
    [still] = again.interruptions  # the run stops at that call again; it never runs
    assert still.raw_item.call_id == ""  # type: ignore[union-attr]
    assert len(model.calls) == 1


async def test_a_call_whose_arguments_are_not_an_object_is_denied_by_the_bridge(
    tmp_path: Path,
) -> None:
    ran: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            [function_call("refund", '["o-7", 500]', call_id="call_1")],
            [assistant_message("not refunded")],
        ]
    )
    agent = agent_of(model, ran)
    async with bridged_bot(tmp_path, ["refund"]) as bridged:
        paused = await Runner.run(agent, "refund o-7", run_config=NO_TRACES)
        state = await resolve_interruptions(paused, bridged.client, run_id=RUN, within=20)
        assert await bridged.pending() == []  # no review was opened
        done = await Runner.run(agent, state, run_config=NO_TRACES)

    assert ran == []
    assert done.interruptions == [] and done.final_output == "not refunded"
    assert "not a JSON object" in outputs(model.calls[1])["call_1"]
