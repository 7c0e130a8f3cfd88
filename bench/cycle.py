"""One approval cycle, measured: nodbot against its peer and its floor, in the same run.

One cycle is: a call that needs review pauses, a decision is stored, the call resumes and
the tool runs once. Each workload runs `--cycles` cycles (after a short warm-up) and the
script prints cycles/second for each, then the ratios that GOALS.md sets goals for:

1. nodbot, memory store: `Executor` + `DeferredApproval(MemoryApprovalStore())`.
2. nodbot, SQLite file: the same with `SqlApprovalStore("sqlite+aiosqlite:///...")`.
3. nodbot, PostgreSQL: the same with `SqlApprovalStore("postgresql+asyncpg://...")`, on a
   fresh database created on the server named by `NODBOT_BENCH_POSTGRES_URL` (default
   `postgresql://postgres@127.0.0.1:5432/postgres`) and dropped at the end. Skipped when the
   server is unreachable; only loopback servers are accepted.
4. The peer: LangChain `create_agent` + `HumanInTheLoopMiddleware` + LangGraph `SqliteSaver`
   on a SQLite file, driven by a fake chat model (no network).
5. The floor: three raw sqlite3 transactions per cycle (WAL, `synchronous=NORMAL`): insert
   a pending row, mark it decided, mark it consumed.

Run it with `make bench`, or `.venv/bin/python bench/cycle.py --cycles 500`. It prints
figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import itertools
import os
import secrets
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# Keep LangSmith tracing off whatever the environment says: the benchmark stays on loopback.
for _name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_name] = "false"

from core import (  # noqa: E402  (after the tracing switch above)
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    MemoryApprovalStore,
    ToolCall,
    ToolRegistry,
)

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PEER_GOAL = 20.0
"""nodbot on SQLite must do at least this many times the peer's cycles/s."""
FLOOR_GOAL = 10.0
"""The floor may do at most this many times nodbot's cycles/s on SQLite."""
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


async def nodbot_cycles(workload: str, store: ApprovalStore, cycles: int, warmup: int) -> Result:
    """Run `warmup` then `cycles` approval cycles through an executor on `store`."""
    runs = 0
    registry = ToolRegistry()

    @registry.tool(confirm=True, effects="destructive")
    async def refund(order_id: str, amount: float) -> str:
        """Refund an order."""
        nonlocal runs
        runs += 1
        return f"refunded {amount} on {order_id}"

    executor = Executor(registry, approval=DeferredApproval(store))
    ctx = executor.context(run_id=f"run_bench_{secrets.token_hex(4)}")
    arguments = {"order_id": "o-7", "amount": 500.0}
    decision = Decision(approved=True, decided_by="bench")
    numbers = itertools.count()

    async def cycle() -> None:
        call = ToolCall(name="refund", arguments=arguments, id=f"call_{next(numbers)}")
        first = await executor.run_call(call, ctx)
        assert first.status == "pending" and first.error is not None, first
        await store.decide(first.error.details["approval_id"], decision)
        done = await executor.run_call(call, ctx)
        assert done.status == "ok", done

    for _ in range(warmup):
        await cycle()
    gc.collect()
    start = time.perf_counter()
    for _ in range(cycles):
        await cycle()
    seconds = time.perf_counter() - start
    assert runs == warmup + cycles, f"{workload}: the tool ran {runs} times"
    return Result(workload, cycles, seconds)


def load_sql_store() -> Callable[[str], Any] | None:
    """`SqlApprovalStore`, or None when `core.sqlstore` does not exist yet."""
    try:
        from core.sqlstore import SqlApprovalStore
    except ImportError:
        return None
    return SqlApprovalStore


async def nodbot_sql(
    workload: str, factory: Callable[[str], Any], url: str, cycles: int, warmup: int
) -> Result:
    """The nodbot workload on a `SqlApprovalStore(url)`, closed at the end."""
    store = factory(url)
    try:
        return await nodbot_cycles(workload, store, cycles, warmup)
    finally:
        await store.close()


def is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine (a loopback address or `localhost`)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def nodbot_postgres(
    factory: Callable[[str], Any], server_url: str, cycles: int, warmup: int
) -> Result | None:
    """The nodbot workload on a fresh PostgreSQL database, dropped at the end, even on error.

    Returns None (and says why) when the server is not on loopback or is unreachable.
    """
    import asyncpg

    parts = urlsplit(server_url)
    if not is_loopback(parts.hostname):
        print(f"postgresql: skipped, {parts.hostname!r} is not a loopback address")
        return None
    try:
        admin = await asyncpg.connect(server_url, timeout=5)
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        print(f"postgresql: unreachable at {parts.hostname}:{parts.port or 5432} ({exc})")
        return None
    name = f"nodbot_bench_{secrets.token_hex(6)}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = urlunsplit(("postgresql+asyncpg", parts.netloc, f"/{name}", "", ""))
            return await nodbot_sql("nodbot postgresql", factory, url, cycles, warmup)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def nodbot_all(args: argparse.Namespace, tmp: Path) -> list[Result]:
    """The nodbot workloads: memory, then SQLite and PostgreSQL when the SQL store exists."""
    results = [
        await nodbot_cycles("nodbot memory", MemoryApprovalStore(), args.cycles, args.warmup)
    ]
    factory = load_sql_store()
    if factory is None:
        print("sqlite/postgresql: SqlApprovalStore not available yet")
        return results
    url = f"sqlite+aiosqlite:///{tmp / 'nodbot.db'}"
    results.append(await nodbot_sql("nodbot sqlite", factory, url, args.cycles, args.warmup))
    server_url = os.environ.get("NODBOT_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    postgres = await nodbot_postgres(factory, server_url, args.cycles, args.warmup)
    if postgres is not None:
        results.append(postgres)
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


def floor_cycles(path: Path, cycles: int, warmup: int) -> Result:
    """Insert a pending row, mark it decided, mark it consumed: three transactions a cycle."""
    conn = sqlite3.connect(path)
    try:
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


def print_goals(results: Sequence[Result]) -> None:
    by_name = {result.workload: result for result in results}
    sqlite = by_name.get("nodbot sqlite")
    peer = by_name.get("peer langchain hitl")
    floor = by_name.get("floor sqlite3")
    postgres = by_name.get("nodbot postgresql")
    print()
    if sqlite and peer:
        print(f"nodbot sqlite / peer = {sqlite.rate / peer.rate:.1f}x (goal >= {PEER_GOAL:.0f}x)")
    else:
        print(f"nodbot sqlite / peer = n/a (goal >= {PEER_GOAL:.0f}x)")
    if sqlite and floor:
        print(
            f"floor / nodbot sqlite = {floor.rate / sqlite.rate:.1f}x (goal <= {FLOOR_GOAL:.0f}x)"
        )
    else:
        print(f"floor / nodbot sqlite = n/a (goal <= {FLOOR_GOAL:.0f}x)")
    if postgres:
        print(f"nodbot postgresql = {postgres.rate:,.0f} cycles/s (goal >= {POSTGRES_GOAL:,.0f}/s)")
    else:
        print(f"nodbot postgresql = n/a (goal >= {POSTGRES_GOAL:,.0f}/s)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=2000, help="measured cycles per workload")
    parser.add_argument(
        "--warmup", type=int, default=50, help="cycles run before measuring (default 50)"
    )
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.warmup < 0:
        parser.error("--cycles must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"approval cycle: {args.cycles} cycles per workload after {args.warmup} warm-up")
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-") as name:
        tmp = Path(name)
        # The peer runs last: it leaves the disk and the heap busy, which slows what follows.
        floor = floor_cycles(tmp / "floor.db", args.cycles, args.warmup)
        results = asyncio.run(nodbot_all(args, tmp))
        results.append(peer_cycles(tmp / "peer.db", args.cycles, args.warmup))
        results.append(floor)
    print_table(results)
    print_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
