"""The bot over HTTP: how soon a decision runs the tool, and how many approvals go through.

The whole bot (`bot.serve.serving`: uvicorn, the HTTP API, the workers) runs in this process
on a SQLite store in a temporary directory, with `workers.poll: 0.5` and a rule putting every
refund of `bench/bot_agent.py` to review. Everything goes through real HTTP on loopback
(httpx), one run being: `POST /runs` (the refund pauses), `POST /approvals/{id}/decide`, and
the tool runs once. Two figures, each over `--runs` runs after `--warmup` warm-up runs:

1. Decision -> tool run, one run at a time: from just before the decision is sent to the
   moment the tool runs (it writes `time.perf_counter()` down, on the same clock). p50, p95,
   p99 against the goal p99 <= 100 ms, which is far below the 500 ms poll interval: the
   decision must wake the workers, not wait for their next look at the store. The decision's
   own HTTP round trip is shown beside it.
2. Approvals per second end to end, `--concurrency` runs at once (GOALS.md: 20): each starts
   a run, decides its approval and polls `GET /runs/{id}` every 5 ms until it is finished;
   the rate is `--runs` over the wall time, against the goal >= 230/s on SQLite.

Every refund must run exactly once; the script fails otherwise.

    make bench                                   # every benchmark
    .venv/bin/python bench/bot.py --runs 200 --concurrency 20

It prints figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
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
# `python bench/bot.py` puts bench/ first on sys.path, where this file would shadow the `bot`
# package. The repository's root goes there instead, which also makes `bench.bot_agent` the
# very module the bot imports (the same RAN_AT and RUNS).
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import httpx  # noqa: E402  (after the import path is set)

from bench import bot_agent  # noqa: E402
from bot.serve import serving  # noqa: E402

POLL = 0.5
"""workers.poll of the bot, seconds: how often the workers look at the store unwoken."""
LATENCY_GOAL_MS = 100.0
"""p99 of decision -> tool run must be at most this."""
THROUGHPUT_GOAL = 230.0
"""Approvals per second end to end on SQLite, 20 runs at once, at least."""
STATUS_POLL = 0.005
"""How often a run's status is read while waiting for it to finish, seconds."""
WAIT_LIMIT = 30.0
"""How long a run may take to finish (or a tool to run) before the benchmark gives up."""
REVIEWER = "U0BENCHLEAD"
"""The API token's name, and the rule's only reviewer."""
TOKEN_VARIABLE = "NODBOT_BENCH_TOKEN"
AGENT = "bench"


@dataclass(frozen=True)
class Latency:
    """One decision, one run at a time."""

    to_tool: float
    """Seconds from just before the decision was sent to the tool's run."""
    answered: float
    """Seconds from just before the decision was sent to its HTTP answer."""


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
    polls: int
    """`GET /runs/{id}` requests made while waiting."""

    @property
    def rate(self) -> float:
        """Approvals per second."""
        return self.runs / self.seconds


# --- the bot ---------------------------------------------------------------------------------


def write_config(tmp: Path) -> Path:
    """A nodbot.yml in `tmp`: SQLite store beside it, a free loopback port, one token with
    every scope named after the reviewer of the rule that puts every refund to review."""
    path = tmp / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp / "nodbot.db"}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: {POLL}, lease: 5m}}
api:
  tokens:
    - name: {REVIEWER}
      token: ${{{TOKEN_VARIABLE}}}
      scopes: [runs:write, approvals:read, approvals:decide]
agents:
  {AGENT}: bench.bot_agent:agent
rules:
  - tool: refund
    reviewers: [{REVIEWER}]
    allow_self_approval: true
"""
    )
    return path


def is_loopback(url: str) -> bool:
    """Whether `url` points at this machine (a loopback address or `localhost`)."""
    host = urlsplit(url).hostname
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def expect(response: httpx.Response, status: int) -> dict[str, Any]:
    """The JSON body of `response`, which must have `status`."""
    if response.status_code != status:
        request = response.request
        raise AssertionError(
            f"{request.method} {request.url.path}: {response.status_code} {response.text}"
        )
    body: dict[str, Any] = response.json()
    return body


async def start_run(client: httpx.AsyncClient, order_id: str) -> tuple[str, str]:
    """Start a run refunding `order_id`; its run id and the approval it waits for."""
    body = {"agent": AGENT, "input": f"refund {order_id} 500"}
    run = expect(await client.post("/runs", json=body), 201)
    assert run["status"] == "waiting" and len(run["pending"]) == 1, run
    assert order_id not in bot_agent.RUNS, f"{order_id}: the tool ran before the decision"
    return run["run_id"], run["pending"][0]["approval_id"]


async def decide(client: httpx.AsyncClient, approval_id: str) -> None:
    """Approve `approval_id`."""
    decided = expect(
        await client.post(f"/approvals/{approval_id}/decide", json={"action": "approve"}), 200
    )
    assert decided["status"] == "approved", decided


async def until_finished(client: httpx.AsyncClient, run_id: str) -> int:
    """Read the run every `STATUS_POLL` s until it has finished; how many reads it took."""
    deadline = time.monotonic() + WAIT_LIMIT
    polls = 0
    while True:
        run = expect(await client.get(f"/runs/{run_id}"), 200)
        polls += 1
        if run["status"] == "finished":
            return polls
        assert run["status"] in ("running", "waiting"), run
        assert time.monotonic() < deadline, f"run {run_id} did not finish: {run}"
        await asyncio.sleep(STATUS_POLL)


async def tool_ran_at(order_id: str) -> float:
    """When the refund of `order_id` ran (`time.perf_counter()`), waiting for it if need be."""
    deadline = time.monotonic() + WAIT_LIMIT
    while (ran := bot_agent.RAN_AT.get(order_id)) is None:
        assert time.monotonic() < deadline, f"{order_id}: the tool did not run"
        await asyncio.sleep(0.0005)
    return ran


def ran_once(order_id: str) -> None:
    """The refund of `order_id` ran exactly once."""
    runs = bot_agent.RUNS[order_id]
    assert runs == 1, f"{order_id}: the tool ran {runs} times"


# --- the workloads ---------------------------------------------------------------------------


async def one_latency(client: httpx.AsyncClient, order_id: str) -> Latency:
    """One run: pause, then time the decision until the tool runs; wait for the run's end."""
    run_id, approval_id = await start_run(client, order_id)
    sent = time.perf_counter()
    await decide(client, approval_id)
    answered = time.perf_counter()
    ran = await tool_ran_at(order_id)
    await until_finished(client, run_id)  # so the next run has the bot to itself
    ran_once(order_id)
    return Latency(to_tool=ran - sent, answered=answered - sent)


async def latencies(client: httpx.AsyncClient, runs: int, prefix: str) -> list[Latency]:
    """`runs` runs one after the other."""
    return [await one_latency(client, f"{prefix}-{number}") for number in range(runs)]


async def throughput(client: httpx.AsyncClient, runs: int, concurrency: int) -> Throughput:
    """`runs` runs end to end, `concurrency` at once."""
    numbers = iter(range(runs))
    start: list[float] = []
    decided: list[float] = []
    finish: list[float] = []
    polls = 0

    async def worker() -> None:
        nonlocal polls
        for number in numbers:  # shared: each worker takes the next run
            order_id = f"e2e-{number}"
            began = time.perf_counter()
            run_id, approval_id = await start_run(client, order_id)
            sent = time.perf_counter()
            await decide(client, approval_id)
            answered = time.perf_counter()
            polls += await until_finished(client, run_id)
            ended = time.perf_counter()
            ran_once(order_id)
            start.append(sent - began)
            decided.append(answered - sent)
            finish.append(ended - answered)

    gc.collect()
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - began
    return Throughput(runs, concurrency, seconds, start, decided, finish, polls)


async def measure(args: argparse.Namespace) -> tuple[list[Latency], Throughput, str]:
    """Start the bot, warm it up, then measure both workloads; also the store's URL."""
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-bot-") as name:
        os.environ[TOKEN_VARIABLE] = secrets.token_urlsafe(24)
        headers = {"Authorization": f"Bearer {os.environ[TOKEN_VARIABLE]}"}
        async with serving(str(write_config(Path(name)))) as served:
            assert is_loopback(served.url), f"the bot listens on {served.url}, not loopback"
            async with httpx.AsyncClient(
                base_url=served.url,
                headers=headers,
                timeout=WAIT_LIMIT,
                trust_env=False,  # no proxy from the environment: straight to loopback
            ) as client:
                await latencies(client, args.warmup, "warm")
                gc.collect()
                measured = await latencies(client, args.runs, "one")
                end_to_end = await throughput(client, args.runs, args.concurrency)
            store_url = served.store_url
    total = args.warmup + 2 * args.runs
    assert len(bot_agent.RUNS) == total and set(bot_agent.RUNS.values()) == {1}, (
        f"{total} runs, but the tool ran {sum(bot_agent.RUNS.values())} times"
        f" for {len(bot_agent.RUNS)} orders"
    )
    return measured, end_to_end, store_url


# --- report ----------------------------------------------------------------------------------


def percentiles_ms(seconds: Sequence[float]) -> tuple[float, float, float, float]:
    """p50, p95, p99 and max of `seconds`, in milliseconds."""
    if len(seconds) == 1:
        only = seconds[0] * 1000
        return only, only, only, only
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[94] * 1000, cuts[98] * 1000, max(seconds) * 1000


def print_report(measured: Sequence[Latency], end_to_end: Throughput) -> None:
    print()
    print(f"decision -> tool run, one run at a time ({len(measured)} runs)")
    print(f"{'':<24} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    rows = [
        ("decide -> tool ran", [sample.to_tool for sample in measured]),
        ("decide answered (HTTP)", [sample.answered for sample in measured]),
    ]
    for label, values in rows:
        p50, p95, p99, top = percentiles_ms(values)
        print(f"{label:<24} {p50:>8.2f} {p95:>8.2f} {p99:>8.2f} {top:>8.2f}")

    t = end_to_end
    print()
    print(f"approvals end to end, {t.concurrency} runs at once")
    print(f"{'runs':>6} {'seconds':>9} {'approvals/s':>12} {'status reads':>13}")
    print(f"{t.runs:>6} {t.seconds:>9.3f} {t.rate:>12,.1f} {t.polls:>13,}")
    print(f"{'per run':<24} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for label, values in (
        ("POST /runs", t.start),
        ("POST .../decide", t.decide),
        ("decided -> seen finished", t.finish),
    ):
        p50, _, p99, _ = percentiles_ms(values)
        print(f"{label:<24} {statistics.fmean(values) * 1000:>8.2f} {p50:>8.2f} {p99:>8.2f}")

    _, _, p99, _ = percentiles_ms([sample.to_tool for sample in measured])
    print()
    print(
        f"decision -> tool run p99 = {p99:.1f} ms (goal <= {LATENCY_GOAL_MS:.0f} ms:"
        f" {'met' if p99 <= LATENCY_GOAL_MS else 'missed'});"
        f" {p99 / (POLL * 1000):.2f}x the {POLL * 1000:.0f} ms poll interval"
    )
    print(
        f"approvals end to end = {t.rate:,.0f}/s with {t.concurrency} at once"
        f" (goal >= {THROUGHPUT_GOAL:.0f}/s on SQLite with 20:"
        f" {'met' if t.rate >= THROUGHPUT_GOAL else 'missed'})"
    )


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
    args = parser.parse_args(argv)
    if args.runs < 1 or args.concurrency < 1 or args.warmup < 0:
        parser.error("--runs and --concurrency must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)  # the bot imports bench.bot_agent from the working directory
    bot_agent.forget()
    measured, end_to_end, store_url = asyncio.run(measure(args))
    print(
        f"bot over HTTP: {args.runs} runs per workload after {args.warmup} warm-up;"
        f" store {store_url}; workers.poll {POLL} s"
    )
    print_report(measured, end_to_end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
