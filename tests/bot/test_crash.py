"""The bot killed with SIGKILL, then started again: nothing is lost, nothing runs twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.bot.ledger_agent import config_yaml
from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "token-of-lead-00000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def config(tmp_path: Path) -> Path:
    path = tmp_path / "nodbot.yml"
    settings = "server: {host: 127.0.0.1, port: 0}\nworkers: {poll: 0.1, lease: 1s}"
    store = f"sqlite:///{tmp_path / 'nodbot.db'}"
    path.write_text(config_yaml(store, settings=settings, token=TOKEN, self_approval=True))
    return path


@contextlib.contextmanager
def bot(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`nodbot serve` in its own process, and its URL."""
    environment = {**os.environ, "NODBOT_TEST_LEDGER": str(tmp_path / "ledger.txt")}
    command = [nodbot(), "serve", "--config", str(config(tmp_path))]
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("nodbot: serving "), line
            yield process, line.split()[2]
        finally:
            if process.poll() is None:
                process.kill()


def ledger(tmp_path: Path) -> list[str]:
    path = tmp_path / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []


def wait_until(what: str, done: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def call(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    async def send() -> Any:
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.request(method, path, json=body, headers=HEADERS)
            assert response.status_code < 300, response.text
            return response.json()

    return asyncio.run(send())


def test_a_killed_bot_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    with bot(tmp_path) as (first, url):
        stuck = call(url, "POST", "/runs", {"agent": "ledger", "input": "refund stuck-1 5"})
        waiting = call(url, "POST", "/runs", {"agent": "ledger", "input": "refund o-2 7"})
        approval = stuck["pending"][0]["approval_id"]
        call(url, "POST", f"/approvals/{approval}/decide", {"action": "approve"})
        wait_until("the stuck refund runs", lambda: ledger(tmp_path) == ["stuck-1 5.0"])
        first.send_signal(signal.SIGKILL)  # while the tool runs, and a run still waits
        assert first.wait(timeout=10) == -signal.SIGKILL

    with bot(tmp_path) as (_second, url):
        # The waiting run is still there; its review can be decided on the new bot.
        [pending] = call(url, "GET", f"/runs/{waiting['run_id']}")["pending"]
        call(url, "POST", f"/approvals/{pending['approval_id']}/decide", {"action": "approve"})
        for run in (stuck, waiting):
            wait_until(
                f"run {run['run_id']} finishes",
                lambda run=run: call(url, "GET", f"/runs/{run['run_id']}")["status"] == "finished",
            )
        # The killed refund may or may not have taken effect: it is never run again.
        assert sorted(ledger(tmp_path)) == ["o-2 7.0", "stuck-1 5.0"]
        record = call(url, "GET", f"/approvals/{approval}")
        assert (record["consumed"], record["finished"]) == (True, False)
