"""The email channel: how soon an emailed reply runs the tool, and how fast reviews are sent.

The bot (`bot.serve.serving`) runs in this process on a SQLite store, emailing a real SMTP
server (aiosmtpd on loopback, in this process too: `mail_server()` of the tests) and taking
replies on its own SMTP listener (`email.inbound.listen`, port 0), with a rule sending every
refund of `bench/bot_agent.py` to one reviewer by email. Two figures, each measured in
`--rounds` rounds and reported as the median of the rounds:

1. Reply -> tool run, one run at a time: the refund's review email reaches the SMTP server,
   the reviewer's `approve` reply is written as a mail client writes it and authenticated by
   the trusted server (`reply()` of the tests), and handed to the bot's listener as a mail
   server relays it. An SMTP connection is opened and greeted before the clock starts (a
   relaying mail server keeps one; connecting is the transport's cost, not the decision's):
   from just before MAIL FROM to the moment the tool runs. p50 and p99 (GOALS.md: decision
   -> tool ran, p99 <= 100 ms), with the listener's answer to DATA beside it (given only once
   the decision is recorded). The floor: the same bytes in a bare SMTP transaction to the
   aiosmtpd sink, the same way, alternating with the bot's, reply by reply.
2. Review emails sent per second: `--emails` runs started 20 at a time; from the first start
   to the last review email received by the SMTP server; with the CPU seconds of this process
   (bot, SMTP server and client alike) per email, steadier than a rate on a shared machine.

    .venv/bin/python bench/mail.py --runs 100 --emails 200 --rounds 3

It prints figures; it is not a test. It reaches only loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    # The repository's root instead of bench/, so that `bench.bot_agent` is found.
    sys.path[0] = str(ROOT)

from email.message import EmailMessage  # noqa: E402
from email.utils import make_msgid  # noqa: E402

import aiosmtplib  # noqa: E402
import httpx  # noqa: E402

from bench import bot_agent  # noqa: E402
from nodbot.bot.serve import serving  # noqa: E402
from tests.bot.test_email_inbound import reply  # noqa: E402
from tests.bot.test_email_outbound import MailServer, mail_server  # noqa: E402

GOAL_MS = 100.0
TOKEN = "bench-email-token-000000"
LEAD = "lead@example.com"
FLOOR_RECIPIENT = "floor@example.com"
CONCURRENCY = 20
WAIT = 30.0

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.5}}
web: {{secret: bench-email-web-secret-0001-of-32-chars}}
api:
  tokens:
    - {{name: bench, token: {token}, scopes: [runs:write, approvals:read]}}
agents:
  bench: bench.bot_agent:agent
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: {port}, tls: none, timeout: 5}}
  inbound: {{listen: "127.0.0.1:0", protocol: smtp}}
  trusted_authserv_id: mx.example.com
rules:
  - tool: refund
    reviewers: [{lead}]
"""


@dataclass
class Round:
    """What one round measured, in seconds."""

    to_tool: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    emails_per_second: float = 0.0
    cpu_per_email: float = 0.0


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen in {WAIT:.0f} s"
        await asyncio.sleep(0.0005)


async def arrived(mail: MailServer, done: Callable[[], bool], what: str) -> None:
    """Until the SMTP server has received what `done` waits for."""
    try:
        async with asyncio.timeout(WAIT), mail.changed:
            await mail.changed.wait_for(done)
    except TimeoutError:
        raise AssertionError(f"{what} did not arrive in {WAIT:.0f} s") from None


def requests_since(mail: MailServer, before: int) -> list[EmailMessage]:
    """Review emails (not outcomes or answers, which are threaded) the lead was sent."""
    return [
        r.message
        for r in mail.received[before:]
        if r.recipients == [LEAD] and r.message["In-Reply-To"] is None
    ]


def requested(mail: MailServer, before: int, count: int) -> bool:
    """Whether `count` review emails have been received since `before`."""
    return len(requests_since(mail, before)) >= count


def threaded(mail: MailServer, before: int, message_ids: Sequence[str], count: int) -> bool:
    """Whether `count` messages since `before` reply to one of `message_ids`."""
    found = sum(1 for r in mail.received[before:] if r.message["In-Reply-To"] in message_ids)
    return found >= count


async def start(client: httpx.AsyncClient, order_id: str) -> None:
    body = {"agent": "bench", "input": f"refund {order_id} 500"}
    answer = await client.post("/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 201, answer.text


async def transaction(port: int, raw: bytes, sender: str, to: str) -> tuple[float, float, str]:
    """MAIL, RCPT and DATA on a connection opened and greeted beforehand: when MAIL was sent
    and when DATA was answered (`time.perf_counter()`), and the answer."""
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=WAIT) as smtp:
        await smtp.ehlo()
        sent = time.perf_counter()
        await smtp.mail(sender)
        await smtp.rcpt(to)
        answer = await smtp.data(raw)
        answered = time.perf_counter()
    return sent, answered, f"{answer.code} {answer.message}"


async def reply_latencies(
    client: httpx.AsyncClient, mail: MailServer, bot_port: int, runs: int, prefix: str
) -> Round:
    """Per run: the bot's reply -> tool run and DATA answer, then the floor's transaction."""
    measured = Round()
    for number in range(runs):
        order_id = f"{prefix}-{number}"
        before = len(mail.received)
        await start(client, order_id)
        await arrived(mail, partial(requested, mail, before, 1), "the review email")
        [request] = requests_since(mail, before)
        reply_id = make_msgid(domain="mail.example.com")
        raw = reply(request, sender=LEAD, message_id=reply_id)
        sent, answered, answer = await transaction(bot_port, raw, LEAD, str(request["Reply-To"]))
        measured.answered.append(answered - sent)
        assert answer == "250 2.0.0 decided", f"the listener answered {answer!r}"
        await until(partial(operator.contains, bot_agent.RAN_AT, order_id), "the tool's run")
        measured.to_tool.append(bot_agent.RAN_AT[order_id] - sent)
        # The outcome (threaded to the request) and the answer (to the reply) follow; let
        # them pass before the floor and the next run.
        followed = (str(request["Message-ID"]), reply_id)
        await arrived(mail, partial(threaded, mail, before, followed, 2), "the follow-ups")
        sent, answered, answer = await transaction(mail.port, raw, LEAD, FLOOR_RECIPIENT)
        measured.floor.append(answered - sent)
        assert answer.startswith("250"), f"the sink answered {answer!r}"
    return measured


async def sending_rate(
    client: httpx.AsyncClient, mail: MailServer, emails: int, prefix: str
) -> tuple[float, float]:
    """Review emails sent per second, `emails` runs started 20 at a time, and CPU seconds of
    this process per email."""
    before = len(mail.received)
    numbers = iter(range(emails))

    async def starter() -> None:
        for number in numbers:
            await start(client, f"{prefix}-{number}")

    cpu = time.process_time()
    began = time.perf_counter()
    await asyncio.gather(*(starter() for _ in range(CONCURRENCY)))
    # Nothing else is emailed meanwhile (nothing is decided): counting what arrived is enough
    # while the clock runs, and cheaper than reading headers; what it was is checked after.
    await arrived(mail, lambda: len(mail.received) >= before + emails, "every review email")
    seconds = time.perf_counter() - began
    cpu = time.process_time() - cpu
    assert len(mail.received) == before + emails, "a review was emailed twice"
    assert len(requests_since(mail, before)) == emails, "something else was emailed"
    return emails / seconds, cpu / emails


async def measure(args: argparse.Namespace) -> list[Round]:
    bot_agent.forget()
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="nodbot-bench-email-") as name:
        async with mail_server() as mail:
            path = Path(name) / "nodbot.yml"
            path.write_text(
                CONFIG.format(db=Path(name) / "nodbot.db", token=TOKEN, port=mail.port, lead=LEAD)
            )
            async with (
                serving(str(path)) as served,
                httpx.AsyncClient(base_url=served.url, timeout=WAIT, trust_env=False) as client,
            ):
                assert served.mail_port is not None, "the bot's SMTP listener is not bound"
                await reply_latencies(client, mail, served.mail_port, 3, "warm")
                for number in range(args.rounds):
                    measured = await reply_latencies(
                        client, mail, served.mail_port, args.runs, f"reply-{number}"
                    )
                    measured.emails_per_second, measured.cpu_per_email = await sending_rate(
                        client, mail, args.emails, f"email-{number}"
                    )
                    rounds.append(measured)
    twice = {order: n for order, n in bot_agent.RUNS.items() if n != 1}
    assert not twice, f"refunds that ran more than once: {twice}"
    return rounds


def percentiles_ms(values: Sequence[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


def median_percentiles_ms(
    rounds: Sequence[Round], pick: Callable[[Round], list[float]]
) -> tuple[float, float]:
    """The medians across rounds of each round's p50 and p99."""
    cuts = [percentiles_ms(pick(measured)) for measured in rounds]
    return statistics.median(c[0] for c in cuts), statistics.median(c[1] for c in cuts)


def report(args: argparse.Namespace, rounds: Sequence[Round]) -> None:
    print(
        f"email channel over SMTP: {args.rounds} rounds of {args.runs} replies and "
        f"{args.emails} review emails (SMTP server: aiosmtpd on loopback)"
    )
    print(f"{'medians of rounds':<34} {'p50 ms':>8} {'p99 ms':>8}")
    lines: tuple[tuple[str, Callable[[Round], list[float]]], ...] = (
        ("reply -> tool ran", lambda r: r.to_tool),
        ("reply answered (DATA, bot)", lambda r: r.answered),
        ("floor: same bytes to the sink", lambda r: r.floor),
    )
    for label, pick in lines:
        p50, p99 = median_percentiles_ms(rounds, pick)
        print(f"{label:<34} {p50:>8.2f} {p99:>8.2f}")
    _, p99 = median_percentiles_ms(rounds, lambda r: r.to_tool)
    verdict = "met" if p99 <= GOAL_MS else "missed"
    print(f"reply -> tool run p99 = {p99:.1f} ms (goal <= {GOAL_MS:.0f} ms: {verdict})")
    ratio = statistics.median(
        statistics.median(r.to_tool) / statistics.median(r.floor) for r in rounds
    )
    print(f"reply -> tool run p50 = {ratio:.1f}x the floor's transaction (median of rounds)")
    rate = statistics.median(r.emails_per_second for r in rounds)
    cpu = statistics.median(r.cpu_per_email for r in rounds)
    each = ", ".join(f"{r.emails_per_second:,.0f}" for r in rounds)
    print(
        f"review emails sent = {rate:,.0f}/s (rounds: {each}), "
        f"CPU {cpu * 1000:.2f} ms per email (this process: bot, SMTP server and client)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100, help="replies measured (default 100)")
    parser.add_argument("--emails", type=int, default=200, help="reviews emailed (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    args = parser.parse_args(argv)
    if args.runs < 2 or args.emails < 1 or args.rounds < 1:
        parser.error("--runs must be >= 2, --emails and --rounds >= 1")
    os.chdir(ROOT)  # the bot imports bench.bot_agent from the working directory
    report(args, asyncio.run(measure(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
