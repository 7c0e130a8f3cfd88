"""What one approval through the bot asks of its store, counted rather than timed.

The same bot and workload as `bench/bot.py` (uvicorn, the HTTP API, the workers, the outbox,
a webhook receiver in a process of its own): runs one at a time, each `POST /runs`, the
review posted, `POST /approvals/{id}/decide`, the tool run, `GET /runs/{id}?wait` until it has
finished. While they run, every call the store makes to its database backend is counted by
operation, and on SQLite every statement the connections send (their trace callback), so
that the figures per approval say where the database work goes whatever the machine's
speed. On PostgreSQL each backend operation is one round trip, except the few that open a
transaction of several statements.

    .venv/bin/python bench/counts.py --runs 100

It prints figures; it is not a test. It reaches only loopback addresses. The counting wraps
the backends' methods for the length of the script only (it is the bench's instrument).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import inspect
import os
import secrets
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench import bot as bench_bot  # noqa: E402
from bench import bot_agent  # noqa: E402
from bench.support import fresh_postgres, is_loopback, postgres_server  # noqa: E402
from nodbot.bot.serve import serving  # noqa: E402
from nodbot.core.sqlstore.postgres import PostgresBackend  # noqa: E402
from nodbot.core.sqlstore.sqlite import SqliteBackend  # noqa: E402


class Counter:
    """Backend operations by name, and SQLite statements by their first word."""

    def __init__(self) -> None:
        self.on = False
        self.operations: collections.Counter[str] = collections.Counter()
        self.statements: collections.Counter[str] = collections.Counter()
        self.transactions = 0

    def statement(self, sql: str) -> None:
        if not self.on:
            return
        verb = sql.split(None, 1)[0].upper() if sql.strip() else "?"
        self.statements[verb] += 1
        if verb == "BEGIN":
            self.transactions += 1


@contextmanager
def counting(backend: type, counter: Counter) -> Iterator[None]:
    """Count the calls of `backend`'s public coroutine methods while inside."""
    saved: dict[str, Any] = {}
    for name, method in vars(backend).items():
        if name.startswith("_") or not inspect.iscoroutinefunction(method):
            continue
        saved[name] = method
        setattr(backend, name, _counted(name, method, counter))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(backend, name, method)


def _counted(name: str, method: Callable[..., Any], counter: Counter) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if counter.on:
            counter.operations[name] += 1
        return await method(*args, **kwargs)

    return wrapper


@contextmanager
def tracing_sqlite(counter: Counter) -> Iterator[None]:
    """Every SQLite connection opened while inside sends its statements to `counter`."""
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.set_trace_callback(counter.statement)
        return connection

    sqlite3.connect = traced  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = connect  # type: ignore[assignment]


async def count(store_url: str, tmp: Path, runs: int, warmup: int, label: str) -> None:
    counter = Counter()
    backend = SqliteBackend if store_url.startswith("sqlite") else PostgresBackend
    bot_agent.forget()
    with counting(backend, counter), tracing_sqlite(counter):
        async with (
            bench_bot.receiving() as receiver,
            serving(str(bench_bot.write_config(tmp, store_url, receiver.url))) as served,
        ):
            assert is_loopback(urlsplit(served.url).hostname), f"the bot is on {served.url}"
            token = os.environ[bench_bot.TOKEN_VARIABLE]
            async with bench_bot.api_client(served.url, token) as client:
                for number in range(warmup):
                    await bench_bot.one_latency(client, receiver, f"warm-{number}")
                counter.on = True
                for number in range(runs):
                    await bench_bot.one_latency(client, receiver, f"count-{number}")
                counter.on = False
    total = sum(counter.operations.values())
    print(f"[{label}] per approval, {runs} approvals one at a time after {warmup} warm-up:")
    print(f"  store operations {total / runs:.2f}")
    for name, calls in counter.operations.most_common():
        print(f"    {name:<20} {calls / runs:6.2f}")
    if counter.statements:
        statements = sum(counter.statements.values())
        print(
            f"  SQLite statements {statements / runs:.2f},"
            f" write transactions {counter.transactions / runs:.2f}"
        )
        for verb, calls in counter.statements.most_common():
            print(f"    {verb:<20} {calls / runs:6.2f}")


async def count_all(args: argparse.Namespace) -> None:
    os.environ[bench_bot.TOKEN_VARIABLE] = secrets.token_urlsafe(24)
    os.environ[bench_bot.HOOK_SECRET_VARIABLE] = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-counts-") as name:
        tmp = Path(name)
        await count(f"sqlite:///{tmp / 'nodbot.db'}", tmp, args.runs, args.warmup, "sqlite")
        if not args.sqlite_only:
            async with fresh_postgres(postgres_server()) as url:
                if url is not None:
                    await count(url, tmp, args.runs, args.warmup, "postgresql")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100, help="approvals counted (default 100)")
    parser.add_argument("--warmup", type=int, default=5, help="approvals first (default 5)")
    parser.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)  # the bot imports bench.bot_agent from the working directory
    asyncio.run(count_all(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
