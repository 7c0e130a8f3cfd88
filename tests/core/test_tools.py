"""Tools: registration, the argument model built from the signature, invocation and digests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections.abc import Callable
from datetime import date
from types import MappingProxyType
from typing import Any

import pytest

from nodbot.core import (
    ConfigurationError,
    Executor,
    InvalidArgumentsError,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    ToolUsageError,
    UnknownToolError,
    arguments_digest,
)
from nodbot.core.tools import canonical_json


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry()


@pytest.fixture
def refund(registry: ToolRegistry) -> Tool:
    @registry.tool(confirm=True, effects="destructive")
    def refund(order_id: str, amount: float, note: str = "") -> str:
        """Refund an order.

        The money goes back to the card it came from.
        """
        return f"refunded {amount} on {order_id}"

    return refund


def context(registry: ToolRegistry) -> ToolContext:
    return Executor(registry).context(run_id="r")


# --- Registration ---------------------------------------------------------------------------


def test_bare_decorator_registers_with_defaults(registry: ToolRegistry) -> None:
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return order_id

    tool = registry.tool(lookup_order)

    assert isinstance(tool, Tool)
    assert tool.name == "lookup_order"
    assert tool.description == "Look an order up."
    assert tool.function is lookup_order
    assert tool.confirm is False
    assert tool.effects == "write"
    assert tool.context_parameter is None
    assert registry.get("lookup_order") is tool


def test_bare_decorator_syntax(registry: ToolRegistry) -> None:
    @registry.tool
    def ping() -> str:
        return "pong"

    assert isinstance(ping, Tool)
    assert registry.get("ping") is ping


def test_decorator_with_options(registry: ToolRegistry) -> None:
    def rule(call: ToolCall, ctx: ToolContext) -> bool:
        return True

    @registry.tool(name="issue_refund", description="Give money back.", confirm=rule)
    def refund(order_id: str) -> None:
        """Ignored, since a description is given."""

    assert refund.name == "issue_refund"
    assert refund.description == "Give money back."
    assert refund.confirm is rule
    assert "issue_refund" in registry
    assert "refund" not in registry


def test_decorator_with_confirm_and_effects(refund: Tool) -> None:
    assert refund.confirm is True
    assert refund.effects == "destructive"


@pytest.mark.parametrize("effects", ["read", "write", "destructive"])
def test_every_effect_is_accepted(registry: ToolRegistry, effects: Any) -> None:
    def tool() -> None: ...

    assert registry.add(tool, effects=effects).effects == effects


def test_add_registers_like_the_decorator(registry: ToolRegistry) -> None:
    def lookup(order_id: str) -> None: ...

    tool = registry.add(lookup, name="find_order", effects="read")

    assert tool.name == "find_order"
    assert tool.effects == "read"
    assert registry.get("find_order") is tool


def test_description_is_the_first_docstring_paragraph(refund: Tool) -> None:
    assert refund.description == "Refund an order."


def test_description_joins_a_multi_line_first_paragraph(registry: ToolRegistry) -> None:
    @registry.tool
    def send_email(to: str) -> None:
        """Send an email
        to one recipient.

        Details that the model is not told.
        """

    assert send_email.description == "Send an email to one recipient."


def test_description_without_docstring_is_empty(registry: ToolRegistry) -> None:
    @registry.tool
    def quiet() -> None: ...

    assert quiet.description == ""


# --- Invocation -----------------------------------------------------------------------------


async def test_sync_tool_runs_in_a_worker_thread(registry: ToolRegistry) -> None:
    threads: list[threading.Thread] = []

    @registry.tool
    def add(a: int, b: int) -> int:
        assert threading.current_thread() is not threading.main_thread()
        threads.append(threading.current_thread())
        return a + b

    result = await add.invoke(add.validate({"a": 2, "b": 3}).values, context(registry))

    assert result == 5
    assert len(threads) == 1
    assert threads[0] is not threading.main_thread()


async def test_async_tool_is_awaited_on_the_event_loop(registry: ToolRegistry) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    @registry.tool
    async def add(a: int, b: int) -> int:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return a + b

    result = await add.invoke({"a": 2, "b": 3}, context(registry))

    assert result == 5
    assert loops == [asyncio.get_running_loop()]


async def test_sync_tool_error_propagates_from_invoke(registry: ToolRegistry) -> None:
    @registry.tool
    def explode() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await explode.invoke({}, context(registry))


async def test_tool_receives_python_values(registry: ToolRegistry) -> None:
    received: list[Any] = []

    @registry.tool
    def schedule(day: date, amount: float) -> None:
        received.extend([day, amount])

    validated = schedule.validate({"day": "2024-05-01", "amount": 500})
    await schedule.invoke(validated.values, context(registry))

    assert received == [date(2024, 5, 1), 500.0]
    assert type(received[0]) is date
    assert type(received[1]) is float


# --- ToolContext injection ------------------------------------------------------------------


async def test_context_parameter_is_injected(registry: ToolRegistry) -> None:
    seen: list[ToolContext] = []

    @registry.tool
    def whoami(label: str, ctx: ToolContext) -> str:
        seen.append(ctx)
        return f"{label}:{ctx.run_id}"

    ctx = context(registry)
    result = await whoami.invoke(whoami.validate({"label": "x"}).values, ctx)

    assert result == "x:r"
    assert seen == [ctx]
    assert seen[0] is ctx
    assert whoami.context_parameter == "ctx"


async def test_async_tool_context_under_any_name(registry: ToolRegistry) -> None:
    @registry.tool
    async def run_of(context_of_run: ToolContext) -> str:
        return context_of_run.run_id

    assert run_of.context_parameter == "context_of_run"
    assert await run_of.invoke({}, context(registry)) == "r"


def test_context_parameter_is_not_an_argument(registry: ToolRegistry) -> None:
    @registry.tool
    def whoami(label: str, ctx: ToolContext) -> str:
        return label

    assert set(whoami.model.model_fields) == {"label"}
    assert whoami.validate({"label": "x"}).values == {"label": "x"}
    with pytest.raises(InvalidArgumentsError) as caught:
        whoami.validate({"label": "x", "ctx": "forged"})
    assert caught.value.errors == [{"field": "ctx", "message": "not an argument of this tool"}]
    assert "ctx" not in whoami.spec().parameters["properties"]


# --- Validation -----------------------------------------------------------------------------


def test_defaults_are_filled_in(refund: Tool) -> None:
    validated = refund.validate({"order_id": "A-1", "amount": 20.0})

    assert validated.values == {"order_id": "A-1", "amount": 20.0, "note": ""}
    assert validated.canonical == {"order_id": "A-1", "amount": 20.0, "note": ""}


def test_given_values_override_defaults(refund: Tool) -> None:
    validated = refund.validate({"order_id": "A-1", "amount": 20.0, "note": "late"})

    assert validated.values["note"] == "late"


def test_validate_accepts_any_mapping(refund: Tool) -> None:
    validated = refund.validate(MappingProxyType({"order_id": "A-1", "amount": 1.0}))

    assert validated.values["order_id"] == "A-1"


def test_wrong_type_is_refused_naming_the_field(refund: Tool) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({"order_id": "A-1", "amount": "a lot"})

    error = caught.value
    assert [entry["field"] for entry in error.errors] == ["amount"]
    assert error.errors[0]["message"]
    assert error.message.startswith("invalid arguments for tool 'refund': amount: ")
    assert error.tool == "refund"
    assert error.source == "arguments"
    assert error.kind == "invalid-arguments"
    assert isinstance(error, ToolUsageError)
    assert error.details() == {"tool": "refund", "errors": error.errors, "source": "arguments"}


def test_every_wrong_field_is_named(refund: Tool) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({"order_id": 7, "amount": [1]})

    assert sorted(entry["field"] for entry in caught.value.errors) == ["amount", "order_id"]
    assert "order_id: " in caught.value.message
    assert "amount: " in caught.value.message


def test_int_argument_refuses_a_fraction(registry: ToolRegistry) -> None:
    @registry.tool
    def repeat(times: int) -> None: ...

    with pytest.raises(InvalidArgumentsError, match=r"invalid arguments for tool 'repeat': times"):
        repeat.validate({"times": 1.5})


def test_date_argument_refuses_a_non_date(registry: ToolRegistry) -> None:
    @registry.tool
    def schedule(day: date) -> None: ...

    with pytest.raises(InvalidArgumentsError) as caught:
        schedule.validate({"day": "next tuesday"})

    assert [entry["field"] for entry in caught.value.errors] == ["day"]


def test_unknown_argument_is_refused(refund: Tool) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({"order_id": "A-1", "amount": 1.0, "currency": "EUR"})

    assert caught.value.errors == [{"field": "currency", "message": "not an argument of this tool"}]
    assert caught.value.message == (
        "invalid arguments for tool 'refund': currency: not an argument of this tool"
    )


def test_missing_required_argument_is_refused(refund: Tool) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({"amount": 1.0})

    assert caught.value.errors == [{"field": "order_id", "message": "Field required"}]


def test_all_missing_arguments_are_named(refund: Tool) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({})

    assert sorted(entry["field"] for entry in caught.value.errors) == ["amount", "order_id"]


@pytest.mark.parametrize("arguments", [["A-1", 1.0], "A-1", None, 42, ("order_id", "A-1")])
def test_non_mapping_arguments_are_refused(refund: Tool, arguments: Any) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate(arguments)

    assert caught.value.errors == [
        {"field": "(arguments)", "message": "expected an object of named values"}
    ]
    assert caught.value.message == (
        "invalid arguments for tool 'refund': (arguments): expected an object of named values"
    )


def test_source_names_what_was_validated(refund: Tool) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({"order_id": "A-1", "amount": "half"}, source="edit")

    assert caught.value.source == "edit"
    assert caught.value.message.startswith("invalid edit for tool 'refund': amount: ")


def test_unannotated_parameter_takes_any_value(registry: ToolRegistry) -> None:
    @registry.tool
    def echo(value) -> None:  # type: ignore[no-untyped-def]
        ...

    assert echo.validate({"value": [1, {"a": None}]}).values == {"value": [1, {"a": None}]}
    with pytest.raises(InvalidArgumentsError):
        echo.validate({})


# --- Canonical values -----------------------------------------------------------------------


def test_date_is_a_date_in_values_and_iso_text_in_canonical(registry: ToolRegistry) -> None:
    @registry.tool
    def schedule(day: date) -> None: ...

    for given in ("2024-05-01", date(2024, 5, 1)):
        validated = schedule.validate({"day": given})
        assert validated.values == {"day": date(2024, 5, 1)}
        assert type(validated.values["day"]) is date
        assert validated.canonical == {"day": "2024-05-01"}


def test_float_given_an_int_becomes_a_float(refund: Tool) -> None:
    validated = refund.validate({"order_id": "A-1", "amount": 500})

    assert type(validated.values["amount"]) is float
    assert type(validated.canonical["amount"]) is float
    assert validated.canonical["amount"] == 500.0
    assert canonical_json(validated.canonical) == '{"amount":500.0,"note":"","order_id":"A-1"}'


def test_canonical_values_are_json(registry: ToolRegistry) -> None:
    @registry.tool
    def plan(day: date, tags: list[str], limits: dict[str, float]) -> None: ...

    validated = plan.validate({"day": "2024-05-01", "tags": ["a"], "limits": {"x": 1}})

    assert json.loads(json.dumps(validated.canonical)) == validated.canonical
    assert validated.canonical == {"day": "2024-05-01", "tags": ["a"], "limits": {"x": 1.0}}


def test_equal_calls_give_equal_digests_after_validation(refund: Tool) -> None:
    as_int = refund.validate({"order_id": "A-1", "amount": 500})
    as_float = refund.validate({"amount": 500.0, "order_id": "A-1", "note": ""})

    assert arguments_digest(as_int.canonical) == arguments_digest(as_float.canonical)


# --- arguments_digest and canonical_json ----------------------------------------------------


def test_digest_is_the_sha256_of_the_canonical_json() -> None:
    arguments = {"order_id": "A-1", "amount": 120.0}

    digest = arguments_digest(arguments)

    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest == hashlib.sha256(b'{"amount":120.0,"order_id":"A-1"}').hexdigest()


def test_digest_of_a_known_value() -> None:
    assert arguments_digest({}) == (
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )


def test_digest_is_stable_across_key_order() -> None:
    first = {"a": 1, "b": {"x": [1, 2], "y": "é"}, "c": None}
    second = {"c": None, "b": {"y": "é", "x": [1, 2]}, "a": 1}

    assert arguments_digest(first) == arguments_digest(second)
    assert arguments_digest(first) == arguments_digest(dict(first))


@pytest.mark.parametrize(
    "other",
    [
        {"order_id": "A-1", "amount": 121.0},
        {"order_id": "A-2", "amount": 120.0},
        {"order_id": "A-1", "amount": 120},
        {"order_id": "A-1", "amount": "120.0"},
        {"order_id": "A-1"},
        {"order_id": "A-1", "amount": 120.0, "note": ""},
        {"order_id": "a-1", "amount": 120.0},
    ],
)
def test_digest_differs_across_values(other: dict[str, Any]) -> None:
    assert arguments_digest(other) != arguments_digest({"order_id": "A-1", "amount": 120.0})


def test_digest_differs_for_list_order() -> None:
    assert arguments_digest({"ids": [1, 2]}) != arguments_digest({"ids": [2, 1]})


def test_canonical_json_sorts_keys_without_spaces() -> None:
    value = {"b": 1, "a": {"z": [3, 1], "y": None}, "c": True}

    assert canonical_json(value) == '{"a":{"y":null,"z":[3,1]},"b":1,"c":true}'


def test_canonical_json_keeps_non_ascii_text() -> None:
    assert canonical_json({"name": "Zoë 😀"}) == '{"name":"Zoë 😀"}'


def test_canonical_json_is_independent_of_key_order() -> None:
    assert canonical_json({"x": 1, "y": 2}) == canonical_json({"y": 2, "x": 1})


# --- Lookup ---------------------------------------------------------------------------------


def test_get_unknown_tool_lists_registered_tools(registry: ToolRegistry, refund: Tool) -> None:
    @registry.tool
    def lookup_order(order_id: str) -> None: ...

    with pytest.raises(UnknownToolError) as caught:
        registry.get("delete_everything")

    error = caught.value
    assert error.tool == "delete_everything"
    assert error.known == ["lookup_order", "refund"]
    assert error.message == (
        "unknown tool 'delete_everything'; registered tools: 'lookup_order', 'refund'"
    )
    assert error.kind == "unknown-tool"
    assert isinstance(error, ToolUsageError)


def test_get_unknown_tool_from_an_empty_registry(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownToolError, match=r"registered tools: none$") as caught:
        registry.get("refund")

    assert caught.value.known == []


def test_get_is_case_sensitive(registry: ToolRegistry, refund: Tool) -> None:
    with pytest.raises(UnknownToolError):
        registry.get("Refund")


# --- Bad registrations ----------------------------------------------------------------------


def test_duplicate_name_is_refused(registry: ToolRegistry, refund: Tool) -> None:
    def other(order_id: str) -> None: ...

    with pytest.raises(ConfigurationError, match="a tool named 'refund' is already registered"):
        registry.add(other, name="refund")

    assert registry.get("refund") is refund
    assert len(registry) == 1


def test_same_function_twice_is_refused(registry: ToolRegistry) -> None:
    def ping() -> None: ...

    registry.add(ping)

    with pytest.raises(ConfigurationError, match="already registered"):
        registry.tool(ping)


def _star_args(order_id: str, *args: int) -> None: ...


def _star_kwargs(order_id: str, **kwargs: int) -> None: ...


def _positional_only(order_id: str, /, amount: float) -> None: ...


@pytest.mark.parametrize(
    ("function", "pattern"),
    [
        (_star_args, r"\*args and \*\*kwargs cannot be validated.*found 'args'"),
        (_star_kwargs, r"\*args and \*\*kwargs cannot be validated.*found 'kwargs'"),
        (_positional_only, r"argument 'order_id' is positional-only"),
    ],
)
def test_signatures_that_cannot_take_named_arguments_are_refused(
    registry: ToolRegistry, function: Callable[..., Any], pattern: str
) -> None:
    with pytest.raises(ConfigurationError, match=pattern) as caught:
        registry.add(function, name="bad")

    assert caught.value.message.startswith("tool 'bad': ")
    assert "bad" not in registry
    assert len(registry) == 0


@pytest.mark.parametrize("effects", ["delete", "READ", "", None, 1])
def test_bad_effects_are_refused(registry: ToolRegistry, effects: Any) -> None:
    def tool() -> None: ...

    with pytest.raises(ConfigurationError) as caught:
        registry.add(tool, effects=effects)

    assert caught.value.message == (
        f"tool 'tool': effects must be one of read, write, destructive, not {effects!r}"
    )
    assert "tool" not in registry


@pytest.mark.parametrize("confirm", ["yes", 1, 0, None, "always"])
def test_bad_confirm_is_refused(registry: ToolRegistry, confirm: Any) -> None:
    def tool() -> None: ...

    with pytest.raises(ConfigurationError, match="tool 'tool': confirm must be True, False or"):
        registry.add(tool, confirm=confirm)

    assert "tool" not in registry


@pytest.mark.parametrize("name", ["refund order", "1refund", "refund-order", "<lambda>"])
def test_name_must_be_an_identifier(registry: ToolRegistry, name: str) -> None:
    def tool() -> None: ...

    with pytest.raises(ConfigurationError, match="must be a Python identifier"):
        registry.add(tool, name=name)


def test_lambda_without_a_name_is_refused(registry: ToolRegistry) -> None:
    with pytest.raises(ConfigurationError, match="'<lambda>' must be a Python identifier"):
        registry.add(lambda: None)


def test_unresolvable_type_hint_is_refused(registry: ToolRegistry) -> None:
    def broken(order: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(ConfigurationError, match="tool 'broken': cannot resolve its type hints"):
        registry.add(broken)


def test_parameter_with_leading_underscore_is_an_argument(registry: ToolRegistry) -> None:
    def tagged(_tag: str) -> str:
        return _tag

    tool = registry.add(tagged)
    assert tool.validate({"_tag": "x"}).values == {"_tag": "x"}
    assert tool.validate({"_tag": "x"}).canonical == {"_tag": "x"}
    assert set(tool.spec().parameters["properties"]) == {"_tag"}


def test_parameters_named_like_model_attributes_are_plain_arguments(
    registry: ToolRegistry,
) -> None:
    def render(json: str, schema: int, copy: bool = False) -> str:
        return f"{json}{schema}{copy}"

    tool = registry.add(render)  # pytest turns pydantic's shadowing warning into an error
    validated = tool.validate({"json": "{}", "schema": "2"})
    assert validated.values == {"json": "{}", "schema": 2, "copy": False}
    with pytest.raises(InvalidArgumentsError) as caught:
        tool.validate({"json": "{}", "schema": "two"})
    assert [e["field"] for e in caught.value.errors] == ["schema"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused(refund: Tool, value: float) -> None:
    with pytest.raises(InvalidArgumentsError) as caught:
        refund.validate({"order_id": "A-1", "amount": value})
    assert [e["field"] for e in caught.value.errors] == ["amount"]


# --- spec -----------------------------------------------------------------------------------


def test_spec_gives_name_description_and_json_schema(refund: Tool) -> None:
    spec = refund.spec()

    assert isinstance(spec, ToolSpec)
    assert spec.name == "refund"
    assert spec.description == "Refund an order."
    schema = spec.parameters
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"order_id", "amount", "note"}
    assert schema["properties"]["order_id"]["type"] == "string"
    assert schema["properties"]["amount"]["type"] == "number"
    assert schema["properties"]["note"]["default"] == ""
    assert sorted(schema["required"]) == ["amount", "order_id"]
    assert schema["additionalProperties"] is False
    assert json.loads(json.dumps(schema)) == schema


def test_spec_of_a_tool_without_arguments(registry: ToolRegistry) -> None:
    @registry.tool
    def ping(ctx: ToolContext) -> None:
        """Check the service is up."""

    spec = ping.spec()

    assert spec.description == "Check the service is up."
    assert spec.parameters["properties"] == {}
    assert "required" not in spec.parameters


def test_spec_describes_a_date_as_a_formatted_string(registry: ToolRegistry) -> None:
    @registry.tool
    def schedule(day: date) -> None: ...

    assert schedule.spec().parameters["properties"]["day"] == {
        "format": "date",
        "title": "Day",
        "type": "string",
    }


def test_registry_specs_list_every_tool_in_order(registry: ToolRegistry, refund: Tool) -> None:
    @registry.tool
    def lookup_order(order_id: str) -> None:
        """Find an order."""

    assert [spec.name for spec in registry.specs()] == ["refund", "lookup_order"]
    assert registry.specs()[1] == lookup_order.spec()


# --- len, in, iteration ---------------------------------------------------------------------


def test_empty_registry(registry: ToolRegistry) -> None:
    assert len(registry) == 0
    assert list(registry) == []
    assert "refund" not in registry
    assert registry.specs() == []


def test_len_in_and_iteration(registry: ToolRegistry, refund: Tool) -> None:
    @registry.tool
    def lookup_order(order_id: str) -> None: ...

    @registry.tool(name="send")
    def send_email(to: str) -> None: ...

    assert len(registry) == 3
    assert list(registry) == [refund, lookup_order, send_email]
    assert "refund" in registry
    assert "send" in registry
    assert "send_email" not in registry
    assert "nope" not in registry
    assert 1 not in registry
    assert None not in registry


def test_merged_registries_share_tools_and_refuse_clashing_names() -> None:
    first, second = ToolRegistry(), ToolRegistry()

    def lookup(order_id: str) -> str:
        return order_id

    first.add(lookup)
    second.add(lookup)

    @second.tool
    def refund(amount: float) -> float:
        return amount

    merged = ToolRegistry.merged([first, second])
    assert sorted(tool.name for tool in merged) == ["lookup", "refund"]

    @first.tool(name="refund")
    def other_refund(amount: float) -> float:
        return -amount

    with pytest.raises(ConfigurationError, match="two different tools are named 'refund'"):
        ToolRegistry.merged([first, second])


async def test_a_sync_tool_runs_in_a_thread_unless_it_does_not_block(
    registry: ToolRegistry,
) -> None:
    ctx = context(registry)
    where: dict[str, int] = {}

    @registry.tool
    def slow(key: str) -> str:
        """May block."""
        where[key] = threading.get_ident()
        return key

    @registry.tool(blocking=False)
    def quick(key: str) -> str:
        """Returns at once."""
        where[key] = threading.get_ident()
        return key

    assert (slow.blocking, quick.blocking) == (True, False)
    assert await slow.invoke({"key": "slow"}, ctx) == "slow"
    assert await quick.invoke({"key": "quick"}, ctx) == "quick"
    loop_thread = threading.get_ident()
    assert where["quick"] == loop_thread and where["slow"] != loop_thread
