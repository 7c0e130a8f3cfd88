"""Reading the file: the YAML is composed into nodes and read into plain values with the
line of every key, `${VAR}` references are substituted from the environment, and pydantic's
validation errors are mapped back to `<file>:<line>: <dotted.key>` problems. `load_config`
puts it together."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from nodbot.bot.config.errors import ConfigError, KeyPath, Source, shown
from nodbot.bot.config.models import Config
from nodbot.bot.config.values import ConfigModel

# --- reading YAML ---------------------------------------------------------------------------

_MAX_NODES = 100_000  # more values than any real config has: an alias bomb, refused

_REFERENCE = re.compile(r"\$(\$)?\{([^}]*)\}|\$\{")
_VARIABLE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _TooLarge(Exception):
    """The document expands to more values than a configuration has (an alias bomb)."""


class _Reader:
    """Turns the composed YAML node tree into plain values, recording the line of every key
    and list item, substituting environment variables and collecting problems."""

    def __init__(self, source: Source, loader: yaml.SafeLoader, environ: Mapping[str, str]):
        self.source = source
        self.loader = loader
        self.environ = environ
        self.problems: list[str] = []
        self.problem_lines: list[int] = []
        """The line of each of `problems`, to sort them with validation's."""
        self.problem_paths: set[KeyPath] = set()
        """The keys whose reading failed: their values are stand-ins."""
        self._open: set[int] = set()
        self._count = 0

    def add(self, path: KeyPath, message: str, *, line: int | None = None) -> None:
        self.problems.append(self.source.problem(path, message, line=line))
        self.problem_lines.append(line if line is not None else self.source.line(path))
        self.problem_paths.add(path)

    def value(self, node: yaml.Node, path: KeyPath) -> Any:
        self._count += 1
        if self._count > _MAX_NODES:
            raise _TooLarge
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if id(node) in self._open:
            self.add(path, "an alias refers to a value that contains it")
            return None
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return self._sequence(node, path)
            assert isinstance(node, yaml.MappingNode)  # the composer makes no other node
            return self._mapping(node, path)
        finally:
            self._open.discard(id(node))

    def _scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.add(path, f"cannot read this value: {_yaml_problem(exc)}")
            return None
        if isinstance(value, str) and "$" in value:
            return self._substitute(value, path)
        return value

    def _sequence(self, node: yaml.SequenceNode, path: KeyPath) -> list[Any]:
        if node.tag != _SEQ_TAG:
            self.add(path, f"the YAML tag {node.tag} is not supported here")
        items = []
        for index, item in enumerate(node.value):
            self.source.lines.setdefault((*path, index), _line(item))
            items.append(self.value(item, (*path, index)))
        return items

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[Any, Any]:
        if node.tag != _MAP_TAG:
            self.add(path, f"the YAML tag {node.tag} is not supported here")
        seen: dict[tuple[str, str], int] = {}  # (resolved tag, text) -> line: 1 and "1" differ
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            written = (key_node.tag, key_node.value)
            if written in seen:
                first = f"duplicate key (first given on line {seen[written]})"
                self.add((*path, key_node.value), first, line=_line(key_node))
            else:
                seen[written] = _line(key_node)
        try:
            self.loader.flatten_mapping(node)
        except yaml.YAMLError as exc:
            self.add(path, f"cannot merge (<<) here: {_yaml_problem(exc)}")
            return {}
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.add(path, f"a key must be a plain value, not a {_kind(key_node)}")
                continue
            key = self._key(key_node, path)
            self.source.lines.setdefault((*path, key), _line(key_node))
            result[key] = self.value(value_node, (*path, key))
        return result

    def _key(self, node: yaml.ScalarNode, path: KeyPath) -> str | int:
        """The key as Python reads it: a string or an integer. Other scalars (`yes`, `1.5`,
        `null`, dates) keep the text they were written with."""
        try:
            key = self.loader.construct_object(node)
        except yaml.YAMLError as exc:
            self.add((*path, node.value), f"cannot read this key: {_yaml_problem(exc)}")
            return str(node.value)
        if isinstance(key, (str, int)) and not isinstance(key, bool):
            return key
        return str(node.value)

    def _substitute(self, text: str, path: KeyPath) -> str:
        def replace(found: re.Match[str]) -> str:
            if found.group(2) is None:
                self.add(path, "unclosed ${: expected ${NAME} or ${NAME:-default}")
                return found.group(0)
            if found.group(1):  # `$${...}` writes `${...}` itself
                return found.group(0)[1:]
            reference = _VARIABLE.fullmatch(found.group(2))
            if reference is None:
                self.add(
                    path,
                    f"bad variable reference {found.group(0)!r}: expected ${{NAME}} or "
                    "${NAME:-default}, NAME made of letters, digits and _",
                )
                return found.group(0)
            name, default = reference.group(1), reference.group(2)
            if default is not None:
                self.source.defaulted.setdefault(path, []).append(name)
            value = self.environ.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    self.add(
                        path,
                        f"the environment variable {name} is not set; set it, or give a "
                        f"default with ${{{name}:-default}}",
                    )
                    return ""
                value = default
            else:
                self.source.from_environment.add(path)
            self.source.substituted.add(path)
            return value

        if "${" in text:
            self.source.written[path] = text
        return _REFERENCE.sub(replace, text)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _kind(node: yaml.Node) -> str:
    return "mapping" if isinstance(node, yaml.MappingNode) else "list"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [part for part in (exc.context, exc.problem) if part]
        return ", ".join(parts) or str(exc)
    return str(exc)


_UNQUOTED_VARIABLE = re.compile(r"[{\[,][^\"'{}\[\]]*?:?\s*\$\{")
"""A `${...}` not quoted, after the `{`, `[` or `,` of a flow collection on its line."""


def _quote_hint(text: str, line: int) -> str:
    """What to do about a malformed line that has a `${...}` unquoted inside `{ }` or `[ ]`
    (YAML reads its `{` as the start of another mapping), else nothing."""
    lines = text.splitlines()
    written = lines[line - 1] if 0 < line <= len(lines) else ""
    if _UNQUOTED_VARIABLE.search(written) is None:
        return ""
    return '; inside { } or [ ], quote a ${...}: write "${NAME}"'


def _read_yaml(file: str, text: str, environ: Mapping[str, str]) -> tuple[Any, Source, _Reader]:
    """Compose and read the document. Raises `ConfigError` for malformed YAML; the problems
    found while reading (duplicate keys, missing variables) are the reader's `problems`, the
    document read as far as it could be, so that validation can find the others too."""
    source = Source(file=file, lines={})
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = int(mark.line) + 1 if mark is not None else 1
            problem = exc.problem or "cannot be parsed"
            if exc.context:
                started = exc.context_mark
                since = f" (line {started.line + 1})" if started is not None else ""
                problem = f"{exc.context}{since}: {problem}"
            hint = _quote_hint(text, line)
            raise ConfigError([f"{file}:{line}: malformed YAML: {problem}{hint}"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([f"{file}:1: malformed YAML: {exc}"]) from None
        if root is None:
            raise ConfigError(
                [f"{file}:1: (top level): the file is empty; expected a mapping of {_TOP}"]
            )
        source.lines[()] = _line(root)
        reader = _Reader(source, loader, environ)
        try:
            data = reader.value(root, ())
        except _TooLarge:
            raise ConfigError(
                [f"{file}:1: (top level): the document expands to more than {_MAX_NODES} values"]
            ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        found = source.problem((), f"expected a mapping of {_TOP}, not {shown(data)}")
        raise ConfigError([*reader.problems, found])
    return data, source, reader


_TOP = ", ".join(field.alias or name for name, field in Config.model_fields.items())


# --- reporting validation errors ------------------------------------------------------------


def _validation_problems(
    error: ValidationError, source: Source, said: set[KeyPath] | None = None
) -> list[tuple[int, str]]:
    """One line per problem, each naming the file, the line and the dotted key, with that
    line; problems at or under a key in `said` are left out (reading it failed already, and
    its value is a stand-in)."""
    found: list[tuple[int, str]] = []
    for detail in error.errors(include_url=False):
        loc: KeyPath = tuple(part for part in detail["loc"] if part != "[key]")
        for path, message in _messages(detail, loc, source):
            if any(path[: len(known)] == known for known in said or ()):
                continue
            found.append((source.line(path), source.problem(path, message)))
    return found


def _messages(detail: ErrorDetails, loc: KeyPath, source: Source) -> Iterator[tuple[KeyPath, str]]:
    kind = detail["type"]
    context = detail.get("ctx") or {}
    if kind == "nodbot":
        for below, message in context["problems"]:
            yield loc + tuple(below), message
    elif kind == "extra_forbidden":
        yield loc, _unknown_key(loc)
    elif kind == "missing":
        yield loc, f"the required key {loc[-1]!r} is missing"
    else:
        message = detail["msg"].removeprefix("Value error, ")
        value = detail.get("input")
        if loc not in source.substituted and isinstance(value, (str, int, float, bool)):
            message = f"{message}, not {value!r}"
        yield loc, message


def _unknown_key(loc: KeyPath) -> str:
    """`unknown key 'x'`, with the closest known key of that place when one is close (a
    typo), then every known key there, as the file writes them (`from`, not `sender`)."""
    model = _model_at(loc[:-1])
    if model is None:  # not reached: every model is reachable from Config; kept as a fallback
        return "unknown key"
    keys = [field.alias or name for name, field in model.model_fields.items()]
    said = f"unknown {model.key_noun} {loc[-1]!r}"
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    if close:
        return f"{said}; did you mean {close[0]!r}? (expected one of: {', '.join(keys)})"
    return f"{said}; expected one of: {', '.join(keys)}"


def _model_at(loc: KeyPath) -> type[ConfigModel] | None:
    """The configuration model that validates the value at `loc`, if any."""
    current: Any = Config
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            found = current.model_fields.get(str(part))
            if found is None:
                return None
            current = found.annotation
        elif get_origin(current) is list:
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, ConfigModel) else None


def _unwrap(annotation: Any) -> Any:
    """`X` for `X | None` and `Annotated[X, ...]`."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            annotation = members[0]
        else:
            return annotation


# --- loading --------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Config:
    """Read and validate a configuration file; `${VAR}` come from `environ` (default:
    `os.environ`). Imports no agent (see `check_agents`).

    Raises `ConfigError` listing every problem, each with the file, line and key.
    """
    file = os.fspath(path)
    try:
        raw = Path(file).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read the file: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError([f"{file}:{line}: (top level): the file is not UTF-8 text"]) from None
    data, source, reader = _read_yaml(file, text, os.environ if environ is None else environ)
    # Every problem at once: the reading ones (a missing variable, say) with the validation's
    # of every other key.
    found = list(zip(reader.problem_lines, reader.problems, strict=True))
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        found += _validation_problems(exc, source, reader.problem_paths)
    if found:
        found.sort(key=lambda pair: pair[0])
        raise ConfigError([text for _, text in found])
    config._source = source
    return config
