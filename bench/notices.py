"""Decisions at once on PostgreSQL, and what a NOTIFY inside the deciding transaction cost.

PostgreSQL takes one lock for the whole server when a transaction that sent NOTIFY commits,
and holds it until the commit is durable: transactions that notify commit one after another,
each with its own fsync, where others share one. nodbot's decisions used to notify inside
their transaction; they now notify after it, in a statement of their own, and only when
another store listens (migration 0015). Each round, alternating the order, measures
decisions per second with `--concurrency` sessions deciding at once:

1. the floor: each session updates a row of its own, one durable transaction a decision;
2. the floor with `pg_notify` in the same statement (how nodbot's decisions were made);
3. the floor with the notice sent after the commit, in a statement of its own;
4. nodbot: `SqlApprovalStore.decide` on pending reviews, no other store listening (a lone
   bot, or an app whose store nobody else listens to: no notice at all);
5. nodbot, another store listening (replicas): each decision noticed after its commit.

The medians of the rounds are printed, and each as a ratio of the floor's. Every round runs
on a fresh database of the server named by `NODBOT_BENCH_POSTGRES_URL` (default
`postgresql://postgres@127.0.0.1:5432/postgres`); only loopback is accepted.

    .venv/bin/python bench/notices.py --decisions 2000 --rounds 5

It prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench.support import fresh_postgres, postgres_server  # noqa: E402
from nodbot.core import ApprovalRequest, Decision, SqlApprovalStore, arguments_digest  # noqa: E402

FLOOR = "floor"
FLOOR_NOTIFY_INSIDE = "floor, NOTIFY inside"
FLOOR_NOTIFY_AFTER = "floor, NOTIFY after"
NODBOT_ALONE = "nodbot decide, nobody else listens"
NODBOT_HEARD = "nodbot decide, another store listens"
WORKLOADS = (FLOOR, FLOOR_NOTIFY_INSIDE, FLOOR_NOTIFY_AFTER, NODBOT_ALONE, NODBOT_HEARD)

_UPDATE = "UPDATE decisions SET decided = decided + 1 WHERE id = $1"
_STATEMENTS = {
    FLOOR: (f"{_UPDATE} RETURNING id", None),
    FLOOR_NOTIFY_INSIDE: (f"{_UPDATE} RETURNING pg_notify('bench', id::text)", None),
    FLOOR_NOTIFY_AFTER: (f"{_UPDATE} RETURNING id", "SELECT pg_notify('bench', $1::text)"),
}


async def at_once(sessions: int, decisions: int, decide: Callable[[int], Awaitable[None]]) -> float:
    """Decisions per second: `decisions` made by `sessions` tasks at once, each task calling
    `decide(its number)` in turn."""

    async def session(number: int) -> None:
        for _ in range(decisions // sessions):
            await decide(number)

    start = time.perf_counter()
    await asyncio.gather(*(session(number) for number in range(sessions)))
    return sessions * (decisions // sessions) / (time.perf_counter() - start)


async def floor(url: str, workload: str, sessions: int, decisions: int) -> float:
    import asyncpg

    statement, after = _STATEMENTS[workload]
    connections = [await asyncpg.connect(url) for _ in range(sessions)]
    try:
        await connections[0].execute(
            "CREATE TABLE IF NOT EXISTS decisions (id int PRIMARY KEY, decided int NOT NULL);"
            f"INSERT INTO decisions SELECT g, 0 FROM generate_series(0, {sessions - 1}) AS g "
            "ON CONFLICT (id) DO NOTHING"
        )

        async def decide(number: int) -> None:
            await connections[number].fetchval(statement, number)
            if after is not None:
                await connections[number].fetchval(after, str(number))

        return await at_once(sessions, decisions, decide)
    finally:
        for connection in connections:
            await connection.close()


async def nodbot(url: str, heard: bool, sessions: int, decisions: int) -> float:
    arguments = {"order_id": "o-7", "amount": 500.0}
    async with SqlApprovalStore(url) as store, SqlApprovalStore(url) as elsewhere:
        pending: list[list[str]] = [[] for _ in range(sessions)]
        for number in range(decisions):
            request = ApprovalRequest(
                f"run_{number % sessions}",
                f"call_{number}",
                "refund",
                arguments,
                arguments_digest(arguments),
            )
            pending[number % sessions].append((await store.create(request)).approval_id)
        listening = await elsewhere.listen(lambda: None) if heard else None
        decision = Decision(approved=True, decided_by="bench")

        async def decide(number: int) -> None:
            await store.decide(pending[number].pop(), decision)

        try:
            return await at_once(sessions, decisions, decide)
        finally:
            if listening is not None:
                await listening()


async def measure(server: str, rounds: int, sessions: int, decisions: int) -> None:
    rates: dict[str, list[float]] = {workload: [] for workload in WORKLOADS}
    for round_ in range(rounds):
        order = WORKLOADS if round_ % 2 == 0 else WORKLOADS[::-1]
        for workload in order:
            async with fresh_postgres(server) as url:
                if url is None:
                    return
                if workload in _STATEMENTS:
                    rate = await floor(url, workload, sessions, decisions)
                else:
                    rate = await nodbot(url, workload == NODBOT_HEARD, sessions, decisions)
            rates[workload].append(rate)
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{workload} {rates[workload][-1]:,.0f}/s" for workload in WORKLOADS),
            flush=True,
        )
    base = statistics.median(rates[FLOOR])
    print(f"\n{sessions} deciding at once, medians of {rounds} rounds:")
    for workload in WORKLOADS:
        median = statistics.median(rates[workload])
        print(f"  {workload:40} {median:8,.0f} decisions/s  ({median / base:.2f}x the floor)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=2000, help="per workload and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating the order")
    parser.add_argument("--concurrency", type=int, default=8, help="sessions deciding at once")
    args = parser.parse_args(argv)
    if args.decisions < args.concurrency or args.rounds < 1 or args.concurrency < 1:
        parser.error("--rounds and --concurrency must be >= 1, --decisions >= --concurrency")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    asyncio.run(measure(postgres_server(), args.rounds, args.concurrency, args.decisions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
