"""One approval cycle, measured: nodbot against its peer and its floor, in the same run.

One cycle is: a call that needs review pauses, a decision is stored, the call resumes and
the tool runs once. nodbot's cycle goes through the core API the way a user's code does: the
tool is a plain `def refund(order_id, amount)` (a synchronous tool, `blocking=True` by
default, so it runs in a thread), and every cycle calls it with new arguments (a new order
id and amount). Two further rows measure the same cycle with an `async def` tool and with a
synchronous tool declared `blocking=False` (run on the event loop). Every nodbot row also
gives the CPU time of this process per cycle (`time.process_time`, every thread of it), which
moves less with the machine's load than a rate does.

1. nodbot, memory store: `Executor` + `DeferredApproval(MemoryApprovalStore())`, the plain
   `def` tool, once.
2. nodbot, SQLite file: the same with `SqlApprovalStore("sqlite:///...")`, each tool's row on
   a fresh file, measured `--rounds` times alternately with the floor and the peer (in
   every round: the floor, the three nodbot rows and the peer, the order turned round from
   one round to the next).
3. The peer: LangChain `create_agent` + `HumanInTheLoopMiddleware` + LangGraph `SqliteSaver`
   on a SQLite file, driven by a fake chat model (no network) that asks for a new refund each
   cycle: a twentieth of `--cycles` each round.
4. SQLite's floor: three raw sqlite3 transactions per cycle (WAL, `synchronous=NORMAL`, and
   the page size the store gives a new file, `SQLITE_PAGE_SIZE`, so that both write pages of
   one size): insert a pending row, mark it decided, mark it consumed; ten times `--cycles`
   of them, so that it is measured over about as long a window as nodbot.
5. nodbot, PostgreSQL: one run at a time (the `def` tool) and 8 runs at once (each tool),
   `--rounds` times after the SQLite rounds, alternately with PostgreSQL's floor: raw
   asyncpg, 8 connections at once, four autocommitted statements a cycle (insert pending,
   mark decided, mark consumed, mark finished), each committed durably as the server is
   configured. Each round runs on a fresh database created on the server named by
   `NODBOT_BENCH_POSTGRES_URL` (default `postgresql://postgres@127.0.0.1:5432/postgres`)
   and dropped at its end. Skipped when the server is unreachable; only loopback is
   accepted.

The goals (GOALS.md), each compared as the median of the rounds, and each ratio taken within
one round (two workloads measured in the same minute): nodbot on SQLite with the `def` tool
at least 30 times the peer's cycles/s, and the floor at most 5 times nodbot's; nodbot on
PostgreSQL, 8 runs at once with the `def` tool, at least half its floor's cycles/s (about
2,000/s on the development machine). The report is a table of every row with its goal and
whether the goal is met; the other rows are there to show where the difference lies.

Run it with `make bench`, or `.venv/bin/python bench/cycle.py --cycles 500`. It prints
figures; it is not a test. It reaches only loopback addresses. `bench/profile_cycle.py`
shows where the time of one cycle goes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import importlib.util
import itertools
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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

ToolKind = Literal["sync", "async", "nonblocking"]
TOOL_KINDS: tuple[ToolKind, ...] = ("sync", "async", "nonblocking")
TOOL_LABELS: dict[ToolKind, str] = {
    "sync": "def tool",
    "async": "async def tool",
    "nonblocking": "blocking=False",
}
"""How each kind of tool is named in the report."""

PEER_GOAL = 30.0
"""nodbot on SQLite (the `def` tool) must do at least this many times the peer's cycles/s."""
FLOOR_GOAL = 5.0
"""SQLite's floor may do at most this many times nodbot's cycles/s (the `def` tool)."""
POSTGRES_CONCURRENCY = 8
"""Runs at once in the concurrent PostgreSQL workloads, and connections of its floor."""
POSTGRES_GOAL = 0.5
"""nodbot on PostgreSQL, `POSTGRES_CONCURRENCY` runs at once, must do at least this share
of its floor's cycles/s."""
POSTGRES_RATE_GOAL = 2000.0
"""The same goal in cycles/s on the development machine (half its floor's 4,000/s)."""

FLOOR_SCALE = 10
"""How many times more cycles SQLite's floor runs than nodbot (it is about ten times
faster), so that both are measured over windows of about the same length."""
POSTGRES_FLOOR_SCALE = 2
"""The same for PostgreSQL's floor (about two to four times faster than nodbot)."""
PEER_DIVISOR = 20
"""How many times fewer cycles the peer runs than nodbot (it is about twenty times slower)."""

PEER = "peer langchain hitl"
SQLITE_FLOOR = "floor sqlite3"
POSTGRES_FLOOR = f"floor postgresql x{POSTGRES_CONCURRENCY}"


def nodbot_workload(store: str, kind: ToolKind, concurrency: int = 1) -> str:
    """The name of a nodbot row: `nodbot sqlite, def tool`, `nodbot postgresql x8, ...`."""
    at_once = f" x{concurrency}" if concurrency > 1 else ""
    return f"nodbot {store}{at_once}, {TOOL_LABELS[kind]}"


@dataclass(frozen=True)
class Result:
    """The figures of one workload in one round."""

    workload: str
    cycles: int
    seconds: float
    cpu_seconds: float
    """CPU time of this process (every thread) over the measured cycles."""
    round: int = 0

    @property
    def rate(self) -> float:
        """Cycles per second."""
        return self.cycles / self.seconds

    @property
    def cpu_per_cycle(self) -> float:
        """CPU microseconds of this process per cycle."""
        return self.cpu_seconds / self.cycles * 1e6


class Stopwatch:
    """Wall and CPU time (of this process, every thread) of the work in a `with` block,
    which starts after a garbage collection."""

    seconds = 0.0
    cpu_seconds = 0.0

    def __enter__(self) -> Stopwatch:
        gc.collect()
        self._cpu = time.process_time()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self.cpu_seconds = time.process_time() - self._cpu


# --- nodbot ------------------------------------------------------------------------------


def refund_registry(kind: ToolKind, ran: list[str]) -> ToolRegistry:
    """A registry with one reviewed tool, `refund`, of the given kind; each run of it appends
    its order id to `ran` (a list's append is atomic, so a thread may make it)."""
    registry = ToolRegistry()
    if kind == "async":

        @registry.tool(confirm=True, effects="destructive")
        async def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            ran.append(order_id)
            return f"refunded {amount} on {order_id}"

    else:  # as a user writes it: `blocking=True` by default, so it runs in a thread

        @registry.tool(confirm=True, effects="destructive", blocking=kind == "sync")
        def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            ran.append(order_id)
            return f"refunded {amount} on {order_id}"

    return registry


class RefundCycles:
    """Approval cycles of a `refund` tool through an executor on `store`, in `concurrency`
    runs at once (each its own run id, as a bot serving several runs), each cycle with new
    arguments: a new order id and amount."""

    def __init__(self, store: ApprovalStore, kind: ToolKind = "sync", concurrency: int = 1):
        self.store = store
        self.ran: list[str] = []
        self.executor = Executor(refund_registry(kind, self.ran), approval=DeferredApproval(store))
        tag = secrets.token_hex(4)
        self.contexts = [self.executor.context(f"run_bench_{tag}_{i}") for i in range(concurrency)]
        self._numbers = itertools.count()
        self._decision = Decision(approved=True, decided_by="bench")
        self.cycles = 0

    async def cycle(self, ctx: ToolContext) -> None:
        """One cycle: the call pauses, the decision is stored, the call resumes and runs."""
        number = next(self._numbers)
        arguments = {"order_id": f"o-{number}", "amount": 10.0 + number / 100}
        call = ToolCall(name="refund", arguments=arguments, id=f"call_{number}")
        first = await self.executor.run_call(call, ctx)
        assert first.status == "pending" and first.error is not None, first
        await self.store.decide(first.error.details["approval_id"], self._decision)
        done = await self.executor.run_call(call, ctx)
        assert done.status == "ok", done

    async def run(self, count: int) -> None:
        """Run `count` cycles, spread over the runs."""

        async def worker(ctx: ToolContext, share: int) -> None:
            for _ in range(share):
                await self.cycle(ctx)

        share, extra = divmod(count, len(self.contexts))
        await asyncio.gather(
            *(worker(ctx, share + (i < extra)) for i, ctx in enumerate(self.contexts))
        )
        self.cycles += count

    def check(self) -> None:
        """Every cycle ran the tool exactly once, with its own arguments."""
        assert len(self.ran) == self.cycles, f"the tool ran {len(self.ran)} times"
        assert len(set(self.ran)) == self.cycles, "the tool ran twice for one order"


async def nodbot_cycles(
    workload: str,
    store: ApprovalStore,
    cycles: int,
    warmup: int,
    concurrency: int = 1,
    kind: ToolKind = "sync",
) -> Result:
    """Run `warmup` then `cycles` approval cycles of a `kind` tool through an executor on
    `store`, in `concurrency` runs at once, and time the `cycles`."""
    bench = RefundCycles(store, kind, concurrency)
    await bench.run(warmup)
    with Stopwatch() as watch:
        await bench.run(cycles)
    bench.check()
    return Result(workload, cycles, watch.seconds, watch.cpu_seconds)


async def nodbot_sql(
    workload: str, url: str, cycles: int, warmup: int, concurrency: int = 1, kind: ToolKind = "sync"
) -> Result:
    """The nodbot workload on a `SqlApprovalStore(url)`, closed at the end."""
    store = SqlApprovalStore(url)
    try:
        return await nodbot_cycles(workload, store, cycles, warmup, concurrency, kind)
    finally:
        await store.close()


# --- PostgreSQL: nodbot and its floor, alternately ------------------------------------------


async def nodbot_postgres(
    server_url: str, cycles: int, warmup: int, rounds: int = 1
) -> list[Result]:
    """PostgreSQL's floor and nodbot's PostgreSQL rows (one run at a time, and
    `POSTGRES_CONCURRENCY` at once with each tool), `rounds` times, each round on a fresh
    database (dropped at its end, even on error) so that every round starts from the same
    empty tables; the floor first in even rounds and last in odd ones, nodbot's rows in an
    order turned round by one each round.

    Returns nothing (and says why) when the server is not on loopback or is unreachable.
    """
    results: list[Result] = []
    for round_ in range(rounds):
        async with fresh_postgres(server_url) as url:
            if url is None:
                return []
            rows: list[tuple[int, ToolKind]] = [(1, "sync")]
            rows += [(POSTGRES_CONCURRENCY, kind) for kind in TOOL_KINDS]
            shift = round_ % len(rows)
            rows = rows[shift:] + rows[:shift]
            if not round_ % 2:
                results.append(await postgres_floor(url, cycles, warmup, round_))
            for concurrency, kind in rows:
                workload = nodbot_workload("postgresql", kind, concurrency)
                result = await nodbot_sql(workload, url, cycles, warmup, concurrency, kind)
                results.append(_in_round(result, round_))
            if round_ % 2:
                results.append(await postgres_floor(url, cycles, warmup, round_))
    return results


async def postgres_floor(url: str, cycles: int, warmup: int, round_: int = 0) -> Result:
    """PostgreSQL's floor: `POSTGRES_CONCURRENCY` connections at once, each cycle four
    autocommitted statements (insert pending, mark decided, mark consumed, mark finished),
    each committed durably as the server is configured; `POSTGRES_FLOOR_SCALE` times
    `cycles` of them."""
    import asyncpg

    cycles *= POSTGRES_FLOOR_SCALE
    connections = [await asyncpg.connect(url) for _ in range(POSTGRES_CONCURRENCY)]
    try:
        await connections[0].execute(
            "CREATE TABLE IF NOT EXISTS floor (id text PRIMARY KEY, status text NOT NULL,"
            " decided_by text, decided_at timestamptz, consumed_at timestamptz,"
            " finished_at timestamptz, result text)"
        )
        numbers = itertools.count()

        async def cycle(connection: Any) -> None:
            approval_id = f"apr_{round_}_{next(numbers)}"
            await connection.execute(
                "INSERT INTO floor (id, status) VALUES ($1, 'pending')", approval_id
            )
            await connection.execute(
                "UPDATE floor SET status = 'decided', decided_by = $2, decided_at = now()"
                " WHERE id = $1 AND status = 'pending'",
                approval_id,
                "bench",
            )
            await connection.execute(
                "UPDATE floor SET status = 'consumed', consumed_at = now()"
                " WHERE id = $1 AND status = 'decided'",
                approval_id,
            )
            await connection.execute(
                "UPDATE floor SET status = 'finished', finished_at = now(), result = $2"
                " WHERE id = $1 AND status = 'consumed'",
                approval_id,
                "refunded",
            )

        async def run(count: int) -> None:
            async def worker(connection: Any, share: int) -> None:
                for _ in range(share):
                    await cycle(connection)

            share, extra = divmod(count, len(connections))
            await asyncio.gather(
                *(worker(c, share + (i < extra)) for i, c in enumerate(connections))
            )

        await run(warmup)
        with Stopwatch() as watch:
            await run(cycles)
        finished = await connections[0].fetchval(
            "SELECT count(*) FROM floor WHERE status = 'finished' AND id LIKE $1",
            f"apr_{round_}_%",
        )
        assert finished == warmup + cycles, f"floor postgresql: {finished} rows finished"
        return Result(POSTGRES_FLOOR, cycles, watch.seconds, watch.cpu_seconds, round_)
    finally:
        for connection in connections:
            await connection.close()


async def nodbot_memory(cycles: int, warmup: int) -> Result:
    """nodbot's cycle on the memory store (the `def` tool)."""
    workload = nodbot_workload("memory", "sync")
    return await nodbot_cycles(workload, MemoryApprovalStore(), cycles, warmup)


# --- the peer: LangChain HumanInTheLoopMiddleware + LangGraph SqliteSaver -----------------


def peer_missing() -> str | None:
    """What the peer needs and is not installed (`make bench` installs it), or None."""
    for module in ("langchain.agents", "langgraph.checkpoint.sqlite"):
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return module
    return None


def peer_cycles(path: Path, cycles: int, warmup: int) -> Result:
    """Run approval cycles through a LangChain agent that pauses on `refund`, a plain `def`
    tool called with new arguments each cycle."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    orders = itertools.count()

    class RefundModel(BaseChatModel):
        """Asks for a new refund first, then answers in plain text once the tool has run."""

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
                number = next(orders)
                call = {
                    "name": "refund",
                    "args": {"order_id": f"o-{number}", "amount": 10.0 + number / 100},
                    "id": f"call_{secrets.token_hex(8)}",
                    "type": "tool_call",
                }
                message = AIMessage(content="", tool_calls=[call])
            return ChatResult(generations=[ChatGeneration(message=message)])

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RefundModel:  # type: ignore[override]
            return self

    ran: list[str] = []

    def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        ran.append(order_id)
        return f"refunded {amount} on {order_id}"

    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        agent = create_agent(
            RefundModel(),
            tools=[refund],
            middleware=[HumanInTheLoopMiddleware(interrupt_on={"refund": True})],
            checkpointer=SqliteSaver(conn),
        )
        threads = itertools.count()
        # The batched mode's answer (the default): one decision per reviewed call, in order.
        approve = {"decisions": [{"type": "approve"}]}

        def cycle() -> None:
            config: Any = {"configurable": {"thread_id": f"thread_{next(threads)}"}}
            before = len(ran)
            paused = agent.invoke({"messages": [{"role": "user", "content": "refund"}]}, config)
            assert "__interrupt__" in paused, paused
            assert len(ran) == before, "the tool ran before the decision"
            done = agent.invoke(Command(resume=approve), config)
            assert "__interrupt__" not in done, done
            assert len(ran) == before + 1, "the tool did not run once"
            assert isinstance(done["messages"][-1], AIMessage), done

        for _ in range(warmup):
            cycle()
        with Stopwatch() as watch:
            for _ in range(cycles):
                cycle()
    finally:
        conn.close()
    assert len(set(ran)) == len(ran) == warmup + cycles, f"peer: the tool ran {len(ran)} times"
    return Result(PEER, cycles, watch.seconds, watch.cpu_seconds)


# --- SQLite's floor: three raw sqlite3 transactions ------------------------------------------


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
        with Stopwatch() as watch:
            for _ in range(cycles):
                cycle()
        (consumed,) = conn.execute(
            "SELECT count(*) FROM approvals WHERE status = 'consumed'"
        ).fetchone()
        assert consumed == warmup + cycles, f"floor: {consumed} rows consumed"
    finally:
        conn.close()
    return Result(SQLITE_FLOOR, cycles, watch.seconds, watch.cpu_seconds)


# --- the rounds ----------------------------------------------------------------------------


def _in_round(result: Result, round_: int) -> Result:
    return Result(result.workload, result.cycles, result.seconds, result.cpu_seconds, round_)


def _in_loop(work: Callable[[], Coroutine[Any, Any, Result]]) -> Result:
    """Run `work` in an event loop of its own (each workload starts from a fresh one)."""
    return asyncio.run(work())


def sqlite_round(tmp: Path, round_: int, args: argparse.Namespace, peer: bool) -> list[Result]:
    """One round on SQLite: the floor, nodbot with each tool (each on a fresh file) and the
    peer. The peer leaves the disk and the heap busy: it goes first in odd rounds and last in
    even ones, the floor the other way round; nodbot's rows turn round by one each round."""
    kinds = TOOL_KINDS[round_ % 3 :] + TOOL_KINDS[: round_ % 3]
    floor = tmp / f"floor{round_}.db"
    steps: list[Callable[[], Result]] = [
        functools.partial(floor_cycles, floor, FLOOR_SCALE * args.cycles, args.warmup)
    ]
    for kind in kinds:
        url = f"sqlite:///{tmp / f'nodbot{round_}_{kind}.db'}"
        workload = nodbot_workload("sqlite", kind)
        run = functools.partial(nodbot_sql, workload, url, args.cycles, args.warmup, kind=kind)
        steps.append(functools.partial(_in_loop, run))
    if peer:
        peer_count = max(1, args.cycles // PEER_DIVISOR)
        steps.append(
            functools.partial(peer_cycles, tmp / f"peer{round_}.db", peer_count, args.warmup)
        )
    if round_ % 2:
        steps.reverse()
    return [_in_round(step(), round_) for step in steps]


# --- report --------------------------------------------------------------------------------


def print_rounds(results: Sequence[Result]) -> None:
    """Every workload of every round."""
    print()
    print(
        f"{'round':>5}  {'workload':<36} {'cycles':>7} {'seconds':>8} {'cycles/s':>9} {'CPU µs':>8}"
    )
    for r in results:
        print(
            f"{r.round + 1:>5}  {r.workload:<36} {r.cycles:>7} {r.seconds:>8.3f}"
            f" {r.rate:>9,.0f} {r.cpu_per_cycle:>8,.0f}"
        )


def of(results: Sequence[Result], workload: str) -> list[Result]:
    return [r for r in results if r.workload == workload]


def round_ratios(results: Sequence[Result], top: str, bottom: str) -> list[float]:
    """`top`'s rate over `bottom`'s, within each round both were measured in."""
    bottoms = {r.round: r.rate for r in of(results, bottom)}
    return [r.rate / bottoms[r.round] for r in of(results, top) if bottoms.get(r.round)]


@dataclass(frozen=True)
class Measure:
    """A figure of one row compared with a goal (or shown beside the others, without one)."""

    text: str
    goal: str = "-"
    met: bool | None = None
    rounds: Sequence[float] = ()


def ratio_measure(
    values: Sequence[float], text: str, goal: str | None, passes: Callable[[float], bool]
) -> Measure | None:
    if not values:
        return None
    median = statistics.median(values)
    if goal is None:
        return Measure(text.format(median), rounds=values)
    return Measure(text.format(median), goal, passes(median), values)


def measures(results: Sequence[Result], workload: str) -> list[Measure]:
    """What a row is compared with: for nodbot's SQLite rows the peer and the floor, for its
    PostgreSQL rows at once the floor (and the rate); goals only on the `def` tool's rows."""
    if workload.startswith("nodbot sqlite,"):
        gated = workload == nodbot_workload("sqlite", "sync")
        peer = ratio_measure(
            round_ratios(results, workload, PEER),
            "{:.1f}x the peer",
            f">= {PEER_GOAL:.0f}x" if gated else None,
            lambda value: value >= PEER_GOAL,
        )
        floor = ratio_measure(
            round_ratios(results, SQLITE_FLOOR, workload),
            "the floor {:.1f}x it",
            f"<= {FLOOR_GOAL:.0f}x" if gated else None,
            lambda value: value <= FLOOR_GOAL,
        )
        return [m for m in (peer, floor) if m is not None]
    if workload.startswith(f"nodbot postgresql x{POSTGRES_CONCURRENCY},"):
        gated = workload == nodbot_workload("postgresql", "sync", POSTGRES_CONCURRENCY)
        share = ratio_measure(
            round_ratios(results, workload, POSTGRES_FLOOR),
            "{:.2f}x its floor",
            f">= {POSTGRES_GOAL}x" if gated else None,
            lambda value: value >= POSTGRES_GOAL,
        )
        found = [share] if share is not None else []
        if gated:
            rate = statistics.median(r.rate for r in of(results, workload))
            found.append(
                Measure(
                    f"{rate:,.0f}/s",
                    f">= {POSTGRES_RATE_GOAL:,.0f}/s here",
                    rate >= POSTGRES_RATE_GOAL,
                )
            )
        return found
    return []


def print_goals(results: Sequence[Result]) -> None:
    """The medians of the rounds, row by row, each with its goal and whether it is met."""
    workloads = list(dict.fromkeys(r.workload for r in results))
    sqlite_first = sorted(workloads, key=lambda w: ("postgresql" in w, "memory" in w))
    rounds = len({r.round for r in results})
    print()
    print(f"medians of {rounds} round(s); CPU: this process, every thread, per cycle")
    header = f"{'workload':<36} {'cycles/s':>9} {'CPU µs':>8}  {'measure':<22} {'goal':<20} met"
    print(header)
    print("-" * len(header))
    lines: list[str] = []
    for workload in sqlite_first:
        rows = of(results, workload)
        rate = statistics.median(r.rate for r in rows)
        cpu = statistics.median(r.cpu_per_cycle for r in rows)
        found = measures(results, workload) or [Measure("")]
        for index, measure in enumerate(found):
            left = f"{workload:<36} {rate:>9,.0f} {cpu:>8,.0f}" if index == 0 else " " * 55
            verdict = "" if measure.met is None else ("met" if measure.met else "MISSED")
            print(f"{left}  {measure.text:<22} {measure.goal:<20} {verdict}".rstrip())
            if measure.met is not None and len(measure.rounds) > 1:
                each = ", ".join(f"{value:.2f}" for value in measure.rounds)
                lines.append(f"{workload}: {measure.text} (rounds: {each})")
    if lines:
        print()
        print("\n".join(lines))


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
        help="times the SQLite workloads (the floor, nodbot with each tool, the peer) are"
        " measured, alternately, and the PostgreSQL ones after them (default 5)",
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="measure SQLite and the memory store only"
    )
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--cycles and --rounds must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"approval cycle: {args.cycles} cycles per workload after {args.warmup} warm-up, new"
        f" arguments each cycle; {args.rounds} alternating round(s), medians compared"
    )
    missing = peer_missing()
    if missing:
        print(f"peer: not measured, {missing} is not installed (`make bench` installs it)")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-") as name:
        tmp = Path(name)
        for round_ in range(args.rounds):
            results += sqlite_round(tmp, round_, args, peer=missing is None)
    results.append(asyncio.run(nodbot_memory(args.cycles, args.warmup)))
    if not args.no_postgres:
        results += asyncio.run(
            nodbot_postgres(postgres_server(), args.cycles, args.warmup, args.rounds)
        )
    print_rounds(results)
    print_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
