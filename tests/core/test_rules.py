"""Interrupt rules and the predicates they test a call's arguments with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from nodbot.core import (
    ConfigurationError,
    InterruptRule,
    Predicate,
    all_fields,
    any_field,
    eq,
    ge,
    gt,
    le,
    lt,
    matches,
    should_interrupt,
)

Comparator = Callable[[str, Any], Predicate]


# --- The seed's example ---------------------------------------------------------------------


def test_seed_example_gives_true_false_true_false() -> None:
    rules = [InterruptRule(tool="refund", match=gt("amount", 100))]

    results = [
        should_interrupt(rules, "refund", {"amount": 120.0}),
        should_interrupt(rules, "refund", {"amount": 20.0}),
        should_interrupt(rules, "refund", {"amount": "a lot"}),
        should_interrupt(rules, "lookup_order", {"order_id": "A-1001"}),
    ]

    assert results == [True, False, True, False]
    assert all(type(result) is bool for result in results)


# --- InterruptRule(tool=...) and match=None -------------------------------------------------


def test_rule_without_match_asks_for_every_call_of_its_tool() -> None:
    rules = [InterruptRule(tool="delete_user")]

    assert should_interrupt(rules, "delete_user", {}) is True
    assert should_interrupt(rules, "delete_user", {"user_id": 7}) is True
    assert should_interrupt(rules, "delete_user", {"anything": [1, 2], "x": None}) is True


def test_rule_without_match_ignores_other_tools() -> None:
    rules = [InterruptRule(tool="delete_user")]

    assert should_interrupt(rules, "lookup_user", {"user_id": 7}) is False
    assert should_interrupt(rules, "delete_user_later", {}) is False
    assert should_interrupt(rules, "Delete_User", {}) is False


def test_rule_match_defaults_to_none_and_description_is_kept() -> None:
    rule = InterruptRule(tool="refund", description="refunds cost money")

    assert rule.match is None
    assert rule.description == "refunds cost money"
    assert rule.matches({}) is True


def test_applies_to_names_only_its_own_tool() -> None:
    rule = InterruptRule(tool="refund")

    assert rule.applies_to("refund") is True
    assert rule.applies_to("lookup_order") is False
    assert rule.applies_to("*") is False


@pytest.mark.parametrize("tool", ["refund", "lookup_order", "send_email", "x"])
def test_star_rule_without_match_asks_for_every_tool(tool: str) -> None:
    rule = InterruptRule(tool="*")

    assert rule.applies_to(tool) is True
    assert should_interrupt([rule], tool, {}) is True


def test_star_rule_with_predicate_asks_only_when_it_matches() -> None:
    rules = [InterruptRule(tool="*", match=eq("dry_run", False))]

    assert should_interrupt(rules, "refund", {"dry_run": False}) is True
    assert should_interrupt(rules, "send_email", {"dry_run": False}) is True
    assert should_interrupt(rules, "refund", {"dry_run": True}) is False
    assert should_interrupt(rules, "send_email", {"dry_run": True}) is False


def test_star_rule_predicate_that_raises_asks_for_any_tool() -> None:
    rules = [InterruptRule(tool="*", match=gt("amount", 100))]

    assert should_interrupt(rules, "lookup_order", {"order_id": "A-1"}) is True


def test_no_rules_never_asks() -> None:
    assert should_interrupt([], "refund", {"amount": 1_000_000}) is False


# --- Several rules ---------------------------------------------------------------------------


def test_any_matching_rule_asks() -> None:
    rules = [
        InterruptRule(tool="refund", match=gt("amount", 100)),
        InterruptRule(tool="refund", match=eq("currency", "BTC")),
    ]

    assert should_interrupt(rules, "refund", {"amount": 500, "currency": "EUR"}) is True
    assert should_interrupt(rules, "refund", {"amount": 20, "currency": "BTC"}) is True
    assert should_interrupt(rules, "refund", {"amount": 500, "currency": "BTC"}) is True
    assert should_interrupt(rules, "refund", {"amount": 20, "currency": "EUR"}) is False


def test_result_does_not_depend_on_rule_order() -> None:
    rules = [
        InterruptRule(tool="refund", match=gt("amount", 100)),
        InterruptRule(tool="*", match=eq("currency", "BTC")),
        InterruptRule(tool="delete_user"),
    ]
    calls: list[tuple[str, dict[str, Any]]] = [
        ("refund", {"amount": 500, "currency": "EUR"}),
        ("refund", {"amount": 20, "currency": "EUR"}),
        ("lookup_order", {"currency": "BTC"}),
        ("lookup_order", {"currency": "EUR"}),
        ("delete_user", {"user_id": 1}),
    ]

    forward = [should_interrupt(rules, tool, args) for tool, args in calls]
    backward = [should_interrupt(list(reversed(rules)), tool, args) for tool, args in calls]

    assert forward == backward == [True, False, True, False, True]


def test_rules_for_other_tools_are_not_consulted() -> None:
    """A predicate written for another tool's arguments would raise, which counts as a match."""
    seen: list[Mapping[str, Any]] = []

    def strict_amount(arguments: Mapping[str, Any]) -> bool:
        seen.append(arguments)
        return bool(arguments["amount"] > 100)

    rules = [InterruptRule(tool="refund", match=strict_amount)]

    assert should_interrupt(rules, "lookup_order", {"order_id": "A-1"}) is False
    assert seen == []


def test_later_rules_are_not_consulted_after_a_match() -> None:
    seen: list[str] = []

    def record(name: str, answer: bool) -> Callable[[Mapping[str, Any]], bool]:
        def predicate(arguments: Mapping[str, Any]) -> bool:
            seen.append(name)
            return answer

        return predicate

    rules = [
        InterruptRule(tool="refund", match=record("first", False)),
        InterruptRule(tool="refund", match=record("second", True)),
        InterruptRule(tool="refund", match=record("third", True)),
    ]

    assert should_interrupt(rules, "refund", {}) is True
    assert seen == ["first", "second"]


def test_rules_may_be_any_iterable() -> None:
    rules = (rule for rule in [InterruptRule(tool="refund", match=gt("amount", 100))])

    assert should_interrupt(rules, "refund", {"amount": 101}) is True


def test_a_non_matching_rule_for_the_tool_does_not_block_a_star_rule() -> None:
    rules = [
        InterruptRule(tool="refund", match=gt("amount", 100)),
        InterruptRule(tool="*"),
    ]

    assert should_interrupt(rules, "refund", {"amount": 1}) is True


# --- Custom match callables -----------------------------------------------------------------


def test_custom_callable_match_is_used() -> None:
    rule = InterruptRule(tool="send_email", match=lambda args: args["to"].endswith("@ext.com"))

    assert rule.matches({"to": "bob@ext.com"}) is True
    assert rule.matches({"to": "bob@corp.com"}) is False


@pytest.mark.parametrize(
    ("answer", "expected"), [("yes", True), (1, True), (0, False), ("", False)]
)
def test_match_result_is_converted_to_bool(answer: object, expected: bool) -> None:
    rule = InterruptRule(tool="t", match=lambda args: answer)  # type: ignore[arg-type,return-value]

    assert rule.matches({}) is expected
    assert should_interrupt([rule], "t", {}) is expected


@pytest.mark.parametrize(
    "error", [ValueError("bad"), KeyError("x"), TypeError("t"), ZeroDivisionError()]
)
def test_custom_callable_that_raises_counts_as_a_match(error: Exception) -> None:
    def broken(arguments: Mapping[str, Any]) -> bool:
        raise error

    rule = InterruptRule(tool="t", match=broken)

    assert rule.matches({"a": 1}) is True
    assert should_interrupt([rule], "t", {"a": 1}) is True


# --- Comparison predicates ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicate", "value", "expected"),
    [
        (gt("amount", 100), 101, True),
        (gt("amount", 100), 100.5, True),
        (gt("amount", 100), 100, False),
        (gt("amount", 100), 99, False),
        (ge("amount", 100), 101, True),
        (ge("amount", 100), 100, True),
        (ge("amount", 100), 100.0, True),
        (ge("amount", 100), 99.99, False),
        (lt("amount", 100), 99, True),
        (lt("amount", 100), -5, True),
        (lt("amount", 100), 100, False),
        (lt("amount", 100), 101, False),
        (le("amount", 100), 99, True),
        (le("amount", 100), 100, True),
        (le("amount", 100), 100.01, False),
        (le("amount", 100), 200, False),
        (eq("currency", "EUR"), "EUR", True),
        (eq("currency", "EUR"), "USD", False),
        (eq("currency", "EUR"), "eur", False),
        (eq("amount", 100), 100.0, True),
        (eq("amount", 100), 101, False),
        (eq("dry_run", False), False, True),
        (eq("dry_run", False), True, False),
    ],
)
def test_comparison_true_and_false_cases(
    predicate: Predicate, value: object, expected: bool
) -> None:
    field = predicate.field  # type: ignore[attr-defined]
    arguments = {field: value, "other": "ignored"}

    assert predicate(arguments) is expected
    rule = InterruptRule(tool="t", match=predicate)
    assert rule.matches(arguments) is expected
    assert should_interrupt([rule], "t", arguments) is expected


def test_comparisons_work_on_strings_too() -> None:
    assert gt("name", "m")({"name": "zed"}) is True
    assert gt("name", "m")({"name": "abe"}) is False
    assert le("day", "2024-05-01")({"day": "2024-04-30"}) is True


@pytest.mark.parametrize("factory", [gt, ge, lt, le, eq])
def test_comparisons_are_predicates(factory: Comparator) -> None:
    assert isinstance(factory("amount", 1), Predicate)


@pytest.mark.parametrize("factory", [gt, ge, lt, le, eq])
def test_comparison_on_missing_argument_raises_and_counts_as_a_match(
    factory: Comparator,
) -> None:
    predicate = factory("amount", 100)
    arguments = {"order_id": "A-1"}

    with pytest.raises(KeyError):
        predicate(arguments)
    assert InterruptRule(tool="refund", match=predicate).matches(arguments) is True
    assert should_interrupt([InterruptRule("refund", predicate)], "refund", arguments) is True


@pytest.mark.parametrize("factory", [gt, ge, lt, le])
@pytest.mark.parametrize("value", ["a lot", None, [120], {"value": 120}])
def test_ordering_another_type_raises_and_counts_as_a_match(
    factory: Comparator, value: object
) -> None:
    predicate = factory("amount", 100)
    arguments = {"amount": value}

    with pytest.raises(TypeError):
        predicate(arguments)
    assert should_interrupt([InterruptRule("refund", predicate)], "refund", arguments) is True


# --- matches --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        (r"@ext\.com$", "bob@ext.com", True),
        (r"@ext\.com$", "bob@corp.com", False),
        (r"@ext\.com$", "bob@ext.com.evil", False),
        ("ext", "bob@ext.com", True),  # searched, not matched from the start
        ("^ext$", "bob@ext.com", False),  # anchors match the whole value
        ("^ext$", "ext", True),
        ("(?i)^DROP ", "drop table users", True),
        ("x", "", False),
    ],
)
def test_matches_searches_the_string(pattern: str, value: str, expected: bool) -> None:
    predicate = matches("to", pattern)

    assert predicate({"to": value}) is expected
    assert should_interrupt([InterruptRule("send", predicate)], "send", {"to": value}) is expected


@pytest.mark.parametrize("value", [123, None, ["bob@ext.com"], b"bob@ext.com", 1.5])
def test_matches_on_a_non_string_raises_and_counts_as_a_match(value: object) -> None:
    predicate = matches("to", r"@ext\.com$")

    with pytest.raises(TypeError, match=r"to is .*not a string"):
        predicate({"to": value})
    assert should_interrupt([InterruptRule("send", predicate)], "send", {"to": value}) is True


def test_matches_on_a_missing_argument_counts_as_a_match() -> None:
    predicate = matches("to", r"@ext\.com$")

    with pytest.raises(KeyError):
        predicate({"cc": "x@ext.com"})
    assert should_interrupt([InterruptRule("send", predicate)], "send", {"cc": "x"}) is True


# --- all_fields / any_field -----------------------------------------------------------------

EXT = r"@ext\.com$"


@pytest.mark.parametrize(
    ("to", "cc", "expected"),
    [
        ("a@ext.com", "b@ext.com", True),
        ("a@ext.com", "b@corp.com", False),
        ("a@corp.com", "b@ext.com", False),
        ("a@corp.com", "b@corp.com", False),
    ],
)
def test_all_fields_needs_every_pattern(to: str, cc: str, expected: bool) -> None:
    predicate = all_fields(to=EXT, cc=EXT)
    arguments = {"to": to, "cc": cc}

    assert predicate(arguments) is expected
    assert should_interrupt([InterruptRule("send", predicate)], "send", arguments) is expected


@pytest.mark.parametrize(
    ("to", "cc", "expected"),
    [
        ("a@ext.com", "b@ext.com", True),
        ("a@ext.com", "b@corp.com", True),
        ("a@corp.com", "b@ext.com", True),
        ("a@corp.com", "b@corp.com", False),
    ],
)
def test_any_field_needs_one_pattern(to: str, cc: str, expected: bool) -> None:
    predicate = any_field(to=EXT, cc=EXT)
    arguments = {"to": to, "cc": cc}

    assert predicate(arguments) is expected
    assert should_interrupt([InterruptRule("send", predicate)], "send", arguments) is expected


def test_field_patterns_accept_a_mapping_and_keywords_together() -> None:
    predicate = all_fields({"to": EXT}, subject="^URGENT")

    assert predicate({"to": "a@ext.com", "subject": "URGENT: pay"}) is True
    assert predicate({"to": "a@ext.com", "subject": "hello"}) is False
    assert predicate({"to": "a@corp.com", "subject": "URGENT: pay"}) is False


def test_field_pattern_keywords_override_the_mapping() -> None:
    predicate = any_field({"to": "corp"}, to="ext")

    assert predicate({"to": "a@ext.com"}) is True
    assert predicate({"to": "a@corp.com"}) is False


def test_field_patterns_are_searched_not_matched_whole() -> None:
    assert any_field(body="password")({"body": "my password is hunter2"}) is True


def test_all_fields_with_a_missing_argument_counts_as_a_match() -> None:
    predicate = all_fields(to=EXT, cc=EXT)
    rule = InterruptRule("send", predicate)

    with pytest.raises(KeyError):
        predicate({"to": "a@ext.com"})
    assert should_interrupt([rule], "send", {"to": "a@ext.com"}) is True


def test_all_fields_with_a_non_string_argument_counts_as_a_match() -> None:
    rule = InterruptRule("send", all_fields(to=EXT, cc=EXT))

    assert should_interrupt([rule], "send", {"to": "a@ext.com", "cc": ["b@ext.com"]}) is True


def test_any_field_with_a_missing_argument_counts_as_a_match() -> None:
    predicate = any_field(to=EXT, cc=EXT)

    assert should_interrupt([InterruptRule("send", predicate)], "send", {"to": "a@corp.com"})
    assert should_interrupt([InterruptRule("send", predicate)], "send", {}) is True


def test_any_field_with_a_non_string_argument_counts_as_a_match() -> None:
    predicate = any_field(to=EXT, cc=EXT)
    arguments = {"to": "a@corp.com", "cc": None}

    with pytest.raises(TypeError):
        predicate(arguments)
    assert should_interrupt([InterruptRule("send", predicate)], "send", arguments) is True


def test_field_patterns_are_predicates() -> None:
    assert isinstance(all_fields(to=EXT), Predicate)
    assert isinstance(any_field(to=EXT), Predicate)
    assert isinstance(matches("to", EXT), Predicate)


# --- describe() -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicate", "text"),
    [
        (gt("amount", 100), "amount > 100"),
        (ge("amount", 100), "amount >= 100"),
        (lt("amount", 2.5), "amount < 2.5"),
        (le("amount", 0), "amount <= 0"),
        (eq("currency", "EUR"), "currency == 'EUR'"),
        (eq("dry_run", False), "dry_run == False"),
        (eq("note", None), "note == None"),
        (matches("to", r"@ext\.com$"), r"to matches '@ext\\.com$'"),
        (matches("sql", "^DROP"), "sql matches '^DROP'"),
        (all_fields(to="ext", cc="corp"), "to matches 'ext' and cc matches 'corp'"),
        (any_field(to="ext", cc="corp"), "to matches 'ext' or cc matches 'corp'"),
        (all_fields(to="ext"), "to matches 'ext'"),
        (any_field({"a": "1"}, b="2", c="3"), "a matches '1' or b matches '2' or c matches '3'"),
    ],
)
def test_describe(predicate: Predicate, text: str) -> None:
    assert predicate.describe() == text


# --- Bad definitions ------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [gt, ge, lt, le, eq])
@pytest.mark.parametrize("field", ["", None, 3])
def test_comparison_without_an_argument_name_is_refused(factory: Comparator, field: object) -> None:
    name = factory.__name__

    with pytest.raises(ConfigurationError, match=rf"^{name}\(\) needs an argument name, not "):
        factory(field, 100)  # type: ignore[arg-type]


def test_gt_with_empty_field_names_the_problem() -> None:
    with pytest.raises(ConfigurationError) as caught:
        gt("", 100)

    assert caught.value.message == "gt() needs an argument name, not ''"


def test_invalid_regex_in_matches_names_the_field() -> None:
    with pytest.raises(ConfigurationError, match="not a valid regular expression") as caught:
        matches("recipient", "(unclosed")

    assert "'recipient'" in caught.value.message


@pytest.mark.parametrize("factory", [all_fields, any_field])
def test_invalid_regex_in_field_patterns_names_the_bad_field(
    factory: Callable[..., Predicate],
) -> None:
    with pytest.raises(ConfigurationError, match="not a valid regular expression") as caught:
        factory(to=r"@ext\.com$", cc="[unclosed")

    assert "'cc'" in caught.value.message
    assert "'to'" not in caught.value.message


@pytest.mark.parametrize("pattern", [3, None, b"bytes"])
def test_non_string_pattern_is_refused_naming_the_field(pattern: object) -> None:
    with pytest.raises(ConfigurationError, match="the pattern for 'to' must be a string"):
        matches("to", pattern)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="the pattern for 'cc' must be a string"):
        all_fields(to="ok", cc=pattern)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: all_fields(),
        lambda: all_fields({}),
        lambda: any_field(),
        lambda: any_field({}),
    ],
)
def test_field_patterns_need_at_least_one_field(make: Callable[[], Predicate]) -> None:
    with pytest.raises(ConfigurationError, match="need at least one field"):
        make()


@pytest.mark.parametrize("tool", [3, None, ["refund"], b"refund", ""])
def test_rule_tool_must_be_a_name(tool: object) -> None:
    with pytest.raises(ConfigurationError, match=r"InterruptRule\.tool must be a tool name") as e:
        InterruptRule(tool=tool)  # type: ignore[arg-type]

    assert repr(tool) in e.value.message


@pytest.mark.parametrize("match", [5, "amount > 100", True, {"amount": 100}])
def test_rule_match_must_be_callable(match: object) -> None:
    with pytest.raises(ConfigurationError, match=r"InterruptRule\.match for 'refund'") as e:
        InterruptRule(tool="refund", match=match)  # type: ignore[arg-type]

    assert "must be a predicate" in e.value.message
    assert repr(match) in e.value.message


# --- undecidable values fail closed ---------------------------------------------------------


@pytest.mark.parametrize("predicate", [gt("amount", 100), le("amount", 100), eq("amount", 1.0)])
def test_nan_counts_as_a_match(predicate: Predicate) -> None:
    rule = InterruptRule(tool="refund", match=predicate)
    assert rule.matches({"amount": float("nan")})


@pytest.mark.parametrize(
    ("actual", "expected", "asks"),
    [
        ("100", 100, True),  # a string where a number was meant: ask
        (True, 1, True),  # a bool is not the number 1 here
        (100, 100.0, True),  # int and float compare as numbers: equal
        (100, 101, False),
        ("EUR", "EUR", True),
        ("USD", "EUR", False),
    ],
)
def test_eq_across_types_counts_as_a_match(actual: object, expected: object, asks: bool) -> None:
    rule = InterruptRule(tool="refund", match=eq("amount", expected))
    assert rule.matches({"amount": actual}) is asks


@pytest.mark.parametrize("build", [all_fields, any_field])
def test_field_patterns_do_not_depend_on_field_order(build: Any) -> None:
    forward = InterruptRule(tool="*", match=build({"to": r"@ext\.com$", "cc": r"@ext\.com$"}))
    backward = InterruptRule(tool="*", match=build({"cc": r"@ext\.com$", "to": r"@ext\.com$"}))
    arguments = {"to": "a@home.org"}  # cc is missing: undecidable, so both ask
    assert forward.matches(arguments) is True
    assert backward.matches(arguments) is True


@pytest.mark.parametrize("field", ["", None])
def test_matches_needs_a_field_name(field: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"matches\(\) needs an argument name"):
        matches(field, "x")
