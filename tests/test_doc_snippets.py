"""Every YAML and Python block of the README parses: a reader who copies one gets what it
shows, not a syntax error. A Python block may use `await` at its top level (as in an async
function or a notebook). A block that is a piece of a larger whole, which cannot stand on its
own, is marked so on the line before it: `<!-- fragment: why -->`.

Blocks that run are run by tests of their own (the README's running section, the request
API's, the rules' examples); this test holds every other block to parsing at least."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md"]
BLOCK = re.compile(
    r"^(?P<indent>[ ]*)```(?P<language>[a-z]+)\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    re.MULTILINE | re.DOTALL,
)
FRAGMENT = re.compile(r"<!-- fragment: [^>]+ -->\s*$")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    body: str
    fragment: bool

    def __str__(self) -> str:
        return f"{self.document.name}:{self.line}"


def blocks(language: str) -> list[Block]:
    """The fenced blocks of `language` in the documents, dedented as a reader copies them."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in BLOCK.finditer(text):
            if match["language"] != language:
                continue
            start = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
            indent = len(match["indent"])
            body = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
            found.append(Block(document, start, language, body, bool(FRAGMENT.search(before))))
    return found


def test_the_documents_have_blocks_of_each_language() -> None:
    # The pattern finds what it should: a change of fence style would otherwise pass unseen.
    assert len(blocks("yaml")) >= 8 and len(blocks("python")) >= 8


@pytest.mark.parametrize("block", blocks("yaml"), ids=str)
def test_a_yaml_block_parses(block: Block) -> None:
    try:
        yaml.safe_load(block.body)
    except yaml.YAMLError as exc:
        pytest.fail(f"{block}: the YAML block does not parse: {exc}")


@pytest.mark.parametrize("block", [b for b in blocks("python") if not b.fragment], ids=str)
def test_a_python_block_parses(block: Block) -> None:
    try:
        compile(block.body, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        pytest.fail(
            f"{block}: the Python block does not parse ({exc}); mark a piece of a "
            "larger whole with <!-- fragment: why --> on the line before it"
        )


def test_a_fragment_is_marked_only_where_the_block_cannot_stand_alone() -> None:
    # A mark on a block that parses would hide it from the check above for nothing.
    standing = []
    for block in blocks("python"):
        if block.fragment:
            try:
                compile(block.body, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            except SyntaxError:
                continue
            standing.append(str(block))
    assert standing == []
