"""The installed `nodbot` console script."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from core import SqlApprovalStore, __version__
from core.sqlstore import head_revision


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
