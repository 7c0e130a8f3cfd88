"""The docs' Reference pages are made at build time by `docs/hooks/reference.py` from the code
itself: every command of the real parser, every path of the OpenAPI document the bot serves,
every key of the configuration models. These tests walk the parser and the models on their
own and find each part on the pages; they feed the renderers hostile text and find it shown,
never obeyed; and they run `docs/shots.py` (a real bot, headless Chromium) for the Quick
start's screenshots."""

from __future__ import annotations

import argparse
import html
import importlib.util
import re
import struct
import subprocess
import sys
import typing
from collections.abc import Iterator
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType, UnionType
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from nodbot.bot.cli import build_parser
from nodbot.bot.config.models import Config
from nodbot.bot.http.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "reference.py"
SHOTS = ROOT / "docs" / "shots.py"
PAGES = {
    "cli": ROOT / "docs" / "reference" / "cli.md",
    "http-api": ROOT / "docs" / "reference" / "http-api.md",
    "configuration": ROOT / "docs" / "reference" / "configuration.md",
}


def load(path: Path, name: str) -> ModuleType:
    """A module of docs/ (not a package), imported as MkDocs imports a hook."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return load(HOOK, "nodbot_docs_reference_hook")


def sections(markdown: str) -> dict[str, str]:
    """Each heading's text (tags and entities undone) -> the text up to the next heading."""
    found: dict[str, str] = {}
    title = ""
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = html.unescape(re.sub(r"<[^>]+>", "", line.lstrip("#").strip()))
            found.setdefault(title, "")
        else:
            found[title] = found.get(title, "") + line + "\n"
    return found


class Tags(HTMLParser):
    """Every element and every comment a piece of HTML opens, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str | None]] = []
        self.comments: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.extend(attrs)

    def handle_comment(self, data: str) -> None:
        self.comments.append(data)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


# The tags the renderers write themselves; anything else came from the text rendered.
OWN_TAGS = {
    "a",
    "br",
    "code",
    "p",
    "pre",
    "span",
    "strong",
    "table",
    "tbody",
    "td",
    "th",
    "thead",
    "tr",
}


def parsed(markdown: str) -> Tags:
    tags = Tags()
    tags.feed(markdown)
    tags.close()
    return tags


# -- the command line -----------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and each subcommand's parser, at any depth."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from commands(sub)


def test_the_cli_page_has_every_command_with_its_options(hook: ModuleType) -> None:
    page = sections(hook.cli_reference(build_parser()))
    parsers = list(commands(build_parser()))
    assert len(parsers) > 15  # the walk found the subcommands
    for parser in parsers:
        assert parser.prog in page, f"no section for {parser.prog}"
        section = page[parser.prog]
        assert "usage: " + parser.prog in html.unescape(section)
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue  # -h / --help: every command has it, the page says so once
            if isinstance(action, argparse._SubParsersAction):
                for name in action.choices:
                    assert f"{parser.prog} {name}" in section, f"{parser.prog}: {name} not listed"
            elif action.option_strings:
                for option in action.option_strings:
                    assert f"<code>{option}" in section, f"{parser.prog}: {option} missing"
            else:
                assert f"<code>{action.metavar or action.dest}" in section


# -- the HTTP API ---------------------------------------------------------------------------


def test_the_http_page_has_every_path_method_and_schema(hook: ModuleType) -> None:
    document = openapi_document(with_runs=True, with_email=True)
    assert hook.served_document() == document  # every route the bot may serve
    page = sections(hook.http_reference(document))
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            title = f"{method.upper()} {path}"
            assert title in page, f"no section for {title}"
            section = html.unescape(page[title])
            assert operation["summary"].split("`")[0] in section
            for parameter in operation.get("parameters", []):
                assert f"<code>{parameter['name']}</code>" in section
            for status in operation["responses"]:
                assert f"<td>{status}</td>" in section
            if "security" in operation:
                assert "bearer token" in section
                scope = re.search(r"`([^`]+)`", operation["description"])
                assert scope is not None and scope.group(1) in section
            else:
                assert "no token" in section
    for name, schema in document["components"]["schemas"].items():
        assert name in page, f"no section for the schema {name}"
        for field in schema.get("properties", {}):
            assert f"<code>{field}</code>" in page[name], f"{name}.{field} missing"


def test_the_openapi_document_is_a_file_of_the_site(hook: ModuleType) -> None:
    assert "openapi.json" in hook.http_reference(hook.served_document())


# -- the configuration ----------------------------------------------------------------------


def models_in(annotation: Any) -> Iterator[tuple[type[BaseModel], bool]]:
    """The models a field's type names, each with whether it is an item of a list."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, False
    elif origin is list:
        for model, _ in models_in(typing.get_args(annotation)[0]):
            yield model, True
    elif origin in (typing.Union, UnionType, typing.Annotated):
        for argument in typing.get_args(annotation):
            yield from models_in(argument)


def key_paths(
    model: type[BaseModel], prefix: str = "", seen: set[type[BaseModel]] | None = None
) -> Iterator[tuple[str, str]]:
    """(dotted key, description) of every key of the file; a model met again (the
    predicates nest) is not walked twice."""
    seen = seen if seen is not None else {model}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        yield key, field.description or ""
        for inner, listed in models_in(field.annotation):
            if inner not in seen:
                seen.add(inner)
                yield from key_paths(inner, key + ("[]." if listed else "."), seen)


def test_the_configuration_page_has_every_key_in_the_files_order(hook: ModuleType) -> None:
    page = hook.configuration_reference(Config)
    keys = list(key_paths(Config))
    assert len(keys) > 100
    for key, description in keys:
        anchor = hook.key_anchor(key)
        row = re.search(rf'<tr id="{anchor}">(.*?)</tr>', page, re.DOTALL)
        assert row is not None, f"no row for {key}"
        assert f"<code>{html.escape(key.rpartition('.')[2])}</code>" in row.group(1)
        words = re.sub(
            r"\s+", " ", parsed(row.group(1)).text and "".join(parsed(row.group(1)).text)
        )
        first = re.sub(r"\s+", " ", description).split("`")[0].strip()
        assert first in words, f"{key}: its description is missing"
    top = [page.index(f'<tr id="{hook.key_anchor(key)}">') for key in Config.model_fields]
    assert top == sorted(top), "the top-level keys are not in the order of the models"
    aliased = re.search(r'<tr id="key-email-from">(.*?)</tr>', page, re.DOTALL)
    assert aliased is not None and "<code>from</code>" in aliased.group(1)


def test_defaults_and_types_read_as_the_file_writes_them(hook: ModuleType) -> None:
    page = hook.configuration_reference(Config)

    def row(key: str) -> str:
        found = re.search(rf'<tr id="{hook.key_anchor(key)}">(.*?)</tr>', page, re.DOTALL)
        assert found is not None, key
        return found.group(1)

    assert "<code>5m</code>" in row("workers.lease")  # 300 seconds, written as a duration
    assert "<code>[approve, edit, deny]</code>" in row("rules[].allowed_decisions")
    assert "required" in row("rules[].tool")
    assert "Duration" in row("rules[].timeout")
    assert "65535" in row("server.port")


# -- hostile text ---------------------------------------------------------------------------

HOSTILE = "<script>alert(1)</script> a | b *c* _d_ `<b>code</b>` &amp; <!-- generated: cli -->"


def assert_shown_not_obeyed(markdown: str) -> None:
    tags = parsed(markdown)
    assert tags.tags <= OWN_TAGS, f"text became markup: {tags.tags - OWN_TAGS}"
    assert not tags.comments, "text became a comment (or a marker)"
    assert not [name for name, _ in tags.attributes if name not in ("id", "href", "style")]
    text = "".join(tags.text)
    assert "<script>alert(1)</script>" in text
    assert "<b>code</b>" in text
    assert "&amp;" in text


def test_the_cli_renderer_escapes_what_it_shows(hook: ModuleType) -> None:
    parser = argparse.ArgumentParser(prog="nodbot", description=HOSTILE)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    evil = sub.add_parser("evil", help=HOSTILE, description=HOSTILE)
    evil.add_argument("--x", metavar="<X>", default="<d>", help=HOSTILE)
    evil.add_argument("--choice", choices=["<a>", "b|c"], help="pick")
    markdown = hook.cli_reference(parser)
    assert_shown_not_obeyed(markdown)
    assert "b|c" in "".join(parsed(markdown).text)


def test_the_http_renderer_escapes_what_it_shows(hook: ModuleType) -> None:
    document = {
        "openapi": "3.1.0",
        "info": {"title": "x", "version": "1"},
        "paths": {
            "/x/{id}": {
                "get": {
                    "summary": HOSTILE,
                    "description": HOSTILE,
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "<p>",
                            "in": "query",
                            "description": HOSTILE,
                            "schema": {"enum": ["<a>", "b|c"]},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": HOSTILE,
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/E"}}
                            },
                        }
                    },
                }
            }
        },
        "components": {
            "schemas": {
                "E": {
                    "type": "object",
                    "description": HOSTILE,
                    "properties": {"a|<b>": {"type": "string", "description": HOSTILE}},
                }
            }
        },
    }
    assert_shown_not_obeyed(hook.http_reference(document))


def test_the_configuration_renderer_escapes_what_it_shows(hook: ModuleType) -> None:
    class Inner(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        deep: str = "</td></tr></table><script>alert(1)</script>"
        """<script>alert(1)</script> a | b *c* _d_ `<b>code</b>` &amp; <!-- generated: cli -->"""

    class Evil(BaseModel):
        """<script>alert(1)</script> `<b>code</b>` &amp;"""

        model_config = ConfigDict(use_attribute_docstrings=True)
        key: Inner = Inner()
        """<script>alert(1)</script> a | b *c* _d_ `<b>code</b>` &amp; <!-- generated: cli -->"""

    markdown = hook.configuration_reference(Evil)
    assert_shown_not_obeyed(markdown)
    assert "</td></tr></table><script>alert(1)</script>" in "".join(parsed(markdown).text)


# -- the pages and their markers ------------------------------------------------------------


def test_each_reference_page_has_its_marker_and_is_filled(hook: ModuleType) -> None:
    for name, path in PAGES.items():
        markdown = path.read_text()
        assert f"<!-- generated: {name} -->" in markdown, path
        filled = hook.fill(markdown, str(path))
        assert "<!-- generated:" not in filled
        assert len(filled) > len(markdown) + 1000


def test_an_unknown_marker_fails_the_build_naming_the_page(hook: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"reference/x\.md: no generated part named 'nope'"):
        hook.fill("intro\n<!-- generated: nope -->\n", "reference/x.md")


# -- the screenshots ------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_shots_makes_the_quick_starts_screenshots(tmp_path: Path) -> None:
    shots = load(SHOTS, "nodbot_docs_shots")
    done = subprocess.run(
        [sys.executable, str(SHOTS), str(tmp_path)],
        cwd=tmp_path,  # it finds the repository by its own path, not the working directory
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    inbox, slack = tmp_path / "inbox.png", tmp_path / "slack-review.png"
    assert png_size(inbox) == shots.INBOX_SIZE
    assert png_size(slack) == shots.SLACK_SIZE
    assert inbox.stat().st_size > 10_000 and slack.stat().st_size > 10_000  # not blank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inbox.png", "slack-review.png"]


def test_the_committed_screenshots_are_there(hook: ModuleType) -> None:
    shots = load(SHOTS, "nodbot_docs_shots")
    assert png_size(ROOT / "docs" / "img" / "inbox.png") == shots.INBOX_SIZE
    assert png_size(ROOT / "docs" / "img" / "slack-review.png") == shots.SLACK_SIZE


def test_the_slack_drawing_shows_text_and_never_obeys_it() -> None:
    shots = load(SHOTS, "nodbot_docs_shots")
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "<script>alert(1)</script>"}},
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                # As the bot sends it: Slack's escapes, a mention, a date, a code block.
                "text": "*Asked by* <@U1> &lt;b&gt;x&lt;/b&gt; _it_ `<i>`\n"
                "<!date^0^{date}|then>\n```\n</pre><script>alert(1)</script>\n```",
            },
        },
        {
            "type": "actions",
            "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": "<u>Go</u>"}},
                {"type": "button", "style": "danger", "text": {"type": "plain_text", "text": "No"}},
            ],
        },
    ]
    page = shots.slack_html(blocks, channel="<c>", users={"U1": "<Ann>"}, posted=datetime.now())
    tags = parsed(page)
    drawn = {"html", "head", "meta", "title", "style", "body", "div", "span", "b", "i"}
    assert tags.tags <= drawn | {"code", "pre", "br"}, tags.tags - drawn
    text = "".join(tags.text)
    for shown in ("<script>alert(1)</script>", "<b>x</b>", "@<Ann>", "<u>Go</u>", "<i>", "#<c>"):
        assert shown in text
    assert "</pre><script>alert(1)</script>" in text  # the code block's text, whole
    with pytest.raises(ValueError, match="cannot draw a 'video' block"):
        shots.slack_html([{"type": "video"}], channel="c", users={}, posted=datetime.now())
