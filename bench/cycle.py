"""One approval cycle, measured: nodbot against its peer and its floor, in the same run.

One cycle is: a call that needs review pauses, a decision is stored, the call resumes and
the tool runs once. Each workload runs `--cycles` cycles (after a short warm-up) and the
script prints cycles/second for each, then the ratios that GOALS.md sets goals for:

1. nodbot, memory store: `Executor` + `DeferredApproval(MemoryApprovalStore())`.
2. nodbot, SQLite file: the same with `SqlApprovalStore("sqlite:///...")`, measured
   `--rounds` times alternately with the floor and the peer; the goals compare the median
   of the rounds' ratios (each ratio of two workloads measured in the same minute).
3. nodbot, PostgreSQL: the same with `SqlApprovalStore("postgresql://...")`, one run at a
   time and 8 runs at once (PostgreSQL makes every commit durable with an fsync, which
   concurrent commits share), `--rounds` times after the SQLite rounds, each round with its
   floor on a fresh database created on the server named by `NODBOT_BENCH_POSTGRES_URL`
   (default `postgresql://postgres@127.0.0.1:5432/postgres`) and dropped at its end; the
   goal compares the median of the rounds' rates (a single 2,000-cycle window moved from
   950 to 1,240 cycles/s at 8 at once from one minute to the next). Skipped when the server
   is unreachable; only loopback is accepted.
4. The peer: LangChain `create_agent` + `HumanInTheLoopMiddleware` + LangGraph `SqliteSaver`
   on a SQLite file, driven by a fake chat model (no network): a twentieth of `--cycles`
   each round, before nodbot in odd rounds and after it in even ones.
5. The floor: three raw sqlite3 transactions per cycle (WAL, `synchronous=NORMAL`, and the
   page size the store gives a new file, `SQLITE_PAGE_SIZE`, so that both write pages of one
   size): insert a pending row, mark it decided, mark it consumed; ten times `--cycles` of
   them, so that it is measured over about as long a window as nodbot. The same three
   statements through asyncpg give PostgreSQL's floor, which shows what the server's durable
   commits cost.

Run it with `make bench`, or `.venv/bin/python bench/cycle.py --cycles 500`. It prints
figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keep LangSmith tracing off whatever the environment says: the benchmark stays on loopback.
for _name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_name] = "false"

ROOT = Path(__file__).resolve().parents[1]
# `python bench/cycle.py` puts bench/ first on sys.path; the repository's root goes there
# instead, so that `bench.support` is found.
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench.support import fresh_postgres, postgres_server  # noqa: E402
from nodbot.core import (  # noqa: E402  (after the tracing switch above)
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    MemoryApprovalStore,
    SqlApprovalStore,
    ToolCall,
    ToolContext,
    ToolRegistry,
)
from nodbot.core.sqlstore.engine import SQLITE_PAGE_SIZE  # noqa: E402

PEER_GOAL = 20.0
"""nodbot on SQLite must do at least this many times the peer's cycles/s."""
FLOOR_GOAL = 10.0
"""The floor may do at most this many times nodbot's cycles/s on SQLite."""
POSTGRES_CONCURRENCY = 8
"""Runs at once in the concurrent PostgreSQL workload."""
POSTGRES_GOAL = 1000.0
"""Cycles/s nodbot must reach on PostgreSQL over loopback."""


@dataclass(frozen=True)
class Result:
    """The figures of one workload."""

    workload: str
    cycles: int
    seconds: float

    @property
    def rate(self) -> float:
        """Cycles per second."""
        return self.cycles / self.seconds


# --- nodbot ------------------------------------------------------------------------------


async def nodbot_cycles(
    workload: str, store: ApprovalStore, cycles: int, warmup: int, concurrency: int = 1
) -> Result:
    """Run `warmup` then `cycles` approval cycles through an executor on `store`, in
    `concurrency` runs at once (each its own run id, as a bot serving several runs)."""
    runs = 0
    registry = ToolRegistry()

    @registry.tool(confirm=True, effects="destructive")
    async def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        nonlocal runs
        runs += 1
        return f"refunded {amount} on {order_id}"

    executor = Executor(registry, approval=DeferredApproval(store))
    contexts = [executor.context(f"run_bench_{secrets.token_hex(4)}") for _ in range(concurrency)]
    arguments = {"order_id": "o-7", "amount": 500.0}
    decision = Decision(approved=True, decided_by="bench")
    numbers = itertools.count()

    async def cycle(ctx: ToolContext) -> None:
        call = ToolCall(name="refund", arguments=arguments, id=f"call_{next(numbers)}")
        first = await executor.run_call(call, ctx)
        assert first.status == "pending" and first.error is not None, first
        await store.decide(first.error.details["approval_id"], decision)
        done = await executor.run_call(call, ctx)
        assert done.status == "ok", done

    async def worker(ctx: ToolContext, count: int) -> None:
        for _ in range(count):
            await cycle(ctx)

    async def run(count: int) -> None:
        share, extra = divmod(count, concurrency)
        await asyncio.gather(*(worker(ctx, share + (i < extra)) for i, ctx in enumerate(contexts)))

    await run(warmup)
    gc.collect()
    start = time.perf_counter()
    await run(cycles)
    seconds = time.perf_counter() - start
    assert runs == warmup + cycles, f"{workload}: the tool ran {runs} times"
    return Result(workload, cycles, seconds)


async def nodbot_sql(
    workload: str, url: str, cycles: int, warmup: int, concurrency: int = 1
) -> Result:
    """The nodbot workload on a `SqlApprovalStore(url)`, closed at the end."""
    store = SqlApprovalStore(url)
    try:
        return await nodbot_cycles(workload, store, cycles, warmup, concurrency)
    finally:
        await store.close()


async def nodbot_postgres(
    server_url: str, cycles: int, warmup: int, rounds: int = 1
) -> list[Result]:
    """PostgreSQL's floor, then the nodbot workload one run at a time and
    `POSTGRES_CONCURRENCY` at once, `rounds` times, each round on a fresh database (dropped
    at its end, even on error), so that every round starts from the same empty tables.

    Returns nothing (and says why) when the server is not on loopback or is unreachable.
    """
    results: list[Result] = []
    for _ in range(rounds):
        async with fresh_postgres(server_url) as url:
            if url is None:
                return []
            results += [
                await postgres_floor(url, cycles, warmup),
                await nodbot_sql("nodbot postgresql", url, cycles, warmup),
                await nodbot_sql(
                    f"nodbot postgresql x{POSTGRES_CONCURRENCY}",
                    url,
                    cycles,
                    warmup,
                    POSTGRES_CONCURRENCY,
                ),
            ]
    return results


async def postgres_floor(url: str, cycles: int, warmup: int) -> Result:
    """The PostgreSQL floor: three single-statement transactions per cycle (insert pending,
    mark decided, mark consumed), each committed durably as the server is configured."""
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "CREATE TABLE floor (id bigserial PRIMARY KEY, status text, consumed boolean)"
        )

        async def cycle() -> None:
            row = await connection.fetchval(
                "INSERT INTO floor (status, consumed) VALUES ('pending', false) RETURNING id"
            )
            await connection.execute("UPDATE floor SET status = 'approved' WHERE id = $1", row)
            await connection.execute("UPDATE floor SET consumed = true WHERE id = $1", row)

        for _ in range(warmup):
            await cycle()
        start = time.perf_counter()
        for _ in range(cycles):
            await cycle()
        return Result("floor postgresql", cycles, time.perf_counter() - start)
    finally:
        await connection.close()


async def nodbot_all(args: argparse.Namespace, tmp: Path) -> list[Result]:
    """The nodbot workloads besides SQLite: memory and PostgreSQL."""
    results = [
        await nodbot_cycles("nodbot memory", MemoryApprovalStore(), args.cycles, args.warmup)
    ]
    results += await nodbot_postgres(postgres_server(), args.cycles, args.warmup, args.rounds)
    return results


# --- the peer: LangChain HumanInTheLoopMiddleware + LangGraph SqliteSaver -----------------


def peer_cycles(path: Path, cycles: int, warmup: int) -> Result:
    """Run approval cycles through a LangChain agent that pauses on `refund`."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    class RefundModel(BaseChatModel):
        """Asks for a refund first, then answers in plain text once the tool has run."""

        @property
        def _llm_type(self) -> str:
            return "bench-refund"

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: list[str] | None = None,
            run_manager: CallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            if isinstance(messages[-1], ToolMessage):
                message = AIMessage(content=f"done: {messages[-1].content}")
            else:
                call = {
                    "name": "refund",
                    "args": {"order_id": "o-7", "amount": 500.0},
                    "id": f"call_{secrets.token_hex(8)}",
                    "type": "tool_call",
                }
                message = AIMessage(content="", tool_calls=[call])
            return ChatResult(generations=[ChatGeneration(message=message)])

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RefundModel:  # type: ignore[override]
            return self

    runs = 0

    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        nonlocal runs
        runs += 1
        return f"refunded {amount} on {order_id}"

    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        agent = create_agent(
            RefundModel(),
            tools=[refund],
            middleware=[HumanInTheLoopMiddleware(interrupt_on={"refund": True})],
            checkpointer=SqliteSaver(conn),
        )
        numbers = itertools.count()
        # The batched mode's answer (the default): one decision per reviewed call, in order.
        approve = {"decisions": [{"type": "approve"}]}

        def cycle() -> None:
            config: Any = {"configurable": {"thread_id": f"thread_{next(numbers)}"}}
            before = runs
            paused = agent.invoke({"messages": [{"role": "user", "content": "refund o-7"}]}, config)
            assert "__interrupt__" in paused, paused
            assert runs == before, "the tool ran before the decision"
            done = agent.invoke(Command(resume=approve), config)
            assert "__interrupt__" not in done, done
            assert runs == before + 1, "the tool did not run once"
            assert isinstance(done["messages"][-1], AIMessage), done

        for _ in range(warmup):
            cycle()
        gc.collect()
        start = time.perf_counter()
        for _ in range(cycles):
            cycle()
        seconds = time.perf_counter() - start
    finally:
        conn.close()
    assert runs == warmup + cycles, f"peer: the tool ran {runs} times"
    return Result("peer langchain hitl", cycles, seconds)


# --- the floor: three raw sqlite3 transactions ---------------------------------------------


FLOOR_SCALE = 10
"""How many times more cycles the floor runs than nodbot (it is about ten times faster)."""
PEER_DIVISOR = 20
"""How many times fewer cycles the peer runs than nodbot (it is about twenty times slower),
so that each round measures the three over windows of about the same length."""


def floor_cycles(path: Path, cycles: int, warmup: int) -> Result:
    """Insert a pending row, mark it decided, mark it consumed: three transactions a cycle."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # before WAL: then it is fixed
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE approvals (id TEXT PRIMARY KEY, status TEXT NOT NULL,"
            " decided_by TEXT, decided_at REAL, consumed_at REAL)"
        )
        numbers = itertools.count()

        def cycle() -> None:
            approval_id = f"apr_{next(numbers)}"
            with conn:
                conn.execute(
                    "INSERT INTO approvals (id, status) VALUES (?, 'pending')", (approval_id,)
                )
            with conn:
                conn.execute(
                    "UPDATE approvals SET status = 'decided', decided_by = ?, decided_at = ?"
                    " WHERE id = ? AND status = 'pending'",
                    ("bench", time.time(), approval_id),
                )
            with conn:
                conn.execute(
                    "UPDATE approvals SET status = 'consumed', consumed_at = ?"
                    " WHERE id = ? AND status = 'decided'",
                    (time.time(), approval_id),
                )

        for _ in range(warmup):
            cycle()
        gc.collect()
        start = time.perf_counter()
        for _ in range(cycles):
            cycle()
        seconds = time.perf_counter() - start
        (consumed,) = conn.execute(
            "SELECT count(*) FROM approvals WHERE status = 'consumed'"
        ).fetchone()
        assert consumed == warmup + cycles, f"floor: {consumed} rows consumed"
    finally:
        conn.close()
    return Result("floor sqlite3", cycles, seconds)


# --- report --------------------------------------------------------------------------------


def print_table(results: Sequence[Result]) -> None:
    print()
    print(f"{'workload':<22} {'cycles':>8} {'seconds':>9} {'cycles/s':>10}")
    for result in results:
        print(
            f"{result.workload:<22} {result.cycles:>8} {result.seconds:>9.3f} {result.rate:>10,.0f}"
        )


def median_rate(results: Sequence[Result], workload: str) -> float | None:
    """The median cycles/s of a workload measured in several rounds, or None."""
    rates = [result.rate for result in results if result.workload == workload]
    return statistics.median(rates) if rates else None


def round_ratios(results: Sequence[Result], top: str, bottom: str) -> list[float]:
    """`top`'s rate over `bottom`'s, round by round (the n-th of each is one round)."""
    tops = [r.rate for r in results if r.workload == top]
    bottoms = [r.rate for r in results if r.workload == bottom]
    return [a / b for a, b in zip(tops, bottoms, strict=False) if b]


def print_goals(results: Sequence[Result]) -> None:
    print()
    against_peer = round_ratios(results, "nodbot sqlite", "peer langchain hitl")
    if against_peer:
        each = ", ".join(f"{ratio:.1f}" for ratio in against_peer)
        print(
            f"nodbot sqlite / peer = {statistics.median(against_peer):.1f}x, the median of "
            f"{len(against_peer)} alternating rounds ({each}) (goal >= {PEER_GOAL:.0f}x)"
        )
    against_floor = round_ratios(results, "floor sqlite3", "nodbot sqlite")
    if against_floor:
        each = ", ".join(f"{ratio:.1f}" for ratio in against_floor)
        print(
            f"floor / nodbot sqlite = {statistics.median(against_floor):.1f}x, the median of "
            f"{len(against_floor)} rounds ({each}) (goal <= {FLOOR_GOAL:.0f}x)"
        )
    postgres_floor_rate = median_rate(results, "floor postgresql")
    for workload in ("nodbot postgresql", f"nodbot postgresql x{POSTGRES_CONCURRENCY}"):
        rate = median_rate(results, workload)
        if rate:
            rates = [f"{r.rate:,.0f}" for r in results if r.workload == workload]
            against = (
                f"; floor / it = {postgres_floor_rate / rate:.1f}x" if postgres_floor_rate else ""
            )
            print(
                f"{workload} = {rate:,.0f} cycles/s, the median of {len(rates)} rounds"
                f" ({', '.join(rates)}) (goal >= {POSTGRES_GOAL:,.0f}/s){against}"
            )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=2000, help="measured cycles per workload")
    parser.add_argument(
        "--warmup", type=int, default=50, help="cycles run before measuring (default 50)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="times nodbot sqlite, the floor and the peer are measured, alternately, and"
        " PostgreSQL's workloads after them (default 5)",
    )
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--cycles and --rounds must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"approval cycle: {args.cycles} cycles per workload after {args.warmup} warm-up; "
        f"nodbot sqlite, the floor and the peer alternate over {args.rounds} rounds (the "
        "median of the rounds' ratios compared)"
    )
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-") as name:
        tmp = Path(name)
        results: list[Result] = []
        # This machine is shared and noisy: measuring the two alternately, several times,
        # keeps a passing load from favouring one of them. The floor runs ten times the
        # cycles, so that both are measured over windows of about the same length.
        for round_ in range(args.rounds):
            peer_cycles_now = max(1, args.cycles // PEER_DIVISOR)
            peer_path = tmp / f"peer{round_}.db"
            if round_ % 2:  # the peer leaves the disk and the heap busy: first, then last
                results.append(peer_cycles(peer_path, peer_cycles_now, args.warmup))
            floor = floor_cycles(tmp / f"floor{round_}.db", FLOOR_SCALE * args.cycles, args.warmup)
            results.append(floor)
            url = f"sqlite:///{tmp / f'nodbot{round_}.db'}"
            results.append(asyncio.run(nodbot_sql("nodbot sqlite", url, args.cycles, args.warmup)))
            if not round_ % 2:
                results.append(peer_cycles(peer_path, peer_cycles_now, args.warmup))
        results += asyncio.run(nodbot_all(args, tmp))
    print_table(results)
    print_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
