"""An MkDocs hook that writes the Reference pages at build time from nodbot itself, so they
cannot fall behind the code: the command line from the real argparse parser, the HTTP API
from the OpenAPI document the bot serves, the configuration from the pydantic models of
`nodbot.yml`.

A page of docs/reference/ holds a short introduction and a marker line, such as
`<!-- generated: cli -->`, which this hook replaces (`on_page_markdown`); it also adds the
OpenAPI document to the site as reference/openapi.json (`on_files`). A marker naming no part
fails the build.

Everything rendered goes out as HTML with every value escaped (descriptions may hold `<`,
`|`, `*`): tables are HTML tables, so no text of a docstring or a help string is read as
Markdown or markup. Only a pair of backticks becomes `<code>`, as the docstrings mean it.
Headings are Markdown (they feed the table of contents) with their text written as
character references, so nothing in them is Markdown syntax either.
"""

from __future__ import annotations

import argparse
import ast
import html
import inspect
import itertools
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType, NoneType, UnionType
from typing import TYPE_CHECKING, Any

try:
    import annotated_types
    from pydantic import BaseModel, SecretStr
    from pydantic.fields import FieldInfo
    from pydantic_core import PydanticUndefined

    from nodbot.bot.cli import build_parser
    from nodbot.bot.config import models as config_models
    from nodbot.bot.config import predicates as config_predicates
    from nodbot.bot.config import values as config_values
    from nodbot.bot.config.models import Config
    from nodbot.bot.http.openapi import openapi_document
except ImportError as exc:  # mkdocs from elsewhere than nodbot's virtual environment
    raise ImportError(
        f"the Reference pages are made from nodbot itself, which cannot be imported ({exc}): "
        "build the docs with the mkdocs of nodbot's environment, `make docs`"
    ) from exc

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

MARKER = re.compile(r"^<!-- generated: (?P<name>[^ ]*) -->[ \t]*$", re.MULTILINE)
OPENAPI_FILE = "reference/openapi.json"
"""Where the OpenAPI document is in the site (beside reference/http-api.md)."""


# -- escaping -------------------------------------------------------------------------------

_MARKDOWN_SPECIALS = str.maketrans({c: f"&#{ord(c)};" for c in "\\`*_{}[]()#+-.!|~:<>&\"'"})


def heading(level: int, text: str, *, code: bool = False) -> str:
    """A Markdown heading whose text is only character references and plain characters (no
    Markdown, no attribute list, no markup); `code` shows it as code."""
    shown = text.translate(_MARKDOWN_SPECIALS)
    return "#" * level + " " + (f"<code>{shown}</code>" if code else shown)


def inline(text: str | None) -> str:
    """Docstring or help text as HTML: escaped, its `backtick` spans as code, its line breaks
    (a wrapped docstring) as spaces, its blank lines as paragraph breaks."""
    if not text:
        return ""
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "<br><br>".join(_spans(" ".join(p.split())) for p in paragraphs)


def _spans(text: str) -> str:
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(
        f"<code>{html.escape(part[1:-1])}</code>" if i % 2 else html.escape(part)
        for i, part in enumerate(parts)
    )


def code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


def paragraph(text: str) -> str:
    return f"<p>{text}</p>" if text else ""


def table(header: Sequence[str], rows: Sequence[Sequence[str]], ids: Sequence[str] = ()) -> str:
    """An HTML table of cells that are HTML already (escaped by the caller); one line per
    row and no blank line, so Markdown takes the whole table as one raw HTML block."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    lines = ["<table>", f"<thead><tr>{head}</tr></thead>", "<tbody>"]
    for index, row in enumerate(rows):
        attribute = f' id="{html.escape(ids[index])}"' if ids else ""
        lines.append(f"<tr{attribute}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)


def preformatted(text: str) -> str:
    """A block of text shown as is (a usage line): escaped, without blank lines (which would
    end Markdown's raw HTML block)."""
    lines = [line for line in text.rstrip().splitlines() if line.strip()]
    return "<pre><code>" + html.escape("\n".join(lines)) + "</code></pre>"


def blocks(*parts: str) -> str:
    """Block-level parts, a blank line apart (Markdown's block separator)."""
    return "\n\n".join(part for part in parts if part) + "\n"


# -- the command line -----------------------------------------------------------------------

USAGE_WIDTH = 88
"""Where usage lines wrap: the width of the docs' code blocks."""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str | None, Any]]:
    """(name, help, parser) of each subcommand, in the parser's order."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name), sub))
    return found


def _option(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """How an argument is written: `--store URL`, `FILE`, `--version`."""
    if not action.option_strings:  # its choices, if any, are listed beside it
        if action.metavar is None:
            return code(action.dest)
        return code(formatter._metavar_formatter(action, action.dest)(1)[0])
    if action.nargs == 0:
        return ", ".join(code(option) for option in action.option_strings)
    value = formatter._format_args(action, action.dest.upper())
    return ", ".join(code(f"{option} {value}") for option in action.option_strings)


def _argument_help(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """The help text, then in the same lowercase voice what `--help` leaves to the usage
    line: required, the choices, the default (unless the text says it)."""
    help_text = formatter._expand_help(action) if action.help else ""
    notes = []
    if action.required and action.option_strings:
        notes.append("required")
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        notes.append("one of " + ", ".join(code(str(choice)) for choice in action.choices))
    stated = "default" in help_text.lower()
    default = action.default
    if not stated and action.option_strings and default not in (None, False, argparse.SUPPRESS):
        notes.append(f"default: {code(str(default))}")
    return "; ".join(part for part in [inline(help_text), *notes] if part)


def _command(parser: argparse.ArgumentParser, help_text: str | None, level: int) -> list[str]:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    parts = [
        heading(level, parser.prog, code=True),
        paragraph(inline(parser.description or help_text)),
        preformatted(formatter.format_help()),
    ]
    subcommands = _subcommands(parser)
    arguments = [
        action
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        and not isinstance(action, (argparse._SubParsersAction, argparse._HelpAction))
    ]
    if arguments:
        rows = [[_option(a, formatter), _argument_help(a, formatter)] for a in arguments]
        parts.append(table(["Argument", "What it does"], rows))
    if subcommands:
        rows = [[code(f"{parser.prog} {name}"), inline(text)] for name, text, _ in subcommands]
        parts.append(table(["Command", "What it does"], rows))
    parts = [blocks(*parts)]
    for _, text, sub in subcommands:
        parts += _command(sub, text, min(level + 1, 4))
    return parts


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """Every command and subcommand of `parser`: its description, usage, arguments (with
    their defaults and choices) and subcommands, parents first."""
    return "\n".join(_command(parser, None, 2))


# -- the HTTP API ---------------------------------------------------------------------------

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_SCHEMA_REF = "#/components/schemas/"


def served_document() -> dict[str, Any]:
    """The OpenAPI document of a bot that serves every route (runs, the request API, the
    email door): what a bot serves is this, less the parts its configuration leaves out."""
    return openapi_document(with_runs=True, with_email=True)


def schema_anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def schema_type(schema: Mapping[str, Any]) -> str:
    """A JSON Schema as a reader says it: `string`, `array of ApprovalView`, `"a" | "b"`,
    `integer, 1 to 500`, a link for a named schema."""
    if "$ref" in schema:
        ref = str(schema["$ref"])
        name = ref.removeprefix(_SCHEMA_REF)
        return f'<a href="#{schema_anchor(name)}">{html.escape(name)}</a>'
    for key in ("anyOf", "oneOf"):
        if key in schema:
            kinds = [schema_type(option) for option in schema[key]]
            return " or ".join(dict.fromkeys(kinds))
    if "enum" in schema:
        return " | ".join(code(json.dumps(value)) for value in schema["enum"])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        text = " or ".join(html.escape(str(k)) for k in kind)
    elif kind == "array":
        text = "array of " + schema_type(schema.get("items", {}))
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        text = "object of " + schema_type(schema["additionalProperties"])
    else:
        text = html.escape(str(kind))
    if "format" in schema:
        text += f" ({html.escape(str(schema['format']))})"
    limits = _limits(schema)
    return text + (", " + limits if limits else "")


def _limits(schema: Mapping[str, Any]) -> str:
    """A schema's bounds in words: `1 to 500`, `at most 200 characters`, `above 0`."""
    found = []
    for low, high, unit in (
        ("minimum", "maximum", ""),
        ("minLength", "maxLength", " characters"),
        ("minItems", "maxItems", " items"),
    ):
        if low in schema and high in schema:
            found.append(f"{schema[low]} to {schema[high]}{unit}")
        elif low in schema:
            found.append(f"at least {schema[low]}{unit}")
        elif high in schema:
            found.append(f"at most {schema[high]}{unit}")
    if "exclusiveMinimum" in schema:
        found.append(f"above {schema['exclusiveMinimum']}")
    if "exclusiveMaximum" in schema:
        found.append(f"below {schema['exclusiveMaximum']}")
    text = html.escape(", ".join(found))
    if "pattern" in schema:
        text += (", " if text else "") + "matching " + code(str(schema["pattern"]))
    return text


def _content(body: Mapping[str, Any]) -> str:
    """The media types of a body or an answer, each with its schema."""
    return "<br>".join(
        f"{code(media)}: {schema_type(spec.get('schema', {}))}"
        for media, spec in body.get("content", {}).items()
    )


def _operation(method: str, path: str, operation: Mapping[str, Any]) -> str:
    secured = bool(operation.get("security"))
    who = (
        "A bearer token (<code>Authorization: Bearer ...</code>). "
        + inline(operation.get("description"))
        if secured
        else "Needs no token."
    )
    parts = [
        heading(3, f"{method.upper()} {path}", code=True),
        paragraph(inline(operation.get("summary"))),
        paragraph(who),
    ]
    parameters = operation.get("parameters", [])
    if parameters:
        rows = [
            [
                code(str(p.get("name"))),
                html.escape(str(p.get("in"))),
                schema_type(p.get("schema", {})),
                "yes" if p.get("required") else "no",
                inline(p.get("description")),
            ]
            for p in parameters
        ]
        parts.append(table(["Parameter", "In", "Type", "Required", "What it is"], rows))
    body = operation.get("requestBody")
    if body:
        required = "required" if body.get("required") else "optional"
        parts.append(paragraph(f"Body ({required}): {_content(body)}"))
    rows = [
        [html.escape(str(status)), inline(answer.get("description")), _content(answer)]
        for status, answer in operation.get("responses", {}).items()
    ]
    parts.append(table(["Status", "When", "Body"], rows))
    return blocks(*parts)


def _schema(name: str, schema: Mapping[str, Any]) -> str:
    required = set(schema.get("required", []))
    rows = [
        [
            code(field_name),
            schema_type(spec),
            "yes" if field_name in required else "no",
            inline(spec.get("description")),
        ]
        for field_name, spec in schema.get("properties", {}).items()
    ]
    parts = [
        f'<a id="{schema_anchor(name)}"></a>',
        heading(3, name, code=True),
        paragraph(inline(schema.get("description"))),
    ]
    if rows:
        parts.append(table(["Field", "Type", "Always there", "What it is"], rows))
    else:
        parts.append(paragraph("Type: " + schema_type(schema)))
    return blocks(*parts)


def http_reference(document: Mapping[str, Any]) -> str:
    """Every path and method of an OpenAPI document (summary, token and scope, parameters,
    body, answers), then every schema it names, field by field."""
    version = str(document.get("openapi", "")).translate(_MARKDOWN_SPECIALS)
    parts = [
        # A Markdown link, which MkDocs checks and points at the file wherever the page is.
        "The whole document, for a client generator or an API tool: "
        f"[openapi.json](openapi.json) (OpenAPI {version}); "
        "a running bot serves its own at <code>GET /openapi.json</code>.",
        heading(2, "Paths"),
    ]
    for path, operations in document.get("paths", {}).items():
        for method in METHODS:
            if method in operations:
                parts.append(_operation(method, path, operations[method]))
    parts.append(heading(2, "Schemas"))
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        parts.append(_schema(name, schema))
    return blocks(*parts)


# -- the configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class ValueType:
    """A named type of the file's values (`Duration`, `ReviewerEntry`, ...)."""

    name: str
    doc: str


def _alias_docs(module: ModuleType) -> dict[str, str]:
    """`Name: TypeAlias = ...` -> the docstring under it, read from the module's source (a
    type alias keeps no docstring at run time)."""
    source = inspect.getsource(module)
    docs: dict[str, str] = {}
    body = ast.parse(source).body
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = following.value.value
    return docs


def value_types(*modules: ModuleType) -> dict[int, ValueType]:
    """The validators of each `Annotated` type alias of these modules (by identity: pydantic
    keeps the very objects in a field's metadata) -> the alias's name and docstring."""
    found: dict[int, ValueType] = {}
    for module in modules:
        docs = _alias_docs(module)
        for name, doc in docs.items():
            alias: Any = getattr(module, name, None)
            if typing.get_origin(alias) is typing.Annotated:
                for item in alias.__metadata__:
                    if not isinstance(item, (FieldInfo, annotated_types.BaseMetadata)):
                        found.setdefault(id(item), ValueType(name, doc))
    return found


_DURATION = typing.get_args(config_values.Duration)[1]
_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))


def duration_text(seconds: int) -> str:
    """Seconds as the file writes them: 300 -> `5m`, 5400 -> `1h30m`."""
    parts = []
    for unit, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def key_anchor(path: str) -> str:
    """The id of a key's row: `rules[].timeout` -> `key-rules-timeout`."""
    return "key-" + re.sub(r"[^a-z0-9_]+", "-", path.lower()).strip("-")


def type_anchor(name: str) -> str:
    return "type-" + re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-")


def section_anchor(path: str) -> str:
    return "section-" + re.sub(r"[^a-z0-9_]+", "-", path.lower()).strip("-")


@dataclass
class _Walk:
    """The configuration page, model by model: each is written once, at its first key."""

    aliases: dict[int, ValueType]
    written: dict[type[BaseModel], str] = field(default_factory=dict)
    used: dict[str, ValueType] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)

    def model(self, model: type[BaseModel], path: str) -> None:
        self.written[model] = path
        rows: list[list[str]] = []
        ids: list[str] = []
        nested: list[tuple[type[BaseModel], str]] = []
        for name, info in model.model_fields.items():
            key = info.alias or name
            key_path = f"{path}.{key}" if path else key
            kind = self.type_of(info.annotation, info.metadata, key_path, nested)
            rows.append([_nowrap(code(key)), kind, self.default(info), inline(info.description)])
            ids.append(key_anchor(key_path))
        title = path or "nodbot.yml"
        doc = inspect.getdoc(model) if model.__doc__ else None
        self.sections.append(
            blocks(
                f'<a id="{section_anchor(title)}"></a>',
                heading(2 if path.count(".") == 0 else 3, title, code=True),
                paragraph(inline(doc)),
                table(["Key", "Type", "Default", "What it is"], rows, ids),
            )
        )
        for inner, inner_path in nested:
            if inner not in self.written:
                self.model(inner, inner_path)

    def type_of(
        self,
        annotation: Any,
        metadata: Sequence[Any],
        path: str,
        nested: list[tuple[type[BaseModel], str]],
    ) -> str:
        """A field's type as the file writes it, with its limits; the models it names are
        noted in `nested` with the path of their section."""
        limits = [_limit(item) for item in metadata if _limit(item)]
        named = [self.aliases[id(item)] for item in metadata if id(item) in self.aliases]
        if named:
            self.used[named[0].name] = named[0]
            text = f'<a href="#{type_anchor(named[0].name)}">{html.escape(named[0].name)}</a>'
        else:
            text = self.plain_type(annotation, path, nested)
        return text + (", " + ", ".join(limits) if limits else "")

    def plain_type(
        self, annotation: Any, path: str, nested: list[tuple[type[BaseModel], str]]
    ) -> str:
        origin = typing.get_origin(annotation)
        arguments = typing.get_args(annotation)
        if origin is typing.Annotated:
            return self.type_of(arguments[0], annotation.__metadata__, path, nested)
        if origin in (typing.Union, UnionType):
            kinds = [self.plain_type(a, path, nested) for a in arguments if a is not NoneType]
            return " or ".join(kinds)
        if origin is typing.Literal:
            return " | ".join(code(_yaml(value)) for value in arguments)
        if origin is list:
            return "list of " + self.plain_type(arguments[0], path + "[]", nested)
        if origin is dict:
            key, value = (self.plain_type(a, path + ".*", nested) for a in arguments)
            return f"map of {key} to {value}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            target = self.written.get(annotation)
            if target is None:
                target = next((p for m, p in nested if m is annotation), None)
            if target is None:
                nested.append((annotation, path))
                target = path
            return f'<a href="#{section_anchor(target)}">section {html.escape(target)}</a>'
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        if annotation in names:
            return names[annotation]
        if annotation is SecretStr:
            return "secret string"
        if annotation is Any:
            return "any value"
        return html.escape(getattr(annotation, "__name__", str(annotation)))

    def default(self, info: FieldInfo) -> str:
        if info.is_required():
            return "<strong>required</strong>"
        value = info.get_default(call_default_factory=True, validated_data={})
        if value is None or value is PydanticUndefined:
            return "not set"
        if isinstance(value, BaseModel):
            return "each key's default"
        duration = any(item is _DURATION for item in info.metadata)
        if duration and isinstance(value, int) and not isinstance(value, bool):
            return code(duration_text(value))
        return code(_yaml(value))

    def value_types(self) -> str:
        if not self.used:
            return ""
        used = sorted(self.used.values(), key=_name)
        rows = [[code(v.name), inline(v.doc)] for v in used]
        return blocks(
            f'<a id="{section_anchor("value types")}"></a>',
            heading(2, "Value types"),
            paragraph("The kinds of values the keys above take, and how they are written."),
            table(["Type", "What it is"], rows, [type_anchor(v.name) for v in used]),
        )


def _nowrap(cell: str) -> str:
    # A key is short and one word: broken over lines it reads as two.
    return f'<span style="white-space: nowrap">{cell}</span>'


def _name(value: ValueType) -> str:
    return value.name


def _limit(item: Any) -> str:
    words = {
        annotated_types.Gt: ("above", "gt"),
        annotated_types.Ge: ("at least", "ge"),
        annotated_types.Lt: ("below", "lt"),
        annotated_types.Le: ("at most", "le"),
    }
    for kind, (word, attribute) in words.items():
        if isinstance(item, kind):
            return f"{word} {html.escape(str(getattr(item, attribute)))}"
    return ""


def _yaml(value: Any) -> str:
    """A default as it would be written in the file (YAML's flow style)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def configuration_reference(model: type[BaseModel]) -> str:
    """Every key of the file, section by section in the file's order (a section at its
    first key: the predicates, which nest, once): its type and limits, its default and its
    description; then the named value types the keys use."""
    walk = _Walk(value_types(config_values, config_models, config_predicates))
    walk.model(model, "")
    return blocks(*walk.sections, walk.value_types())


# -- the hook -------------------------------------------------------------------------------

GENERATED: dict[str, Callable[[], str]] = {
    "cli": lambda: cli_reference(build_parser()),
    "http-api": lambda: http_reference(served_document()),
    "configuration": lambda: configuration_reference(Config),
}


def fill(markdown: str, where: str) -> str:
    """`markdown` with each marker replaced by its part. Raises `ValueError` naming the
    page for a marker that names no part."""

    def part(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATED:
            known = ", ".join(GENERATED)
            raise ValueError(f"{where}: no generated part named {name!r} (known: {known})")
        return GENERATED[name]()

    return MARKER.sub(part, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """MkDocs event: fill the page's markers."""
    return fill(markdown, page.file.src_uri)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """MkDocs event: the OpenAPI document becomes a file of the site."""
    from mkdocs.structure.files import File  # mkdocs is there when MkDocs runs the hook

    document = json.dumps(served_document(), indent=2, ensure_ascii=False) + "\n"
    files.append(File.generated(config, OPENAPI_FILE, content=document))
    return files


__all__ = [
    "cli_reference",
    "configuration_reference",
    "fill",
    "http_reference",
    "on_files",
    "on_page_markdown",
    "served_document",
]
