"""Tools: plain functions registered with a name, an argument model and a review rule.

```python
registry = ToolRegistry()

@registry.tool(confirm=True, effects="destructive")
def refund(order_id: str, amount: float) -> str:
    \"\"\"Refund an order.\"\"\"
```

The argument model is a pydantic model built from the signature (unknown arguments are
refused). A parameter annotated `ToolContext` receives the run's context and is not an
argument. Sync tools run in a worker thread so they never block the event loop.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nodbot.core.calls import ToolCall, ToolContext
from nodbot.core.errors import ConfigurationError, InvalidArgumentsError, UnknownToolError
from nodbot.core.threads import run_in_thread

__all__ = [
    "NOT_TEXT",
    "ConfirmRule",
    "Effects",
    "Tool",
    "ToolRegistry",
    "ToolSpec",
    "ValidatedArguments",
    "arguments_digest",
    "canonical_json",
    "unencodable",
]

Effects: TypeAlias = Literal["read", "write", "destructive"]
"""What a tool does to the world: reviewers are warned before approving a destructive one."""

ConfirmRule: TypeAlias = Callable[[ToolCall, ToolContext], "bool | Awaitable[bool]"]
"""Decides per call whether a person must review it; sync or async. Raising means review."""

_EFFECTS = ("read", "write", "destructive")


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""One encoder for every call: `json.dumps` with options makes a new one each time."""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same arguments always give the same text."""
    return _CANONICAL.encode(value)


NOT_TEXT = "not valid text: it holds a lone surrogate (such as a JSON \\ud800 escape)"
"""What is wrong with a string that UTF-8 cannot carry (`unencodable`)."""


def unencodable(value: Any, path: str = "") -> str | None:
    """The dotted path (from `path`) of the first string in `value`, a key or a value at any
    depth of its mappings and lists, that UTF-8 cannot carry: a lone surrogate, which a
    model's JSON `\\ud800` escape makes and which no store, digest or page can hold. "" for
    `value` itself; None when every string is text."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and unencodable(key) is not None:
                return path or "(arguments)"
            found = unencodable(item, where)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unencodable(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of the canonical JSON of validated arguments."""
    return hashlib.sha256(canonical_json(arguments).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ValidatedArguments:
    """Arguments that passed a tool's model, in the two forms nodbot needs."""

    values: dict[str, Any]
    """Python values, as the tool function receives them."""
    canonical: dict[str, Any]
    """JSON values, as stored, shown to reviewers and digested."""


@dataclass(frozen=True)
class ToolSpec:
    """What a chat model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON schema of the arguments."""


@dataclass(frozen=True)
class Tool:
    """One registered tool. Build it with `ToolRegistry.tool` or `ToolRegistry.add`."""

    name: str
    description: str
    function: Callable[..., Any]
    model: type[BaseModel]
    """The pydantic model that validates the arguments."""
    confirm: bool | ConfirmRule
    """True: every call is reviewed. A rule: the calls it returns True for. False: none."""
    effects: Effects
    context_parameter: str | None
    """The name of the parameter that receives the `ToolContext`, if any."""
    blocking: bool = True
    """Whether a synchronous function may block (I/O, waiting): then it runs in a thread, so
    the event loop goes on meanwhile. `blocking=False` runs it on the loop itself, which
    saves the thread's hand-off: only for functions that return at once."""

    def validate(
        self, arguments: Mapping[str, Any], *, source: str = "arguments"
    ) -> ValidatedArguments:
        """Validate arguments with the tool's model.

        Raises `InvalidArgumentsError` naming each offending field.
        """
        if not isinstance(arguments, Mapping):
            errors = [{"field": "(arguments)", "message": "expected an object of named values"}]
            raise InvalidArgumentsError(tool=self.name, errors=errors, source=source)
        try:
            instance = self.model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise InvalidArgumentsError(
                tool=self.name, errors=_field_errors(exc), source=source
            ) from None
        values = {
            field.alias or name: getattr(instance, name)
            for name, field in type(instance).model_fields.items()
        }
        canonical = instance.model_dump(mode="json", by_alias=True)
        fault = unencodable(canonical)
        if fault is not None:  # before it is digested, stored or shown: none of them can
            errors = [{"field": fault or "(arguments)", "message": NOT_TEXT}]
            raise InvalidArgumentsError(tool=self.name, errors=errors, source=source)
        return ValidatedArguments(values=values, canonical=canonical)

    def spec(self) -> ToolSpec:
        """The tool as a chat model sees it."""
        return ToolSpec(self.name, self.description, self.model.model_json_schema())

    async def invoke(self, values: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Run the function with validated values; sync functions run in a thread
        (`core.threads`) unless they are declared `blocking=False`."""
        kwargs = dict(values)
        if self.context_parameter is not None:
            kwargs[self.context_parameter] = ctx
        if inspect.iscoroutinefunction(self.function):
            return await self.function(**kwargs)
        if self.blocking:
            result = await run_in_thread(self.function, **kwargs)
        else:
            result = self.function(**kwargs)
        if inspect.isawaitable(result):  # an async callable object, or a partial of one
            result = await result
        return result


def _field_errors(exc: ValidationError) -> list[dict[str, str]]:
    errors = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "not an argument of this tool"
        errors.append({"field": field, "message": message})
    return errors


class ToolRegistry:
    """The tools an executor may run, by name."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: list[ToolSpec] | None = None

    @overload
    def tool(self, function: Callable[..., Any], /) -> Tool: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        confirm: bool | ConfirmRule = False,
        effects: Effects = "write",
        blocking: bool = True,
    ) -> Callable[[Callable[..., Any]], Tool]: ...

    def tool(
        self,
        function: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        confirm: bool | ConfirmRule = False,
        effects: Effects = "write",
        blocking: bool = True,
    ) -> Tool | Callable[[Callable[..., Any]], Tool]:
        """Register a function as a tool; use bare (`@registry.tool`) or with options."""

        def register(fn: Callable[..., Any]) -> Tool:
            return self.add(
                fn,
                name=name,
                description=description,
                confirm=confirm,
                effects=effects,
                blocking=blocking,
            )

        return register(function) if function is not None else register

    def add(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        confirm: bool | ConfirmRule = False,
        effects: Effects = "write",
        blocking: bool = True,
    ) -> Tool:
        """Register `function`. Raises `ConfigurationError` for a bad name, signature or option.
        `blocking=False` (a synchronous function that returns at once) runs it on the event
        loop instead of a thread."""
        tool_name: str = name if name else str(getattr(function, "__name__", ""))
        if not tool_name.isidentifier():
            raise ConfigurationError(f"tool name {tool_name!r} must be a Python identifier")
        if tool_name in self._tools:
            raise ConfigurationError(f"a tool named {tool_name!r} is already registered")
        if effects not in _EFFECTS:
            raise ConfigurationError(
                f"tool {tool_name!r}: effects must be one of {', '.join(_EFFECTS)}, not {effects!r}"
            )
        if not (isinstance(confirm, bool) or callable(confirm)):
            raise ConfigurationError(
                f"tool {tool_name!r}: confirm must be True, False or a rule (call, ctx) -> bool"
            )
        model, context_parameter = _arguments_model(tool_name, function)
        tool = Tool(
            name=tool_name,
            description=description or _summary(function),
            function=function,
            model=model,
            confirm=confirm,
            effects=effects,
            context_parameter=context_parameter,
            blocking=blocking,
        )
        self._tools[tool_name] = tool
        self._specs = None
        return tool

    @classmethod
    def merged(cls, registries: Iterable[ToolRegistry]) -> ToolRegistry:
        """One registry with the tools of all `registries` (several agents share tools).

        Raises `ConfigurationError` when two of them give one name to different tools.
        """
        merged = cls()
        for registry in registries:
            for tool in registry:
                known = merged._tools.get(tool.name)
                if known is not None and known.function is not tool.function:
                    raise ConfigurationError(
                        f"two different tools are named {tool.name!r}; tool names must be "
                        "unique across the agents of one bot"
                    )
                merged._tools[tool.name] = tool
        merged._specs = None
        return merged

    def get(self, name: str) -> Tool:
        """The tool called `name`. Raises `UnknownToolError`."""
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(tool=name, known=sorted(self._tools)) from None

    def specs(self) -> list[ToolSpec]:
        """Every tool as a chat model sees it (built once per set of tools: every model turn
        asks for it, and a JSON schema is not cheap to make)."""
        if self._specs is None:
            self._specs = [tool.spec() for tool in self._tools.values()]
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def _summary(function: Callable[..., Any]) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _arguments_model(
    tool_name: str, function: Callable[..., Any]
) -> tuple[type[BaseModel], str | None]:
    try:
        hints = get_type_hints(function)
    except Exception as exc:
        raise ConfigurationError(
            f"tool {tool_name!r}: cannot resolve its type hints: {exc}"
        ) from exc
    fields: dict[str, Any] = {}
    context_parameter = None
    for index, parameter in enumerate(inspect.signature(function).parameters.values()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {tool_name!r}: *args and **kwargs cannot be validated; "
                f"name each argument (found {parameter.name!r})"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"tool {tool_name!r}: argument {parameter.name!r} is positional-only; "
                "tools are called with named arguments"
            )
        annotation = hints.get(parameter.name, Any)
        if annotation is ToolContext:
            context_parameter = parameter.name
            continue
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[_field_name(parameter.name, index)] = (
            annotation,
            Field(default, alias=parameter.name),
        )
    model = create_model(f"{tool_name}_arguments", __config__=_ARGUMENTS_CONFIG, **fields)
    return model, context_parameter


# Arguments are read and written by their parameter names (the aliases); NaN and infinity are
# refused because they are not JSON and would slip past comparisons such as gt("amount", 100).
_ARGUMENTS_CONFIG = ConfigDict(
    extra="forbid",
    allow_inf_nan=False,
    validate_by_alias=True,
    validate_by_name=False,
)


def _field_name(parameter: str, index: int) -> str:
    """The model's own name for a parameter: pydantic keeps `_x` private and warns when a name
    such as `json` or `schema` shadows a BaseModel attribute, so those get a neutral name."""
    if parameter.startswith("_") or hasattr(BaseModel, parameter):
        return f"argument_{index}"
    return parameter
