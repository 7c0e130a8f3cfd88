"""The bot over HTTP: how soon a pending call is posted, how soon a decision runs the tool,
and how many approvals go through, on SQLite and on PostgreSQL.

The whole bot (`bot.serve.serving`: uvicorn, the HTTP API, the workers, the outbox) runs in
this process, with `workers.poll: 0.5`, a rule putting every refund of `bench/bot_agent.py` to
review, and a webhook (the channel the bot posts reviews to here) served by a receiver in a
process of its own that checks every signature. Everything goes through real HTTP on loopback
(aiohttp, the lightest of the HTTP clients the project has, so that the clients leave the bot
as much of the machine as they can).
A run is: `POST /runs` (the refund pauses, the review is posted), `POST /approvals/{id}/decide`,
the tool runs once, `GET /runs/{id}?wait=30` answers when the run has finished. Per store:

1. Pending -> delivered, one run at a time: from the review's `created_at` to the webhook's
   arrival at the receiver (both wall clock, same machine). Goal p99 <= 100 ms.
2. Decision -> tool run, one run at a time: from just before the decision is sent to the
   moment the tool runs (it writes `time.perf_counter()` down, on the same clock). Goal p99
   <= 100 ms, far below the 500 ms poll interval: the decision must wake the workers.
3. Approvals per second end to end, `--concurrency` runs at once (GOALS.md: 20), by clients
   in another process (so that the client's own HTTP work does not share the bot's core):
   `--runs` over the wall time, against the goal >= 230/s on SQLite, and the CPU time of the
   bot's process per approval, against <= 2 ms (the webhook receiver runs in a process of
   its own). Measured `--rounds` times (default 5: awaithumans' rate moves by a third from
   one round to the next, with where its once-a-second check falls); the medians are
   compared.
4. The peer, on SQLite: after each of nodbot's rounds, awaithumans 0.1.12 with the same
   workload (`--concurrency` agents, `--runs` approvals, a reviewer approving each at once),
   in a virtual environment of its own, made on first use (bench/awaithumans_peer.py says
   how it is driven). The ratio of approvals/s in each pair of rounds, against >= 40x, and
   of CPU per approval (its server process against the bot's), medians of the rounds.
   `--no-peer` skips it.
5. Event-loop stalls: every callback the bot's loop runs is timed (`StallMeter`) while the
   runs one at a time go, and in one more end-to-end round after the measured ones, whose
   latencies count with theirs under load but whose rate and CPU are not compared (timing
   each callback costs the bot's process about a microsecond a callback).

The bot logs warnings only, as awaithumans' server does here; `--logs` has it log as
`nodbot serve` does by default (level info, as text: about 8 lines an approval), to a file.

Every refund must run exactly once and every review be posted once; the script fails
otherwise. PostgreSQL is measured on a fresh database on the server named by
`NODBOT_BENCH_POSTGRES_URL` (default the local one), dropped at the end; skipped when that
server is unreachable or not on loopback.

    make bench                                   # every benchmark
    .venv/bin/python bench/bot.py --runs 200 --concurrency 20

It prints figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import logging
import multiprocessing
import os
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
# `python bench/bot.py` puts bench/ first on sys.path, where this file would shadow the `bot`
# package. The repository's root goes there instead, which also makes `bench.bot_agent` the
# very module the bot imports (the same RAN_AT and RUNS).
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import aiohttp  # noqa: E402  (after the import path is set)
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from bench import bot_agent  # noqa: E402
from bench.awaithumans_peer import PEER_VERSION, PeerError, PeerFigures, ensure_venv, measure_peer  # noqa: E402
from bench.profile_cycle import Attribution, Function  # noqa: E402
from bench.profile_cycle import label as function_label  # noqa: E402
from bench.support import fresh_postgres, is_loopback, postgres_server  # noqa: E402
from nodbot.bot.serve import serving  # noqa: E402
from nodbot.bot.webhooks import InvalidSignature, verify_signature  # noqa: E402

POLL = 0.5
"""workers.poll of the bot, seconds: how often the workers look at the store unwoken."""
LATENCY_GOAL_MS = 100.0
"""p99 of pending -> delivered and of decision -> tool run must be at most this."""
THROUGHPUT_GOAL = 230.0
"""Approvals per second end to end on SQLite, 20 runs at once, at least."""
CPU_GOAL_MS = 2.0
"""The bot's CPU milliseconds per approval end to end on SQLite, at most."""
PEER_GOAL = 40.0
"""nodbot's approvals/s over awaithumans' with the same workload, at least."""
WAIT_LIMIT = 30.0
"""How long a run may take to finish (or a tool to run) before the benchmark gives up."""
REVIEWER = "U0BENCHLEAD"
"""The API token's name, and the rule's only reviewer."""
TOKEN_VARIABLE = "NODBOT_BENCH_TOKEN"
HOOK_SECRET_VARIABLE = "NODBOT_BENCH_HOOK_SECRET"
AGENT = "bench"


@dataclass(frozen=True)
class Latency:
    """One run, one at a time."""

    delivered: float
    """Seconds from the review's creation to the webhook's arrival."""
    to_tool: float
    """Seconds from just before the decision was sent to the tool's run."""
    answered: float
    """Seconds from just before the decision was sent to its HTTP answer."""


class Sent(NamedTuple):
    """A run of the end-to-end workload, as its client saw it."""

    order_id: str
    approval_id: str
    created_at: str
    """The review's `created_at`, as the API said it."""
    decided: float
    """perf_counter() just before the decision was sent."""
    answered: float
    """perf_counter() when the decision was answered."""


@dataclass(frozen=True)
class Throughput:
    """The end-to-end workload: `runs` runs, `concurrency` at once."""

    runs: int
    concurrency: int
    seconds: float
    start: list[float]
    """Per run: seconds `POST /runs` took."""
    decide: list[float]
    """Per run: seconds `POST /approvals/{id}/decide` took."""
    finish: list[float]
    """Per run: seconds from the decision's answer until the run was seen finished."""
    cpu: float = 0.0
    """CPU seconds of the bot's process over the workload."""
    began: float = 0.0
    ended: float = 0.0
    """perf_counter() when the workload began and ended."""
    sent: list[Sent] = field(default_factory=list)
    """Per run: what the client saw of its review and when it sent the decision."""
    latencies: list[Latency] = field(default_factory=list)
    """Per run, under this load: pending -> posted and decision -> tool ran (`under_load`)."""

    @property
    def rate(self) -> float:
        """Approvals per second."""
        return self.runs / self.seconds

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds of the bot's process per approval."""
        return self.cpu / self.runs * 1000


@dataclass
class Measured:
    """The figures of one store."""

    store: str
    latencies: list[Latency]
    rounds: list[Throughput]
    """The end-to-end workload, once per round."""
    peer: list[PeerFigures] = field(default_factory=list)
    """awaithumans' figures for the same workload, one per round, each measured right after
    nodbot's round of the same number (SQLite only)."""
    stalls: StallMeter = field(default_factory=lambda: StallMeter())
    """The event loop while the bot's workloads ran: one at a time, and a round of the
    end-to-end workload of its own (`watched`)."""
    watched: Throughput | None = None
    """The end-to-end round the stall meter watched: its latencies count with the rounds'
    (`loaded`), its rate and CPU do not (the meter's wrapper costs CPU at every callback)."""

    @property
    def throughput(self) -> Throughput:
        """The round of the median rate."""
        ranked = sorted(self.rounds, key=lambda round_: round_.rate)
        return ranked[(len(ranked) - 1) // 2]

    @property
    def loaded(self) -> list[Latency]:
        """Every run of every round, the watched one too, timed under the round's load."""
        rounds = [*self.rounds, *([self.watched] if self.watched is not None else [])]
        return [sample for round_ in rounds for sample in round_.latencies]

    @property
    def cpu_ms(self) -> float:
        """The median over the rounds of the bot's CPU milliseconds per approval."""
        return statistics.median(round_.cpu_ms for round_ in self.rounds)

    def peer_ratios(self) -> tuple[list[float], list[float]]:
        """Per round: nodbot's approvals/s over awaithumans', and awaithumans' server CPU per
        approval over the bot's."""
        pairs = list(zip(self.rounds, self.peer, strict=False))
        return (
            [ours.rate / theirs.rate for ours, theirs in pairs],
            [theirs.cpu_ms / ours.cpu_ms for ours, theirs in pairs],
        )


# --- the receiving end of the webhook ----------------------------------------------------------


@dataclass
class Receiver:
    """Where the bot posts reviews: when each arrived (wall clock), signatures checked. It
    runs in a process of its own (`receiver_process`), so that the bot's CPU is the bot's."""

    secret: str
    arrived: dict[str, float] = field(default_factory=dict)
    """approval_id -> `time.time()` when its `approval.pending` arrived."""
    problems: list[str] = field(default_factory=list)
    """Posts that were wrong: a bad signature, a review posted twice."""
    waiting: dict[str, asyncio.Event] = field(default_factory=dict)

    async def handle(self, request: Request) -> Response:
        at = time.time()
        body = await request.body()
        try:
            verify_signature(self.secret, dict(request.headers), body)
        except InvalidSignature as exc:
            self.problems.append(f"a webhook with a bad signature: {exc}")
            return Response(status_code=401)
        approval_id = json.loads(body)["approval"]["approval_id"]
        if approval_id in self.arrived:
            self.problems.append(f"{approval_id} was posted twice")
        self.arrived[approval_id] = at
        self.waiting.pop(approval_id, asyncio.Event()).set()
        return Response(status_code=204)

    async def arrival(self, request: Request) -> Response:
        """`GET /arrival/{approval_id}`: when the review was posted, waiting for it if need be."""
        approval_id = request.path_params["approval_id"]
        if approval_id not in self.arrived:
            event = self.waiting.setdefault(approval_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), WAIT_LIMIT)
        at = self.arrived.get(approval_id)
        return JSONResponse({"at": at}, status_code=200 if at is not None else 404)

    async def report(self, request: Request) -> Response:
        """`GET /report`: how many reviews were posted, and what was wrong."""
        return JSONResponse({"posts": len(self.arrived), "problems": self.problems})


def receiver_process(secret: str, ports: Any) -> None:
    """Serve a `Receiver` on a free loopback port, which is put on `ports`, until killed."""
    receiver = Receiver(secret=secret)
    app = Starlette(
        routes=[
            Route("/hook", receiver.handle, methods=["POST"]),
            Route("/arrival/{approval_id}", receiver.arrival),
            Route("/report", receiver.report),
        ]
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                await task  # it failed to start: its error ends the process
                return
            await asyncio.sleep(0.01)
        ports.put(server.servers[0].sockets[0].getsockname()[1])
        await task

    asyncio.run(main())


@dataclass
class RemoteReceiver:
    """The bench's side of the receiver process."""

    url: str
    """Where the bot posts (`.../hook`)."""
    client: Client

    async def arrival(self, approval_id: str) -> float:
        """When the review was posted (wall clock), waiting for it if need be."""
        async with self.client.get(f"/arrival/{approval_id}") as response:
            assert response.status == 200, f"{approval_id} was never posted"
            at: float = (await response.json())["at"]
        return at

    async def report(self) -> tuple[int, list[str]]:
        answer = await call(self.client, "GET", "/report", 200)
        return answer["posts"], answer["problems"]


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[RemoteReceiver]:
    """A receiver served by uvicorn on a free loopback port, in a process of its own."""
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    process = context.Process(
        target=receiver_process, args=(os.environ[HOOK_SECRET_VARIABLE], ports), daemon=True
    )
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, process.start)
    try:
        port = await loop.run_in_executor(None, ports.get, True, WAIT_LIMIT)
        base = f"http://127.0.0.1:{port}"
        timeout = aiohttp.ClientTimeout(total=WAIT_LIMIT + 5)
        async with aiohttp.ClientSession(base_url=base, timeout=timeout) as client:
            yield RemoteReceiver(f"{base}/hook", client)
    finally:
        process.terminate()
        await loop.run_in_executor(None, process.join, WAIT_LIMIT)


# --- the bot ---------------------------------------------------------------------------------


TOOLS = {"def": "agent", "async": "async_agent", "nonblocking": "nonblocking_agent"}
"""`--tool`: the agent of `bench/bot_agent.py` whose refund is a plain `def` (in a thread of
the tool pool, the default: what users write), an `async def`, or a `def` declared
`blocking=False` (on the bot's loop)."""


def write_config(tmp: Path, store_url: str, hook_url: str, tool: str = "def") -> Path:
    """A nodbot.yml in `tmp`: the store, a free loopback port, one token with every scope
    named after the reviewer of the rule that puts every refund to review, the webhook, and
    the agent whose refund is of the kind `tool` (`TOOLS`)."""
    path = tmp / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "{store_url}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: {POLL}, lease: 5m}}
api:
  tokens:
    - name: {REVIEWER}
      token: ${{{TOKEN_VARIABLE}}}
      scopes: [runs:write, approvals:read, approvals:decide]
agents:
  {AGENT}: bench.bot_agent:{TOOLS[tool]}
rules:
  - tool: refund
    reviewers: [{REVIEWER}]
    allow_self_approval: true
webhooks:
  - name: reviews
    url: {hook_url}
    secret: ${{{HOOK_SECRET_VARIABLE}}}
    events: [approval.pending]
"""
    )
    return path


Client: TypeAlias = aiohttp.ClientSession
"""A session on the bot's base URL with the reviewer's token (`api_client`)."""


def api_client(url: str, token: str) -> Client:
    return aiohttp.ClientSession(
        base_url=url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=WAIT_LIMIT + 5),
    )


async def call(client: Client, method: str, path: str, status: int, **kwargs: Any) -> Any:
    """The JSON body of the answer to `method path`, which must have `status`."""
    async with client.request(method, path, **kwargs) as response:
        text = await response.text()
        if response.status != status:
            raise AssertionError(f"{method} {path}: {response.status} {text}")
        return json.loads(text)


async def start_run(client: Client, order_id: str) -> dict[str, Any]:
    """Start a run refunding `order_id`; the run, waiting for its one review."""
    body = {"agent": AGENT, "input": f"refund {order_id} 500"}
    run: dict[str, Any] = await call(client, "POST", "/runs", 201, json=body)
    assert run["status"] == "waiting" and len(run["pending"]) == 1, run
    return run


async def decide(client: Client, approval_id: str) -> None:
    """Approve `approval_id`."""
    path = f"/approvals/{approval_id}/decide"
    decided = await call(client, "POST", path, 200, json={"action": "approve"})
    assert decided["status"] == "approved", decided


async def until_finished(client: Client, run_id: str) -> None:
    """Wait for the run to finish (one request: the API answers once it has settled)."""
    run = await call(client, "GET", f"/runs/{run_id}", 200, params={"wait": str(WAIT_LIMIT)})
    assert run["status"] == "finished", run


async def tool_ran_at(order_id: str) -> float:
    """When the refund of `order_id` ran (`time.perf_counter()`), waiting for it if need be."""
    deadline = time.monotonic() + WAIT_LIMIT
    while (ran := bot_agent.RAN_AT.get(order_id)) is None:
        assert time.monotonic() < deadline, f"{order_id}: the tool did not run"
        await asyncio.sleep(0.0005)
    return ran


# --- the workloads ---------------------------------------------------------------------------


async def one_latency(client: Client, receiver: RemoteReceiver, order_id: str) -> Latency:
    """One run: pause, see it posted, then time the decision until the tool runs."""
    run = await start_run(client, order_id)
    [pending] = run["pending"]
    created = datetime.fromisoformat(pending["created_at"]).timestamp()
    delivered = await receiver.arrival(pending["approval_id"]) - created
    assert order_id not in bot_agent.RUNS, f"{order_id}: the tool ran before the decision"
    sent = time.perf_counter()
    await decide(client, pending["approval_id"])
    answered = time.perf_counter()
    ran = await tool_ran_at(order_id)
    await until_finished(client, run["run_id"])  # so the next run has the bot to itself
    return Latency(delivered=delivered, to_tool=ran - sent, answered=answered - sent)


def client_process(
    url: str,
    token: str,
    runs: range,
    concurrency: int,
    prefix: str,
    ready: Any,
    answer: Any,
) -> None:
    """The end-to-end workload, or a share of it, run in a process of its own: once every
    client is `ready` (a barrier), `concurrency` workers take the `runs` in turn; it sends
    its figures back."""

    async def main() -> Throughput:
        numbers = iter(runs)
        start: list[float] = []
        decided: list[float] = []
        finish: list[float] = []
        seen: list[Sent] = []
        async with api_client(url, token) as client:

            async def worker() -> None:
                for number in numbers:  # shared: each worker takes the next run
                    began = time.perf_counter()
                    order_id = f"{prefix}-{number}"
                    run = await start_run(client, order_id)
                    [pending] = run["pending"]
                    sent = time.perf_counter()
                    await decide(client, pending["approval_id"])
                    answered = time.perf_counter()
                    await until_finished(client, run["run_id"])
                    start.append(sent - began)
                    decided.append(answered - sent)
                    finish.append(time.perf_counter() - answered)
                    review = (pending["approval_id"], pending["created_at"])
                    seen.append(Sent(order_id, *review, sent, answered))

            gc.collect()
            await asyncio.to_thread(ready.wait, WAIT_LIMIT)
            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            ended = time.perf_counter()
        return Throughput(
            len(runs), concurrency, ended - began, start, decided, finish, 0.0, began, ended, seen
        )

    answer.put(asyncio.run(main()))


async def throughput(
    url: str, runs: int, concurrency: int, prefix: str, processes: int = 1
) -> Throughput:
    """`runs` runs end to end, `concurrency` at once, by clients in `processes` other
    processes (each with its share of both); the wall time is from the first client's start
    to the last one's end (perf_counter is the system's monotonic clock)."""
    context = multiprocessing.get_context("spawn")
    answer = context.Queue()
    ready = context.Barrier(processes)
    token = os.environ[TOKEN_VARIABLE]
    clients = [
        context.Process(
            target=client_process,
            args=(
                url,
                token,
                range(runs)[share::processes],
                len(range(concurrency)[share::processes]),
                prefix,
                ready,
                answer,
            ),
        )
        for share in range(processes)
    ]
    cpu = time.process_time()
    loop = asyncio.get_running_loop()
    for client in clients:  # spawning takes ~10 ms: in a thread, so the bot's loop goes on
        await loop.run_in_executor(None, client.start)
    try:
        shares: list[Throughput] = [
            await loop.run_in_executor(None, answer.get, True, 10 * WAIT_LIMIT) for _ in clients
        ]
        cpu = time.process_time() - cpu
    finally:
        for client in clients:
            await loop.run_in_executor(None, client.join, WAIT_LIMIT)
    began = min(share.began for share in shares)
    ended = max(share.ended for share in shares)
    return Throughput(
        runs,
        concurrency,
        ended - began,
        [seconds for share in shares for seconds in share.start],
        [seconds for share in shares for seconds in share.decide],
        [seconds for share in shares for seconds in share.finish],
        cpu,
        began,
        ended,
        [sent for share in shares for sent in share.sent],
    )


async def under_load(round_: Throughput, receiver: RemoteReceiver) -> Throughput:
    """`round_` with its runs' pending -> posted (the receiver's arrival against the review's
    `created_at`, both wall clock) and decision -> tool ran (the tool's `RAN_AT` in this
    process against the client's `perf_counter()`, the system's one monotonic clock)."""
    latencies = []
    for sent in round_.sent:
        created = datetime.fromisoformat(sent.created_at).timestamp()
        delivered = await receiver.arrival(sent.approval_id) - created
        ran = await tool_ran_at(sent.order_id)
        latencies.append(Latency(delivered, ran - sent.decided, sent.answered - sent.decided))
    return replace(round_, latencies=latencies)


STALL_TICK = 0.001
"""Seconds the stall meter sleeps between looks at the event loop's clock."""
STALL_GOAL_MS = 10.0


class StallMeter:
    """The bot's event loop, watched while the meter runs (it may run several times, adding
    up), three ways:

    - stalls: each callback the loop runs is timed (`asyncio.Handle._run` wrapped while the
      meter runs; the bench's own instrument, one or two microseconds a callback), in the loop
      thread's CPU time. A callback that computes long holds the loop: a commit, a WAL
      checkpoint, a batch of runs moved on without yielding, a full garbage collection. The
      goal is none over 10 ms; the slowest one is named.
    - the same callbacks in wall time: beside the stalls, the times the system left the
      loop's thread waiting for a core while a callback ran (the machine has 2, shared with
      the clients and the receiver).
    - lag: how late a task that sleeps `STALL_TICK` at a time is woken. Beside both of the
      above this counts the queue: when the loop is saturated, every callback ready in one
      turn of the loop runs before the timer's, however short each one is.
    """

    def __init__(self) -> None:
        self.worst = 0.0
        """CPU seconds of the slowest callback."""
        self.worst_callback = ""
        self.over = 0
        """Callbacks over the goal, in CPU time."""
        self.worst_wall = 0.0
        """Wall seconds of the longest callback."""
        self.over_wall = 0
        self.lag = 0.0
        """Seconds of the timer's worst lateness."""
        self.lag_over = 0
        self._task: asyncio.Task[None] | None = None
        self._run: Any = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(STALL_TICK)
            late = loop.time() - before - STALL_TICK
            self.lag = max(self.lag, late)
            self.lag_over += late * 1000 > STALL_GOAL_MS

    def _timed(self, run: Any) -> Any:
        meter, clock, cpu = self, time.perf_counter, time.thread_time
        goal = STALL_GOAL_MS / 1000

        def timed_run(handle: asyncio.Handle) -> None:
            began, computed = clock(), cpu()
            run(handle)
            took = clock() - began
            if took > meter.worst_wall:
                meter.worst_wall = took
            if took <= meter.worst and took <= goal:
                return  # its CPU time, at most `took`, beats neither: not read again
            meter.over_wall += took > goal
            computed = cpu() - computed
            meter.over += computed > goal
            if computed > meter.worst:
                meter.worst = computed
                # A task's step names the task, its coroutine and where it stopped next.
                callback = handle._callback  # type: ignore[attr-defined]
                meter.worst_callback = repr(getattr(callback, "__self__", callback))[:300]

        return timed_run

    def __enter__(self) -> StallMeter:
        self._run = asyncio.Handle._run
        asyncio.Handle._run = self._timed(self._run)  # type: ignore[method-assign]
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._run is not None:
            asyncio.Handle._run = self._run  # type: ignore[method-assign]
            self._run = None


@contextlib.asynccontextmanager
async def bot_logs(path: Path, wanted: bool) -> AsyncIterator[None]:
    """With `wanted` (`--logs`), the bot's log lines go to `path` while it serves: it writes
    them to stderr, as `nodbot serve` does, and stderr is that file meanwhile."""
    if not wanted:
        yield
        return
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with path.open("w") as file, contextlib.redirect_stderr(file):
        try:
            yield
        finally:  # the handler the bot installed writes to this file: it goes with it
            root.handlers[:] = handlers
            root.setLevel(level)


async def measure(
    store_url: str, tmp: Path, args: argparse.Namespace, label: str, peer: Path | None = None
) -> Measured:
    """Start the bot on `store_url`, warm it up, then measure the three workloads, the
    end-to-end one `args.rounds` times; with `peer` (awaithumans' interpreter) each of those
    rounds is followed by awaithumans' round of the same workload, while the bot idles."""
    bot_agent.forget()
    async with (
        receiving() as receiver,
        bot_logs(tmp / f"bot-{label}.log", args.logs),
        serving(
            str(write_config(tmp, store_url, receiver.url, args.tool)), configure_logs=args.logs
        ) as served,
    ):
        assert is_loopback(urlsplit(served.url).hostname), f"the bot is on {served.url}"
        async with api_client(served.url, os.environ[TOKEN_VARIABLE]) as client:
            for number in range(args.warmup):
                await one_latency(client, receiver, f"warm-{number}")
            gc.collect()
            stalls = StallMeter()
            with stalls:
                latencies = [
                    await one_latency(client, receiver, f"one-{number}")
                    for number in range(args.runs)
                ]
            rounds: list[Throughput] = []
            peers: list[PeerFigures] = []
            profiler = cProfile.Profile() if args.profile else None
            for number in range(args.rounds):
                if profiler is not None:
                    profiler.enable()
                round_ = await throughput(
                    served.url, args.runs, args.concurrency, f"e2e{number}", args.clients
                )
                if profiler is not None:
                    profiler.disable()
                rounds.append(await under_load(round_, receiver))
                if peer is not None:
                    peers.append(await peer_round(peer, args))
            # The meter times every callback (thread_time, a system call: about a microsecond
            # a callback, some 7% of the bot's CPU under this load), so it watches a round of
            # its own, whose rate and CPU are not the rounds'.
            with stalls:
                round_ = await throughput(
                    served.url, args.runs, args.concurrency, "watched", args.clients
                )
            watched = await under_load(round_, receiver)
        deadline = time.monotonic() + WAIT_LIMIT
        total = args.warmup + (2 + args.rounds) * args.runs
        while (report := await receiver.report())[0] < total:  # the last may be on their way
            assert time.monotonic() < deadline, f"{report[0]} of {total} reviews posted"
            await asyncio.sleep(0.01)
        assert not report[1], "; ".join(report[1])
    assert len(bot_agent.RUNS) == total and set(bot_agent.RUNS.values()) == {1}, (
        f"{total} runs, but the tool ran {sum(bot_agent.RUNS.values())} times"
        f" for {len(bot_agent.RUNS)} orders"
    )
    if profiler is not None:
        print_profile(profiler, label, args.rounds * args.runs, Path(f"{args.profile}.{label}"))
    if args.logs:
        lines = len((tmp / f"bot-{label}.log").read_text().splitlines())
        print(f"[{label}] the bot logged {lines} lines, {lines / total:.1f} an approval")
    return Measured(label, latencies, rounds, peers, stalls, watched)


async def peer_round(python: Path, args: argparse.Namespace) -> PeerFigures:
    """awaithumans' round of the end-to-end workload (bench/awaithumans_peer.py), in a thread
    so that the bot's loop goes on meanwhile, as idle as between two agents' runs."""
    figures = await asyncio.to_thread(
        measure_peer, args.runs, args.concurrency, python=python, processes=args.clients
    )
    print(f"  {figures.summary()}", flush=True)
    return figures


def peer_python(args: argparse.Namespace) -> Path | None:
    """awaithumans' interpreter, its environment made when missing; None (having said why)
    when it is not wanted or cannot be installed."""
    if args.no_peer:
        return None
    try:
        return ensure_venv()
    except PeerError as error:
        print(f"awaithumans {PEER_VERSION}: not measured, its environment failed: {error}")
        return None


async def measure_all(args: argparse.Namespace) -> list[Measured]:
    os.environ[TOKEN_VARIABLE] = secrets.token_urlsafe(24)
    os.environ[HOOK_SECRET_VARIABLE] = secrets.token_urlsafe(24)
    results = []
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-bot-") as name:
        tmp = Path(name)
        peer = peer_python(args)
        sqlite_url = f"sqlite:///{tmp / 'nodbot.db'}"
        results.append(await measure(sqlite_url, tmp, args, "sqlite", peer))
        if not args.sqlite_only:
            async with fresh_postgres(postgres_server()) as url:
                if url is not None:
                    results.append(await measure(url, tmp, args, "postgresql"))
    return results


# --- report ----------------------------------------------------------------------------------


def percentiles_ms(seconds: Sequence[float]) -> tuple[float, float, float, float]:
    """p50, p95, p99 and max of `seconds`, in milliseconds."""
    if len(seconds) == 1:
        only = seconds[0] * 1000
        return only, only, only, only
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[94] * 1000, cuts[98] * 1000, max(seconds) * 1000


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def print_latencies(title: str, samples: Sequence[Latency], answered: bool) -> None:
    """A table of p50, p95, p99 and max of `samples` (with the decision's HTTP answer)."""
    print()
    print(title)
    print(f"{'':<26} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    rows = [
        ("pending -> posted", [sample.delivered for sample in samples]),
        ("decide -> tool ran", [sample.to_tool for sample in samples]),
    ]
    if answered:
        rows.append(("decide answered (HTTP)", [sample.answered for sample in samples]))
    for label, values in rows:
        p50, p95, p99, top = percentiles_ms(values)
        print(f"{label:<26} {p50:>8.2f} {p95:>8.2f} {p99:>8.2f} {top:>8.2f}")


def print_report(measured: Measured) -> None:
    samples, loaded = measured.latencies, measured.loaded
    print_latencies(f"[{measured.store}] one run at a time ({len(samples)} runs)", samples, True)
    print_latencies(
        f"[{measured.store}] under load: {measured.rounds[0].concurrency} runs at once, every"
        f" run of the {len(measured.rounds)} rounds and the watched one ({len(loaded)} runs)",
        loaded,
        False,
    )

    t = measured.throughput
    print()
    print(f"[{measured.store}] approvals end to end, {t.concurrency} runs at once")
    print(
        f"{'round':>6} {'runs':>6} {'seconds':>9} {'approvals/s':>12} {'bot CPU ms/approval':>20}"
    )
    for number, round_ in enumerate(measured.rounds, 1):
        print(
            f"{number:>6} {round_.runs:>6} {round_.seconds:>9.3f} {round_.rate:>12,.1f}"
            f" {round_.cpu_ms:>20.2f}"
        )
    for number, theirs in enumerate(measured.peer, 1):
        print(
            f"{'peer ' + str(number):>6} {theirs.runs:>6} {theirs.wall:>9.3f} {theirs.rate:>12,.1f}"
            f" {theirs.cpu_ms:>20.2f}   (awaithumans {PEER_VERSION}, its server's CPU)"
        )
    print("CPU is of the bot's process over each round (the webhook receiver has its own)")
    print(
        f"the round of the median rate, {'per run':<15} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8}"
    )
    for label, values in (
        ("POST /runs", t.start),
        ("POST .../decide", t.decide),
        ("decided -> seen finished", t.finish),
    ):
        p50, _, p99, _ = percentiles_ms(values)
        print(f"{label:<44} {statistics.fmean(values) * 1000:>8.2f} {p50:>8.2f} {p99:>8.2f}")


def print_goals(results: Sequence[Measured]) -> None:
    print()
    for measured in results:
        for when, samples in (("", measured.latencies), ("under load, ", measured.loaded)):
            _, _, posted, _ = percentiles_ms([s.delivered for s in samples])
            _, _, ran, _ = percentiles_ms([s.to_tool for s in samples])
            print(
                f"[{measured.store}] {when}pending -> posted p99 = {posted:.1f} ms"
                f" (goal <= {LATENCY_GOAL_MS:.0f} ms: {verdict(posted <= LATENCY_GOAL_MS)});"
                f" decision -> tool run p99 = {ran:.1f} ms"
                f" (goal <= {LATENCY_GOAL_MS:.0f} ms: {verdict(ran <= LATENCY_GOAL_MS)})"
            )
        stalls = measured.stalls
        worst = stalls.worst * 1000
        print(
            f"[{measured.store}] longest event-loop stall (one callback, CPU) = {worst:.1f} ms,"
            f" {stalls.over} over {STALL_GOAL_MS:.0f} ms"
            f" (goal: none over {STALL_GOAL_MS:.0f} ms: {verdict(worst <= STALL_GOAL_MS)});"
            f" the slowest: {stalls.worst_callback}"
        )
        print(
            f"[{measured.store}] the longest callback in wall time (waits for a core too) ="
            f" {stalls.worst_wall * 1000:.1f} ms, {stalls.over_wall} over {STALL_GOAL_MS:.0f} ms"
        )
        print(
            f"[{measured.store}] a 1 ms timer's worst lateness (stalls and the loop's queue) ="
            f" {stalls.lag * 1000:.1f} ms, {stalls.lag_over} times over {STALL_GOAL_MS:.0f} ms"
        )
    measured = results[0]
    sqlite = measured.throughput
    rounds = len(measured.rounds)
    print(
        f"[sqlite] approvals end to end = {sqlite.rate:,.0f}/s with {sqlite.concurrency} at once,"
        f" the median of {rounds} rounds"
        f" (goal >= {THROUGHPUT_GOAL:.0f}/s with 20: {verdict(sqlite.rate >= THROUGHPUT_GOAL)})"
    )
    cpu = measured.cpu_ms
    print(
        f"[sqlite] bot CPU per approval end to end = {cpu:.2f} ms, the median of {rounds} rounds"
        f" (goal <= {CPU_GOAL_MS:.0f} ms: {verdict(cpu <= CPU_GOAL_MS)})"
    )
    if not measured.peer:
        print(f"[sqlite] awaithumans {PEER_VERSION}: not measured, so no ratio")
        return
    rates, cpus = measured.peer_ratios()
    rate, cpu_ratio = statistics.median(rates), statistics.median(cpus)
    print(
        f"[sqlite] approvals/s nodbot / awaithumans {PEER_VERSION} = {rate:.1f}x, the median of"
        f" {len(rates)} alternating rounds ({', '.join(f'{r:.1f}' for r in rates)})"
        f" (goal >= {PEER_GOAL:.0f}x: {verdict(rate >= PEER_GOAL)})"
    )
    print(
        f"[sqlite] CPU per approval awaithumans' server / nodbot's bot = {cpu_ratio:.1f}x"
        f" ({', '.join(f'{r:.1f}' for r in cpus)}); awaithumans' decision -> tool ran p99"
        f" {statistics.median(p.p99_ms for p in measured.peer):.0f} ms"
    )


# Where a bot approval's time goes (`--profile`): a function's category by its module; a
# built-in or a helper of the standard library takes its callers' (`Attribution`).
HTTP = "HTTP (uvicorn, Starlette, nodbot's routes)"
STEP = "the run's step (agent loop, executor, rules)"
STORE = "store (SQL and the Python around it)"
OUTBOX = "outbox and webhook (aiohttp)"
CHECKS = "validation, JSON"
LOOP = "event loop, sockets"
IDLE = "idle (waiting in epoll)"
REST = "the rest"
BOT_CATEGORIES = (HTTP, STEP, STORE, OUTBOX, CHECKS, LOOP, IDLE, REST)
_BOT_PACKAGES = {
    "uvicorn": HTTP,
    "starlette": HTTP,
    "httptools": HTTP,
    "h11": HTTP,
    "aiohttp": OUTBOX,
    "yarl": OUTBOX,
    "multidict": OUTBOX,
    "pydantic": CHECKS,
    "pydantic_core": CHECKS,
    "asyncpg": STORE,
    "sqlalchemy": STORE,
}


def bot_category(function: Function) -> str | None:
    """The category of a function of a bot approval's profile; None: its callers'."""
    filename, _, name = function
    if filename == "~":
        if "epoll" in name and "poll" in name:
            return IDLE
        return STORE if "sqlite3." in name else None
    path = Path(filename).as_posix()
    if "/site-packages/" in path:
        package = path.split("/site-packages/", 1)[1].split("/", 1)[0].split(".")[0]
        return _BOT_PACKAGES.get(package, REST)
    for part, category in (
        ("/bot/http/", HTTP),
        ("/bot/web/", HTTP),
        ("/bot/outbox.py", OUTBOX),
        ("/bot/webhooks.py", OUTBOX),
        ("/core/sqlstore/", STORE),
        ("/core/store.py", STORE),
        ("/core/", STEP),
        ("/bot/", STEP),
        ("/bench/", REST),
    ):
        if part in path:
            return category
    if "/asyncio/" in path or path.endswith(("/selectors.py", "/socket.py")):
        return LOOP
    if path.endswith(("/json/encoder.py", "/json/decoder.py", "/json/__init__.py")):
        return CHECKS
    return None


def print_profile(profiler: cProfile.Profile, store: str, approvals: int, path: Path) -> None:
    """Where the bot's loop spent its time in the end-to-end rounds (`--profile`): its own
    time by category, then the functions of most own time, in microseconds an approval
    (cProfile sees the loop's thread: a tool's thread and SQLite's checkpoints are not in
    it, and its own cost inflates every figure, so read them as shares; the loop's waits in
    epoll are idle and left out of the shares), and the whole profile saved to `path`
    (`python -m pstats`)."""
    profiler.dump_stats(path)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    totals = Attribution(stats, bot_category, BOT_CATEGORIES).by_category()
    busy = sum(totals.values()) - totals[IDLE]
    print(
        f"[{store}] profile of the end-to-end rounds (the loop's thread, under cProfile):"
        f" {busy / approvals * 1e6:,.0f} us an approval busy (idle left out); saved to {path}"
    )
    print(f"{'us/approval':>12} {'share':>6}  category")
    for category in sorted(BOT_CATEGORIES, key=lambda c: -totals[c]):
        if category != IDLE:
            micro = totals[category] / approvals * 1e6
            print(f"{micro:>12,.1f} {totals[category] / busy:>6.1%}  {category}")
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)
    print(f"{'own us/approval':>16} {'share':>6} {'calls/approval':>15}  function")
    for function, (_, calls, own, _, _) in [row for row in rows if bot_category(row[0]) != IDLE][
        :30
    ]:
        each = f"{own / approvals * 1e6:>16.1f} {own / busy:>6.1%} {calls / approvals:>15.1f}"
        print(f"{each}  {function_label(function)}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--runs", type=int, default=200, help="measured runs per workload (default 200)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=20, help="runs at once end to end (default 20)"
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="runs made before measuring (default 5)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="end-to-end rounds per store, alternating with awaithumans' on SQLite (default 5)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=2,
        help="client processes sharing the end-to-end agents, nodbot's and awaithumans'"
        " alike (default 2, one per core)",
    )
    parser.add_argument(
        "--logs",
        action="store_true",
        help="the bot logs as `nodbot serve` does by default (level info, text), to a file;"
        " without it, it logs warnings only, as awaithumans' server does here",
    )
    parser.add_argument(
        "--tool",
        choices=sorted(TOOLS),
        default="def",
        help="the refund tool: a plain def in a thread (default, what users write), an"
        " async def, or a def declared blocking=False",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="profile the bot's loop over the end-to-end rounds (cProfile) and print where"
        " its time goes; the whole profile is saved to FILE.<store>",
    )
    parser.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--no-peer", action="store_true", help=f"skip awaithumans {PEER_VERSION}")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.concurrency < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--runs, --concurrency and --rounds must be >= 1 and --warmup >= 0")
    if not 1 <= args.clients <= args.concurrency:
        parser.error("--clients must be between 1 and --concurrency")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)  # the bot imports bench.bot_agent from the working directory
    results = asyncio.run(measure_all(args))
    print(
        f"bot over HTTP: {args.runs} runs per workload after {args.warmup} warm-up;"
        f" workers.poll {POLL} s; reviews posted to a webhook; the refund a {args.tool} tool"
    )
    for measured in results:
        print_report(measured)
    print_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
