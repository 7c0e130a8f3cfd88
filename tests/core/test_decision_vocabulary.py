"""Every form of answer the seeds use, through `Executor.decide` on a real SQLite store.

Seed 000/001 answer `True` or a `ToolDecision` (or its dict); seed 002 answers as LangChain's
`HumanInTheLoopMiddleware` (`{"type": "approve" | "edit" | "reject", ...}`, an edit as
`edited_action: {name, args}`); seed 003 names the edit `edited_arguments` and records a
`Decision`. Each is recorded as the decision it means and the resumed call runs (or not)
accordingly; LangChain's `respond` is recorded as the answer in the tool's place
(tests/core/test_respond.py follows it through). An answer of no known form and an edit
naming another tool raise `InvalidDecisionError` and record nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.core import (
    Decision,
    DeferredApproval,
    Executor,
    InvalidDecisionError,
    SqlApprovalStore,
    ToolCall,
    ToolDecision,
    ToolRegistry,
    as_decision,
)

ORDER = {"order_id": "o-7", "amount": 500.0}
EDITED = {"order_id": "o-7", "amount": 450.0}


@dataclass
class Desk:
    """A real SQLite store, an executor whose `refund` tool always needs review, and the
    refunds that ran."""

    store: SqlApprovalStore
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


@pytest.fixture
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    ran: list[tuple[str, float]] = []
    registry = ToolRegistry()

    @registry.tool(confirm=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        yield Desk(store, Executor(registry, approval=DeferredApproval(store)), ran)


def approve(**fields: Any) -> Decision:
    return Decision(approved=True, decided_by="ana", **fields)


def deny(reason: str | None = None) -> Decision:
    return Decision(approved=False, reason=reason, decided_by="ana")


LANGCHAIN_EDIT = {"type": "edit", "edited_action": {"name": "refund", "args": EDITED}}

# (answer, the decision recorded when "ana" decides)
FORMS = [
    # seed 000 / 001
    pytest.param(True, approve(), id="True"),
    pytest.param(False, deny(), id="False"),
    pytest.param(None, deny(), id="None"),
    pytest.param(ToolDecision(action="approve"), approve(), id="ToolDecision-approve"),
    pytest.param(
        ToolDecision(action="edit", arguments={"amount": 450.0}),
        approve(edited_args={"amount": 450.0}),
        id="ToolDecision-edit",
    ),
    pytest.param(
        ToolDecision(action="deny", message="too much"), deny("too much"), id="ToolDecision-deny"
    ),
    pytest.param({"action": "approve"}, approve(), id="action-approve"),
    pytest.param(
        {"action": "edit", "arguments": {"amount": 450.0}},
        approve(edited_args={"amount": 450.0}),
        id="action-edit",
    ),
    pytest.param({"action": "deny", "message": "no"}, deny("no"), id="action-deny"),
    # seed 003: the edit named edited_arguments, beside arguments
    pytest.param(
        {"action": "edit", "edited_arguments": {"amount": 450.0}},
        approve(edited_args={"amount": 450.0}),
        id="edited_arguments",
    ),
    pytest.param(
        {"action": "edit", "arguments": {"amount": 450.0}, "edited_arguments": {"amount": 450.0}},
        approve(edited_args={"amount": 450.0}),
        id="arguments-and-the-same-edited_arguments",
    ),
    pytest.param(
        Decision(approved=True, edited_args={"amount": 450.0}, reason="checked", decided_by="bob"),
        Decision(approved=True, edited_args={"amount": 450.0}, reason="checked", decided_by="bob"),
        id="Decision",
    ),
    pytest.param(
        {"approved": False, "reason": "policy"}, deny("policy"), id="Decision-dict-denied"
    ),
    # seed 002: LangChain's HumanInTheLoopMiddleware
    pytest.param({"type": "approve"}, approve(), id="langchain-approve"),
    pytest.param(LANGCHAIN_EDIT, approve(edited_args=EDITED), id="langchain-edit"),
    pytest.param({"type": "reject"}, deny(), id="langchain-reject"),
    pytest.param(
        {"type": "reject", "message": "User rejected this action."},
        deny("User rejected this action."),
        id="langchain-reject-message",
    ),
]


@pytest.mark.parametrize(("answer", "expected"), FORMS)
async def test_each_form_is_recorded_as_its_decision_and_the_call_resumes_so(
    desk: Desk, answer: object, expected: Decision
) -> None:
    call, run_id, approval_id = await desk.pending()

    record = await desk.executor.decide(approval_id, answer, decided_by="ana")

    assert record.decision == expected
    assert (await desk.store.get(approval_id)).decision == expected
    resumed = await desk.executor.run_call(call, desk.executor.context(run_id=run_id))
    if expected.approved:
        amount = (expected.edited_args or {}).get("amount", ORDER["amount"])
        assert (resumed.status, desk.ran) == ("ok", [("o-7", amount)])
    else:
        assert resumed.status == "error" and resumed.error is not None
        assert resumed.error.kind == "approval-denied"
        assert resumed.error.details.get("reason") == expected.reason
        assert desk.ran == []


async def test_a_langchain_edit_naming_another_tool_is_refused_and_records_nothing(
    desk: Desk,
) -> None:
    _, _, approval_id = await desk.pending()
    events = len(await desk.store.events(approval_id))
    other = {"type": "edit", "edited_action": {"name": "wire_money", "args": EDITED}}

    with pytest.raises(InvalidDecisionError) as caught:
        await desk.executor.decide(approval_id, other, decided_by="ana")

    [error] = caught.value.errors
    assert error["field"] == "edited_action.name"
    assert "'wire_money'" in error["message"] and "'refund'" in error["message"]
    assert await desk.untouched(approval_id, events)
    # The same edit for the call's own tool is taken.
    record = await desk.executor.decide(approval_id, LANGCHAIN_EDIT, decided_by="ana")
    assert record.decision == approve(edited_args=EDITED)


def test_a_langchain_edit_is_not_taken_without_the_tool_to_check_it_against() -> None:
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(LANGCHAIN_EDIT)

    assert [e["field"] for e in caught.value.errors] == ["edited_action.name"]
    assert as_decision(LANGCHAIN_EDIT, tool="refund") == Decision(approved=True, edited_args=EDITED)


async def test_respond_is_recorded_as_the_answer_in_the_tools_place(desk: Desk) -> None:
    call, run_id, approval_id = await desk.pending()

    record = await desk.executor.decide(
        approval_id, {"type": "respond", "message": "it is Tuesday"}, decided_by="ana"
    )

    assert record.decision == Decision(approved=False, response="it is Tuesday", decided_by="ana")
    resumed = await desk.executor.run_call(call, desk.executor.context(run_id=run_id))
    assert (resumed.status, resumed.value, desk.ran) == ("ok", "it is Tuesday", [])


NO_FORM = [
    pytest.param({"decision": "yes"}, id="decision-yes"),
    pytest.param({"approve": True}, id="approve-key"),
    pytest.param({}, id="empty-dict"),
    pytest.param({"decisions": [{"type": "approve"}]}, id="langchain-resume-envelope"),
    pytest.param("yes", id="'yes'"),
    pytest.param("approve", id="'approve'"),
    pytest.param(1, id="1"),
    pytest.param(0, id="0"),
    pytest.param(1.0, id="1.0"),
    pytest.param([True], id="[True]"),
    pytest.param((), id="()"),
    pytest.param(object(), id="object()"),
]


@pytest.mark.parametrize("answer", NO_FORM)
async def test_an_answer_of_no_known_form_raises_and_records_nothing(
    desk: Desk, answer: object
) -> None:
    _, _, approval_id = await desk.pending()
    events = len(await desk.store.events(approval_id))

    with pytest.raises(InvalidDecisionError) as caught:
        await desk.executor.decide(approval_id, answer, decided_by="ana")

    assert [e["field"] for e in caught.value.errors] == ["(decision)"]
    assert caught.value.message.startswith("not a decision: ")
    assert await desk.untouched(approval_id, events)


def test_the_error_names_the_keys_of_an_unknown_mapping_and_the_langchain_envelope() -> None:
    with pytest.raises(InvalidDecisionError, match="'decision'"):
        as_decision({"decision": "yes"})
    with pytest.raises(InvalidDecisionError, match="one decision per call"):
        as_decision({"decisions": [{"type": "approve"}]})
    with pytest.raises(InvalidDecisionError, match="a str is no decision"):
        as_decision("yes")


def test_the_error_shows_untrusted_keys_bounded() -> None:
    keys = {f"{'k' * 500}{n}": n for n in range(50)}

    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(keys)

    assert len(caught.value.message) < 600


def test_the_problems_of_a_malformed_form_are_listed_bounded() -> None:
    answer = {"action": "approve", **{f"{'k' * 500}{n}": n for n in range(50)}}

    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(answer)

    errors = caught.value.errors
    assert len(errors) == 11 and errors[-1] == {
        "field": "(decision)",
        "message": "and 40 more problems",
    }
    assert all(len(e["field"]) <= 40 for e in errors)
    assert len(caught.value.message) < 1500


MALFORMED = [
    pytest.param(
        {"action": "edit", "arguments": {"amount": 1.0}, "edited_arguments": {"amount": 2.0}},
        "edited_arguments",
        id="arguments-and-other-edited_arguments",
    ),
    pytest.param(
        {"action": "approve", "edited_arguments": {"amount": 1.0}},
        "edited_arguments",
        id="approve-with-edited_arguments",
    ),
    pytest.param({"type": "edit"}, "edited_action", id="edit-without-edited_action"),
    pytest.param(
        {"type": "edit", "edited_action": {"name": "refund", "args": {}}},
        "edited_action.args",
        id="edit-with-no-args",
    ),
    pytest.param(
        {"type": "edit", "edited_action": {"name": "refund"}},
        "edited_action.args",
        id="edited_action-without-args",
    ),
    pytest.param(
        {"type": "approve", "edited_action": {"name": "refund", "args": EDITED}},
        "edited_action",
        id="approve-with-edited_action",
    ),
    pytest.param({"type": "reject", "message": 5}, "message", id="message-not-text"),
    pytest.param({"type": "maybe"}, "type", id="unknown-type"),
    pytest.param(
        {"type": "approve", "arguments": {"amount": 1}}, "arguments", id="type-with-arguments"
    ),
    pytest.param({"type": "approve", "approved": True}, "type", id="type-and-approved"),
]


@pytest.mark.parametrize(("answer", "field_name"), MALFORMED)
async def test_a_malformed_form_names_the_field_and_records_nothing(
    desk: Desk, answer: dict[str, Any], field_name: str
) -> None:
    _, _, approval_id = await desk.pending()
    events = len(await desk.store.events(approval_id))

    with pytest.raises(InvalidDecisionError) as caught:
        await desk.executor.decide(approval_id, answer, decided_by="ana")

    assert field_name in [e["field"] for e in caught.value.errors]
    assert field_name in caught.value.message
    assert await desk.untouched(approval_id, events)


# --- any answer ------------------------------------------------------------------------------

FORM_KEYS = ("action", "approved", "type")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
NOT_A_FORM = st.one_of(
    st.dictionaries(st.text(max_size=12).filter(lambda k: k not in FORM_KEYS), JSON, max_size=4),
    st.builds(
        lambda kind, rest: {**rest, "type": kind},
        JSON.filter(lambda v: v not in ("approve", "edit", "reject")),
        st.dictionaries(st.sampled_from(["message", "edited_action", "x"]), JSON, max_size=2),
    ),
    st.builds(
        lambda kind, rest: {**rest, "action": kind},
        JSON.filter(lambda v: v not in ("approve", "edit", "deny")),
        st.dictionaries(st.sampled_from(["message", "arguments", "x"]), JSON, max_size=2),
    ),
    JSON.filter(
        lambda v: not isinstance(v, dict) and v is not True and v is not False and v is not None
    ),
)


@given(answer=NOT_A_FORM)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_any_answer_that_is_not_a_known_form_raises_and_records_nothing(
    desk: Desk, answer: object
) -> None:
    _, _, approval_id = await desk.pending()
    events = len(await desk.store.events(approval_id))

    with pytest.raises(InvalidDecisionError) as caught:
        await desk.executor.decide(approval_id, answer, decided_by="ana")

    assert caught.value.errors
    assert all(set(e) == {"field", "message"} for e in caught.value.errors)
    assert await desk.untouched(approval_id, events)


EDITS = st.fixed_dictionaries(
    {},
    optional={
        "order_id": st.text(min_size=1, max_size=12),
        "amount": st.floats(min_value=0, max_value=1e6, allow_nan=False),
    },
).filter(bool)


@st.composite
def decisions(draw: st.DrawFn) -> Decision:
    """A decision any vocabulary can say: approve, edit (with a note) or deny (with a reason)."""
    approved = draw(st.booleans())
    edited = draw(st.none() | EDITS) if approved else None
    reason = draw(st.none() | st.text(max_size=40))
    return Decision(approved=approved, edited_args=edited, reason=reason)


def said_as(decision: Decision, vocabulary: str) -> object:
    """`decision` as `vocabulary` says it."""
    action = "deny" if not decision.approved else "edit" if decision.edited_args else "approve"
    edit, note = decision.edited_args, decision.reason
    if vocabulary == "ToolDecision":
        return ToolDecision(action=action, arguments=edit, message=note)
    if vocabulary in ("action", "edited_arguments"):
        said: dict[str, Any] = {"action": action}
        if edit is not None:
            said["arguments" if vocabulary == "action" else "edited_arguments"] = edit
    elif vocabulary == "langchain":
        said = {"type": {"deny": "reject"}.get(action, action)}
        if edit is not None:
            said["edited_action"] = {"name": "refund", "args": edit}
    elif vocabulary == "Decision":
        return decision
    else:
        return decision.model_dump(exclude_none=True)
    if note is not None:
        said["message"] = note
    return said


VOCABULARIES = ["ToolDecision", "action", "edited_arguments", "langchain", "Decision", "dict"]


@given(decision=decisions(), vocabulary=st.sampled_from(VOCABULARIES))
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
async def test_any_known_form_is_recorded_as_the_decision_it_says(
    desk: Desk, decision: Decision, vocabulary: str
) -> None:
    _, _, approval_id = await desk.pending()
    answer = said_as(decision, vocabulary)

    record = await desk.executor.decide(approval_id, answer, decided_by="ana")

    expected = decision.model_copy(update={"decided_by": "ana"})
    assert record.decision == expected
    assert (await desk.store.get(approval_id)).decision == expected
    assert as_decision(answer, decided_by="ana", tool="refund") == expected
