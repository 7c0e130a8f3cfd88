"""Checking a call's arguments against the JSON schema its caller sent with it: how an edit of a
tool that runs outside nodbot (`POST /approvals` with `schema`) is validated before it is
recorded.

The subset of JSON Schema that describes tool arguments is checked: `type` (one or a list),
`properties`, `required`, `additionalProperties: false`, `enum`, `const`, `minimum`,
`maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `minLength`, `maxLength` and `items`.
Other keywords are not checked (the tool itself still validates what it is given). Booleans
are not numbers, and an integer-valued float is an integer, as JSON Schema says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["schema_errors"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}
_DEPTH = 32


def schema_errors(schema: dict[str, Any], value: Any) -> list[dict[str, str]]:
    """Each way `value` breaks `schema`, as `{"field", "message"}` (the field a dotted
    path, "" for the whole value); empty when it holds."""
    return [{"field": field, "message": message} for field, message in _check(schema, value, "", 0)]


def _check(schema: Any, value: Any, path: str, depth: int) -> Iterator[tuple[str, str]]:
    if not isinstance(schema, dict) or depth > _DEPTH:
        return
    kinds = schema.get("type")
    if kinds is not None:
        names = [kinds] if isinstance(kinds, str) else [k for k in kinds if isinstance(k, str)]
        if names and not any(_is(value, name) for name in names):
            yield path, f"expected {' or '.join(names)}"
            return
    if "const" in schema and value != schema["const"]:
        yield path, f"expected {schema['const']!r}"
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        yield path, f"expected one of {', '.join(repr(v) for v in enum)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        yield from _bounds(schema, value, path)
    if isinstance(value, str):
        if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
            yield path, f"at least {schema['minLength']} characters"
        if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
            yield path, f"at most {schema['maxLength']} characters"
    if isinstance(value, dict):
        yield from _object(schema, value, path, depth)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _check(schema["items"], item, f"{path}[{index}]", depth + 1)


def _is(value: Any, name: str) -> bool:
    if name in ("number", "integer") and isinstance(value, bool):
        return False
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, _TYPES.get(name, (object,)))


def _bounds(schema: dict[str, Any], value: float, path: str) -> Iterator[tuple[str, str]]:
    for key, words in (
        ("minimum", "at least"),
        ("maximum", "at most"),
        ("exclusiveMinimum", "more than"),
        ("exclusiveMaximum", "less than"),
    ):
        bound = schema.get(key)
        if not isinstance(bound, (int, float)) or isinstance(bound, bool):
            continue
        holds = {
            "minimum": value >= bound,
            "maximum": value <= bound,
            "exclusiveMinimum": value > bound,
            "exclusiveMaximum": value < bound,
        }[key]
        if not holds:
            yield path, f"{words} {bound}"


def _object(
    schema: dict[str, Any], value: dict[str, Any], path: str, depth: int
) -> Iterator[tuple[str, str]]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    for name in schema.get("required") or []:
        if isinstance(name, str) and name not in value:
            yield _join(path, name), "required"
    if schema.get("additionalProperties") is False:
        for name in sorted(set(value) - set(properties)):
            yield _join(path, name), "not an argument of the tool"
    for name, item in value.items():
        if name in properties:
            yield from _check(properties[name], item, _join(path, name), depth + 1)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
