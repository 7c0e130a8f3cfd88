"""`HostedAgentFramework`, as the bot drives it, without the bot: an `Agent` on the scripted
chat client of `test_agent_framework` (Agent Framework ships no test model) pauses on tools
that always need approval, the decisions are built by hand as `Resolution`s, and every
`resume` is made by a NEW adapter on a NEW agent from the state as plain text, so nothing can
stay in memory between steps."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, FunctionTool, InMemoryHistoryProvider, tool

from nodbot.core.bridges.agent_framework import EDITS_NOT_RUN, HostedAgentFramework
from nodbot.core.bridges.common import NO_CALL_ID, PendingCall, Resolution, StaleResume
from nodbot.core.bridges.hosted import HostedAgent, HostedStep
from tests.bridges.test_agent_framework import REJECTED, ScriptedChatClient, calls, text

RUN = "support-42"
REFUND_SCHEMA = {
    "properties": {
        "order_id": {"title": "Order Id", "type": "string"},
        "amount": {"title": "Amount", "type": "number"},
    },
    "required": ["order_id", "amount"],
    "title": "refund_input",
    "type": "object",
}


def shop_tools(ran: list[tuple[str, dict[str, Any]]]) -> list[FunctionTool]:
    """The tools of the tests, recording each real call in `ran`."""

    @tool(approval_mode="always_require")
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append(("refund", {"order_id": order_id, "amount": amount}))
        return f"refunded {amount} on {order_id}"

    @tool(approval_mode="always_require")
    def notify(customer: str) -> str:
        """Tell a customer."""
        ran.append(("notify", {"customer": customer}))
        return f"told {customer}"

    return [refund, notify]


def hosted(
    client: ScriptedChatClient, ran: list[tuple[str, dict[str, Any]]]
) -> HostedAgentFramework:
    """A new adapter (and agent) each time, as a restarted process would build it."""
    return HostedAgentFramework(Agent(client, name="support", tools=shop_tools(ran)))


def stored(step: HostedStep) -> str:
    """The state as the bot's store gives it back: text, and nothing else."""
    return step.state.encode("utf-8").decode("utf-8")


def approve(call: PendingCall) -> Resolution:
    return Resolution(call, True, call.arguments, False, None, "lead@example.com", None)


def deny(call: PendingCall, reason: str) -> Resolution:
    return Resolution(call, False, call.arguments, False, reason, "lead@example.com", None)


def edit(call: PendingCall, changes: dict[str, Any]) -> Resolution:
    arguments = {**call.arguments, **changes}
    return Resolution(call, True, arguments, True, None, "lead@example.com", None)


async def reasons(step: HostedStep) -> dict[str, Any]:
    """The reasons the session's history recorded with each approval response, by call id."""
    session = AgentSession.from_dict(json.loads(step.state)["session"])
    history = await InMemoryHistoryProvider().get_messages(
        session.session_id, state=session.state[InMemoryHistoryProvider.DEFAULT_SOURCE_ID]
    )
    return {
        str(content.function_call.call_id): content.additional_properties.get("reason")
        for message in history
        for content in message.contents
        if content.type == "function_approval_response" and content.function_call is not None
    }


def refund_of(order_id: str, amount: float, call_id: str = "call_1") -> Any:
    return calls((call_id, "refund", {"order_id": order_id, "amount": amount}))


async def test_start_pauses_with_the_native_calls_and_runs_nothing() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-7", 500)])
    adapter = hosted(client, ran)
    step = await adapter.start("refund o-7", run_id=RUN)

    assert isinstance(adapter, HostedAgent)
    assert step.pending == (
        PendingCall(
            tool="refund",
            arguments={"order_id": "o-7", "amount": 500},
            call_id="call_1",
            schema=REFUND_SCHEMA,
            description=EDITS_NOT_RUN,
        ),
    )
    assert step.final_text is None
    assert json.loads(step.state)["session"]["session_id"] == RUN
    assert ran == []


async def test_an_approved_call_runs_once_and_the_run_finishes() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-7", 500), text("refunded")])
    paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    done = await hosted(client, ran).resume(stored(paused), [approve(call)], run_id=RUN)
    with pytest.raises(StaleResume, match="the state has finished"):
        await hosted(client, ran).resume(stored(done), [], run_id=RUN)

    assert ran == [("refund", {"order_id": "o-7", "amount": 500.0})]
    assert done.pending == () and done.final_text == "refunded"
    assert client.results() == {"call_1": "refunded 500.0 on o-7"}
    assert len(client.sent) == 2


async def test_a_denied_call_never_runs_and_its_reason_is_kept_with_the_response() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-9", 900), text("not refunded")])
    paused = await hosted(client, ran).start("refund o-9", run_id=RUN)
    [call] = paused.pending
    no = deny(call, "refund policy: max 500")
    done = await hosted(client, ran).resume(stored(paused), [no], run_id=RUN)

    assert ran == []
    assert done.pending == () and done.final_text == "not refunded"
    # The framework tells the model its own fixed text; the reason stays with the response.
    assert client.results() == {"call_1": REJECTED}
    assert await reasons(done) == {"call_1": "refund policy: max 500"}


async def test_two_calls_of_one_turn_are_decided_each_on_its_own() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient(
        [
            calls(
                ("call_1", "refund", {"order_id": "o-1", "amount": 2000}),
                ("call_2", "notify", {"customer": "c-9"}),
            ),
            text("told them"),
        ]
    )
    paused = await hosted(client, ran).start("refund o-1 and tell c-9", run_id=RUN)
    first, second = paused.pending
    assert [(c.call_id, c.tool) for c in paused.pending] == [
        ("call_1", "refund"),
        ("call_2", "notify"),
    ]
    decided = [deny(first, "too much"), approve(second)]
    done = await hosted(client, ran).resume(stored(paused), decided, run_id=RUN)

    assert ran == [("notify", {"customer": "c-9"})]
    assert done.pending == () and done.final_text == "told them"
    assert client.results() == {"call_1": REJECTED, "call_2": "told c-9"}
    assert await reasons(done) == {"call_1": "too much", "call_2": None}


async def test_an_edit_is_a_denial_naming_the_edited_call() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-7", 500), text("not refunded")])
    paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    done = await hosted(client, ran).resume(
        stored(paused), [edit(call, {"amount": 450})], run_id=RUN
    )

    assert ran == []  # neither with the original arguments nor with the edited ones
    assert done.pending == () and done.final_text == "not refunded"
    assert client.results() == {"call_1": REJECTED}
    reason = (await reasons(done))["call_1"]
    assert "refund" in reason and "call_1" in reason and '"amount": 450' in reason


async def test_a_run_pauses_again_on_a_later_turn() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient(
        [
            refund_of("o-7", 500),
            calls(("call_2", "notify", {"customer": "c-9"})),
            text("refunded and told"),
        ]
    )
    paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    again = await hosted(client, ran).resume(stored(paused), [approve(call)], run_id=RUN)
    [new] = again.pending
    assert (new.call_id, new.tool, new.arguments) == ("call_2", "notify", {"customer": "c-9"})
    assert again.final_text is None
    assert ran == [("refund", {"order_id": "o-7", "amount": 500.0})]
    done = await hosted(client, ran).resume(stored(again), [approve(new)], run_id=RUN)

    assert ran == [
        ("refund", {"order_id": "o-7", "amount": 500.0}),
        ("notify", {"customer": "c-9"}),
    ]
    assert done.pending == () and done.final_text == "refunded and told"


async def test_decisions_that_do_not_answer_the_state_are_stale_and_run_nothing() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-7", 500), refund_of("o-7", 450, "call_2")])
    paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    again = await hosted(client, ran).resume(stored(paused), [deny(call, "no")], run_id=RUN)
    [new] = again.pending
    other_arguments = PendingCall("refund", {"order_id": "o-7", "amount": 1}, "call_2")
    for wrong in ([approve(call)], [approve(other_arguments)], [], [approve(new)] * 2):
        with pytest.raises(StaleResume, match="do not answer the state's pending calls"):
            await hosted(client, ran).resume(stored(again), wrong, run_id=RUN)

    assert ran == []
    assert len(client.sent) == 2  # the model was not called again


async def test_a_session_whose_requests_are_no_longer_pending_is_stale() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-7", 500)])
    paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    answered = json.loads(paused.state)
    answered["session"]["state"]["tool_approval"].pop("pending_approval_requests")
    moved_on = json.loads(paused.state)
    history = moved_on["session"]["state"]["in_memory"]["messages"]
    history.append({"type": "message", "role": "user", "contents": [{"type": "text", "text": "?"}]})

    with pytest.raises(StaleResume, match="no longer holds the state's pending requests"):
        await hosted(client, ran).resume(json.dumps(answered), [approve(call)], run_id=RUN)
    with pytest.raises(StaleResume, match="no longer open in the history"):
        await hosted(client, ran).resume(json.dumps(moved_on), [approve(call)], run_id=RUN)
    assert ran == []
    assert len(client.sent) == 1


async def test_a_call_without_a_call_id_is_given_no_id_and_denied_runs_nothing() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient(
        [calls(("", "refund", {"order_id": "o-7", "amount": 500})), text("ok")]
    )
    with warnings.catch_warnings():
        # The framework warns that it stands its own occurrence id in for the call id.
        warnings.simplefilter("ignore", FutureWarning)
        paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    assert call.call_id is None
    denied = Resolution(call, False, call.arguments, False, NO_CALL_ID, None, None)
    done = await hosted(client, ran).resume(stored(paused), [denied], run_id=RUN)

    assert ran == []
    assert done.pending == () and done.final_text == "ok"
    assert list((await reasons(done)).values()) == [NO_CALL_ID]


def other(state: str, **changes: Any) -> str:
    envelope = json.loads(state)
    envelope.update(changes)
    return json.dumps(envelope)


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (lambda state: "not json", "it is not JSON"),
        (lambda state: json.dumps([1, 2]), "names no such adapter"),
        (lambda state: other(state, kind="nodbot.bridges.openai_agents"), "no such adapter"),
        (lambda state: other(state, version=2), "of version 2"),
        (lambda state: other(state, run_id="another-run"), "of run 'another-run'"),
        (lambda state: other(state, agent="billing"), "of agent 'billing'"),
        (lambda state: other(state, requests="x"), "no list of pending requests"),
        (lambda state: other(state, session=None), "no session of this run"),
        (
            lambda state: other(state, session={"session_id": RUN, "state": []}),
            "the framework cannot restore",
        ),
    ],
)
async def test_a_state_that_is_not_the_adapters_is_refused(broken: Any, message: str) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    client = ScriptedChatClient([refund_of("o-7", 500)])
    paused = await hosted(client, ran).start("refund o-7", run_id=RUN)
    [call] = paused.pending
    with pytest.raises(ValueError, match=message):
        await hosted(client, ran).resume(broken(paused.state), [approve(call)], run_id=RUN)
    assert ran == []
    assert len(client.sent) == 1
