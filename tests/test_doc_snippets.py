"""Every YAML and Python block of the README and of the docs (`docs/**/*.md`) does what it
shows: a reader who copies one gets a working file or program, not an error.

- Every YAML block parses.
- A YAML block whose top-level keys are all keys of `nodbot.yml` is a whole configuration:
  `nodbot check-config` (the command itself, `nodbot.bot.cli.main`) must pass it, given a
  dummy value for each `${VARIABLE}` it names without a default, from the repository's
  folder (so `examples.support_agent:agent` imports). Any other YAML block must be marked as
  a fragment: nothing escapes the check unseen.
- Every Python block runs, in a process of its own with a time limit, in an empty temporary
  folder (a SQLite store it makes lands there), reaching only loopback addresses. It may use
  `await` at its top level, as in a notebook.

A block that is a piece of a larger whole, or needs what this test cannot give it (a running
bot, a PostgreSQL server, a model), is marked on the line before it: `<!-- fragment: why -->`.
A fragment is still parsed. The blocks that need a bot are run by tests of their own
(`tests/bot/test_readme_running.py`, `tests/bot/test_idempotency.py`,
`tests/bot/test_rules_fail_closed.py`).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodbot.bot.cli import main as nodbot_command
from nodbot.bot.config.models import Config

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"^(?P<indent>[ ]*)```(?P<language>[a-z]+)\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    re.MULTILINE | re.DOTALL,
)
FRAGMENT = re.compile(r"<!-- fragment: [^>]+ -->\s*$")
VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<default>:-[^}]*)?\}")
CONFIG_KEYS = frozenset(field.alias or name for name, field in Config.model_fields.items())
RUN_LIMIT = 120  # seconds a Python block may take, on a busy machine

# Runs one block: top-level `await` allowed, and (as the tests' own guard does) any connection
# to an address other than this machine's refused.
RUNNER = """
import ast, asyncio, ipaddress, socket, sys

def loopback(address):
    if not isinstance(address, tuple) or not address:
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False

real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

def guard(address):
    if not loopback(address):
        raise ConnectionRefusedError(f"the block tried to reach {address!r}, not loopback")

def connect(self, address):
    guard(address)
    return real_connect(self, address)

def connect_ex(self, address):
    guard(address)
    return real_connect_ex(self, address)

socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
path = sys.argv[1]
with open(path) as file:
    code = compile(file.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__", "__file__": path})
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    body: str
    fragment: bool

    def __str__(self) -> str:
        shown = (
            self.document.relative_to(ROOT) if self.document.is_relative_to(ROOT) else self.document
        )
        return f"{shown}:{self.line}"


def blocks(language: str, documents: Iterable[Path] = DOCUMENTS) -> list[Block]:
    """The fenced blocks of `language` in the documents, dedented as a reader copies them."""
    found = []
    for document in documents:
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


def parse_yaml(block: Block) -> Any:
    try:
        return yaml.safe_load(block.body)
    except yaml.YAMLError as exc:
        pytest.fail(f"{block}: the YAML block does not parse: {exc}")


def is_configuration(data: Any) -> bool:
    """Whether parsed YAML is a whole `nodbot.yml`: a mapping of its top-level keys only."""
    return isinstance(data, dict) and bool(data) and set(data) <= CONFIG_KEYS


def dummy_environment(body: str) -> dict[str, str]:
    """A value for each `${NAME}` without a default: long and varied, as a secret must be (a
    weak one would only be warned of, but a short token is refused)."""
    return {
        match["name"]: f"dummy-{match['name'].lower()}-7Kq2xW9pLm4Rt8Zv"
        for match in VARIABLE.finditer(body)
        if match["default"] is None
    }


def check_configuration(
    block: Block, folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """`nodbot check-config` of the block written as a file: its exit status and output."""
    path = folder / "nodbot.yml"
    path.write_text(block.body)
    for name, value in dummy_environment(block.body).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)  # agents such as examples.support_agent:agent import from here
    capsys.readouterr()
    status = nodbot_command(["check-config", str(path)])
    said = capsys.readouterr()
    return status, said.out + said.err


def run_python(block: Block, folder: Path) -> subprocess.CompletedProcess[str]:
    """The block run as a program in `folder`, with the repository on the import path."""
    script = folder / "block.py"
    script.write_text(block.body)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)])}
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(script)],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT,
    )


def compiles(block: Block) -> SyntaxError | None:
    try:
        compile(block.body, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        return exc
    return None


# --- the documents -----------------------------------------------------------------------------


def test_the_documents_have_blocks_of_each_language() -> None:
    # The pattern finds what it should: a change of fence style would otherwise pass unseen.
    assert len(DOCUMENTS) >= 10
    assert len(blocks("yaml")) >= 20 and len(blocks("python")) >= 8
    assert sum(not block.fragment for block in blocks("python")) >= 3


@pytest.mark.parametrize("block", blocks("yaml"), ids=str)
def test_a_yaml_block_parses_and_a_whole_configuration_passes_check_config(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    data = parse_yaml(block)
    if block.fragment:
        return
    if not is_configuration(data):
        pytest.fail(
            f"{block}: the YAML block is not a whole nodbot.yml (top-level keys "
            f"{sorted(data) if isinstance(data, dict) else type(data).__name__}); make it one, "
            "or mark it with <!-- fragment: why --> on the line before it"
        )
    status, said = check_configuration(block, tmp_path, monkeypatch, capsys)
    assert status == 0, f"{block}: nodbot check-config refuses the block:\n{said}"


@pytest.mark.parametrize("block", blocks("python"), ids=str)
def test_a_python_block_runs(block: Block, tmp_path: Path) -> None:
    error = compiles(block)
    if error is not None:
        pytest.fail(f"{block}: the Python block does not parse ({error})")
    if block.fragment:
        return
    completed = run_python(block, tmp_path)
    assert completed.returncode == 0, (
        f"{block}: the Python block fails ({completed.returncode}); make it run alone, or mark "
        f"it with <!-- fragment: why --> on the line before it:\n{completed.stderr[-3000:]}"
    )


# --- the checks fail on a broken block ---------------------------------------------------------

BROKEN = """# A broken page

```yaml
api:
  tokens:
    - {name: agent, token: ${NODBOT_TOKEN_AGENT}, scopes: [approvals:request]}
```

```yaml
rules:
  - tool: refund
    reviewers: [group:nobody]
```

```yaml
editable: [amount]
```

```python
print(undefined_name)
```

```python
def broken(:
```

<!-- fragment: continues the block above -->
```python
await store.close()
```

<!-- fragment: a piece of nodbot.yml -->
```yaml
editable: [amount]
```
"""


def failures(test: Any, *arguments: Any) -> str | None:
    """What `test` failed with, or None when it passed."""
    try:
        test(*arguments)
    except (pytest.fail.Exception, AssertionError) as exc:
        return str(exc)
    return None


def test_each_check_fails_on_a_broken_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    page = tmp_path / "broken.md"
    page.write_text(BROKEN)
    unquoted, unknown_group, piece, fragment_yaml = blocks("yaml", [page])
    raises, unparsable, fragment_python = blocks("python", [page])

    def yaml_check(block: Block) -> None:
        folder = tmp_path / f"yaml-{block.line}"
        folder.mkdir()
        test_a_yaml_block_parses_and_a_whole_configuration_passes_check_config(
            block, folder, monkeypatch, capsys
        )

    def python_check(block: Block) -> None:
        folder = tmp_path / f"python-{block.line}"
        folder.mkdir()
        test_a_python_block_runs(block, folder)

    # README line ~1012 of old: a ${...} unquoted inside { } does not parse.
    assert "does not parse" in (failures(yaml_check, unquoted) or "")
    said = failures(yaml_check, unknown_group) or ""
    assert "check-config refuses" in said and "no reviewer group named 'nobody'" in said
    assert "not a whole nodbot.yml" in (failures(yaml_check, piece) or "")
    assert failures(yaml_check, fragment_yaml) is None
    assert "NameError" in (failures(python_check, raises) or "")
    assert "does not parse" in (failures(python_check, unparsable) or "")
    assert failures(python_check, fragment_python) is None


def test_a_block_cannot_reach_beyond_this_machine(tmp_path: Path) -> None:
    block = Block(tmp_path / "page.md", 1, "python", _REACH_OUT, fragment=False)
    (tmp_path / "page.md").write_text("")
    completed = run_python(block, tmp_path)
    assert completed.returncode != 0 and "not loopback" in completed.stderr


_REACH_OUT = "import socket\nsocket.socket().connect(('192.0.2.1', 80))\n"
