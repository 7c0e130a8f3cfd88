"""The Slack channel: how soon a click runs the tool, and how fast reviews are posted.

The bot (`bot.serve.serving`) runs in this process on a SQLite store, with the Slack channel
in HTTP mode pointed at the local fake of Slack's Web API from the tests (`tests/fakes/
slack.py`, real HTTP on loopback, in this process too) and a rule sending every refund of
`bench/bot_agent.py` to one reviewer by direct message. Two figures:

1. Click -> tool run, one run at a time: the refund's message is posted, then an Approve click
   is sent to `/slack/events` as Slack sends it (form-encoded, signed); from just before the
   click is sent to the moment the tool runs. p50 and p99 (GOALS.md: decision -> resumed,
   p99 <= 100 ms). The click's own HTTP answer is shown beside it.
2. Posts per second: `--posts` runs started 20 at a time; from the first start to the last
   review posted in Slack.

    .venv/bin/python bench/slack.py --runs 100 --posts 200

It prints figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import httpx  # noqa: E402

from bench import bot_agent  # noqa: E402
from nodbot.bot.serve import serving  # noqa: E402
from tests.fakes.slack import (  # noqa: E402
    Message,
    SlackFake,
    User,
    interactive_request,
    slack_fake,
)

GOAL_MS = 100.0
TOKEN = "bench-slack-token-000000"
WAIT = 30.0

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.5}}
api:
  tokens:
    - {{name: bench, token: {token}, scopes: [runs:write, approvals:read]}}
agents:
  bench: bench.bot_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [{lead}]
"""


async def until(check: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not (check() if callable(check) else check):
        assert time.monotonic() < deadline, f"{what} did not happen in {WAIT:.0f} s"
        await asyncio.sleep(0.0005)


async def start(client: httpx.AsyncClient, order_id: str) -> None:
    body = {"agent": "bench", "input": f"refund {order_id} 500"}
    answer = await client.post("/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 201, answer.text


def reviews(slack: SlackFake, lead: User) -> list[Message]:
    """The reviews posted in the lead's DM: its top-level messages (a finished run's answer
    is a reply in its review's thread, and may come after the next review)."""
    return [message for message in slack.messages(lead) if message.thread_ts is None]


async def click_latencies(
    client: httpx.AsyncClient, slack: SlackFake, lead: User, runs: int, prefix: str
) -> tuple[list[float], list[float]]:
    """Per run: seconds from the click to the tool's run, and to the click's HTTP answer."""
    to_tool: list[float] = []
    answered: list[float] = []
    for number in range(runs):
        order_id = f"{prefix}-{number}"
        before = len(reviews(slack, lead))
        await start(client, order_id)
        await until(lambda before=before: len(reviews(slack, lead)) > before, "the post")
        message = reviews(slack, lead)[-1]
        body, headers = interactive_request(
            slack.click(message, "nodbot.approve", lead), slack.signing_secret
        )
        sent = time.perf_counter()
        answer = await client.post("/slack/events", content=body, headers=headers)
        answered.append(time.perf_counter() - sent)
        assert answer.status_code == 200, answer.text
        await until(lambda order_id=order_id: order_id in bot_agent.RAN_AT, "the tool's run")
        to_tool.append(bot_agent.RAN_AT[order_id] - sent)
        await until(lambda message=message: message.updates, "the update")
    return to_tool, answered


async def posting_rate(
    client: httpx.AsyncClient, slack: SlackFake, lead: User, posts: int
) -> float:
    """Reviews posted per second, `posts` runs started 20 at a time."""
    before = len(reviews(slack, lead))
    numbers = iter(range(posts))

    async def starter() -> None:
        for number in numbers:
            await start(client, f"post-{number}")

    began = time.perf_counter()
    await asyncio.gather(*(starter() for _ in range(20)))
    await until(lambda: len(reviews(slack, lead)) >= before + posts, "every post")
    seconds = time.perf_counter() - began
    assert len(reviews(slack, lead)) == before + posts, "a review was posted twice"
    return posts / seconds


async def measure(args: argparse.Namespace) -> tuple[list[float], list[float], float]:
    bot_agent.forget()
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-slack-") as name:
        async with slack_fake() as slack:
            lead = slack.add_user("lead", email="lead@example.com")
            path = Path(name) / "nodbot.yml"
            path.write_text(
                CONFIG.format(
                    db=Path(name) / "nodbot.db",
                    token=TOKEN,
                    bot_token=slack.bot_token,
                    signing_secret=slack.signing_secret,
                    api_url=slack.api_url,
                    lead=lead.id,
                )
            )
            async with (
                serving(str(path)) as served,
                httpx.AsyncClient(base_url=served.url, timeout=WAIT, trust_env=False) as client,
            ):
                await click_latencies(client, slack, lead, 3, "warm")
                to_tool, answered = await click_latencies(client, slack, lead, args.runs, "click")
                rate = await posting_rate(client, slack, lead, args.posts)
    twice = {order: n for order, n in bot_agent.RUNS.items() if n != 1}
    assert not twice, f"refunds that ran more than once: {twice}"
    return to_tool, answered, rate


def percentiles_ms(values: Sequence[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100, help="clicks measured (default 100)")
    parser.add_argument("--posts", type=int, default=200, help="reviews posted (default 200)")
    args = parser.parse_args(argv)
    if args.runs < 2 or args.posts < 1:
        parser.error("--runs must be >= 2 and --posts >= 1")
    os.chdir(ROOT)  # the bot imports bench.bot_agent from the working directory
    to_tool, answered, rate = asyncio.run(measure(args))
    print(f"slack channel over HTTP: {args.runs} clicks, {args.posts} posts (Slack: local fake)")
    print(f"{'':<24} {'p50 ms':>8} {'p99 ms':>8}")
    for label, values in (("click -> tool ran", to_tool), ("click answered (HTTP)", answered)):
        p50, p99 = percentiles_ms(values)
        print(f"{label:<24} {p50:>8.2f} {p99:>8.2f}")
    _, p99 = percentiles_ms(to_tool)
    verdict = "met" if p99 <= GOAL_MS else "missed"
    print(f"click -> tool run p99 = {p99:.1f} ms (goal <= {GOAL_MS:.0f} ms: {verdict})")
    print(f"reviews posted = {rate:,.0f}/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
