"""An edit typed into any channel's form (`bot.forms.parse_edit`: the inbox, Slack, Teams,
Discord) is JSON from outside, held to a request body's shape (`bot.json_shape`): nested at
most 32 levels and no lone surrogate; anything else is an error on its field and no edit."""

from __future__ import annotations

import json

import pytest

from nodbot.bot.forms import edit_fields, parse_edit
from nodbot.bot.json_shape import MAX_JSON_DEPTH

SCHEMA = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "note": {}},  # `note`: any JSON
}
ARGUMENTS = {"amount": 30, "note": {"text": "refund"}}


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (nested(MAX_JSON_DEPTH + 1), "nests deeper than 32 levels"),
        (nested(900), "nests deeper than 32 levels"),  # parses, and stops nothing later
        ('{"a":' * 600 + "1" + "}" * 600, "nests deeper than 32 levels"),
        ('"refund \\ud800"', "lone surrogate"),
        ('{"\\udfff": 1}', "lone surrogate"),
    ],
)
@pytest.mark.parametrize("key", ["arg.note", "arg.extra"])  # a field, an argument that is none
def test_an_edited_value_of_a_shape_no_body_may_have_is_an_error(
    text: str, said: str, key: str
) -> None:
    fields = edit_fields(SCHEMA, ARGUMENTS, None)
    parsed = parse_edit(fields, {"arg.amount": "40", key: text}, ARGUMENTS)
    name = key.removeprefix("arg.")
    assert said in parsed.errors[name]
    assert name not in parsed.edited


def test_an_edited_value_as_deep_as_a_body_may_be_is_taken() -> None:
    fields = edit_fields(SCHEMA, ARGUMENTS, None)
    deepest = nested(MAX_JSON_DEPTH)
    parsed = parse_edit(fields, {"arg.note": deepest}, ARGUMENTS)
    assert parsed.errors == {}
    assert parsed.edited == {"note": json.loads(deepest)}
