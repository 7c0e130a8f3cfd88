"""Which calls need a person: interrupt rules and the predicates they test arguments with.

```python
rules = [InterruptRule(tool="refund", match=gt("amount", 100))]
should_interrupt(rules, "refund", {"amount": 120.0})   # True
```

Rules judge the arguments the tool will run with: the executor tests them on the arguments
as the tool's model validated them (types coerced, defaults filled in), never on what the
model wrote.

A predicate can fail to judge a call: an argument is missing, is of another type than the
value it is compared with (`"5000"`, `null`, a list or an object where a number is meant; a
boolean is not a number here), or is NaN. Such a predicate raises, and `judge` says None:
neither a match nor a miss. What None leads to is the safer outcome of the rule it belongs
to (fail closed by the outcome, not by the predicate):

- a rule that asks for review (every `InterruptRule`) or denies counts it as a match: when
  in doubt, a person is asked;
- a rule that approves (or lets a remembered approval decide) counts it as no match: the
  call goes on to the next rule, and in the end to a person. No rule ever approves a call
  it could not judge.

`all` and `any` of several predicates (and `all_fields`, `any_field`) test each of them, so
one that cannot judge makes the whole undecided, whatever the order. Regular expressions
are searched (`re.search`), so anchor them with `^` and `$` to match a whole value.
"""

from __future__ import annotations

import operator
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from nodbot.core.errors import ConfigurationError

__all__ = [
    "ArgumentTest",
    "Comparison",
    "FieldPatterns",
    "InterruptRule",
    "Matches",
    "Predicate",
    "all_fields",
    "any_field",
    "eq",
    "ge",
    "gt",
    "judge",
    "le",
    "lt",
    "matches",
    "should_interrupt",
]

ArgumentTest: TypeAlias = Callable[[Mapping[str, Any]], bool]
"""Anything that takes a call's arguments and says whether the rule applies."""

_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
    "eq": operator.eq,
}


class Predicate(ABC):
    """A named test on a call's arguments. Raises when it cannot judge them (see the
    module): `judge` turns that into None."""

    @abstractmethod
    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the arguments match."""

    @abstractmethod
    def describe(self) -> str:
        """A short text such as `amount > 100`, for reviewers and logs."""


@dataclass(frozen=True)
class Comparison(Predicate):
    """`arguments[field] <op> value`, for op in gt, ge, lt, le, eq."""

    op: str
    field: str
    value: Any

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        actual = arguments[self.field]
        if actual != actual:  # NaN compares false with everything: undecidable, so raise
            raise ValueError(f"{self.field} is not a number")
        comparable = _comparable if self.op == "eq" else _ordered
        if not comparable(actual, self.value):
            raise TypeError(
                f"{self.field} is {type(actual).__name__}, not {type(self.value).__name__}"
            )
        return bool(_OPERATORS[self.op](actual, self.value))

    def describe(self) -> str:
        symbol = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}[self.op]
        return f"{self.field} {symbol} {self.value!r}"


@dataclass(frozen=True)
class Matches(Predicate):
    """The string argument `field` contains a match of the regular expression `pattern`."""

    field: str
    pattern: str

    def __post_init__(self) -> None:
        _check_field(self.field, "matches()")
        _compile(self.pattern, self.field)

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        value = arguments[self.field]
        if not isinstance(value, str):
            raise TypeError(f"{self.field} is {type(value).__name__}, not a string")
        return _compile(self.pattern, self.field).search(value) is not None

    def describe(self) -> str:
        return f"{self.field} matches {self.pattern!r}"


@dataclass(frozen=True)
class FieldPatterns(Predicate):
    """Several `matches` at once: all of them (`all_fields`) or any of them (`any_field`)."""

    patterns: tuple[tuple[str, str], ...]
    require_all: bool

    def __post_init__(self) -> None:
        if not self.patterns:
            raise ConfigurationError("all_fields / any_field need at least one field: pattern")
        for field, pattern in self.patterns:
            _check_field(field, "all_fields() / any_field()")
            _compile(pattern, field)

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        # Every field is tested, so a field that cannot be (missing, not a string) raises
        # whatever the order: the rule then counts as a match.
        results = [Matches(field, pattern)(arguments) for field, pattern in self.patterns]
        return all(results) if self.require_all else any(results)

    def describe(self) -> str:
        joiner = " and " if self.require_all else " or "
        return joiner.join(f"{field} matches {pattern!r}" for field, pattern in self.patterns)


def _comparable(actual: Any, expected: Any) -> bool:
    """Whether `==` between the two means something: same type, or two non-bool numbers."""
    numbers = (int, float)
    if isinstance(actual, numbers) and isinstance(expected, numbers):
        return isinstance(actual, bool) == isinstance(expected, bool)
    return type(actual) is type(expected)


def _ordered(actual: Any, expected: Any) -> bool:
    """Whether `<` between the two means something: two strings, or two non-bool numbers
    (Python would order True below 2, and lists among themselves)."""
    if isinstance(actual, str) and isinstance(expected, str):
        return True
    numbers = (int, float)
    return (
        isinstance(actual, numbers)
        and isinstance(expected, numbers)
        and not isinstance(actual, bool)
        and not isinstance(expected, bool)
    )


def _check_field(field: object, what: str) -> None:
    if not isinstance(field, str) or not field:
        raise ConfigurationError(f"{what} needs an argument name, not {field!r}")


def _compile(pattern: str, field: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ConfigurationError(f"the pattern for {field!r} must be a string, not {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigurationError(
            f"the pattern for {field!r} is not a valid regular expression: {exc}"
        ) from None


def _comparison(op: str, field: str, value: Any) -> Comparison:
    _check_field(field, f"{op}()")
    return Comparison(op, field, value)


def gt(field: str, value: Any) -> Comparison:
    """The argument is greater than `value`."""
    return _comparison("gt", field, value)


def ge(field: str, value: Any) -> Comparison:
    """The argument is greater than or equal to `value`."""
    return _comparison("ge", field, value)


def lt(field: str, value: Any) -> Comparison:
    """The argument is less than `value`."""
    return _comparison("lt", field, value)


def le(field: str, value: Any) -> Comparison:
    """The argument is less than or equal to `value`."""
    return _comparison("le", field, value)


def eq(field: str, value: Any) -> Comparison:
    """The argument equals `value`."""
    return _comparison("eq", field, value)


def matches(field: str, pattern: str) -> Matches:
    """The string argument contains a match of the regular expression `pattern`."""
    return Matches(field, pattern)


def _patterns(
    patterns: Mapping[str, str] | None, more: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    return tuple({**(patterns or {}), **more}.items())


def all_fields(patterns: Mapping[str, str] | None = None, /, **more: str) -> FieldPatterns:
    """Every named argument matches its pattern: `all_fields(to=r"@ext\\.com$", cc=...)`."""
    return FieldPatterns(_patterns(patterns, more), require_all=True)


def any_field(patterns: Mapping[str, str] | None = None, /, **more: str) -> FieldPatterns:
    """At least one named argument matches its pattern."""
    return FieldPatterns(_patterns(patterns, more), require_all=False)


@dataclass(frozen=True)
class InterruptRule:
    """Calls of `tool` (a name, or `"*"` for every tool) need review when `match` holds.

    Without `match` every call of the tool is reviewed.
    """

    tool: str
    """A tool name, or `"*"` for every tool."""
    match: ArgumentTest | None = None
    """A predicate on the arguments; one that cannot judge them (raises) counts as a
    match."""
    description: str | None = None
    """Why the rule exists, shown to reviewers."""

    def __post_init__(self) -> None:
        if not isinstance(self.tool, str) or not self.tool:
            raise ConfigurationError(
                f"InterruptRule.tool must be a tool name or '*', not {self.tool!r}"
            )
        if self.match is not None and not callable(self.match):
            raise ConfigurationError(
                f"InterruptRule.match for {self.tool!r} must be a predicate, not {self.match!r}"
            )

    def applies_to(self, tool: str) -> bool:
        """Whether the rule names this tool."""
        return self.tool in ("*", tool)

    def judge(self, arguments: Mapping[str, Any]) -> bool | None:
        """Whether `match` holds for the arguments (True without one); None when it cannot
        judge them. A rule that approves takes only True (see the module)."""
        if self.match is None:
            return True
        return judge(self.match, arguments)

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a call with these arguments needs review. Fails closed: a predicate that
        cannot judge them (a missing argument, a wrong type) must not let the call through
        unreviewed."""
        return self.judge(arguments) is not False


def judge(test: ArgumentTest, arguments: Mapping[str, Any]) -> bool | None:
    """Whether `test` holds for `arguments`: True or False, or None when it cannot tell
    (it raised: a missing argument, a value of another type, NaN)."""
    try:
        return bool(test(arguments))
    except Exception:
        return None


def should_interrupt(
    rules: Iterable[InterruptRule], tool: str, arguments: Mapping[str, Any]
) -> bool:
    """Whether any rule asks for review of this call."""
    return any(rule.applies_to(tool) and rule.matches(arguments) for rule in rules)
