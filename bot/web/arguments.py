"""A review's arguments as the inbox's table shows them: one row per argument, a long value
folded behind a disclosure.

A value that `bot.forms.is_long` calls long (over 80 characters, several lines, an object or
a list) is folded: the row shows a preview (a string's first line, or an object's compact
JSON, cut at `PREVIEW` characters) and, once opened, the whole value (indented JSON for
objects and lists), so that a page of twenty arguments stays readable and a 10,000
character value does not push the decision forms off the screen. A short value is shown
inline. An edited value shows the original struck through, then the value the call runs
with, unfolded: the change is what a reviewer has to see.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodbot.bot.forms import is_long, shown

__all__ = ["PREVIEW", "ArgumentRow", "argument_rows", "preview"]

PREVIEW = 80
"""The most characters of a folded value's preview."""


@dataclass(frozen=True)
class ArgumentRow:
    """One argument of the table."""

    name: str
    value: Any
    long: bool
    """Shown in a <pre> (folded, unless edited) rather than inline."""
    preview: str
    """What a folded value shows while closed."""
    size: int | None
    """The entries of an object or a list (None for other values)."""
    lines: int
    """The lines of the value as shown whole."""
    edited: bool
    new: Any = None
    """The edited value, when `edited`."""


def preview(value: Any) -> str:
    """A value's preview: a string's first line, anything else as compact JSON, at most
    `PREVIEW` characters (cut with `…`)."""
    if isinstance(value, str):
        text = value.split("\n", 1)[0]
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def argument_rows(
    arguments: Mapping[str, Any], edited: Mapping[str, Any] | None = None
) -> list[ArgumentRow]:
    """The rows of `arguments` (in their order), with the reviewer's `edited` values."""
    edited = edited or {}
    rows = []
    for name, value in arguments.items():
        changed = name in edited
        rows.append(
            ArgumentRow(
                name=name,
                value=value,
                long=is_long(value) or (changed and is_long(edited[name])),
                preview=preview(value),
                size=len(value) if isinstance(value, dict | list) else None,
                lines=shown(value).count("\n") + 1,
                edited=changed,
                new=edited.get(name),
            )
        )
    return rows
