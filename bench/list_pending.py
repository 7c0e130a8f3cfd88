"""How long `store.list(run_id=..., status="pending")` takes with 100,000 records.

Goal (GOALS.md): at most 5 ms. The records are spread over 2,000 runs (50 each, 5 of them
pending), written with one bulk insert so that filling the table takes seconds; then one run's
pending records are listed many times and the median and p99 are printed, for a SQLite file
and, when reachable, PostgreSQL.

    make bench                               # all benchmarks
    .venv/bin/python bench/list_pending.py   # this one
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine

from nodbot.core import SqlApprovalStore
from nodbot.core.sqlstore.schema import approvals

RUNS = 2_000
PER_RUN = 50
PENDING_PER_RUN = 5
GOAL_MS = 5.0


def rows(total: int) -> list[dict[str, object]]:
    now = datetime.now(UTC)
    made = []
    for index in range(total):
        run, call = divmod(index, PER_RUN)
        pending = call < PENDING_PER_RUN
        made.append(
            {
                "approval_id": f"apr_{index:012d}",
                "run_id": f"run_{run}",
                "call_id": f"call_{call}",
                "tool": "refund",
                "arguments": '{"amount":500.0,"order_id":"o-7"}',
                "digest": "0" * 64,
                "status": "pending" if pending else "approved",
                "decision": None if pending else '{"approved":true}',
                "created_at": now,
                "decided_at": None if pending else now,
                "consumed_at": None if pending else now,
                "finished_at": None if pending else now,
                "outcome": None if pending else "ok",
            }
        )
    return made


async def measure(label: str, url: str, total: int, repeats: int) -> None:
    async with SqlApprovalStore(url) as store:
        started = time.perf_counter()
        engine = create_async_engine(store.url)  # a bulk fill, not the store's API
        async with engine.begin() as connection:
            await connection.execute(insert(approvals), rows(total))
        await engine.dispose()
        filled = time.perf_counter() - started
        target = f"run_{RUNS // 2}"
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            found = await store.list(run_id=target, status="pending")
            timings.append((time.perf_counter() - started) * 1000)
            assert len(found) == PENDING_PER_RUN, len(found)
    timings.sort()
    p50 = statistics.median(timings)
    p99 = timings[int(len(timings) * 0.99) - 1]
    verdict = "meets" if p99 <= GOAL_MS else "misses"
    print(
        f"{label:<11} {total:>7} records (filled in {filled:.1f} s): "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms  ({verdict} the goal of <= {GOAL_MS} ms)"
    )


@contextlib.asynccontextmanager
async def postgres_database(server: str) -> AsyncIterator[str]:
    name = f"nodbot_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=RUNS * PER_RUN)
    parser.add_argument("--repeats", type=int, default=500)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/nodbot.db"
        await measure("sqlite", url, arguments.records, arguments.repeats)
    server = os.environ.get("NODBOT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1/postgres")
    try:
        async with postgres_database(server) as url:
            await measure("postgresql", url, arguments.records, arguments.repeats)
    except OSError as exc:
        print(f"postgresql  skipped: {server} is not reachable ({exc})")


if __name__ == "__main__":
    asyncio.run(main())
