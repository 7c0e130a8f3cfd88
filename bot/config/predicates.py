"""Predicates on a call's arguments, as the file writes them (`PredicateSpec`: `{gt:
{amount: 100}}`, `{all: [...]}`) and as they run (`AllOf`, `AnyOf` and the core predicates
a spec builds); and the bounds of edits (`BoundSpec`), written the same way with values that
may name an argument of the original call (`{le: {amount: {original: amount}}}`)."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import ValidationInfo, field_validator, model_validator

from nodbot import core
from nodbot.bot.config.errors import problem, problems, shown
from nodbot.bot.config.values import ConfigModel
from nodbot.core import ConfigurationError, Predicate


@dataclass(frozen=True)
class AllOf(Predicate):
    """Every predicate matches. Each is tested, so one that cannot judge the call (a missing
    argument) makes the whole unable to, whatever the order (`core.rules`)."""

    predicates: tuple[Predicate, ...]

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        results = [predicate(arguments) for predicate in self.predicates]
        return all(results)

    def describe(self) -> str:
        return " and ".join(f"({predicate.describe()})" for predicate in self.predicates)


@dataclass(frozen=True)
class AnyOf(Predicate):
    """At least one predicate matches. Each is tested, so one that cannot judge the call
    makes the whole unable to, whatever the order (`core.rules`)."""

    predicates: tuple[Predicate, ...]

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        results = [predicate(arguments) for predicate in self.predicates]
        return any(results)

    def describe(self) -> str:
        return " or ".join(f"({predicate.describe()})" for predicate in self.predicates)


_COMPARISONS: dict[str, Callable[[str, Any], Predicate]] = {
    "gt": core.gt,
    "ge": core.ge,
    "lt": core.lt,
    "le": core.le,
    "eq": core.eq,
}


class _PredicateForm(ConfigModel):
    """The keys a predicate (`PredicateSpec`) or a bound (`BoundSpec`) is written with, one
    per mapping; each adds its own `all` and `any`."""

    key_noun: ClassVar[str] = "predicate"

    gt: dict[str, Any] | None = None
    """`{argument: value}`: the argument is greater than the value."""
    ge: dict[str, Any] | None = None
    """`{argument: value}`: the argument is greater than or equal to the value."""
    lt: dict[str, Any] | None = None
    """`{argument: value}`: the argument is less than the value."""
    le: dict[str, Any] | None = None
    """`{argument: value}`: the argument is less than or equal to the value."""
    eq: dict[str, Any] | None = None
    """`{argument: value}`: the argument equals the value (same type)."""
    matches: dict[str, str] | None = None
    """`{argument: regex}`: the string argument contains a match (anchor with ^ and $)."""
    all_fields: dict[str, str] | None = None
    """`{argument: regex, ...}`: every named argument matches its regex."""
    any_field: dict[str, str] | None = None
    """`{argument: regex, ...}`: at least one named argument matches its regex."""

    @model_validator(mode="before")
    @classmethod
    def _one_key(cls, data: Any) -> Any:
        known = ", ".join(cls.model_fields)
        example = "such as {gt: {amount: 100}}"
        if not isinstance(data, Mapping):
            raise problem(f"expected a predicate mapping {example}, not {shown(data)}")
        if not data:
            raise problem(f"an empty predicate; expected one of: {known}")
        if len(data) > 1:
            names = ", ".join(str(key) for key in data)
            raise problem(
                f"a predicate has exactly one key, found {names}; "
                "combine several with all: [...] or any: [...]"
            )
        return data

    @field_validator(*_COMPARISONS)
    @classmethod
    def _comparison(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if value is None:
            return value
        _one_argument(value)
        argument, expected = next(iter(value.items()))
        _check_compared(str(info.field_name), argument, expected)
        return value

    @field_validator("matches")
    @classmethod
    def _matches(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            _one_argument(value)
            _check_patterns(value)
        return value

    @field_validator("all_fields", "any_field")
    @classmethod
    def _fields(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if not value:
                raise problem("expected at least one {argument: regex}")
            _check_patterns(value)
        return value

    @field_validator("all", "any", check_fields=False)
    @classmethod
    def _combined(cls, value: list[Any] | None) -> list[Any] | None:
        if value is not None and not value:
            raise problem("expected a list of at least one predicate")
        return value

    @model_validator(mode="after")
    def _buildable(self) -> _PredicateForm:
        if getattr(self, self.name) is None:
            raise problem("expected a value, not null", self.name)
        try:  # whatever core refuses is refused now, not when the first call is tested
            self.to_predicate()
        except ConfigurationError as exc:
            raise problem(exc.message, self.name) from None
        return self

    @property
    def name(self) -> str:
        """The predicate's key: `gt`, `matches`, `all`, ..."""
        return next(iter(self.model_fields_set))

    def arguments_of(self, name: str) -> dict[str, Any]:
        """The `{argument: value}` mapping of a field predicate (not of `all` / `any`)."""
        value = getattr(self, name)
        return dict(value) if isinstance(value, dict) else {}

    def to_predicate(self) -> Predicate:
        """The core predicate this stands for."""
        name = self.name
        if name in _COMPARISONS:
            argument, expected = next(iter(self.arguments_of(name).items()))
            return _COMPARISONS[name](argument, expected)
        if name == "matches":
            argument, pattern = next(iter(self.arguments_of(name).items()))
            return core.matches(argument, pattern)
        if name == "all_fields":
            return core.all_fields(self.arguments_of(name))
        if name == "any_field":
            return core.any_field(self.arguments_of(name))
        parts = tuple(spec.to_predicate() for spec in getattr(self, name))
        return AllOf(parts) if name == "all" else AnyOf(parts)

    def argument_names(self) -> set[str]:
        """Every argument the predicate reads, through `all` and `any` too."""
        if self.name in ("all", "any"):
            specs: list[_PredicateForm] = getattr(self, self.name)
            return set().union(*(spec.argument_names() for spec in specs))
        return set(self.arguments_of(self.name))


class PredicateSpec(_PredicateForm):
    """A test on a call's arguments, written as a mapping with exactly one key:
    `{gt: {amount: 100}}`, `{matches: {to: '@ext\\.com$'}}`, `{all: [..., ...]}`."""

    all: list[PredicateSpec] | None = None
    """Every listed predicate matches."""
    any: list[PredicateSpec] | None = None
    """At least one listed predicate matches."""


ORIGINAL = "original"
"""The key of a bound's value that names an argument of the original call."""


class BoundSpec(_PredicateForm):
    """A bound an edited call must meet (an entry of `edit_bounds`), written like a predicate
    of `when`: `{gt: {amount: 0}}`, `{all: [...]}`. A value to compare with may be
    `{original: <argument>}`, that argument as the call asked for it: `{le: {amount:
    {original: amount}}}`. `bot.bounds.edit_refusal` tests it (not `to_predicate`, which
    knows no original call); one that cannot be tested refuses the edit."""

    all: list[BoundSpec] | None = None
    """Every listed bound holds."""
    any: list[BoundSpec] | None = None
    """At least one listed bound holds."""

    @field_validator(*_COMPARISONS)
    @classmethod
    def _comparison(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if value is None:
            return value
        _one_argument(value)
        argument, expected = next(iter(value.items()))
        if isinstance(expected, Mapping):
            _check_reference(expected, argument)
        elif isinstance(expected, str) and expected.startswith(f"{ORIGINAL}."):
            name = expected.removeprefix(f"{ORIGINAL}.")
            raise problem(
                f"{expected!r} would be compared as a string; to compare with the original "
                f"call's {name}, write {{{ORIGINAL}: {name}}}",
                argument,
            )
        else:
            _check_compared(str(info.field_name), argument, expected)
        return value

    def references(self) -> set[str]:
        """Every argument of the original call the bound reads (through `all` and `any`)."""
        if self.name in ("all", "any"):
            specs: list[BoundSpec] = getattr(self, self.name)
            return set().union(*(spec.references() for spec in specs))
        values = self.arguments_of(self.name).values()
        return {str(value[ORIGINAL]) for value in values if isinstance(value, Mapping)}

    def to_json(self) -> dict[str, Any]:
        """The bound as the file writes it, in JSON values (kept with a review's policy)."""
        return self.model_dump(mode="json", exclude_unset=True)


def _check_compared(name: str, argument: str, expected: object) -> None:
    """Refuse a value a comparison cannot use: only numbers and strings are ordered."""
    if name == "eq":
        allowed: tuple[type, ...] = (int, float, str, bool, type(None))
        kinds = "a number, a string, a boolean or null"
    else:  # an order: Python would compare True with 1, and None with nothing
        allowed, kinds = (int, float, str), "a number or a string"
    if not isinstance(expected, allowed) or (isinstance(expected, bool) and bool not in allowed):
        raise problem(
            f"expected {kinds} to compare with, not {shown(expected)}{_date_hint(expected)}",
            argument,
        )
    if isinstance(expected, float) and expected != expected:
        raise problem("expected a number, not NaN (it compares false with all)", argument)


def _check_reference(value: Mapping[Any, Any], argument: str) -> None:
    """Refuse a mapping that is not `{original: <argument name>}`."""
    if set(value) != {ORIGINAL}:
        found = ", ".join(str(key) for key in value) or "none"
        raise problem(
            f"expected {{{ORIGINAL}: <argument>}} naming an argument of the original call, "
            f"or a number or a string; found the keys {found}",
            argument,
        )
    name = value[ORIGINAL]
    if not isinstance(name, str) or not _ARGUMENT.fullmatch(name):
        raise problem(f"expected an argument name, not {shown(name)}", argument, ORIGINAL)


_ARGUMENT = re.compile(r"[A-Za-z_]\w*")


def _one_argument(value: Mapping[str, Any]) -> None:
    if len(value) != 1:
        names = ", ".join(value) or "none"
        raise problem(f"expected exactly one {{argument: value}}, found {names}")


def _check_patterns(value: Mapping[str, str]) -> None:
    found = []
    for argument, pattern in value.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            found.append(((argument,), f"not a valid regular expression: {exc}"))
    if found:
        raise problems(*found)


def _date_hint(value: object) -> str:
    if isinstance(value, datetime.date):
        return " (YAML reads an unquoted date as a date: quote it)"
    return ""
