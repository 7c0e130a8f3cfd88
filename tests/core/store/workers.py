"""Child processes for the multi-process store tests, and the parent's helpers to run them.

A child is run from the repository root as `python -m tests.core.store.workers <role> ...`:

- `race URL TOOL_FILE BARRIER CALLS`: wait at the start barrier (`BARRIER/go`), then resume
  the decided call `CALLS` times at once, printing one JSON line per result as it comes. The
  tool writes the pid to `TOOL_FILE` and stays in flight until `BARRIER/release` exists.
- `decide URL APPROVAL_ID READY`: decide the approval, touch `READY`, block until killed.
- `consume URL MARKER`: resume the decided call; the tool writes a line to `MARKER` and
  blocks until killed.
- `create URL READY`: create records for ever more call ids, touching `READY` after a few,
  until killed.

Every child blocks on nothing longer than `CHILD_DEADLINE` seconds, or on its stdin, so a
child whose parent died ends by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nodbot.core import (
    ApprovalRequest,
    Decision,
    DeferredApproval,
    Executor,
    ToolCall,
    ToolRegistry,
    arguments_digest,
)
from nodbot.core.sqlstore import SqlApprovalStore

ROOT = Path(__file__).resolve().parents[3]
RUN_ID = "run_1"
CALL = ToolCall(name="send", arguments={"to": "ops@example.com"}, id="call_1")
CHILD_DEADLINE = 60.0
"""The longest a child waits for the parent or keeps working before it gives up."""
PARENT_DEADLINE = 30.0
"""The longest the parent waits for a child to reach a point."""
READY_AFTER = 20
"""How many records the `create` child writes before it says it is ready to be killed."""


# Shared by parent and children --------------------------------------------------------------


def build_executor(store: SqlApprovalStore, send: Callable[[str], object]) -> Executor:
    """An executor whose one tool, `send(to)`, needs review and is decided in `store`."""
    registry = ToolRegistry()
    registry.add(send, name="send", confirm=True)
    return Executor(registry, approval=DeferredApproval(store))


def append_line(path: Path, line: str) -> None:
    """Append one line in one `write` with O_APPEND: lines from many processes never mix."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[str]:
    """The lines of `path`, none if it does not exist."""
    return path.read_text().splitlines() if path.exists() else []


def send_request(call_id: str) -> ApprovalRequest:
    """The approval request the executor would store for `send` with `CALL`'s arguments."""
    arguments = dict(CALL.arguments)
    return ApprovalRequest(RUN_ID, call_id, "send", arguments, arguments_digest(arguments))


# The children --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[SqlApprovalStore]:
    """A store on `url`, opened now (the schema checked, a connection made) and closed after."""
    store = await SqlApprovalStore(url).open()
    try:
        yield store
    finally:
        await store.close()


def wait_for_path(path: Path) -> None:
    """Return once `path` exists; end the child if it does not appear in time."""
    deadline = time.monotonic() + CHILD_DEADLINE
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {path}")
        time.sleep(0.002)


def block_until_parent_closes_stdin() -> None:
    """Block (the parent kills us meanwhile); returns only if the parent went away."""
    sys.stdin.read()


async def race(url: str, tool_file: Path, barrier: Path, calls: int) -> None:
    def send(to: str) -> str:
        append_line(tool_file, str(os.getpid()))
        # In flight until the parent has seen every other resume answered (or in this tool).
        wait_for_path(barrier / "release")
        return f"sent to {to}"

    async with opened(url) as store:
        executor = build_executor(store, send)
        ctx = executor.context(RUN_ID)
        await asyncio.to_thread((barrier / f"ready-{os.getpid()}").touch)
        await asyncio.to_thread(wait_for_path, barrier / "go")
        resumes = [executor.run_call(CALL, ctx) for _ in range(calls)]
        for resumed in asyncio.as_completed(resumes):
            result = await resumed
            error = result.error
            line = {
                "status": result.status,
                "kind": None if error is None else error.kind,
                "message": None if error is None else error.message,
            }
            print(json.dumps(line), flush=True)


async def decide(url: str, approval_id: str, ready: Path) -> None:
    async with opened(url) as store:
        await store.decide(approval_id, Decision(approved=True, decided_by="ana"), channel="web")
        await asyncio.to_thread(ready.touch)
        await asyncio.to_thread(block_until_parent_closes_stdin)


async def consume(url: str, marker: Path) -> None:
    def send(to: str) -> str:
        append_line(marker, str(os.getpid()))
        block_until_parent_closes_stdin()
        return f"sent to {to}"

    async with opened(url) as store:
        executor = build_executor(store, send)
        result = await executor.run_call(CALL, executor.context(RUN_ID))
    print(json.dumps({"status": result.status}), flush=True)


async def create(url: str, ready: Path) -> None:
    deadline = time.monotonic() + CHILD_DEADLINE
    async with opened(url) as store:
        number = 0
        while time.monotonic() < deadline:
            await store.create(send_request(f"call_{number}"))
            number += 1
            if number == READY_AFTER:
                await asyncio.to_thread(ready.touch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.core.store.workers")
    roles = parser.add_subparsers(dest="role", required=True)
    for role, arguments in {
        "race": ["url", "tool_file", "barrier", "calls"],
        "decide": ["url", "approval_id", "ready"],
        "consume": ["url", "marker"],
        "create": ["url", "ready"],
    }.items():
        sub = roles.add_parser(role)
        for name in arguments:
            sub.add_argument(name, type=int if name == "calls" else str)
    args = parser.parse_args(argv)
    if args.role == "race":
        work = race(args.url, Path(args.tool_file), Path(args.barrier), args.calls)
    elif args.role == "decide":
        work = decide(args.url, args.approval_id, Path(args.ready))
    elif args.role == "consume":
        work = consume(args.url, Path(args.marker))
    else:
        work = create(args.url, Path(args.ready))
    asyncio.run(work)


# The parent's side ---------------------------------------------------------------------------


@dataclass
class Child:
    """A child process, with its stdout and stderr kept in files."""

    name: str
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def report(self) -> str:
        """What the child said, for an assertion message."""
        return (
            f"child {self.name} (pid {self.process.pid}, exit {self.process.returncode})\n"
            f"stdout:\n{self.out.read_text()}\nstderr:\n{self.err.read_text()}"
        )

    def stdout_lines(self) -> list[str]:
        return read_lines(self.out)

    def lines_written(self) -> int:
        """How many whole lines the child has written to stdout so far."""
        return self.out.read_bytes().count(b"\n")


class Children:
    """Starts children and, whatever happens, leaves none running."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Child] = []

    def start(self, role: str, *arguments: object) -> Child:
        name = f"{role}-{len(self.started)}"
        out, err = self.logs / f"{name}.out", self.logs / f"{name}.err"
        command = [sys.executable, "-m", "tests.core.store.workers", role, *map(str, arguments)]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                command, cwd=ROOT, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr
            )
        child = Child(name, process, out, err)
        self.started.append(child)
        return child

    def wait_for(self, what: str, done: Callable[[], bool]) -> None:
        """Poll `done` until it holds; fail if it does not in time or a child fails first."""
        deadline = time.monotonic() + PARENT_DEADLINE
        while not done():
            failed = [child for child in self.started if child.process.poll() not in (None, 0)]
            assert not failed, f"a child failed before {what}:\n" + failed[0].report()
            assert time.monotonic() < deadline, f"timed out after {PARENT_DEADLINE}s: {what}"
            time.sleep(0.002)

    def finish(self, child: Child, timeout: float = CHILD_DEADLINE) -> None:
        """Wait for `child` to exit by itself and check it succeeded."""
        assert child.process.stdin is not None
        child.process.stdin.close()
        child.process.wait(timeout=timeout)
        assert child.process.returncode == 0, child.report()

    def sigkill(self, child: Child) -> None:
        """Kill `child` with SIGKILL, as the OS or an operator would, and reap it."""
        child.process.send_signal(signal.SIGKILL)
        child.process.wait(timeout=CHILD_DEADLINE)
        assert child.process.returncode == -signal.SIGKILL, child.report()

    def stop_all(self) -> None:
        for child in self.started:
            if child.process.poll() is None:
                child.process.kill()
            child.process.wait(timeout=CHILD_DEADLINE)
            if child.process.stdin is not None:
                child.process.stdin.close()


@contextlib.contextmanager
def children(logs: Path) -> Iterator[Children]:
    """A `Children` whose processes are all killed and reaped on the way out."""
    started = Children(logs)
    try:
        yield started
    finally:
        started.stop_all()


if __name__ == "__main__":
    main()
