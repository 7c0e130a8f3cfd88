"""The bot as it runs for real: `nodbot serve` in a process of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Running:
    """A `nodbot serve` process, and where it serves."""

    url: str
    process: subprocess.Popen[str]


@contextlib.asynccontextmanager
async def nodbot_serve(path: Path, **environment: str) -> AsyncIterator[Running]:
    """`nodbot serve --config path` in a process of its own, with `environment` added to
    this one's (its log beside the config), stopped with SIGINT at the end."""
    log = (path.parent / f"{path.stem}.log").open("w")
    process = await asyncio.to_thread(
        subprocess.Popen,
        [nodbot(), "serve", "--config", str(path)],
        cwd=ROOT,  # where examples.support_agent is found
        env={**os.environ, **environment},
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        assert line.startswith("nodbot: serving http://127.0.0.1:"), line
        yield Running(line.split()[2], process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(process.wait, 20)
            except subprocess.TimeoutExpired:
                process.kill()
        if process.stdout is not None:
            process.stdout.close()
        process.wait()
        log.close()
