"""The installed `nodbot` console script."""

from __future__ import annotations

import asyncio
import importlib.resources
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from nodbot.bot import DOCS_URL
from nodbot.core import SqlApprovalStore, __version__
from nodbot.core.sqlstore import head_revision


def nodbot() -> str:
    found = shutil.which("nodbot", path=str(Path(sys.executable).parent))
    assert found, "the nodbot console script is not installed next to this Python"
    return found


def test_version() -> None:
    completed = subprocess.run([nodbot(), "--version"], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == f"nodbot {__version__}"


def test_unknown_option_is_an_error_naming_it() -> None:
    completed = subprocess.run([nodbot(), "--bogus"], capture_output=True, text=True)
    assert completed.returncode == 2
    assert "--bogus" in completed.stderr


def test_migrate_creates_the_schema_and_reports_the_revision(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nodbot.db'}"
    completed = subprocess.run(
        [nodbot(), "migrate", "--store", url], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip().endswith(f"nodbot.db is at schema revision {head_revision()}")

    async def listed() -> int:
        async with SqlApprovalStore(url, auto_migrate=False) as store:
            return len(await store.list())

    assert asyncio.run(listed()) == 0


def test_migrate_failure_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'nodbot.db'}"
    completed = subprocess.run(
        [nodbot(), "migrate", "--store", url], capture_output=True, text=True
    )
    assert completed.returncode == 1
    assert completed.stderr.startswith("nodbot: cannot use the database sqlite")
    assert "does not exist" in completed.stderr


# --- a user's mistakes: one clear line, exit status 2, never a traceback ----------------------


def mistake(tmp_path: Path, *arguments: str) -> str:
    """stderr of a command that must be refused as a mistake."""
    completed = subprocess.run(
        [nodbot(), *arguments], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert completed.returncode == 2, completed
    assert "Traceback" not in completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert completed.stdout == ""
    return lines[0]


def test_bad_arguments_json_is_named(tmp_path: Path) -> None:
    said = mistake(
        tmp_path, "approvals", "decide", "apr_1", "edit", "--as", "U1", "--arguments", "{x"
    )
    assert said.startswith("nodbot approvals decide: error: argument --arguments: not valid JSON")
    said = mistake(
        tmp_path, "approvals", "decide", "apr_1", "edit", "--as", "U1", "--arguments", "[1]"
    )
    assert "a JSON object is needed, not list" in said


def test_an_edit_without_arguments_says_what_to_give(tmp_path: Path) -> None:
    said = mistake(tmp_path, "approvals", "decide", "apr_1", "edit", "--as", "U1")
    assert "an edit needs --arguments" in said and "nodbot approvals decide --help" in said
    said = mistake(
        tmp_path, "approvals", "decide", "apr_1", "deny", "--as", "U1", "--arguments", "{}"
    )
    assert "--arguments is for edit only, not deny" in said


def test_a_port_out_of_range_is_refused_before_anything_starts(tmp_path: Path) -> None:
    said = mistake(tmp_path, "serve", "--port", "70000")
    assert "70000 is not a port: use 0 to 65535 (0 picks a free one)" in said
    assert "not a port number: 'http'" in mistake(tmp_path, "serve", "--port", "http")


def test_a_port_in_use_is_named_with_how_to_pick_another(tmp_path: Path) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    (tmp_path / "nodbot.yml").write_text(
        f'store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}\n'
        f"server: {{host: 127.0.0.1, port: {port}}}\n"
    )
    try:
        said = mistake(tmp_path, "serve")
        again = mistake(tmp_path, "serve", "--port", str(port))
    finally:
        taken.close()
    assert said == (
        f"nodbot: 127.0.0.1:{port} is in use; pick another port with --port N or in "
        "server.port (0 picks a free one); the port came from server.port of nodbot.yml"
    )
    assert again.endswith("the port came from --port")


def test_check_config_lists_every_problem_of_the_file_at_once(tmp_path: Path) -> None:
    file = tmp_path / "nodbot.yml"
    file.write_text(
        'store: {url: "${NODBOT_TEST_NOT_SET}"}\n'
        "server: {host: 127.0.0.1, port: 99999}\n"
        "colour: blue\n"
        "rules:\n"
        "  - tool: refund\n"
        "    reviewers: [lead@example.com]\n"
        "    timeout: soon\n"
    )
    completed = subprocess.run(
        [nodbot(), "check-config", str(file)], capture_output=True, text=True, cwd=tmp_path
    )
    assert completed.returncode == 2  # a bad input
    lines = completed.stderr.strip().splitlines()
    assert [line.split(": ", 2)[1] for line in lines] == [
        "store.url",
        "server.port",
        "colour",
        "rules.0.timeout",
    ], lines
    assert "NODBOT_TEST_NOT_SET is not set" in lines[0]
    assert "Traceback" not in completed.stderr


# --- nodbot init ------------------------------------------------------------------------------


def environment_of(folder: Path) -> dict[str, str]:
    """The environment with the `.env` that `nodbot init` wrote loaded."""
    loaded = dict(os.environ)
    for line in (folder / ".env").read_text().splitlines():
        name, _, value = line.partition("=")
        loaded[name] = value
    return loaded


def test_init_names_the_docs_and_no_file_the_wheel_lacks(tmp_path: Path) -> None:
    completed = subprocess.run(
        [nodbot(), "init", "--dir", str(tmp_path)], capture_output=True, text=True, check=True
    )
    said = completed.stdout + (tmp_path / "nodbot.yml").read_text()
    assert DOCS_URL in completed.stdout.splitlines()[-1]
    assert DOCS_URL in (tmp_path / "nodbot.yml").read_text()
    for absent in ("README", "nodbot.example.yml"):
        assert absent not in said


def test_init_full_writes_the_annotated_example_which_checks(tmp_path: Path) -> None:
    folder = tmp_path / "bot"
    completed = subprocess.run(
        [nodbot(), "init", "--full", "--dir", str(folder), "--port", "8181"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert completed.stdout.splitlines()[:3] == [
        f"wrote {folder / 'nodbot.yml'}",
        f"wrote {folder / '.env'}",
        f"wrote {folder / 'agent.py'}",
    ]
    written = (folder / "nodbot.yml").read_text()
    shipped = importlib.resources.files("nodbot").joinpath("nodbot.example.yml").read_text()
    # The example as shipped, but for its folder: the agent beside it, the port asked for.
    assert written == shipped.replace("examples.support_agent:agent", "agent:agent").replace(
        "${NODBOT_PORT:-8080}", "${NODBOT_PORT:-8181}"
    )
    assert "README" not in written
    checked = subprocess.run(
        [nodbot(), "check-config", "nodbot.yml"],
        capture_output=True,
        text=True,
        cwd=folder,
        env=environment_of(folder),
        timeout=60,
    )
    assert (checked.returncode, checked.stderr) == (0, "")
    assert checked.stdout == "nodbot.yml: ok (4 rules, 1 agent)\n"
