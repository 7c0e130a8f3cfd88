"""The shape JSON from outside must have before anything reads it: nested at most
`MAX_JSON_DEPTH` levels, and no lone surrogate in any string (no text: no store, digest or
page can hold one). A request's body is checked here (`bot.http.limits.loads`), and so is a
value a reviewer types as JSON into any channel's edit form (`bot.forms`).

A module of its own, below both: `bot.forms` cannot import `bot.http`, whose package imports
it."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["LONE_SURROGATE", "MAX_JSON_DEPTH", "shape_problem"]

MAX_JSON_DEPTH = 32
"""The most levels of nesting of JSON from outside (a request's body, an edited value)."""
LONE_SURROGATE = "a string holds a lone surrogate"
_SURROGATE = re.compile("[\ud800-\udfff]")


def shape_problem(data: Any) -> str | None:
    """What keeps parsed JSON `data` from being taken (it nests deeper than
    `MAX_JSON_DEPTH` levels, or `LONE_SURROGATE`), or None. Iterative: a value just parsed
    may still be deeper than Python's recursion allows."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return LONE_SURROGATE
        elif isinstance(value, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                return f"nests deeper than {MAX_JSON_DEPTH} levels"
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
    return None
