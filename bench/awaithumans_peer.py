"""The awaithumans peer of `bench/bot.py`: the same approvals, through awaithumans 0.1.12.

awaithumans lives in a virtual environment of its own (`ensure_venv`, by default
`<repo>/.venv-awaithumans`, made once with `python -m venv` and
`pip install "awaithumans[server]==0.1.12"`: the `server` extra brings FastAPI, SQLModel,
uvicorn and the rest its server needs). This module runs in nodbot's environment and never
imports awaithumans; it drives processes of the other environment:

* the server, `awaithumans serve --host 127.0.0.1 --port <free>` (its production entry point:
  uvicorn, one process), on a throw-away SQLite file in a temporary directory, with a fresh
  `AWAITHUMANS_PAYLOAD_KEY`, an `AWAITHUMANS_ADMIN_API_TOKEN` for the agents, log level WARNING
  (as bench/bot.py runs its uvicorn), and no Slack, email or verifier configured (an LLM is
  only called for tasks that carry a `verifier`, and these do not). Before it starts,
  `awaithumans bootstrap-operator` makes the reviewer's dashboard account in the same file.
* the client, `bench/awaithumans_driver.py`: `concurrency` agents at once, `runs` in all, each
  calling the SDK's `await_human` for a refund (order id, amount), a reviewer approving each
  task through the HTTP API as the dashboard does, and the tool running once per approval.
  Its docstring says which endpoints, and how the reviewer learns of a task. The agents are
  shared among `processes` processes (2 unless told, one a core of the 2-core machines of
  GOALS.md): the SDK makes two `httpx.AsyncClient`s a call, about 40 ms of client CPU, and
  twenty agents waking on the same second-tick in one event loop queue behind each other
  (one process: about 10 approvals/s; two: about 13/s). The reviewer sends one approval at a
  time (`reviewers`): twenty at once exhaust the server's pool of 15 SQLite connections, and
  its requests then fail after 30 s.

Measured, over the workload only (after a login and one warm-up approval): its wall time, the
CPU time of the server process and of the client processes (utime + stime of
`/proc/<pid>/stat`, so Linux only) and, per run, the time from the reviewer's approval being
sent to the tool running. The SDK's agent learns the answer from a long poll that the server
checks once a second, which is where most of that time goes. `PeerFigures.reviewer_polls`
says how many task-list requests the reviewer made meanwhile; their CPU is in the server's
figure, as a dashboard's would be.

    .venv/bin/python bench/awaithumans_peer.py     # measure_peer(200, 20), printed

Everything reaches loopback only; pip reaches the package index it is configured with.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python bench/awaithumans_peer.py` puts bench/ first on sys.path, where bench/requests.py
# would shadow the `requests` package; the repository's root goes there instead, as
# bench/bot.py does.
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import json  # noqa: E402  (after the import path is set)
import secrets  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import IO, Any  # noqa: E402

__all__ = [
    "PEER_VERSION",
    "PeerError",
    "PeerFigures",
    "ensure_venv",
    "measure_peer",
]

PEER_VERSION = "0.1.12"
"""The awaithumans release measured."""
REQUIREMENT = f"awaithumans[server]=={PEER_VERSION}"
"""What `ensure_venv` installs: the SDK and the extra its server needs."""
DEFAULT_VENV = ROOT / ".venv-awaithumans"
DRIVER = Path(__file__).resolve().with_name("awaithumans_driver.py")
REVIEWER_EMAIL = "reviewer@bench.invalid"
STARTUP_LIMIT = 60.0
"""Seconds the server may take to answer `GET /api/health`."""
STOP_LIMIT = 10.0
"""Seconds a process may take to exit on SIGINT before it is killed."""

_CHECK = f"""
import importlib.metadata as metadata
assert metadata.version("awaithumans") == {PEER_VERSION!r}, metadata.version("awaithumans")
import aiosqlite, argon2, fastapi, sqlmodel, typer, uvicorn  # the server extra
"""
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class PeerError(RuntimeError):
    """The awaithumans peer could not be installed, started or measured."""


@dataclass
class PeerFigures:
    """What one `measure_peer` saw."""

    runs: int
    concurrency: int
    wall: float
    """Seconds, from the first agent's start to the last tool run."""
    server_cpu: float
    """CPU seconds of the server process (user + system) over the workload."""
    decide_to_tool: list[float]
    """Per run, seconds from the approval request being sent to the tool running."""
    client_cpu: float = 0.0
    """CPU seconds of the client process (the agents and the reviewer) over the workload."""
    reviewer_polls: int = 0
    """Task-list requests the reviewer made during the workload."""
    reviewer_poll: float = 0.0
    """The reviewer's pause between two of them, seconds."""
    reviewers: int = 1
    """Approval requests the reviewer had in flight at most."""
    processes: int = 1
    """Client processes the agents were shared among."""

    @property
    def rate(self) -> float:
        """Approvals per second, end to end."""
        return self.runs / self.wall

    @property
    def cpu_ms(self) -> float:
        """Server CPU milliseconds per approval."""
        return self.server_cpu * 1000.0 / self.runs

    @property
    def client_cpu_ms(self) -> float:
        """Client CPU milliseconds per approval (the SDK's and the reviewer's HTTP work)."""
        return self.client_cpu * 1000.0 / self.runs

    def decide_to_tool_ms(self, q: float) -> float:
        """The `q` quantile (0..1, nearest rank) of decision -> tool, milliseconds."""
        ordered = sorted(self.decide_to_tool)
        rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
        return ordered[rank] * 1000.0

    @property
    def p50_ms(self) -> float:
        return self.decide_to_tool_ms(0.50)

    @property
    def p99_ms(self) -> float:
        return self.decide_to_tool_ms(0.99)

    def summary(self) -> str:
        return (
            f"awaithumans {PEER_VERSION}: {self.runs} approvals, {self.concurrency} at once: "
            f"{self.rate:.1f}/s, server CPU {self.cpu_ms:.1f} ms/approval "
            f"(client {self.client_cpu_ms:.1f} ms), "
            f"decision -> tool p50 {self.p50_ms:.0f} ms, p99 {self.p99_ms:.0f} ms "
            f"({self.processes} client processes, {self.reviewer_polls} task-list polls every "
            f"{self.reviewer_poll * 1000:.0f} ms)"
        )


def _has_peer(python: Path) -> bool:
    if not python.exists():
        return False
    checked = subprocess.run(
        [str(python), "-c", _CHECK], capture_output=True, text=True, check=False
    )
    return checked.returncode == 0


def ensure_venv(path: Path | None = None) -> Path:
    """The python of a virtual environment holding awaithumans 0.1.12 and its server.

    Made at `path` (default `<repo>/.venv-awaithumans`) when it is missing or lacks them, with
    `python -m venv` and `pip install "awaithumans[server]==0.1.12"`; reused otherwise.
    Raises `PeerError`, with pip's last lines, when that fails.
    """
    venv = Path(path) if path is not None else DEFAULT_VENV
    python = venv / "bin" / "python"
    if _has_peer(python):
        return python
    print(f"installing {REQUIREMENT} into {venv}", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", REQUIREMENT],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise PeerError(f"{' '.join(step)} failed ({done.returncode}):\n{tail}")
    if not _has_peer(python):
        raise PeerError(f"{venv} still lacks {REQUIREMENT} after installing it")
    return python


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds of process `pid`, from /proc/<pid>/stat; with `reaped`, those
    of its children it has waited for too."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rpartition(")")[2].split()
    # After the command come state (field 3 of proc(5)) ... utime (14), stime (15), then the
    # waited-for children's cutime (16) and cstime (17).
    return sum(int(tick) for tick in fields[11 : 15 if reaped else 13]) / _TICKS


def _base_env(home: Path) -> dict[str, str]:
    """This process's environment without anything that could steer awaithumans or Python."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AWAITHUMANS_") and key not in dropped
    }
    env["HOME"] = str(home)  # where `awaithumans dev` would write its discovery file
    return env


def _wait_until_up(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_LIMIT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise PeerError(f"the awaithumans server exited ({server.returncode}):\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=2.0) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise PeerError(f"the awaithumans server did not answer within {STARTUP_LIMIT} s")


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(STOP_LIMIT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _read_record(stream: IO[str], driver: subprocess.Popen[str], errors: Path) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        driver.wait()
        raise PeerError(
            f"the awaithumans driver exited ({driver.returncode}):\n{_tail(errors, 10)}"
        )
    record: dict[str, Any] = json.loads(line)
    return record


def measure_peer(
    runs: int,
    concurrency: int,
    *,
    python: Path | None = None,
    reviewer_poll: float = 0.05,
    reviewers: int = 1,
    processes: int = 2,
    timeout: float = 600.0,
) -> PeerFigures:
    """Runs `runs` approvals through a fresh awaithumans server, `concurrency` at once.

    Synchronous: it blocks for the whole workload (call it from a thread, e.g.
    `asyncio.to_thread`, inside an event loop). `python` is the awaithumans environment's
    interpreter (default: `ensure_venv()`); `reviewer_poll` the reviewer's pause between two
    polls of the task list; `reviewers` how many approvals it may have in flight at once;
    `processes` how many client processes share the agents (see the module's docstring for
    why one and two); `timeout` the driver's limit for everything. Raises `PeerError`
    when a run is not approved or its tool not run exactly once, or the server fails.
    """
    if min(runs, concurrency, reviewers, processes) < 1 or processes > concurrency:
        raise ValueError("runs, concurrency, reviewers, processes >= 1, processes <= concurrency")
    python = Path(python) if python is not None else ensure_venv()
    command = python.parent / "awaithumans"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_urlsafe(32)
    password = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="awaithumans-peer-") as scratch:
        home = Path(scratch)
        env = _base_env(home)
        server_env = env | {
            "AWAITHUMANS_DB_PATH": str(home / "awaithumans.db"),
            "AWAITHUMANS_PAYLOAD_KEY": secrets.token_urlsafe(32),
            "AWAITHUMANS_ADMIN_API_TOKEN": token,
            "AWAITHUMANS_PUBLIC_URL": url,
            "AWAITHUMANS_HOST": "127.0.0.1",
            "AWAITHUMANS_PORT": str(port),
            "AWAITHUMANS_LOG_LEVEL": "WARNING",
        }
        _bootstrap_operator(command, password, server_env, home)
        log = home / "server.log"
        errors = home / "driver.err"
        with log.open("wb") as log_file, errors.open("w") as error_file:
            server = subprocess.Popen(
                [
                    str(command),
                    "serve",
                    "--host=127.0.0.1",
                    f"--port={port}",
                    "--log-level=warning",
                ],
                env=server_env,
                cwd=home,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_until_up(url, server, log)
                driver = subprocess.Popen(
                    [
                        str(python),
                        str(DRIVER),
                        f"--url={url}",
                        f"--runs={runs}",
                        f"--concurrency={concurrency}",
                        f"--reviewer-poll={reviewer_poll}",
                        f"--reviewers={reviewers}",
                        f"--processes={processes}",
                        f"--timeout={timeout}",
                    ],
                    env=env
                    | {
                        "AWAITHUMANS_ADMIN_API_TOKEN": token,
                        "AWAITHUMANS_BENCH_REVIEWER_EMAIL": REVIEWER_EMAIL,
                        "AWAITHUMANS_BENCH_REVIEWER_PASSWORD": password,
                    },
                    cwd=home,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=error_file,
                    text=True,
                )
                try:
                    result, server_cpu, client_cpu = _drive(driver, server.pid, errors)
                finally:
                    _stop(driver)
                if server.poll() is not None:
                    raise PeerError(f"the awaithumans server exited early:\n{_tail(log)}")
            finally:
                _stop(server)
    figures = PeerFigures(
        runs=int(result["runs"]),
        concurrency=int(result["concurrency"]),
        wall=float(result["wall"]),
        server_cpu=server_cpu,
        client_cpu=client_cpu,
        decide_to_tool=[float(seconds) for seconds in result["decide_to_tool"]],
        reviewer_polls=int(result["reviewer_polls"]),
        reviewer_poll=reviewer_poll,
        reviewers=reviewers,
        processes=processes,
    )
    if (figures.runs, len(figures.decide_to_tool), result["tool_runs"]) != (runs, runs, runs):
        raise PeerError(f"the awaithumans driver reported another workload: {result!r}")
    return figures


def _bootstrap_operator(command: Path, password: str, env: dict[str, str], home: Path) -> None:
    """The reviewer's operator account, made by awaithumans' own CLI (it also migrates)."""
    done = subprocess.run(
        [str(command), "bootstrap-operator", "--email", REVIEWER_EMAIL, "--password", password],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        raise PeerError(f"awaithumans bootstrap-operator failed ({done.returncode}):\n{tail}")


def _drive(
    driver: subprocess.Popen[str], server_pid: int, errors: Path
) -> tuple[dict[str, Any], float, float]:
    """The driver's results, and the CPU seconds of the server and of the driver between its
    go and its results."""
    assert driver.stdin is not None and driver.stdout is not None
    ready = _read_record(driver.stdout, driver, errors)
    if ready.get("ready") is not True:
        raise PeerError(f"the awaithumans driver said {ready!r}, not ready")
    # The driver's agent processes, if any, are waited for before it reports: their CPU is
    # then in its children's figures, less what they had spent before the go.
    before = (
        _cpu_seconds(server_pid),
        _cpu_seconds(driver.pid, reaped=True) + sum(_cpu_seconds(pid) for pid in ready["pids"]),
    )
    driver.stdin.write("go\n")
    driver.stdin.flush()
    result = _read_record(driver.stdout, driver, errors)
    after = _cpu_seconds(server_pid), _cpu_seconds(driver.pid, reaped=True)
    if driver.wait(STOP_LIMIT) != 0:
        raise PeerError(
            f"the awaithumans driver failed ({driver.returncode}):\n{_tail(errors, 10)}"
        )
    return result, after[0] - before[0], after[1] - before[1]


if __name__ == "__main__":
    print(measure_peer(200, 20).summary())
