"""The bounds of edits: what an edited call must meet for its rule to accept the edit
(`edit_bounds:` of a rule or of `defaults:`), checked on every channel through
`bot.policy.rule_refusal`.

```python
policy = {"edit_bounds": [{"gt": {"amount": 0}}, {"le": {"amount": {"original": "amount"}}}]}
edit_refusal(policy, {"order_id": "A-1", "amount": 120.0}, {"amount": 500})
# 'amount must be at most the original amount (120.0); the edit asks for 500'
```

The bounds are tested on the edit merged into the call's arguments (an edit's keys replace
the call's, as `core.merge_edit` does); `{original: <argument>}` reads the call as it was
asked. Unlike `when`, where a predicate that cannot decide asks for a review, a bound that
cannot be tested (a missing argument, values that do not compare, bounds that cannot be read)
refuses the edit. Reasons are shown to reviewers.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from nodbot.bot.config.predicates import ORIGINAL, BoundSpec
from nodbot.core import merge_edit

__all__ = ["edit_refusal", "parse_bounds"]

_ORDERS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "gt": (operator.gt, "more than"),
    "ge": (operator.ge, "at least"),
    "lt": (operator.lt, "less than"),
    "le": (operator.le, "at most"),
    "eq": (operator.eq, "equal to"),
}


def edit_refusal(
    policy: Mapping[str, Any], original: Mapping[str, Any], edited: Mapping[str, Any] | None
) -> str | None:
    """Why the review's rule refuses this edit, naming the first bound it breaks, or None
    when it meets every bound of `policy["edit_bounds"]` (or the policy has none).

    `original` is the call's arguments as asked, `edited` the reviewer's edit. Never raises:
    a bound that cannot be tested refuses.
    """
    stored = policy.get("edit_bounds")
    if stored is None:
        return None
    try:
        bounds = parse_bounds(stored)
    except ValueError as exc:
        return f"the bounds of this call's edits cannot be read, so no edit is accepted: {exc}"
    edit = dict(edited or {})
    merged = merge_edit(original, edit)
    for bound in bounds:
        try:
            broken = _broken(bound, original, merged, edit)
        except Exception as exc:  # fail closed: an untestable bound refuses
            return f"the edit cannot be checked against its bounds, so it is refused: {exc}"
        if broken is not None:
            return broken
    return None


def parse_bounds(stored: object) -> list[BoundSpec]:
    """The bounds kept with a review's policy (`BoundSpec.to_json` of each), read back.

    Raises `ValueError` saying what is wrong when they are not a list of bounds.
    """
    if not isinstance(stored, list):
        raise ValueError(f"expected a list of bounds, not {type(stored).__name__}")
    try:
        return [BoundSpec.model_validate(bound) for bound in stored]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None


def _broken(
    bound: BoundSpec,
    original: Mapping[str, Any],
    merged: Mapping[str, Any],
    edited: Mapping[str, Any],
) -> str | None:
    """Why the merged call breaks `bound`, or None when it meets it."""
    name = bound.name
    if name in _ORDERS:
        [(argument, expected)] = bound.arguments_of(name).items()
        return _compared(name, argument, expected, original, merged, edited)
    if name in ("all", "any"):
        parts: list[BoundSpec] = getattr(bound, name)
        reasons = [_broken(part, original, merged, edited) for part in parts]
    else:  # matches, all_fields, any_field: a pattern per argument
        patterns = bound.arguments_of(name).items()
        reasons = [_matched(argument, pattern, merged, edited) for argument, pattern in patterns]
    broken = [reason for reason in reasons if reason is not None]
    if name not in ("any", "any_field"):
        return broken[0] if broken else None
    if len(broken) < len(reasons):
        return None
    return "the edit must meet one of: " + "; or ".join(broken)


def _compared(
    op: str,
    argument: str,
    expected: Any,
    original: Mapping[str, Any],
    merged: Mapping[str, Any],
    edited: Mapping[str, Any],
) -> str | None:
    compare, phrase = _ORDERS[op]
    if isinstance(expected, Mapping):
        name = str(expected[ORIGINAL])
        if name not in original:
            return f"{argument} is bounded by the original {name}, which this call does not have"
        limit = original[name]
        what = f"the original {name} ({_shown(limit)})"
    else:
        limit, what = expected, _shown(expected)
    rule = f"{argument} must be {phrase} {what}"
    if argument not in merged:
        return f"{rule}, and this call has no {argument}"
    actual = merged[argument]
    asked = _asked(argument, actual, edited)
    if not _comparable(op, actual, limit):
        return f"{rule}; {asked}, which cannot be compared with it"
    if not compare(actual, limit):
        return f"{rule}; {asked}"
    return None


def _matched(
    argument: str, pattern: str, merged: Mapping[str, Any], edited: Mapping[str, Any]
) -> str | None:
    rule = f"{argument} must match '{pattern}'"
    if argument not in merged:
        return f"{rule}, and this call has no {argument}"
    actual = merged[argument]
    asked = _asked(argument, actual, edited)
    if not isinstance(actual, str):
        return f"{rule}; {asked}, which is not a string"
    if re.search(pattern, actual) is None:
        return f"{rule}; {asked}"
    return None


def _comparable(op: str, actual: Any, limit: Any) -> bool:
    """Whether the comparison means something: two numbers (not booleans, not NaN), two
    strings, or, for `eq`, two values of one type."""

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value

    if number(actual) and number(limit):
        return True
    if isinstance(actual, str) and isinstance(limit, str):
        return True
    return op == "eq" and type(actual) is type(limit) and actual == actual


def _asked(argument: str, value: Any, edited: Mapping[str, Any]) -> str:
    if argument in edited:
        return f"the edit asks for {_shown(value)}"
    return f"the call has {_shown(value)}"


def _shown(value: Any) -> str:
    """A value as a reviewer reads it: in JSON, as they wrote or see it."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
