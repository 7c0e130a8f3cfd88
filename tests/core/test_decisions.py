"""Approval interrupt ids, reviewers' answers normalized to decisions, and merged edits."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

import pytest
from pydantic import ValidationError

from nodbot.core import (
    Decision,
    InvalidDecisionError,
    ToolDecision,
    ToolInterrupt,
    approval_interrupt_id,
    as_decision,
    merge_edit,
)

# --- approval_interrupt_id ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call_id", "expected"),
    [
        ("call_1", "approve_call_1"),
        ("AZaz09_-", "approve_AZaz09_-"),
        ("toolu_01A-b_c", "approve_toolu_01A-b_c"),
        ("", "approve_"),
        ("a b", "approve_a.20b"),
        ("a.b", "approve_a.2eb"),
        ("a/b", "approve_a.2fb"),
        ("a:b", "approve_a.3ab"),
        ("call\n", "approve_call.0a"),
        ("é", "approve_.c3.a9"),
        ("café", "approve_caf.c3.a9"),
        ("Ä", "approve_.c3.84"),
        ("\u0663", "approve_.d9.a3"),  # ARABIC-INDIC DIGIT THREE: a digit, but not ASCII
        ("😀", "approve_.f0.9f.98.80"),
        ("a😀b", "approve_a.f0.9f.98.80b"),
        ("..", "approve_.2e.2e"),
    ],
)
def test_approval_interrupt_id(call_id: str, expected: str) -> None:
    assert approval_interrupt_id(call_id) == expected


def test_emoji_is_written_as_four_bytes() -> None:
    escaped = approval_interrupt_id("😀").removeprefix("approve_")

    assert re.fullmatch(r"(\.[0-9a-f]{2}){4}", escaped)
    assert bytes.fromhex(escaped.replace(".", "")) == "😀".encode()


def test_escaped_hex_digits_are_lowercase() -> None:
    escaped = approval_interrupt_id("ÿ\x7f\x1b")

    assert escaped == "approve_.c3.bf.7f.1b"


@pytest.mark.parametrize(
    "call_id", ["a b/c.d", "\u202ertl", "tab\there", "ünïcödé", "x" * 300, "%2F", "😀🎉"]
)
def test_ids_are_always_safe_keys(call_id: str) -> None:
    assert re.fullmatch(r"approve_[A-Za-z0-9_.-]*", approval_interrupt_id(call_id))


def test_different_call_ids_give_different_interrupt_ids() -> None:
    """The escape character is escaped itself, so no two ids collide."""
    call_ids = ["a.b", "a.2eb", "a b", "a.20b", "a_b", "a-b", "é", ".c3.a9", "A", "a"]

    keys = [approval_interrupt_id(call_id) for call_id in call_ids]

    assert len(set(keys)) == len(call_ids)


# --- ToolInterrupt --------------------------------------------------------------------------


def test_tool_interrupt_carries_the_call_and_its_key() -> None:
    interrupt = ToolInterrupt(
        tool_name="refund", tool_call_id="call 7/é", arguments={"amount": 120.0}
    )

    assert interrupt.tool_name == "refund"
    assert interrupt.tool_call_id == "call 7/é"
    assert interrupt.arguments == {"amount": 120.0}
    assert interrupt.key == "approve_call.207.2f.c3.a9"
    assert interrupt.key == approval_interrupt_id(interrupt.tool_call_id)


def test_tool_interrupt_key_for_a_plain_id() -> None:
    assert ToolInterrupt("lookup_order", "call_abc123", {}).key == "approve_call_abc123"


# --- as_decision: approve -------------------------------------------------------------------


def test_true_approves() -> None:
    decision = as_decision(True)

    assert decision == Decision(approved=True)
    assert decision.edited_args is None
    assert decision.reason is None
    assert decision.decided_by is None


def test_true_approves_with_decided_by() -> None:
    assert as_decision(True, decided_by="U123") == Decision(approved=True, decided_by="U123")


def test_tool_decision_approve() -> None:
    decision = as_decision(ToolDecision(action="approve"), decided_by="alice@example.com")

    assert decision == Decision(approved=True, decided_by="alice@example.com")


def test_tool_decision_approve_keeps_its_message_as_a_note() -> None:
    decision = as_decision(ToolDecision(action="approve", message="checked the order"))

    assert decision == Decision(approved=True, reason="checked the order")


# --- as_decision: edit ----------------------------------------------------------------------


def test_tool_decision_edit_approves_with_the_edit() -> None:
    answer = ToolDecision(action="edit", arguments={"amount": 50.0}, message="halved")

    decision = as_decision(answer, decided_by="U1")

    assert decision == Decision(
        approved=True, edited_args={"amount": 50.0}, reason="halved", decided_by="U1"
    )


@pytest.mark.parametrize("arguments", [None, {}])
def test_tool_decision_edit_needs_arguments(arguments: dict[str, Any] | None) -> None:
    with pytest.raises(ValidationError, match="an edit needs the arguments to change"):
        ToolDecision(action="edit", arguments=arguments)


@pytest.mark.parametrize("action", ["approve", "deny"])
def test_tool_decision_arguments_only_with_edit(action: Any) -> None:
    with pytest.raises(ValidationError, match=f"arguments go with action 'edit', not '{action}'"):
        ToolDecision(action=action, arguments={"amount": 1})


# --- as_decision: deny ----------------------------------------------------------------------


def test_tool_decision_deny_gives_the_message_as_reason() -> None:
    decision = as_decision(ToolDecision(action="deny", message="too much"), decided_by="U2")

    assert decision == Decision(approved=False, reason="too much", decided_by="U2")


def test_tool_decision_deny_without_message() -> None:
    assert as_decision(ToolDecision(action="deny")) == Decision(approved=False)


@pytest.mark.parametrize("answer", [False, None], ids=repr)
def test_false_and_none_deny(answer: object) -> None:
    decision = as_decision(answer, decided_by="U9")

    assert decision == Decision(approved=False, decided_by="U9")
    assert decision.approved is False
    assert decision.edited_args is None


@pytest.mark.parametrize(
    "answer",
    ["yes", "approve", "true", 1, 1.0, 0, {}, [], (), [True], {"approve": True}, object()],
    ids=repr,
)
def test_any_other_answer_is_refused_not_read_as_a_denial(answer: object) -> None:
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(answer, decided_by="U9")

    assert caught.value.errors[0]["field"] == "(decision)"


def test_one_does_not_approve() -> None:
    assert _outcome(1) == "refused"
    assert _outcome(1.0) == "refused"


# --- as_decision: Decision passthrough ------------------------------------------------------


def test_decision_passes_through_unchanged() -> None:
    decision = Decision(approved=True, edited_args={"amount": 1}, reason="ok", decided_by="bob")

    assert as_decision(decision) is decision
    assert as_decision(decision, decided_by="alice") is decision


def test_decision_keeps_its_own_decider() -> None:
    decision = Decision(approved=False, reason="no", decided_by="bob")

    assert as_decision(decision, decided_by="alice").decided_by == "bob"


def test_decision_without_decider_gets_the_given_one() -> None:
    decision = Decision(approved=False, reason="no")

    filled = as_decision(decision, decided_by="alice")

    assert filled == Decision(approved=False, reason="no", decided_by="alice")
    assert decision.decided_by is None  # the given decision is left as it was


def test_decision_without_decider_and_none_given_passes_through() -> None:
    decision = Decision(approved=True)

    assert as_decision(decision) is decision


def test_denied_decision_with_edit_is_refused() -> None:
    with pytest.raises(ValidationError, match="edited_args can only go with approved=True"):
        Decision(approved=False, edited_args={"amount": 1})


def test_approved_decision_with_edit_is_allowed() -> None:
    assert Decision(approved=True, edited_args={"amount": 1}).edited_args == {"amount": 1}


def test_decision_refuses_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="bogus"):
        Decision(approved=True, bogus=1)  # type: ignore[call-arg]


# --- as_decision: dict forms ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"action": "approve"}, Decision(approved=True)),
        ({"action": "approve", "message": "fine"}, Decision(approved=True, reason="fine")),
        (
            {"action": "edit", "arguments": {"amount": 50.0}},
            Decision(approved=True, edited_args={"amount": 50.0}),
        ),
        ({"action": "deny", "message": "no"}, Decision(approved=False, reason="no")),
        ({"action": "deny"}, Decision(approved=False)),
        ({"approved": True}, Decision(approved=True)),
        ({"approved": False, "reason": "no"}, Decision(approved=False, reason="no")),
        (
            {"approved": True, "edited_args": {"amount": 5}, "reason": "r"},
            Decision(approved=True, edited_args={"amount": 5}, reason="r"),
        ),
        (MappingProxyType({"action": "approve"}), Decision(approved=True)),
    ],
    ids=repr,
)
def test_dict_forms(answer: object, expected: Decision) -> None:
    assert as_decision(answer) == expected


def test_dict_forms_get_decided_by() -> None:
    assert as_decision({"action": "deny"}, decided_by="U1").decided_by == "U1"
    assert as_decision({"approved": True}, decided_by="U1").decided_by == "U1"


def test_decision_dict_keeps_its_own_decider() -> None:
    answer = {"approved": True, "decided_by": "bob"}

    assert as_decision(answer, decided_by="alice") == Decision(approved=True, decided_by="bob")


# --- as_decision: malformed dicts -----------------------------------------------------------

MALFORMED = [
    pytest.param({"action": "maybe"}, "action", "ToolDecision", id="unknown-action"),
    pytest.param({"action": "edit"}, "arguments", "ToolDecision", id="edit-without-arguments"),
    pytest.param({"action": "edit", "arguments": {}}, "arguments", "ToolDecision", id="edit-empty"),
    pytest.param(
        {"action": "approve", "arguments": {"amount": 1}},
        "arguments",
        "ToolDecision",
        id="approve-with-arguments",
    ),
    pytest.param({"action": "deny", "message": 5}, "message", "ToolDecision", id="message-int"),
    pytest.param(
        {"action": "approve", "approved": True}, "approved", "ToolDecision", id="both-forms"
    ),
    pytest.param({"approved": True, "bogus": 1}, "bogus", "Decision", id="extra-field"),
    pytest.param({"approved": "maybe"}, "approved", "Decision", id="approved-not-bool"),
    pytest.param(
        {"approved": False, "edited_args": {"amount": 1}},
        "edited_args",
        "Decision",
        id="denied-with-edit",
    ),
]


@pytest.mark.parametrize(("answer", "field", "model"), MALFORMED)
def test_malformed_decision_dict_message_names_the_field(
    answer: dict[str, Any], field: str, model: str
) -> None:
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(answer, decided_by="U1")

    error = caught.value
    assert error.message.startswith(f"not a valid {model}: ")
    assert field in error.message
    assert error.kind == "invalid-decision"
    assert error.details() == {"errors": error.errors}


@pytest.mark.parametrize(("answer", "field", "model"), MALFORMED)
def test_malformed_decision_dict_errors_name_the_field(
    answer: dict[str, Any], field: str, model: str
) -> None:
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision(answer)

    errors = caught.value.errors
    assert errors
    assert all(set(entry) == {"field", "message"} for entry in errors)
    assert field in [entry["field"] for entry in errors]


def test_unknown_action_error_lists_the_allowed_actions() -> None:
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision({"action": "maybe"})

    assert caught.value.errors == [
        {"field": "action", "message": "Input should be 'approve', 'edit', 'deny' or 'respond'"}
    ]


def test_extra_field_error() -> None:
    with pytest.raises(InvalidDecisionError) as caught:
        as_decision({"approved": True, "bogus": 1})

    assert caught.value.errors == [{"field": "bogus", "message": "Extra inputs are not permitted"}]
    assert caught.value.message == "not a valid Decision: bogus: Extra inputs are not permitted"


def _outcome(answer: object) -> str:
    try:
        decision = as_decision(answer)
    except InvalidDecisionError:
        return "refused"
    return "approved" if decision.approved else "denied"


@pytest.mark.parametrize("approved", ["yes", "on", "1", 1], ids=["'yes'", "'on'", "'1'", "1"])
def test_decision_dict_with_non_bool_approved_does_not_approve(approved: object) -> None:
    """A bare `1` or `"yes"` is refused, and so is the same value inside a Decision dict."""
    assert _outcome({"approved": approved}) == "refused"


def test_decision_dict_with_bool_approved() -> None:
    assert _outcome({"approved": True}) == "approved"
    assert _outcome({"approved": False}) == "denied"
    assert _outcome({"approved": "maybe"}) == "refused"


# --- merge_edit -----------------------------------------------------------------------------


def test_edit_keys_replace_and_others_are_kept() -> None:
    arguments = {"order_id": "A-1", "amount": 120.0, "currency": "EUR"}

    merged = merge_edit(arguments, {"amount": 50.0})

    assert merged == {"order_id": "A-1", "amount": 50.0, "currency": "EUR"}


def test_edit_cannot_remove_an_argument() -> None:
    arguments = {"order_id": "A-1", "amount": 120.0}

    merged = merge_edit(arguments, {"amount": None})

    assert set(merged) == {"order_id", "amount"}
    assert merged["order_id"] == "A-1"
    assert merged["amount"] is None


def test_edit_may_add_a_key() -> None:
    """The merge itself adds it; validating the merged arguments decides whether it is allowed."""
    assert merge_edit({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}


@pytest.mark.parametrize("edited", [None, {}])
def test_no_edit_keeps_the_arguments(edited: dict[str, Any] | None) -> None:
    arguments = {"order_id": "A-1", "amount": 120.0}

    merged = merge_edit(arguments, edited)

    assert merged == arguments
    assert merged is not arguments


def test_merge_edit_leaves_its_inputs_alone() -> None:
    arguments = {"order_id": "A-1", "amount": 120.0}
    edited = {"amount": 50.0}

    merged = merge_edit(arguments, edited)
    merged["order_id"] = "changed"

    assert arguments == {"order_id": "A-1", "amount": 120.0}
    assert edited == {"amount": 50.0}


def test_merge_edit_accepts_mappings() -> None:
    merged = merge_edit(MappingProxyType({"a": 1, "b": 2}), MappingProxyType({"b": 3}))

    assert merged == {"a": 1, "b": 3}
    assert type(merged) is dict


def test_interrupt_id_of_a_lone_surrogate_is_escaped() -> None:
    # JSON text such as "\ud800" decodes to a lone surrogate; it still gets a safe id.
    assert approval_interrupt_id("a\ud800") == "approve_a.ed.a0.80"
