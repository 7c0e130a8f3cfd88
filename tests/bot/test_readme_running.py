"""The quick start's "Running the bot" steps (docs/quickstart.md), run as written, in order, in
an empty folder: `nodbot init`, the secrets loaded, `nodbot serve` in the background, a run
started with curl, the pending approval listed, a sign-in link, and the approval decided with
curl; then the tool has run and the run has finished.

Two things are filled in as a reader would: a free port instead of 8080 (one may be taken on
a shared machine), and the approval id the listing printed instead of `<approval_id>`. The
commands run in one bash, so `set -a && . ./.env` holds for the lines after it, as it does
in the reader's shell.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def steps() -> list[str]:
    """The command lines of the first shell block of the section, as written."""
    page = (ROOT / "docs" / "quickstart.md").read_text()
    section = page.split("## Running the bot", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_running_the_bot_steps_work_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("the quick start's steps use curl, which this machine does not have")
    lines = steps()
    assert lines[0].startswith("nodbot init")
    port = free_port()
    bin_dir = Path(sys.executable).parent  # where `nodbot` is, as with the venv activated
    environment = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    shell = subprocess.Popen(
        ["bash", "--norc", "--noprofile"],
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert shell.stdin is not None and shell.stdout is not None
    outputs: list[str] = []

    def run(line: str) -> str:
        """One line in the shell; what it printed (up to a marker echoed after it)."""
        marker = f"__done_{len(outputs)}__"
        assert shell.stdin is not None and shell.stdout is not None
        shell.stdin.write(f"{line}\necho; echo {marker} $?\n")
        shell.stdin.flush()
        printed = []
        while True:
            text = shell.stdout.readline()
            assert text, f"the shell ended during {line!r}: {''.join(printed)}"
            if text.startswith(marker):
                status = int(text.split()[1])
                break
            printed.append(text)
        said = "".join(printed)
        assert status == 0, f"{line!r} failed ({status}): {said}"
        outputs.append(said)
        return said

    try:
        for written in lines:
            line = written.split("  #", 1)[0].strip()  # the comment is the reader's
            line = line.replace("8080", str(port))
            if line.startswith("nodbot init"):
                line += f" --port {port}"  # the folder's bot on the free port
            if "<approval_id>" in line:
                [approval_id] = set(re.findall(r"apr_[0-9a-f]+", "".join(outputs)))
                line = line.replace("<approval_id>", approval_id)
            if line.endswith("&"):
                run(line)
                wait_until_serving(port)
                continue
            said = run(line)
            if line.startswith("curl") and "/decide" in line:
                decided = answer_of(said)
                assert decided["status"] == "approved", decided
                assert decided["decision"]["decided_by"] == "lead@example.com"
            if line.startswith("nodbot inbox-link"):
                assert f"http://127.0.0.1:{port}/inbox/login?token=" in said
        run_id = answer_of(outputs[3])["run_id"]
        finished = wait_for_run(tmp_path, port, run_id)
        assert finished["status"] == "finished", finished
        assert "refunded 120.0 on A-1001" in json.dumps(finished["tool_results"])
    finally:
        shell.stdin.write("kill %1 2>/dev/null; wait; exit\n")
        shell.stdin.flush()
        shell.wait(30)
        shell.stdin.close()
        shell.stdout.close()


def answer_of(printed: str) -> dict[str, Any]:
    """The JSON curl printed, among the bot's log lines (it runs in the same terminal, and
    curl ends its answer without a line break)."""
    decoder = json.JSONDecoder()
    for start in [m.start() for m in re.finditer(r'\{"', printed)]:
        try:
            answer, _ = decoder.raw_decode(printed, start)
        except json.JSONDecodeError:
            continue
        if isinstance(answer, dict) and "status" in answer:
            return answer
    raise AssertionError(f"no answer in {printed!r}")


def wait_until_serving(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nodbot serve did not listen on {port} within 30 s")


def wait_for_run(folder: Path, port: int, run_id: str) -> dict[str, Any]:
    """The run once it has ended, read as the ops token (from the `.env` init wrote)."""
    secrets = dict(
        line.split("=", 1) for line in (folder / ".env").read_text().splitlines() if line
    )
    headers = {"Authorization": f"Bearer {secrets['NODBOT_TOKEN_OPS']}"}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = httpx.get(f"http://127.0.0.1:{port}/runs/{run_id}?wait=5", headers=headers)
        view: dict[str, Any] = answer.json()
        if view.get("status") in ("finished", "failed"):
            return view
    raise AssertionError(f"run {run_id} did not end within 30 s")
