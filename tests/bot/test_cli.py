"""The installed `nodbot` console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from core import __version__


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
