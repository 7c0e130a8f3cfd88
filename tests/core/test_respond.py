"""`respond`: the reviewer answers in the tool's place (LangChain's fourth decision type).

Each form (`ToolDecision(action="respond", message=...)`, its dict, LangChain's `{"type":
"respond", "message": ...}`, and a `Decision` with a `response`) goes through
`Executor.decide` on a real store (memory, SQLite, PostgreSQL) and is recorded as a denial
that carries the reviewer's text: the review's status is `denied` (nothing ran), its audit
says `respond` and keeps the text. The resumed call does not run the tool: its result is the
reviewer's text, as a normal (`ok`) result without arguments (the tool did not run), and the
decision is spent like any other. An empty, blank or too long text, and a respond that also
approves or edits, raise `InvalidDecisionError` and record nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.core import (
    ApprovalRequest,
    ApprovalStore,
    AssistantMessage,
    CallbackApproval,
    ChatResponse,
    Decision,
    DeferredApproval,
    Executor,
    HumanMessage,
    InvalidDecisionError,
    MemoryApprovalStore,
    ScriptedChat,
    SqlApprovalStore,
    ToolCall,
    ToolDecision,
    ToolMessage,
    ToolRegistry,
    arguments_digest,
    as_decision,
    run_tool_loop,
)
from nodbot.core.decisions import MAX_RESPONSE
from tests.core.store.conftest import database_url

ORDER = {"order_id": "o-7", "amount": 500.0}
TEXT = "Refunds are paused until Monday; tell the customer it is queued."
ANSWERED = Decision(approved=False, response=TEXT, decided_by="ana")
BACKENDS = ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@dataclass
class Desk:
    """A store, an executor whose `refund` tool always needs review, and the refunds that
    really ran."""

    store: ApprovalStore
    executor: Executor
    ran: list[tuple[str, float]]
    calls: itertools.count[int] = field(default_factory=itertools.count)

    async def pending(self) -> tuple[ToolCall, str, str]:
        """A refund call of a new run, waiting for review: the call, its run id, its approval."""
        n = next(self.calls)
        call = ToolCall(name="refund", arguments=ORDER, id=f"call_{n}")
        run_id = f"run_{n}"
        result = await self.executor.run_call(call, self.executor.context(run_id=run_id))
        assert result.status == "pending" and result.error is not None
        return call, run_id, result.error.details["approval_id"]

    async def untouched(self, approval_id: str, events: int) -> bool:
        """Whether the review is still pending with no event added."""
        record = await self.store.get(approval_id)
        return record.status == "pending" and len(await self.store.events(approval_id)) == events


def refunds(ran: list[tuple[str, float]]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    return registry


@contextlib.asynccontextmanager
async def opened(backend: str, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    if backend == "memory":
        yield MemoryApprovalStore()
        return
    async with database_url(backend, tmp_path) as url, SqlApprovalStore(url) as store:
        yield store


@pytest.fixture(params=BACKENDS)
async def desk(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Desk]:
    ran: list[tuple[str, float]] = []
    async with opened(request.param, tmp_path) as store:
        yield Desk(store, Executor(refunds(ran), approval=DeferredApproval(store)), ran)


FORMS = [
    pytest.param(ToolDecision(action="respond", message=TEXT), id="ToolDecision"),
    pytest.param({"action": "respond", "message": TEXT}, id="action-respond"),
    pytest.param({"type": "respond", "message": TEXT}, id="langchain-respond"),
    pytest.param(Decision(approved=False, response=TEXT), id="Decision"),
    pytest.param({"approved": False, "response": TEXT}, id="Decision-dict"),
]


@pytest.mark.parametrize("answer", FORMS)
async def test_each_form_answers_the_call_with_the_text_and_the_tool_never_runs(
    desk: Desk, answer: object
) -> None:
    call, run_id, approval_id = await desk.pending()

    record = await desk.executor.decide(approval_id, answer, decided_by="ana")

    assert record.decision == ANSWERED
    assert record.status == "denied"  # nothing ran, nothing will
    assert (await desk.store.get(approval_id)).decision == ANSWERED
    [decided] = [e for e in await desk.store.events(approval_id) if e.kind == "decided"]
    assert decided.detail["action"] == "respond"
    assert decided.detail["response"] == TEXT
    assert decided.actor == "ana"

    resumed = await desk.executor.run_call(call, desk.executor.context(run_id=run_id))

    assert (resumed.status, resumed.value, resumed.error) == ("ok", TEXT, None)
    assert resumed.arguments is None  # the tool did not run
    assert desk.ran == []
    taken = await desk.store.get(approval_id)
    assert taken.consumed and taken.finished


async def test_the_answer_is_one_use_the_same_call_asked_again_is_reviewed_again(
    desk: Desk,
) -> None:
    call, run_id, approval_id = await desk.pending()
    await desk.executor.decide(approval_id, {"type": "respond", "message": TEXT}, decided_by="ana")
    ctx = desk.executor.context(run_id=run_id)
    assert (await desk.executor.run_call(call, ctx)).value == TEXT

    again = await desk.executor.run_call(call, ctx)

    assert again.status == "pending" and again.error is not None
    assert again.error.details["approval_id"] != approval_id
    assert desk.ran == []


async def test_a_respond_on_a_review_of_several_approvals_decides_it_at_once(
    desk: Desk,
) -> None:
    """As a deny does: an answer in the tool's place leaves nothing for the others to approve."""
    asked = ApprovalRequest(
        "run_votes", "call_votes", "refund", ORDER, arguments_digest(ORDER), approvals_required=2
    )
    record = await desk.store.create(asked)
    await desk.executor.decide(record.approval_id, True, decided_by="bob")  # one vote of two

    decided = await desk.executor.decide(
        record.approval_id, {"type": "respond", "message": TEXT}, decided_by="ana"
    )

    assert decided.decision == ANSWERED and decided.status == "denied"
    call = ToolCall(name="refund", arguments=ORDER, id="call_votes")
    resumed = await desk.executor.run_call(call, desk.executor.context(run_id="run_votes"))
    assert (resumed.status, resumed.value, desk.ran) == ("ok", TEXT, [])


async def test_run_returns_the_text_as_the_tools_value(desk: Desk) -> None:
    call, run_id, approval_id = await desk.pending()
    await desk.executor.decide(approval_id, ToolDecision(action="respond", message=TEXT))

    value = await desk.executor.run(call, desk.executor.context(run_id=run_id))

    assert value == TEXT and desk.ran == []


async def test_the_tool_loop_gives_the_model_the_text_as_a_normal_tool_result(
    desk: Desk,
) -> None:
    call = ToolCall(name="refund", arguments=ORDER, id="call_loop")
    chat = ScriptedChat([ChatResponse(tool_calls=[call]), "The customer has been told."])
    ctx = desk.executor.context(run_id="run_loop")
    paused = await run_tool_loop(chat, [HumanMessage(content="refund o-7")], ctx)
    assert paused.finish == "pending"
    [waiting] = paused.pending
    await desk.executor.decide(
        waiting.approval_id, {"type": "respond", "message": TEXT}, decided_by="ana"
    )

    done = await run_tool_loop(chat, paused.messages, ctx)

    assert done.finish == "stop" and done.final_text == "The customer has been told."
    [answer] = [m for m in done.messages if isinstance(m, ToolMessage)]
    assert answer.status == "ok"
    assert json.loads(answer.content) == {"result": TEXT}
    assert answer.arguments is None  # the tool did not run
    assert isinstance(done.messages[-1], AssistantMessage)
    assert desk.ran == []


async def test_a_callback_may_answer_in_the_tools_place() -> None:
    ran: list[tuple[str, float]] = []
    port = CallbackApproval(lambda request: {"type": "respond", "message": TEXT})
    executor = Executor(refunds(ran), approval=port)

    result = await executor.run_call(ToolCall(name="refund", arguments=ORDER), executor.context())

    assert (result.status, result.value, result.arguments) == ("ok", TEXT, None)
    assert ran == []


def refused(answer: object) -> list[str]:
    """The fields `as_decision` names in refusing `answer`."""
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(answer, tool="refund")
    return [error["field"] for error in caught.value.errors]


TOO_LONG = "x" * (MAX_RESPONSE + 1)
REFUSED = [
    pytest.param({"action": "respond"}, "message", id="action-no-message"),
    pytest.param({"action": "respond", "message": ""}, "message", id="action-empty"),
    pytest.param({"action": "respond", "message": " \n\t"}, "message", id="action-blank"),
    pytest.param({"action": "respond", "message": TOO_LONG}, "message", id="action-too-long"),
    pytest.param(
        {"action": "respond", "message": TEXT, "arguments": {"amount": 1}},
        "arguments",
        id="action-with-arguments",
    ),
    pytest.param({"type": "respond"}, "message", id="langchain-no-message"),
    pytest.param({"type": "respond", "message": ""}, "message", id="langchain-empty"),
    pytest.param({"type": "respond", "message": TOO_LONG}, "message", id="langchain-too-long"),
    pytest.param(
        {"type": "respond", "message": TEXT, "edited_action": {"name": "refund", "args": ORDER}},
        "edited_action",
        id="langchain-with-edit",
    ),
    pytest.param({"approved": True, "response": TEXT}, "response", id="approved-with-response"),
    pytest.param({"approved": False, "response": ""}, "response", id="Decision-empty"),
    pytest.param({"approved": False, "response": TOO_LONG}, "response", id="Decision-too-long"),
]


@pytest.mark.parametrize(("answer", "field_name"), REFUSED)
async def test_an_empty_or_too_long_or_mixed_respond_is_refused_and_records_nothing(
    desk: Desk, answer: object, field_name: str
) -> None:
    _, _, approval_id = await desk.pending()
    events = len(await desk.store.events(approval_id))

    with pytest.raises(InvalidDecisionError) as caught:
        await desk.executor.decide(approval_id, answer, decided_by="ana")

    assert field_name in [error["field"] for error in caught.value.errors], caught.value.errors
    assert await desk.untouched(approval_id, events)


def test_the_longest_answer_is_taken_and_one_more_character_is_not() -> None:
    longest = "x" * MAX_RESPONSE
    assert as_decision({"type": "respond", "message": longest}).response == longest
    assert refused({"type": "respond", "message": longest + "x"}) == ["message"]
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision({"action": "respond", "message": TOO_LONG})
    assert f"{MAX_RESPONSE + 1} characters; at most {MAX_RESPONSE}" in caught.value.message


def test_the_constructors_refuse_what_as_decision_refuses() -> None:
    with pytest.raises(ValueError, match="message"):
        ToolDecision(action="respond")
    with pytest.raises(ValueError, match="message"):
        ToolDecision(action="respond", message="  ")
    with pytest.raises(ValueError, match="approved=False"):
        Decision(approved=True, response=TEXT)


def test_a_decision_without_a_response_is_stored_as_before() -> None:
    """The stored JSON of the other decisions is unchanged (no `response` key), and a
    stored decision of before reads back as it was."""
    plain = Decision(approved=False, reason="no", decided_by="ana")

    assert json.loads(plain.model_dump_json()) == {
        "approved": False,
        "edited_args": None,
        "reason": "no",
        "decided_by": "ana",
    }
    assert "response" not in plain.model_dump()
    assert json.loads(ANSWERED.model_dump_json())["response"] == TEXT
    assert Decision.model_validate_json(ANSWERED.model_dump_json()) == ANSWERED


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(min_size=1, max_size=MAX_RESPONSE).filter(lambda t: t.strip() != ""))
def test_any_answer_comes_back_to_the_model_exactly_as_written(text: str) -> None:
    for answer in (
        {"type": "respond", "message": text},
        {"action": "respond", "message": text},
        ToolDecision(action="respond", message=text),
    ):
        decision = as_decision(answer, decided_by="ana")
        stored = Decision.model_validate_json(decision.model_dump_json())
        assert stored.response == text and not stored.approved


@pytest.mark.parametrize("blank", ["", " ", "\n", "\t \r\n", "\u00a0", "\u2003"])
def test_a_blank_answer_is_refused_whatever_the_spaces(blank: str) -> None:
    assert refused({"type": "respond", "message": blank}) == ["message"]
