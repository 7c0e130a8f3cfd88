"""Decision -> tool ran, with 0 to 100,000 other reviews open in the store.

Goal (GOALS.md): flat within noise from 0 to 100,000 open reviews. Each size gets a store of
its own, filled in bulk (plain SQL) with that many waiting runs, each with one pending review
that the outbox has announced (its request posted): what a busy bot's database holds. Then,
alternately over the sizes, `--rounds` rounds of `--cycles` cycles each: a run starts and
pauses on a refund that needs review; the refund is approved (the clock starts); worker
steps as the bot makes them (`expire_due`, `claim_ready` and `advance_run` on what it
claimed, the outbox's `unannounced` and `claim_deliveries`) run the refund (the clock stops)
and the run finishes. It prints the p50 and p99 of each size (over every cycle of every
round), the median of the rounds' p50s and its ratio to the first size, for a SQLite file
and, when reachable, PostgreSQL (a fresh database per size on the server named by
`NODBOT_BENCH_POSTGRES_URL`, dropped at the end; loopback only).

    .venv/bin/python bench/open_reviews.py                       # 0, 1,000, 10,000, 100,000
    .venv/bin/python bench/open_reviews.py --sizes 0,100 --sqlite-only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python bench/open_reviews.py` puts bench/ first on sys.path; the repository's root goes
# there instead, so that `bench.support` is found.
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench.support import fresh_postgres, postgres_server  # noqa: E402
from nodbot.core import (  # noqa: E402
    Agent,
    ChatResponse,
    DeferredApproval,
    Executor,
    HumanMessage,
    ScriptedChat,
    SqlApprovalStore,
    ToolCall,
    ToolRegistry,
    advance_run,
)
from nodbot.core.sqlstore.schema import runs as runs_table  # noqa: E402

SIZES = (0, 1_000, 10_000, 100_000)
WORKER = "bench"
MESSAGES = '[{"role":"user","content":"Refund order o-7"}]'
ARGUMENTS = '{"amount":500.0,"order_id":"o-7"}'
# Whether the runs table counts its pending reviews (the store since migration 0008).
COUNTS_PENDING = "pending" in runs_table.c


def run_rows(total: int, now: datetime) -> list[tuple[object, ...]]:
    """`total` waiting runs: run_id, agent, status, messages, version, created_at, updated_at
    (and pending, where the schema has it)."""
    extra = (1,) if COUNTS_PENDING else ()
    return [
        (f"run_open_{i}", "support", "waiting", MESSAGES, 2, now, now, *extra) for i in range(total)
    ]


def approval_rows(total: int, now: datetime) -> list[tuple[object, ...]]:
    """One pending, announced review per run: approval_id, run_id, call_id, tool, arguments,
    digest, status, created_at, announced."""
    return [
        (f"apr_open_{i:09d}", f"run_open_{i}", "call_1", "refund", ARGUMENTS, "0" * 64, "pending",
         now, 1)
        for i in range(total)
    ]  # fmt: skip


def delivery_rows(total: int, now: datetime) -> list[tuple[object, ...]]:
    """The request of each review, posted: approval_id, kind, target, status, attempts,
    due_at, created_at, sent_at."""
    return [
        (f"apr_open_{i:09d}", "request", "webhook:ops", "sent", 1, now, now, now)
        for i in range(total)
    ]


RUN_INSERT = "runs (run_id, agent, status, messages, version, created_at, updated_at{})".format(
    ", pending" if COUNTS_PENDING else ""
)
APPROVAL_INSERT = (
    "approvals (approval_id, run_id, call_id, tool, arguments, digest, status, created_at, "
    "announced)"
)
DELIVERY_INSERT = (
    "deliveries (approval_id, kind, target, status, attempts, due_at, created_at, sent_at)"
)
FILLS = ((RUN_INSERT, run_rows), (APPROVAL_INSERT, approval_rows), (DELIVERY_INSERT, delivery_rows))


def fill_sqlite(path: str, total: int) -> None:
    """Insert `total` open reviews and their runs into the SQLite file at `path`."""
    if total == 0:
        return
    now = datetime.now(UTC)
    text = now.isoformat(" ", "microseconds")[:26]  # as the store writes times on SQLite
    db = sqlite3.connect(path)
    try:
        with db:
            for insert, rows in FILLS:
                values = [tuple(text if v is now else v for v in row) for row in rows(total, now)]
                marks = ", ".join("?" for _ in values[0])
                db.executemany(f"INSERT INTO {insert} VALUES ({marks})", values)
    finally:
        db.close()


async def fill_postgres(url: str, total: int) -> None:
    """Insert `total` open reviews and their runs into the PostgreSQL database at `url`."""
    import asyncpg

    now = datetime.now(UTC)
    connection = await asyncpg.connect(url)
    try:
        for insert, rows in FILLS if total else ():
            table, _, columns = insert.partition(" ")
            names = [name.strip() for name in columns.strip("()").split(",")]
            await connection.copy_records_to_table(table, records=rows(total, now), columns=names)
        await connection.execute("ANALYZE")  # as autovacuum would, soon after
    finally:
        await connection.close()


@dataclass
class Subject:
    """One store with `size` open reviews, and the agent that works on it."""

    size: int
    store: SqlApprovalStore
    agent: Agent
    executor: Executor
    ran_at: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    """Seconds from a decision to the tool running, every cycle."""
    round_p50s: list[float] = field(default_factory=list)


def make_subject(size: int, store: SqlApprovalStore) -> Subject:
    tools = ToolRegistry()
    ran_at: list[float] = []

    @tools.tool(confirm=True, effects="destructive")
    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran_at.append(time.perf_counter())
        return f"refunded {amount} on {order_id}"

    call = ToolCall(id="call_1", name="refund", arguments={"order_id": "o-7", "amount": 500.0})
    agent = Agent(ScriptedChat([ChatResponse(tool_calls=[call]), "Refunded."]), tools)
    executor = agent.executor(approval=DeferredApproval(store))
    return Subject(size, store, agent, executor, ran_at)


async def worker_step(subject: Subject) -> None:
    """What the bot's worker step asks of the store, with no channels to deliver to."""
    store = subject.store
    await store.expire_due()
    for run in await store.claim_ready(worker=WORKER, limit=10):
        await advance_run(run, agent=subject.agent, executor=subject.executor, runs=store)
    for announcement in await store.unannounced(limit=50):
        await store.announce(announcement.record.approval_id, announcement.stage, [])
    await store.claim_deliveries(worker=WORKER, limit=10)


async def cycle(subject: Subject) -> float:
    """One run: start, pause, decide, one worker step; the seconds decide -> tool ran."""
    store = subject.store
    run = await store.create_run(
        agent="support", messages=[HumanMessage(content="Refund order o-7")], worker=WORKER
    )
    run = await advance_run(run, agent=subject.agent, executor=subject.executor, runs=store)
    assert run.status == "waiting", run
    await worker_step(subject)  # announces the new review, as the bot's step after a start
    [pending] = await store.list(run_id=run.run_id, status="pending")
    ran = len(subject.ran_at)
    decided = time.perf_counter()
    await subject.executor.decide(pending.approval_id, True, decided_by="ana")
    while len(subject.ran_at) == ran:
        await worker_step(subject)
    latency = subject.ran_at[-1] - decided
    assert (await store.get_run(run.run_id)).status == "finished"
    return latency


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


async def measure(label: str, subjects: list[Subject], rounds: int, cycles: int) -> None:
    """Alternate rounds over the subjects, then print each one's figures."""
    for subject in subjects:
        for _ in range(2):  # warm-up: plans, caches
            await cycle(subject)
    for _ in range(rounds):
        for subject in subjects:
            latencies = [await cycle(subject) for _ in range(cycles)]
            subject.latencies.extend(latencies)
            subject.round_p50s.append(statistics.median(latencies))
    base = statistics.median(subjects[0].round_p50s)
    print(f"{label}: decide -> tool ran, {rounds} rounds x {cycles} cycles, alternating")
    print(f"  {'open reviews':>12}  {'p50 ms':>8}  {'p99 ms':>8}  {'median of round p50s':>20}")
    for subject in subjects:
        p50 = statistics.median(subject.latencies) * 1000
        p99 = percentile(subject.latencies, 0.99) * 1000
        middle = statistics.median(subject.round_p50s)
        print(
            f"  {subject.size:>12,}  {p50:>8.2f}  {p99:>8.2f}  {middle * 1000:>14.2f} "
            f"({middle / base:.2f}x)"
        )
    ratio = statistics.median(subjects[-1].round_p50s) / base
    print(
        f"{label} open reviews {subjects[0].size:,} -> {subjects[-1].size:,}: "
        f"p50 ratio = {ratio:.2f}x (goal: flat within noise)"
    )


async def on_sqlite(folder: str, sizes: Sequence[int], rounds: int, cycles: int) -> None:
    async with contextlib.AsyncExitStack() as stack:
        subjects = []
        for size in sizes:
            path = f"{folder}/open_{size}.db"
            store = await stack.enter_async_context(SqlApprovalStore(f"sqlite:///{path}"))
            started = time.perf_counter()
            fill_sqlite(path, size)
            print(f"sqlite: {size:,} open reviews filled in {time.perf_counter() - started:.1f} s")
            subjects.append(make_subject(size, store))
        await measure("sqlite", subjects, rounds, cycles)


@contextlib.asynccontextmanager
async def postgres_databases(count: int) -> AsyncIterator[list[str] | None]:
    """`count` fresh databases (None when the server cannot be used), dropped at the end."""
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for _ in range(count):
            url = await stack.enter_async_context(fresh_postgres(postgres_server()))
            if url is None:
                yield None
                return
            urls.append(url)
        yield urls


async def on_postgres(sizes: Sequence[int], rounds: int, cycles: int) -> None:
    async with postgres_databases(len(sizes)) as urls, contextlib.AsyncExitStack() as stack:
        if urls is None:
            return
        subjects = []
        for size, url in zip(sizes, urls, strict=True):
            store = await stack.enter_async_context(SqlApprovalStore(url))
            started = time.perf_counter()
            await fill_postgres(url, size)
            elapsed = time.perf_counter() - started
            print(f"postgresql: {size:,} open reviews filled in {elapsed:.1f} s")
            subjects.append(make_subject(size, store))
        await measure("postgresql", subjects, rounds, cycles)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(part) for part in text.split(",")],
        default=list(SIZES),
        help="open reviews in each store, comma-separated; the first is the baseline",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=50, help="cycles per size and round")
    parser.add_argument("--sqlite-only", action="store_true")
    return parser.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        await on_sqlite(folder, args.sizes, args.rounds, args.cycles)
    if not args.sqlite_only:
        await on_postgres(args.sizes, args.rounds, args.cycles)


if __name__ == "__main__":
    asyncio.run(main())
