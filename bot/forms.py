"""Editing a call's arguments, for every channel that lets a reviewer edit (the web inbox's
form, Slack's modal): fields built from the tool's JSON schema, and the entered text read
back into values.

| schema                         | field                                           |
|--------------------------------|-------------------------------------------------|
| `number`, `integer`            | a number input                                  |
| `boolean`                      | a select: true / false                          |
| `enum` (or `const`)            | a select of the allowed values                  |
| `string`                       | a text input (a text area for long or multi-line |
|                                | values, whose line breaks a text input drops)    |
| anything else                  | a text area holding JSON                        |

`X | None` becomes the field of `X` where an empty input means none. Only the fields the rule
lets be edited are built; the tool's model still validates the whole edit afterwards.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

from nodbot.bot.json_shape import shape_problem

__all__ = [
    "FIELD_PREFIX",
    "MAX_ARGUMENT_TEXT",
    "MAX_REASON",
    "EditField",
    "Parsed",
    "edit_fields",
    "is_long",
    "parse_edit",
    "reason_too_long",
    "same_value",
    "shown",
    "text_too_long",
]

MAX_REASON = 2_000
"""The most characters a decision's reason may have, on every channel."""
MAX_ARGUMENT_TEXT = 10_000
"""The most characters of a string anywhere in an edit's arguments, on every channel."""


def text_too_long(value: Any, path: str) -> str | None:
    """What is wrong with the first string in `value` (at `path`, dotted below it) longer
    than `MAX_ARGUMENT_TEXT`, or None."""
    if isinstance(value, str):
        if len(value) > MAX_ARGUMENT_TEXT:
            return f"{path} has {len(value)} characters; at most {MAX_ARGUMENT_TEXT} are allowed"
        return None
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        problem = text_too_long(item, f"{path}.{key}")
        if problem is not None:
            return problem
    return None


def reason_too_long(reason: str | None) -> str | None:
    """What is wrong with a reason longer than `MAX_REASON`, or None."""
    if reason is not None and len(reason) > MAX_REASON:
        return f"the reason has {len(reason)} characters; at most {MAX_REASON} are allowed"
    return None


FIELD_PREFIX = "arg."
"""Form fields `arg.<name>` carry the edited arguments."""

FieldKind: TypeAlias = Literal["number", "integer", "boolean", "enum", "string", "json"]

_LONG = 80
"""Strings longer than this (or with a line break) are shown in a <pre> and edited in a text
area."""


@dataclass(frozen=True)
class EditField:
    """One input of the edit form, with its text (the current value, or what was posted)."""

    name: str
    kind: FieldKind
    text: str
    """What the input holds: the value as text (JSON for `json` and the options of `enum`)."""
    description: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    """For `boolean` and `enum`: (option value, label) pairs."""
    nullable: bool = False
    """Whether an empty input means none (null)."""
    multiline: bool = False
    """For `string`: a text area rather than a text input."""
    error: str | None = None
    """Why the posted text was refused."""

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


@dataclass(frozen=True)
class Parsed:
    """The posted edit: the changed values, and the fields again with what was posted and an
    error on each that could not be read."""

    edited: dict[str, Any]
    fields: list[EditField]
    errors: dict[str, str] = field(default_factory=dict)


def shown(value: Any) -> str:
    """A value as a reviewer reads it: strings as they are, everything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(
        value, ensure_ascii=False, indent=2 if isinstance(value, dict | list) else None
    )


def is_long(value: Any) -> bool:
    """Whether a value is shown whole in a <pre> rather than inline."""
    text = shown(value)
    return len(text) > _LONG or "\n" in text or isinstance(value, dict | list)


def same_value(a: Any, b: Any) -> bool:
    """JSON equality: 1 and 1.0 are the same number, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[key], b[key]) for key in a)
    return type(a) is type(b) and a == b


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """`node` with a local `$ref` replaced by the definition it names."""
    resolved = dict(node)
    for _ in range(10):  # bounded: definitions may refer to each other
        ref = resolved.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            break
        del resolved["$ref"]
        resolved = {**defs.get(ref.rsplit("/", 1)[1], {}), **resolved}
    return resolved


def _kind(node: Mapping[str, Any], defs: Mapping[str, Any]) -> tuple[FieldKind, Any, bool]:
    """(kind, the schema node that decided it, nullable)."""
    node = _resolve(node, defs)
    nullable = False
    variants = node.get("anyOf") or node.get("oneOf")
    if isinstance(variants, list):
        options = [_resolve(variant, defs) for variant in variants]
        others = [option for option in options if option.get("type") != "null"]
        nullable = len(others) < len(options)
        if len(others) != 1:
            return "json", node, nullable
        node = others[0]
    types = node.get("type")
    if isinstance(types, list):  # ["integer", "null"]
        nullable = nullable or "null" in types
        rest = [kind for kind in types if kind != "null"]
        types = rest[0] if len(rest) == 1 else None
    if "const" in node:
        return "enum", {**node, "enum": [node["const"]]}, nullable
    if isinstance(node.get("enum"), list):
        return "enum", node, nullable
    if types in ("number", "integer", "boolean", "string"):
        kind: FieldKind = types
        return kind, node, nullable
    return "json", node, nullable


def _text(kind: FieldKind, value: Any) -> str:
    """The current value as the input's text."""
    if value is None and kind != "json":
        return ""
    if kind in ("enum", "number", "integer", "json"):
        return json.dumps(value, ensure_ascii=False, indent=2 if kind == "json" else None)
    if kind == "boolean":
        return "true" if value is True else "false" if value is False else ""
    return str(value)


def edit_fields(
    schema: Mapping[str, Any], arguments: Mapping[str, Any], editable: Sequence[str] | None
) -> list[EditField]:
    """The inputs of the edit form: one per argument of the tool's `schema` that `editable`
    names (None: every argument), in the schema's order, holding the current values."""
    defs: Mapping[str, Any] = schema.get("$defs", {})
    built: list[EditField] = []
    for name, node in (schema.get("properties") or {}).items():
        if editable is not None and name not in editable:
            continue
        kind, decided, nullable = _kind(node, defs)
        value = arguments.get(name)
        options: tuple[tuple[str, str], ...] = ()
        if kind == "boolean":
            options = (("true", "true"), ("false", "false"))
        elif kind == "enum":
            choices = list(decided["enum"])
            options = tuple(
                (json.dumps(choice, ensure_ascii=False), shown(choice)) for choice in choices
            )
        if nullable and kind in ("boolean", "enum"):
            options = (("", "(none)"), *options)
        text = _text(kind, value)
        description = node.get("description") or decided.get("description")
        built.append(
            EditField(
                name=name,
                kind=kind,
                text=text,
                description=description if isinstance(description, str) else None,
                options=options,
                nullable=nullable,
                multiline=kind == "string" and (len(text) > _LONG or "\n" in text),
            )
        )
    return built


def _read(spec: EditField, text: str) -> Any:
    """The value of one posted input. Raises `ValueError` with what was expected."""
    if spec.kind == "string" and len(text) > MAX_ARGUMENT_TEXT:
        raise ValueError(f"{len(text)} characters; at most {MAX_ARGUMENT_TEXT} are allowed")
    if spec.kind in ("string", "json"):
        text = text.replace("\r\n", "\n")  # browsers send text areas' line breaks as CRLF
    if spec.nullable and text.strip() == "" and spec.kind != "json":
        return None
    if spec.kind == "string":
        return text
    if spec.kind == "number":
        try:
            number = float(text.strip())
        except ValueError:
            raise ValueError(f"expected a number, not {text!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, not {text!r}")
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    if spec.kind == "integer":
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"expected a whole number, not {text!r}") from None
    if spec.kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError(f"expected true or false, not {text!r}")
        return text == "true"
    if spec.kind == "enum":
        allowed = [option for option, _ in spec.options]
        if text not in allowed:
            choices = ", ".join(label for _, label in spec.options)
            raise ValueError(f"expected one of {choices}")
        return json.loads(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ValueError(f"not valid JSON: {exc.msg} ({where})") from None
    except RecursionError:
        raise ValueError("not valid JSON here: nested too deeply") from None
    problem = _shape(value) or text_too_long(value, spec.name)
    if problem is not None:
        raise ValueError(problem)
    return value


def _shape(value: Any) -> str | None:
    """What keeps an edited value (JSON a reviewer typed, in any channel's form) from being
    arguments, as a request's body is checked (`bot.json_shape`): it nests too deeply,
    or holds a lone surrogate."""
    problem = shape_problem(value)
    return None if problem is None else f"not valid here: the value {problem}"


def parse_edit(
    fields: Sequence[EditField], form: Mapping[str, str], arguments: Mapping[str, Any]
) -> Parsed:
    """Read the posted `arg.<name>` inputs of `fields`. The edit holds the values that differ
    from `arguments`; inputs missing from `form` keep their values. `arg.<name>` inputs of
    arguments that are not fields are read as JSON text into the edit, so that the rule,
    not the form, refuses them."""
    known = {spec.name: spec for spec in fields}
    edited: dict[str, Any] = {}
    errors: dict[str, str] = {}
    posted: list[EditField] = []
    for spec in fields:
        text = form.get(spec.input_name)
        if text is None:
            posted.append(spec)
            continue
        try:
            value = _read(spec, text)
        except ValueError as exc:
            errors[spec.name] = str(exc)
            posted.append(replace(spec, text=text, error=str(exc)))
            continue
        posted.append(replace(spec, text=text))
        if spec.name not in arguments or not same_value(value, arguments[spec.name]):
            edited[spec.name] = value
    for key, text in form.items():
        name = key.removeprefix(FIELD_PREFIX)
        if not key.startswith(FIELD_PREFIX) or name in known:
            continue
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            value = text
        problem = _shape(value) or text_too_long(value, name)
        if problem is not None:
            errors[name] = problem
            continue
        if name not in arguments or not same_value(value, arguments[name]):
            edited[name] = value
    return Parsed(edited, posted, errors)
