"""Checking a call's arguments against the JSON schema its caller sent with it, for a tool that
runs outside nodbot (`POST /approvals` with `schema`, a hosted agent's tool, an MCP tool):
what the rules judge (`judged_arguments`) and how a reviewer's edit is validated before it is
recorded (`schema_errors`).

The subset of JSON Schema that describes tool arguments is checked: `type` (one or a list),
`properties`, `required`, `additionalProperties: false`, `enum`, `const`, `minimum`,
`maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `minLength`, `maxLength`, `items`,
`anyOf`, `oneOf`, `allOf` and local references (`$ref` to `#/$defs/...` or
`#/definitions/...`, as pydantic and zod write them). Other keywords are not checked (the
tool itself still validates what it is given; the rules' predicates check the types they
compare). Values are checked strictly, as JSON: `"5000"` is not a number (a tool's model
may coerce it, so rules do not judge it). Booleans are not numbers, and an integer-valued
float is an integer, as JSON Schema says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nodbot.core.tools import NOT_TEXT, unencodable

__all__ = ["judged_arguments", "schema_errors"]

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
_STEPS = 20_000
"""Schemas checked in one check at most: `anyOf` of references to itself would otherwise
take exponential time. A check that runs out counts as a failed one."""


def schema_errors(schema: dict[str, Any], value: Any) -> list[dict[str, str]]:
    """Each way `value` breaks `schema`, as `{"field", "message"}` (the field a dotted
    path, "" for the whole value); empty when it holds."""
    fault = unencodable(value)
    if fault is not None:  # no schema makes it text
        return [{"field": fault, "message": NOT_TEXT}]
    checking = _Checking(schema)
    return [
        {"field": field, "message": message}
        for field, message in checking.check(schema, value, "", 0)
    ]


def judged_arguments(schema: dict[str, Any], arguments: Any) -> dict[str, Any] | None:
    """The arguments as the rules judge them: checked against `schema` and with the
    `default` of each property the call left out filled in (as a tool's model fills it);
    None when they break the schema (no rule approves them then)."""
    checking = _Checking(schema)
    if not isinstance(arguments, dict) or any(checking.check(schema, arguments, "", 0)):
        return None
    properties = checking.resolve(schema, 0).get("properties")
    judged = dict(arguments)
    if isinstance(properties, dict):
        for name, property_schema in properties.items():
            if name in judged or not isinstance(property_schema, dict):
                continue
            resolved = checking.resolve(property_schema, 0)
            if "default" in resolved:
                judged[name] = resolved["default"]
    return judged


class _Checking:
    """One check of a value against a schema, with the schema's own definitions at hand for
    its references."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.steps = 0

    def resolve(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """`schema`, or what its local `$ref` names (followed a bounded number of times);
        a reference that cannot be followed is left as it is (not checked)."""
        while isinstance(schema.get("$ref"), str) and depth <= _DEPTH:
            target = self._target(schema["$ref"])
            if target is None:
                return schema
            schema, depth = target, depth + 1
        return schema

    def _target(self, reference: str) -> dict[str, Any] | None:
        if not reference.startswith("#/"):
            return None
        found: Any = self.root
        for part in reference[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(found, dict) or part not in found:
                return None
            found = found[part]
        return found if isinstance(found, dict) else None

    def check(self, schema: Any, value: Any, path: str, depth: int) -> Iterator[tuple[str, str]]:
        if not isinstance(schema, dict) or depth > _DEPTH:
            return
        self.steps += 1
        if self.steps > _STEPS:
            yield path, "the schema is too complex to check"
            return
        schema = self.resolve(schema, depth)
        yield from self._combined(schema, value, path, depth)
        yield from self._own(schema, value, path, depth)

    def _combined(
        self, schema: dict[str, Any], value: Any, path: str, depth: int
    ) -> Iterator[tuple[str, str]]:
        """`allOf` (each holds), `anyOf` (one holds at least), `oneOf` (exactly one)."""
        every = schema.get("allOf")
        if isinstance(every, list):
            for part in every:
                yield from self.check(part, value, path, depth + 1)
        for key in ("anyOf", "oneOf"):
            parts = schema.get(key)
            if not isinstance(parts, list) or not parts:
                continue
            holding = sum(1 for part in parts if not any(self.check(part, value, path, depth + 1)))
            if holding == 0:
                yield path, f"matches none of the {len(parts)} kinds of value it may be"
            elif key == "oneOf" and holding > 1:
                yield path, f"matches {holding} of the kinds of value it may be, not exactly one"

    def _own(
        self, schema: dict[str, Any], value: Any, path: str, depth: int
    ) -> Iterator[tuple[str, str]]:
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
            yield from self._object(schema, value, path, depth)
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                yield from self.check(schema["items"], item, f"{path}[{index}]", depth + 1)

    def _object(
        self, schema: dict[str, Any], value: dict[str, Any], path: str, depth: int
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
                yield from self.check(properties[name], item, _join(path, name), depth + 1)


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


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
