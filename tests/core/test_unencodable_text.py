"""A string UTF-8 cannot carry (a lone surrogate, which a model's JSON `\\ud800` escape makes)
is refused where it comes in, naming where it is: a tool call's arguments (an invalid-arguments
result the model can read, nothing stored), a question, a call checked against a JSON schema.
Before, it reached the digest and the executor raised `UnicodeEncodeError`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodbot.core import (
    DeferredApproval,
    Executor,
    InvalidQuestionError,
    MemoryApprovalStore,
    SqlApprovalStore,
    ToolCall,
    ToolRegistry,
)
from nodbot.core.arguments_schema import schema_errors
from nodbot.core.questions import make_question
from nodbot.core.tools import NOT_TEXT, unencodable

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=20)


@st.composite
def spoiled(draw: st.DrawFn, text: st.SearchStrategy[str] = TEXT) -> str:
    """Text (of `text`) with a lone surrogate somewhere in it."""
    before, after = draw(text), draw(text)
    return before + draw(SURROGATES) + after


registry = ToolRegistry()


@registry.tool(confirm=True)
def refund(order_id: str, notes: list[str], amount: float = 1.0) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


async def run_with(store: Any, arguments: dict[str, Any]) -> Any:
    executor = Executor(registry, approval=DeferredApproval(store))
    call = ToolCall(name="refund", arguments=arguments, id="call_1")
    return await executor.run_call(call, executor.context("run_1"))


@settings(max_examples=40, deadline=None)
@given(bad=spoiled(), where=st.sampled_from(["order_id", "notes"]), index=st.integers(0, 2))
def test_a_call_whose_argument_is_not_text_is_invalid_and_stores_nothing(
    bad: str, where: str, index: int
) -> None:
    notes = ["fine"] * 3
    arguments: dict[str, Any] = {"order_id": "o-1", "notes": notes}
    if where == "order_id":
        arguments["order_id"] = bad
        field = "order_id"
    else:
        notes[index] = bad
        field = f"notes.{index}"

    async def check() -> None:
        store = MemoryApprovalStore()
        result = await run_with(store, arguments)
        assert result.status == "error" and result.error is not None
        assert result.error.kind == "invalid-arguments"
        assert result.error.details["errors"] == [{"field": field, "message": NOT_TEXT}]
        assert await store.list() == []

    asyncio.run(check())


async def test_the_sql_store_is_never_reached_with_such_text(tmp_path: Path) -> None:
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        result = await run_with(store, {"order_id": "o-\udfff", "notes": []})
        assert result.error is not None and result.error.kind == "invalid-arguments"
        assert await store.list() == []
        fine = await run_with(store, {"order_id": "o-é✓", "notes": ["ü"]})
        assert fine.status == "pending"  # text of any script is text


@settings(max_examples=40, deadline=None)
@given(bad=spoiled(LINE), index=st.integers(0, 2))
def test_a_question_or_choice_that_is_not_text_is_refused_naming_it(bad: str, index: int) -> None:
    """(A choice of one line, as choices are: a choice of two is refused for that first.)"""
    with pytest.raises(InvalidQuestionError) as question:
        make_question(f"Which one? {bad}")
    assert question.value.errors == [{"field": "question", "message": NOT_TEXT}]
    choices = ["Leeds", "Porto", "Oslo"]
    choices[index] = f"x{bad}"
    with pytest.raises(InvalidQuestionError) as choice:
        make_question("Which one?", choices=choices)
    assert choice.value.errors == [{"field": f"choices.{index}", "message": NOT_TEXT}]


def test_a_call_checked_against_a_schema_names_the_field() -> None:
    schema = {"type": "object", "properties": {"to": {"type": "object"}}}
    value = {"to": {"names": ["ana", "b\ud800b"]}}
    assert schema_errors(schema, value) == [{"field": "to.names.1", "message": NOT_TEXT}]
    assert schema_errors(schema, {"to": {"names": ["ana"]}}) == []


@given(
    value=st.recursive(
        TEXT | st.integers() | st.booleans() | st.none(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
        max_leaves=10,
    )
)
def test_values_of_text_only_have_no_fault(value: Any) -> None:
    assert unencodable(value) is None
    assert unencodable({"wrapped": [value, "\ud800"]}) == "wrapped.1"
