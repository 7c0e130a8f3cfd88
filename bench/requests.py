"""The approval request API: request -> decided -> consumed round trips per second, and the
bot's CPU per round trip, with `--concurrency` clients (default 20) at once.

The bot (`bot.serve.serving`: uvicorn, the HTTP API, the workers) runs in this process on a
SQLite file, with `refund` as an external tool. Each client is a process of its own (so that
no client's work shares the bot's process and its CPU figure), making one round trip after
another with the project's `ApprovalClient`, over real HTTP on loopback. Two variants:

- reviewed: a rule puts every `refund` to a reviewer. `POST /approvals` opens the review,
  the client long-polls `GET /approvals/{id}?wait`, while its reviewer client (another token,
  in the same client process) approves over `POST /approvals/{id}/decide`; the wait answers,
  then `POST /approvals/{id}/consume` takes the decision and its token (checked).
- ruled: a rule with `decision: approve` decides `refund_ruled` at once: `POST /approvals`
  answers decided, then the consume.

Either way the refund runs once per decision; the script fails otherwise. Per round, each
variant (alternating which goes first) makes `--round-trips` round trips; the figures are the
medians of `--rounds` rounds (default 3): round trips per second over the wall time, and the
CPU seconds of this process (the bot alone) per round trip.

    make bench                                            # every benchmark
    .venv/bin/python bench/requests.py --round-trips 1000 --concurrency 20 --rounds 3

It prints figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
# `python bench/requests.py` puts bench/ first on sys.path; the repository's root goes there
# instead, for `bench.support` (and so that no module here shadows an installed one).
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import httpx  # noqa: E402  (after the import path is set)

from bench.support import is_loopback  # noqa: E402
from nodbot.bot.serve import serving  # noqa: E402
from nodbot.core.client import ApprovalClient  # noqa: E402

REVIEWER = "lead@example.com"
AGENT_VARIABLE = "NODBOT_BENCH_AGENT_TOKEN"
REVIEWER_VARIABLE = "NODBOT_BENCH_REVIEWER_TOKEN"
WAIT_LIMIT = 30.0
"""How long one step of a round trip may take before the benchmark gives up."""
WARMUP = 5
"""Round trips of each variant each client makes before the rounds."""
VARIANTS = {"reviewed": "refund", "ruled": "refund_ruled"}
"""Variant -> the tool its round trips ask about."""
AWAITHUMANS_CPU_MS = 68.0
"""GOALS.md, quoted (not measured here): awaithumans 0.1.12's server, about 68 ms CPU a task."""


@dataclass(frozen=True)
class Job:
    """What one client process does next: `count` round trips asking about `tool`."""

    tool: str
    count: int
    prefix: str


@dataclass(frozen=True)
class Done:
    """What a client process did: the orders it refunded (each once), and how long it took."""

    orders: list[str]
    seconds: float


@dataclass(frozen=True)
class Measured:
    """One variant in one round."""

    variant: str
    round_trips: int
    seconds: float
    cpu: float
    """CPU seconds of this process (the bot) during the round."""

    @property
    def rate(self) -> float:
        return self.round_trips / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu / self.round_trips * 1000


def write_config(tmp: Path) -> Path:
    """A nodbot.yml in `tmp`: SQLite, a free loopback port, an agent's token and a reviewer's,
    `refund` put to review and `refund_ruled` approved by a rule."""
    path = tmp / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp / "nodbot.db"}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.5}}
api:
  tokens:
    - {{name: agent, token: "${{{AGENT_VARIABLE}}}", scopes: [approvals:request]}}
    - {{name: {REVIEWER}, token: "${{{REVIEWER_VARIABLE}}}",
        scopes: [approvals:read, approvals:decide]}}
external_tools: [refund, refund_ruled]
rules:
  - tool: refund
    reviewers: [{REVIEWER}]
  - tool: refund_ruled
    decision: approve
"""
    )
    return path


# --- the client processes ----------------------------------------------------------------------


async def round_trip(
    agent: ApprovalClient, reviewer: httpx.AsyncClient, tool: str, order_id: str
) -> bool:
    """Ask about a refund of `order_id`, have it decided (by the reviewer or a rule), take the
    decision once; whether it may run."""
    arguments = {"order_id": order_id, "amount": 500}
    asked = await agent.request(tool, arguments, run_id=order_id, call_id="call-1")
    if not asked.decided:
        waiting = asyncio.create_task(agent.wait(asked.approval_id, within=WAIT_LIMIT))
        path = f"/approvals/{asked.approval_id}/decide"
        decided = await reviewer.post(path, json={"action": "approve"})
        assert decided.status_code == 200, decided.text
        asked = await waiting
    answer = await agent.consume(asked)
    return answer.approved and answer.arguments == arguments


def client_process(url: str, jobs: Any, results: Any) -> None:
    """One client: takes `Job`s from `jobs` until None, sends a `Done` for each."""

    async def main() -> None:
        headers = {"Authorization": f"Bearer {os.environ[REVIEWER_VARIABLE]}"}
        async with (
            ApprovalClient(url, token=os.environ[AGENT_VARIABLE]) as agent,
            httpx.AsyncClient(
                base_url=url, headers=headers, timeout=WAIT_LIMIT, trust_env=False
            ) as reviewer,
        ):
            loop = asyncio.get_running_loop()
            while (job := await loop.run_in_executor(None, jobs.get)) is not None:
                orders = []
                began = time.perf_counter()
                for number in range(job.count):
                    order_id = f"{job.prefix}-{number}"
                    if await round_trip(agent, reviewer, job.tool, order_id):
                        orders.append(order_id)  # the refund runs here, once
                results.put(Done(orders, time.perf_counter() - began))

    asyncio.run(main())


class Clients:
    """`count` client processes, each with a queue of jobs."""

    def __init__(self, url: str, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.results = context.Queue()
        self.queues = [context.Queue() for _ in range(count)]
        self.processes = [
            context.Process(target=client_process, args=(url, jobs, self.results))
            for jobs in self.queues
        ]
        for process in self.processes:
            process.start()

    async def run(self, tool: str, per_client: list[int], prefix: str) -> list[Done]:
        """Give every client its job at once; what each did, once all are done."""
        for index, (jobs, count) in enumerate(zip(self.queues, per_client, strict=True)):
            jobs.put(Job(tool, count, f"{prefix}-c{index}"))
        loop = asyncio.get_running_loop()
        return [
            await loop.run_in_executor(None, self.results.get, True, 10 * WAIT_LIMIT)
            for _ in self.queues
        ]

    def stop(self) -> None:
        for jobs in self.queues:
            jobs.put(None)
        for process in self.processes:
            process.join(WAIT_LIMIT)
            if process.is_alive():
                process.kill()


def shares(total: int, clients: int) -> list[int]:
    """`total` round trips split among `clients` as evenly as can be."""
    return [total // clients + (1 if index < total % clients else 0) for index in range(clients)]


async def measure(clients: Clients, variant: str, total: int, prefix: str) -> Measured:
    gc.collect()
    cpu = time.process_time()
    began = time.perf_counter()
    done = await clients.run(VARIANTS[variant], shares(total, len(clients.queues)), prefix)
    seconds = time.perf_counter() - began
    cpu = time.process_time() - cpu
    orders = [order for one in done for order in one.orders]
    assert len(orders) == total == len(set(orders)), (
        f"{variant}: {total} round trips, but {len(orders)} refunds for {len(set(orders))} orders"
    )
    return Measured(variant, total, seconds, cpu)


async def measure_all(args: argparse.Namespace) -> list[Measured]:
    os.environ[AGENT_VARIABLE] = secrets.token_urlsafe(24)
    os.environ[REVIEWER_VARIABLE] = secrets.token_urlsafe(24)
    measured = []
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-requests-") as name:
        async with serving(str(write_config(Path(name)))) as served:
            assert is_loopback(urlsplit(served.url).hostname), f"the bot is on {served.url}"
            clients = Clients(served.url, args.concurrency)
            try:
                for variant in VARIANTS:
                    await measure(clients, variant, WARMUP * args.concurrency, f"warm-{variant}")
                for round_number in range(args.rounds):
                    order = list(VARIANTS) if round_number % 2 == 0 else list(VARIANTS)[::-1]
                    for variant in order:
                        prefix = f"r{round_number}-{variant}"
                        measured.append(await measure(clients, variant, args.round_trips, prefix))
            finally:
                clients.stop()
    return measured


# --- report ----------------------------------------------------------------------------------


def print_report(args: argparse.Namespace, measured: Sequence[Measured]) -> None:
    print(
        f"approval request API over HTTP: {args.round_trips} round trips per variant and round,"
        f" {args.concurrency} client processes at once, {args.rounds} rounds, SQLite"
    )
    print()
    print(f"{'variant':<10} {'round':>5} {'seconds':>8} {'round trips/s':>14} {'bot CPU ms':>11}")
    for index, m in enumerate(measured):
        print(
            f"{m.variant:<10} {index // 2 + 1:>5} {m.seconds:>8.3f} {m.rate:>14,.1f}"
            f" {m.cpu_ms:>11.3f}"
        )
    print()
    for variant in VARIANTS:
        rounds = [m for m in measured if m.variant == variant]
        rate = statistics.median(m.rate for m in rounds)
        cpu = statistics.median(m.cpu_ms for m in rounds)
        print(
            f"[{variant}] request -> decided -> consumed = {rate:,.0f} round trips/s with"
            f" {args.concurrency} clients; bot CPU {cpu:.2f} ms per round trip"
            f" (median of {len(rounds)})"
        )
    print(
        f"reference: GOALS.md quotes about {AWAITHUMANS_CPU_MS:.0f} ms of CPU per task for the"
        " awaithumans 0.1.12 server; bench/bot.py measures it beside the bot, with the same"
        " workload (not here)"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--round-trips",
        type=int,
        default=1000,
        help="round trips per variant and round (default 1000)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=20, help="client processes at once (default 20)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args(argv)
    if args.round_trips < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--round-trips, --concurrency and --rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)
    print_report(args, asyncio.run(measure_all(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
