"""`nodbot runs start|show`, with `nodbot approvals decide` and a bot that finishes the run."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path

import pytest

from nodbot.bot.serve import serving
from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.05}}
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    reviewers: [U0123LEADS]
"""
    )
    return path


def command(config_file: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nodbot(), *words, "--config", str(config_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_a_run_started_from_the_shell_is_finished_by_the_bot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = write_config(tmp_path)
    started = command(
        config_file, "runs", "start", "support", "Refund order A-1001", "--requested-by", "carol"
    )
    assert started.returncode == 0, started.stderr
    first = started.stdout.splitlines()[0]
    run_id = first.split()[1]
    assert first == f"run {run_id} of support: waiting"
    [approval_id] = re.findall(r"waits for approval (apr_\w+)", started.stdout)

    decided = command(
        config_file, "approvals", "decide", approval_id, "approve", "--as", "U0123LEADS"
    )
    assert decided.returncode == 0, decided.stderr
    assert command(config_file, "runs", "show", run_id).stdout.splitlines()[0].endswith("waiting")

    async def bot_finishes() -> None:  # the bot finds the decided run on its first look
        monkeypatch.chdir(ROOT)
        async with serving(str(config_file)):
            deadline = time.monotonic() + 10
            while "finished" not in command(config_file, "runs", "show", run_id).stdout:
                assert time.monotonic() < deadline, "the bot did not finish the run"
                await asyncio.sleep(0.1)

    asyncio.run(bot_finishes())
    shown = command(config_file, "runs", "show", run_id).stdout
    assert (
        'refund {"order_id": "A-1001", "amount": 120.0}: {"result":"refunded 120.0 on A-1001"}'
        in shown
    )


def test_unknown_agents_and_runs_are_clear_errors(tmp_path: Path) -> None:
    config_file = write_config(tmp_path)
    unknown = command(config_file, "runs", "start", "sales", "hi")
    assert unknown.returncode == 2  # a bad input: the file names no such agent
    assert "unknown agent 'sales'; configured agents: support" in unknown.stderr
    missing = command(config_file, "runs", "show", "run_nope")
    assert missing.returncode == 1  # failed while running: the store has no such run
    assert "no run with id 'run_nope'" in missing.stderr
