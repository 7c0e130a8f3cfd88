"""How nodbot is installed: requirements are ranges in pyproject.toml, the exact versions are
uv.lock's, and `make demo`, `make test` and the image install from that lock, the demo only
the `bot` extra. Read from the files and from `make -n` (what make would run): nothing is
installed and no package index is reached here."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def uv_version_of_the_makefile() -> str:
    found = re.search(r"^UV_VERSION\s*:=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile pins no UV_VERSION"
    return found.group(1)


def make_would_run(target: str) -> list[str]:
    """The commands `make` would run for `target` in this checkout, as if nothing were built."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert dry.returncode == 0, dry.stderr
    return dry.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    return [c for c in commands if re.search(r"\buv (sync|pip install)\b", c)]


def test_the_demo_installs_the_bot_extra_from_the_lock_and_nothing_else() -> None:
    [install] = installs(make_would_run(".venv/.bot-installed"))
    assert "sync --locked" in install, install
    assert re.findall(r"--extra ([\w-]+)", install) == ["bot"], install
    commands = make_would_run("demo")
    assert "examples/bot_demo.py" in commands[-1]
    assert [re.findall(r"--extra ([\w-]+)", c) for c in installs(commands)] == [["bot"]]


def test_make_test_installs_the_test_extra_from_the_lock() -> None:
    [install] = installs(make_would_run(".venv/.installed"))
    assert "sync --locked" in install, install
    assert re.findall(r"--extra ([\w-]+)", install) == ["test"], install


def test_each_install_step_prints_one_nodbot_line_and_keeps_the_installers_output() -> None:
    for command in make_would_run(".venv/.bot-installed"):
        if "uv venv" in command or "uv sync" in command or "pip install" in command:
            assert re.search(r'echo "nodbot: [^"]+";', command), command
            assert ">build/install.log 2>&1" in command, command
            assert "cat build/install.log" in command, command  # shown when the step fails


def test_the_lowest_run_resolves_nodbots_own_requirements_to_their_lower_bounds() -> None:
    [install] = installs(make_would_run("build/venv-lowest/.installed"))
    assert "--resolution lowest-direct" in install and ".[test]" in install, install


@pytest.mark.parametrize("extra", ["", "bot", "langgraph", "pydantic-ai", "mcp"])
def test_requirements_are_ranges_not_pins(extra: str) -> None:
    lines = PROJECT["optional-dependencies"][extra] if extra else PROJECT["dependencies"]
    for line in lines:
        requirement = Requirement(line)
        operators = {spec.operator for spec in requirement.specifier}
        assert "==" not in operators, line
        assert ">=" in operators and "<" in operators, f"{line}: a lower and an upper bound"


def test_the_base_requirements_name_none_of_the_bots_packages() -> None:
    base = {Requirement(line).name for line in PROJECT["dependencies"]}
    bot = {Requirement(line).name for line in PROJECT["optional-dependencies"]["bot"]}
    assert not base & bot
    assert {"starlette", "uvicorn", "slack-bolt", "aiosmtpd", "aioimaplib"} <= bot
    assert "nodbot[bot," in PROJECT["optional-dependencies"]["test"][0]


def test_the_lock_pins_one_version_of_each_package_within_its_range() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    pinned: dict[str, list[str]] = {}
    for package in lock["package"]:
        pinned.setdefault(package["name"], []).append(package.get("version", ""))
    for line in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["bot"]:
        requirement = Requirement(line)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        [version] = pinned[name]
        assert requirement.specifier.contains(version), (line, version)


def test_the_dockerfile_installs_the_bot_extra_from_the_lock_with_its_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"pip install --no-cache-dir uv=={uv_version_of_the_makefile()}" in dockerfile
    assert "uv export --locked --extra bot --no-emit-project" in dockerfile
    assert dockerfile.count("--require-hashes") == 2  # downloaded, then installed
    assert "uv.lock" not in (ROOT / ".dockerignore").read_text().split()
