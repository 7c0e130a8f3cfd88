"""The client side of the awaithumans peer: agents asking for refunds, and a reviewer approving.

Run by the python of awaithumans' own virtual environment (`bench/awaithumans_peer.py` starts
it; it imports `awaithumans`, which nodbot's environment does not have). The server is already
running; its URL comes in `--url`, and the secrets in the environment:
`AWAITHUMANS_ADMIN_API_TOKEN` (the agents' bearer token, the server's `ADMIN_API_TOKEN`),
`AWAITHUMANS_BENCH_REVIEWER_EMAIL` and `AWAITHUMANS_BENCH_REVIEWER_PASSWORD` (an operator made
with `awaithumans bootstrap-operator` before the server started).

An agent is what awaithumans' SDK has an agent do: `await awaithumans.await_human(...)` with a
`Refund(order_id, amount)` payload and a `Decision(approved)` response schema. The SDK sends
`POST /api/tasks` (bearer token), then long-polls `GET /api/tasks/{id}/poll?timeout=25`; the
server answers that request when a check of the task, made once a second, finds it terminal.
When the decision comes back approved, the agent runs its tool: `refund()` writes
`time.perf_counter()` down and counts the run.

The reviewer does what the dashboard does, over the same HTTP API: it logs in once
(`POST /api/auth/login`, a session cookie), lists the pending tasks
(`GET /api/tasks?status=created&limit=200`, every `--reviewer-poll` seconds, 0.05 s unless
told: the API has no push to reviewers other than Slack and email, so a quick poll of the list
is the fastest honest way to learn of a task), and approves each new one with
`POST /api/tasks/{id}/complete` `{"response": {"approved": true}}`, `--reviewers` requests in
flight at most (one unless told, as a person at the dashboard; twenty at once exhaust the
server's SQLite connection pool), writing down `time.perf_counter()` just before sending each.
Decision -> tool is the time from there to the tool's run. The reviewer runs in this process;
the agents too, or with `--processes N` in N spawned child processes sharing them (and the
concurrency) round robin, which report their tools' runs back: `time.perf_counter()` is
CLOCK_MONOTONIC on Linux, one clock for every process.

Protocol on stdout, one JSON object a line: after the login and one warm-up approval (not
counted), and once the child processes, if any, are up, it prints
`{"ready": true, "pids": [<child pids>]}` and waits for a line on stdin; then it runs `--runs`
approvals, `--concurrency` agents at once, waits for its children to exit, and prints the
results (`runs`, `concurrency`, `wall`, `decide_to_tool`, `reviewer_polls`, `tool_runs`) as
soon as the last tool has run. Every run must be approved and its tool run exactly once;
otherwise it prints the reasons on stderr and exits with status 1. The SDK prints three lines
on stderr for every task it makes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# `python bench/awaithumans_driver.py` puts bench/ first on sys.path, where bench/requests.py
# would shadow the `requests` package. Nothing here is imported from bench/, so it comes off
# the path.
if sys.path and Path(sys.path[0] or os.curdir).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import queue
import secrets
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from multiprocessing.synchronize import Event as EventType
from typing import Any

import httpx
from awaithumans import await_human
from pydantic import BaseModel

TASK_TIMEOUT = 300
"""The tasks' `timeout_seconds` (awaithumans accepts 60 s at least)."""


class Refund(BaseModel):
    """The tool call a human approves: a refund of `amount` on `order_id`."""

    order_id: str
    amount: float


class Decision(BaseModel):
    """The human's answer."""

    approved: bool


class BenchFailure(Exception):
    """The workload did not go as it must: a run not approved, or a tool not run exactly once."""


RAN_AT: dict[str, float] = {}
"""order_id -> `time.perf_counter()` when its refund ran."""
RUNS: Counter[str] = Counter()
"""order_id -> how many times its refund ran."""


def refund(order_id: str, amount: float) -> str:
    """The tool: writes down when it ran, and how often."""
    RAN_AT[order_id] = time.perf_counter()
    RUNS[order_id] += 1
    return f"refunded {amount:.2f} on {order_id}"


async def agent(url: str, token: str, order_id: str, amount: float) -> None:
    """One run: ask a human through awaithumans' SDK, then run the tool if approved."""
    decision = await await_human(
        task=f"Refund {amount:.2f} on order {order_id}",
        payload_schema=Refund,
        payload=Refund(order_id=order_id, amount=amount),
        response_schema=Decision,
        timeout_seconds=TASK_TIMEOUT,
        server_url=url,
        api_key=token,
    )
    if not decision.approved:
        raise BenchFailure(f"order {order_id}: the decision came back not approved")
    refund(order_id, amount)


class Reviewer:
    """Approves every pending task as soon as a poll of the task list shows it."""

    def __init__(self, client: httpx.AsyncClient, interval: float, at_once: int) -> None:
        self.client = client
        self.interval = interval
        self._at_once = asyncio.Semaphore(at_once)
        self.sent: dict[str, float] = {}
        """order_id -> `time.perf_counter()` just before its approval was sent."""
        self.approved: Counter[str] = Counter()
        """order_id -> how many approvals the server accepted (status completed)."""
        self.polls = 0
        self.failures: list[str] = []
        self._seen: set[str] = set()
        self._approvals: set[asyncio.Task[None]] = set()

    async def login(self, email: str, password: str) -> None:
        response = await self.client.post(
            "/api/auth/login", json={"email": email, "password": password}
        )
        if response.status_code != 204:
            raise BenchFailure(f"login: {response.status_code} {response.text}")

    async def run(self, stop: asyncio.Event) -> None:
        """List the pending tasks until `stop` is set; approve each new one at once."""
        while not stop.is_set():
            if self.failures:
                raise BenchFailure("; ".join(self.failures))
            response = await self.client.get(
                "/api/tasks", params={"status": "created", "limit": 200}
            )
            self.polls += 1
            if response.status_code != 200:
                raise BenchFailure(f"list tasks: {response.status_code} {response.text}")
            for task in response.json():
                if task["id"] not in self._seen:
                    self._seen.add(task["id"])
                    approval = asyncio.create_task(self._approve(task))
                    self._approvals.add(approval)
                    approval.add_done_callback(self._approvals.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
        if self._approvals:
            await asyncio.gather(*self._approvals)
        if self.failures:
            raise BenchFailure("; ".join(self.failures))

    async def _approve(self, task: dict[str, Any]) -> None:
        order_id = task["payload"]["order_id"]
        async with self._at_once:
            self.sent[order_id] = time.perf_counter()
            try:
                response = await self.client.post(
                    f"/api/tasks/{task['id']}/complete", json={"response": {"approved": True}}
                )
            except httpx.HTTPError as error:
                self.failures.append(f"approve {order_id}: {error!r}")
                return
        if response.status_code != 200 or response.json().get("status") != "completed":
            self.failures.append(f"approve {order_id}: {response.status_code} {response.text}")
            return
        self.approved[order_id] += 1


async def run_agents(
    url: str, token: str, orders: Sequence[tuple[str, float]], concurrency: int
) -> None:
    """Runs an agent for every (order, amount), `concurrency` at once, in this process."""
    pending: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    for order in orders:
        pending.put_nowait(order)

    async def worker() -> None:
        while True:
            try:
                order_id, amount = pending.get_nowait()
            except asyncio.QueueEmpty:
                return
            await agent(url, token, order_id, amount)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(orders)))))


def agent_process(
    url: str,
    token: str,
    orders: Sequence[tuple[str, float]],
    concurrency: int,
    go: EventType,
    results: multiprocessing.Queue[dict[str, Any]],
    limit: float,
) -> None:
    """A child process's share of the agents: waits for the go, runs them, reports back."""
    try:
        if not go.wait(limit):
            raise BenchFailure("no go")
        asyncio.run(asyncio.wait_for(run_agents(url, token, orders, concurrency), limit))
        results.put({"ran_at": RAN_AT, "runs": dict(RUNS)})
    except Exception as error:
        results.put({"error": repr(error)})


class AgentProcesses:
    """The agents shared among child processes (spawned, each with its own event loop), for
    when one process's event loop would be the bottleneck of the SDK's client work."""

    def __init__(
        self,
        url: str,
        token: str,
        orders: Sequence[tuple[str, float]],
        concurrency: int,
        processes: int,
        limit: float,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._go = context.Event()
        self._results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
        self._limit = limit
        self._children = [
            context.Process(
                target=agent_process,
                args=(
                    url,
                    token,
                    orders[index::processes],
                    concurrency // processes + (index < concurrency % processes),
                    self._go,
                    self._results,
                    limit,
                ),
                daemon=True,
            )
            for index in range(processes)
        ]
        for child in self._children:
            child.start()

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self._children if child.pid is not None]

    async def run(self) -> None:
        """Sets them going; returns when all have reported, their results merged into
        RAN_AT and RUNS, and they have exited."""
        self._go.set()
        reports = await asyncio.get_running_loop().run_in_executor(None, self._collect)
        for child in self._children:
            child.join()
        errors = [report["error"] for report in reports if "error" in report]
        if errors:
            raise BenchFailure("agent process: " + "; ".join(errors))
        for report in reports:
            RAN_AT.update(report["ran_at"])
            RUNS.update(report["runs"])

    def _collect(self) -> list[dict[str, Any]]:
        reports: list[dict[str, Any]] = []
        deadline = time.monotonic() + self._limit
        while len(reports) < len(self._children):
            try:
                reports.append(self._results.get(timeout=0.2))
            except queue.Empty:
                dead = [child for child in self._children if child.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    return [*reports, {"error": "a child died or did not finish in time"}]
        return reports


async def approvals(reviewer: Reviewer, agents: Coroutine[Any, Any, None]) -> float:
    """Runs `agents` (to completion, every tool run) with the reviewer polling meanwhile;
    returns the wall time from their start to the last tool run."""
    stop = asyncio.Event()
    reviewing = asyncio.create_task(reviewer.run(stop))
    began = time.perf_counter()
    running = asyncio.create_task(agents)
    done, _ = await asyncio.wait({reviewing, running}, return_when=asyncio.FIRST_COMPLETED)
    if reviewing in done:  # it ends only by failing while the agents wait
        running.cancel()
        await reviewing
        raise BenchFailure("the reviewer stopped before the agents were done")
    wall = time.perf_counter() - began
    stop.set()
    await reviewing
    await running  # raises the first agent's failure, if any
    return wall


def check(reviewer: Reviewer, orders: Sequence[str]) -> None:
    """Every order approved once and its refund run once, nothing else run or approved."""
    problems: list[str] = []
    for order_id in orders:
        if reviewer.approved[order_id] != 1:
            problems.append(f"{order_id}: approved {reviewer.approved[order_id]} times")
        if RUNS[order_id] != 1:
            problems.append(f"{order_id}: the tool ran {RUNS[order_id]} times")
    strays = (set(RUNS) | set(reviewer.approved)) - set(orders)
    problems.extend(f"{order_id}: not an order of this workload" for order_id in sorted(strays))
    if problems:
        raise BenchFailure("; ".join(problems[:10]) + (" ..." if len(problems) > 10 else ""))


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def main_async(args: argparse.Namespace) -> None:
    token = os.environ["AWAITHUMANS_ADMIN_API_TOKEN"]
    email = os.environ["AWAITHUMANS_BENCH_REVIEWER_EMAIL"]
    password = os.environ["AWAITHUMANS_BENCH_REVIEWER_PASSWORD"]
    tag = secrets.token_hex(4)
    limits = httpx.Limits(max_connections=args.concurrency + 10)
    async with (
        asyncio.timeout(args.timeout),
        httpx.AsyncClient(base_url=args.url, limits=limits, timeout=30.0) as client,
    ):
        warm_up = Reviewer(client, args.reviewer_poll, args.reviewers)
        await warm_up.login(email, password)
        warm_orders = [(f"warm-{tag}", 1.0)]
        await approvals(warm_up, run_agents(args.url, token, warm_orders, 1))
        check(warm_up, [order_id for order_id, _ in warm_orders])
        RUNS.clear()
        RAN_AT.clear()

        orders = [(f"ord-{tag}-{index}", 10.0 + index % 90 + 0.5) for index in range(args.runs)]
        children: AgentProcesses | None = None
        if args.processes > 1:
            children = AgentProcesses(
                args.url, token, orders, args.concurrency, args.processes, args.timeout
            )
        emit({"ready": True, "pids": children.pids if children else []})
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if not line:
            raise BenchFailure("stdin closed before the go")

        reviewer = Reviewer(client, args.reviewer_poll, args.reviewers)
        agents = (
            children.run() if children else run_agents(args.url, token, orders, args.concurrency)
        )
        wall = await approvals(reviewer, agents)
        order_ids = [order_id for order_id, _ in orders]
        check(reviewer, order_ids)
        emit(
            {
                "runs": args.runs,
                "concurrency": args.concurrency,
                "wall": wall,
                "decide_to_tool": [RAN_AT[order] - reviewer.sent[order] for order in order_ids],
                "reviewer_polls": reviewer.polls,
                "tool_runs": sum(RUNS.values()),
            }
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--url", required=True, help="the awaithumans server, on loopback")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--reviewer-poll", type=float, default=0.05, help="seconds")
    parser.add_argument(
        "--reviewers", type=int, default=1, help="approval requests in flight at most"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes sharing the agents (at most one per agent)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="for it all, seconds")
    args = parser.parse_args(argv)
    if min(args.runs, args.concurrency, args.reviewers, args.processes) < 1:
        parser.error("--runs, --concurrency, --reviewers and --processes must be at least 1")
    if args.processes > args.concurrency:
        parser.error("--processes must be at most --concurrency")
    try:
        asyncio.run(main_async(args))
    except BenchFailure as failure:
        print(f"awaithumans driver: {failure}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"awaithumans driver: not done within {args.timeout} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
