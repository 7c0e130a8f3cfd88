"""The bot's CPU per approval with 1 replica against N (default 3) on one PostgreSQL.

Each round has a fresh PostgreSQL database (on the server named by `NODBOT_BENCH_POSTGRES_URL`,
by default the local one, dropped at the end; skipped when unreachable or not on loopback),
the webhook receiver of `bench/bot.py` in a process of its own (it checks every signature),
and 1 or `--replicas` bots, each `nodbot serve` in a process of its own with a config of its
own on that same database: the rules, token, webhook and agent of `bench/bot.py`
(`bench.bot_agent:agent`, a plain `def` refund), logging warnings only.

Clients in processes of their own (`--clients`, default 2) drive `--runs` approvals end to
end, `--concurrency` at once (default 20, as GOALS.md says), spreading them round-robin over
the replicas as a load balancer would: run i is started on replica i, decided on replica
i + 1 and awaited (`GET /runs/{id}?wait=30`) on replica i + 2 (modulo their number), so that
with several replicas a decision and the run's end are seen by a replica that did not make
them (`--sticky` sends all three to replica i instead). Every refund must run exactly once:
the database is checked after each round (every approval approved, spent once with outcome
ok, every run finished with one tool result), and every review must be posted once.

The CPU is of the bot processes alone (utime + stime from /proc/<pid>/stat, summed over the
replicas), read just before the clients start and just after they end. Rounds alternate
1 replica and `--replicas` (`--rounds` of each, default 3); the medians are compared against
the goal of GOALS.md: with 3 replicas, at most 1.2x the CPU per approval of one.

    .venv/bin/python bench/replicas.py --runs 300 --rounds 3

It prints figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
# `python bench/replicas.py` puts bench/ first on sys.path, where bench/bot.py would shadow
# the `bot` package: the repository's root goes there instead.
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import asyncpg  # noqa: E402  (after the import path is set)

from bench.bot import (  # noqa: E402
    HOOK_SECRET_VARIABLE,
    TOKEN_VARIABLE,
    WAIT_LIMIT,
    api_client,
    decide,
    receiving,
    start_run,
    until_finished,
    write_config,
)
from bench.support import fresh_postgres, is_loopback, postgres_server  # noqa: E402

RATIO_GOAL = 1.2
"""Bot CPU per approval with 3 replicas over that with 1, at most."""
CPU_GOAL_MS = 2.0
"""The bot's CPU milliseconds per approval end to end (GOALS.md; there on SQLite), at most."""
TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second, the unit of /proc/<pid>/stat's utime and stime."""


@dataclass(frozen=True)
class Round:
    """One round: `replicas` bots, `runs` approvals end to end."""

    replicas: int
    runs: int
    concurrency: int
    seconds: float
    cpu: list[float]
    """CPU seconds of each replica over the workload."""
    finishing: list[float]
    """Per run: seconds from the decision's answer until the run was seen finished (a wait
    that no replica wakes lasts until the workers' poll, `workers.poll` 0.5 s)."""

    @property
    def rate(self) -> float:
        """Approvals per second."""
        return self.runs / self.seconds

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds of the bots, summed, per approval."""
        return sum(self.cpu) / self.runs * 1000


# --- the bots --------------------------------------------------------------------------------


def nodbot() -> Path:
    """The `nodbot` console script beside this Python."""
    return Path(sys.executable).parent / "nodbot"


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, in seconds (/proc/<pid>/stat, fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / TICKS


def replica_config(tmp: Path, number: int, store_url: str, hook_url: str) -> Path:
    """`bench/bot.py`'s config in a folder of the replica's own, logging warnings only (as
    `bench/bot.py` has its bot do)."""
    folder = tmp / f"replica-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    path = write_config(folder, store_url, hook_url)
    path.write_text(path.read_text() + "log: {level: warning}\n")
    return path


@contextlib.asynccontextmanager
async def replica(path: Path) -> AsyncIterator[tuple[str, int]]:
    """`nodbot serve --config path` in a process of its own (its log beside the config),
    stopped with SIGINT at the end: its URL and process id."""
    log = (path.parent / "nodbot.log").open("w")
    process = await asyncio.to_thread(
        subprocess.Popen,
        [str(nodbot()), "serve", "--config", str(path)],
        cwd=ROOT,  # where bench.bot_agent is found
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        if not line.startswith("nodbot: serving http://127.0.0.1:"):
            log.flush()
            raise RuntimeError(f"the bot did not start ({line!r}); see {log.name}")
        url = line.split()[2]
        assert is_loopback(urlsplit(url).hostname), f"the bot is on {url}"
        yield url, process.pid
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(process.wait, 20)
            except subprocess.TimeoutExpired:
                process.kill()
        if process.stdout is not None:
            process.stdout.close()
        await asyncio.to_thread(process.wait)
        log.close()


@contextlib.asynccontextmanager
async def replicas(
    count: int, tmp: Path, store_url: str, hook_url: str
) -> AsyncIterator[list[tuple[str, int]]]:
    """`count` bots on `store_url`, started one after the other (the first one makes the
    database's tables)."""
    async with contextlib.AsyncExitStack() as stack:
        served = [
            await stack.enter_async_context(
                replica(replica_config(tmp, number, store_url, hook_url))
            )
            for number in range(count)
        ]
        yield served


# --- the clients -----------------------------------------------------------------------------


def client_process(
    urls: list[str],
    token: str,
    runs: range,
    concurrency: int,
    prefix: str,
    sticky: bool,
    ready: Any,
    answer: Any,
) -> None:
    """A share of the workload in a process of its own: once every client is `ready` (a
    barrier), `concurrency` workers take the `runs` in turn, run i started on replica i,
    decided on i + 1 and awaited on i + 2 (all three on replica i when `sticky`); it sends
    back when it began and ended, and per run the seconds from the decision's answer until
    the run was seen finished."""
    step = 0 if sticky else 1

    async def main() -> tuple[float, float, list[float]]:
        numbers = iter(runs)
        finishing: list[float] = []
        clients = [api_client(url, token) for url in urls]
        try:

            async def worker() -> None:
                for number in numbers:  # shared: each worker takes the next run
                    first = clients[number % len(clients)]
                    run = await start_run(first, f"{prefix}-{number}")
                    [pending] = run["pending"]
                    deciding = clients[(number + step) % len(clients)]
                    await decide(deciding, pending["approval_id"])
                    decided = time.perf_counter()
                    awaiting = clients[(number + 2 * step) % len(clients)]
                    await until_finished(awaiting, run["run_id"])
                    finishing.append(time.perf_counter() - decided)

            gc.collect()
            await asyncio.to_thread(ready.wait, WAIT_LIMIT)
            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return began, time.perf_counter(), finishing
        finally:
            for client in clients:
                await client.close()

    answer.put(asyncio.run(main()))


async def drive(
    urls: list[str], runs: int, concurrency: int, prefix: str, args: argparse.Namespace
) -> tuple[float, float, list[float]]:
    """`runs` runs end to end, `concurrency` at once, by clients in `args.clients` other
    processes: perf_counter() when the first began and the last ended, and per run the
    seconds from the decision's answer until it was seen finished."""
    processes = args.clients
    context = multiprocessing.get_context("spawn")
    answer = context.Queue()
    ready = context.Barrier(processes)
    token = os.environ[TOKEN_VARIABLE]
    clients = [
        context.Process(
            target=client_process,
            args=(
                urls,
                token,
                range(runs)[share::processes],
                len(range(concurrency)[share::processes]),
                prefix,
                args.sticky,
                ready,
                answer,
            ),
        )
        for share in range(processes)
    ]
    loop = asyncio.get_running_loop()
    for client in clients:
        await loop.run_in_executor(None, client.start)
    try:
        times = [
            await loop.run_in_executor(None, answer.get, True, 10 * WAIT_LIMIT) for _ in clients
        ]
    finally:
        for client in clients:
            await loop.run_in_executor(None, client.join, WAIT_LIMIT)
    assert all(client.exitcode == 0 for client in clients), "a client failed"
    began = min(share[0] for share in times)
    ended = max(share[1] for share in times)
    return began, ended, [seconds for share in times for seconds in share[2]]


# --- a round ---------------------------------------------------------------------------------


async def check_database(store_url: str, total: int) -> None:
    """Every one of `total` runs finished, with one approval, approved and spent once with
    outcome ok, and one tool result: the refund ran exactly once."""
    connection = await asyncpg.connect(store_url, timeout=10)
    try:
        approvals = await connection.fetch(
            "SELECT run_id, status, consumed_at, finished_at, outcome FROM approvals"
        )
        runs = await connection.fetch("SELECT run_id, status, messages FROM runs")
    finally:
        await connection.close()
    assert len(approvals) == total, f"{len(approvals)} approvals for {total} runs"
    assert len({row["run_id"] for row in approvals}) == total, "a run with two approvals"
    wrong = [
        dict(row)
        for row in approvals
        if row["status"] != "approved"
        or row["consumed_at"] is None
        or row["finished_at"] is None
        or row["outcome"] != "ok"
    ]
    assert not wrong, f"{len(wrong)} approvals not approved and spent once: {wrong[:3]}"
    assert len(runs) == total, f"{len(runs)} runs, {total} started"
    for row in runs:
        assert row["status"] == "finished", f"run {row['run_id']} is {row['status']}"
        messages = json.loads(row["messages"])
        results = [m for m in messages if "refunded 500" in json.dumps(m)]
        assert len(results) == 1, f"run {row['run_id']}: {len(results)} refund results"


async def one_round(
    number: int, count: int, server: str, tmp: Path, args: argparse.Namespace
) -> Round | None:
    """One round with `count` replicas on a fresh database; None when PostgreSQL is not
    there (having said why)."""
    async with fresh_postgres(server) as store_url:
        if store_url is None:
            return None
        async with (
            receiving() as receiver,
            replicas(count, tmp / f"round-{number}", store_url, receiver.url) as served,
        ):
            urls = [url for url, _ in served]
            if args.warmup:
                await drive(urls, args.warmup, args.concurrency, "warm", args)
            gc.collect()
            before = [cpu_seconds(pid) for _, pid in served]
            began, ended, finishing = await drive(
                urls, args.runs, args.concurrency, f"r{number}", args
            )
            after = [cpu_seconds(pid) for _, pid in served]
            total = args.warmup + args.runs
            deadline = time.monotonic() + WAIT_LIMIT
            while (report := await receiver.report())[0] < total:  # the last on their way
                assert time.monotonic() < deadline, f"{report[0]} of {total} reviews posted"
                await asyncio.sleep(0.01)
            assert report[0] == total and not report[1], report
        await check_database(store_url, total)
    cpu = [end - start for start, end in zip(before, after, strict=True)]
    return Round(count, args.runs, args.concurrency, ended - began, cpu, finishing)


async def measure(args: argparse.Namespace) -> list[Round]:
    os.environ[TOKEN_VARIABLE] = secrets.token_urlsafe(24)
    os.environ[HOOK_SECRET_VARIABLE] = secrets.token_urlsafe(24)
    server = postgres_server()
    done: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-replicas-") as name:
        tmp = Path(name)
        for number in range(2 * args.rounds):
            count = 1 if number % 2 == 0 else args.replicas
            round_ = await one_round(number, count, server, tmp, args)
            if round_ is None:
                return []
            print_round(number + 1, round_)
            done.append(round_)
    return done


# --- report ----------------------------------------------------------------------------------


def print_round(number: int, round_: Round) -> None:
    if number == 1:
        print(
            f"{'round':>5} {'replicas':>8} {'runs':>6} {'seconds':>8} {'approvals/s':>12}"
            f" {'bot CPU ms/approval':>20} {'decided->finished p50/max ms':>29}"
            "  each replica's CPU s"
        )
    each = ", ".join(f"{seconds:.2f}" for seconds in round_.cpu)
    waits = round_.finishing
    finished = f"{statistics.median(waits) * 1000:.1f} / {max(waits) * 1000:.1f}"
    print(
        f"{number:>5} {round_.replicas:>8} {round_.runs:>6} {round_.seconds:>8.3f}"
        f" {round_.rate:>12,.1f} {round_.cpu_ms:>20.2f} {finished:>29}  {each}",
        flush=True,
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_goals(done: Sequence[Round], replicas: int) -> None:
    one = [round_ for round_ in done if round_.replicas == 1]
    many = [round_ for round_ in done if round_.replicas == replicas]
    single = statistics.median(round_.cpu_ms for round_ in one)
    several = statistics.median(round_.cpu_ms for round_ in many)
    pairs = [theirs.cpu_ms / ours.cpu_ms for ours, theirs in zip(one, many, strict=False)]
    ratio = several / single
    print()
    print(
        f"bot CPU per approval with 1 replica = {single:.2f} ms, the median of {len(one)}"
        f" rounds (goal <= {CPU_GOAL_MS:.0f} ms: {verdict(single <= CPU_GOAL_MS)})"
    )
    print(
        f"bot CPU per approval with {replicas} replicas = {several:.2f} ms, the median of"
        f" {len(many)} rounds ({statistics.median(r.rate for r in many):,.0f} approvals/s,"
        f" against {statistics.median(r.rate for r in one):,.0f}/s with 1)"
    )
    print(
        f"bot CPU per approval with {replicas} replicas / with 1 = {ratio:.2f}x"
        f" (goal <= {RATIO_GOAL}x: {verdict(ratio <= RATIO_GOAL)});"
        f" round by round {', '.join(f'{r:.2f}' for r in pairs)}"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=300, help="runs per round (default 300)")
    parser.add_argument(
        "--warmup", type=int, default=20, help="runs before each round's measure (default 20)"
    )
    parser.add_argument("--concurrency", type=int, default=20, help="runs at once (default 20)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of each, alternating (default 3)"
    )
    parser.add_argument("--replicas", type=int, default=3, help="replicas against one (default 3)")
    parser.add_argument(
        "--clients", type=int, default=2, help="client processes sharing the runs (default 2)"
    )
    parser.add_argument(
        "--sticky",
        action="store_true",
        help="all of a run's requests to the replica that started it (default: each request"
        " to the next replica, as a round-robin load balancer sends them)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.concurrency < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--runs, --concurrency and --rounds must be >= 1 and --warmup >= 0")
    if args.replicas < 2:
        parser.error("--replicas must be at least 2")
    if not 1 <= args.clients <= args.concurrency:
        parser.error("--clients must be between 1 and --concurrency")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)  # the bots import bench.bot_agent from the working directory
    print(
        f"bot replicas on one PostgreSQL: {args.runs} runs a round after {args.warmup} warm-up,"
        f" {args.concurrency} at once; 1 and {args.replicas} replicas alternating,"
        f" {args.rounds} rounds of each; the refund a def tool; CPU of the bot processes alone;"
        f" {'each run on one replica' if args.sticky else 'each request to the next replica'}",
        flush=True,
    )
    done = asyncio.run(measure(args))
    if done:
        print_goals(done, args.replicas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
