"""Limits before work: bodies over their route's limit, unsigned Slack requests, long reasons
and hostile JSON are refused before anything is parsed or recorded, and the bot keeps
answering. The bot is served in-process (`bot.serve.serving`) on a loopback port, with a
webhook receiver and the Slack fake; big bodies are streamed over a raw socket from a
generator, so the test never holds them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from nodbot.bot.http.limits import DECIDE_BODY, SLACK_BODY
from nodbot.bot.serve import Served, serving
from tests.bot.webhook_receiver import SECRET as RECEIVER_SECRET
from tests.bot.webhook_receiver import Receiver, receiving
from tests.fakes.slack import slack_fake

ROOT = Path(__file__).resolve().parents[2]
STARTER = {"Authorization": "Bearer token-of-starter-000"}
LEAD = {"Authorization": "Bearer token-of-lead-000000"}
MB = 1024 * 1024

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - {{name: starter, token: token-of-starter-000, scopes: [runs:write, approvals:read]}}
    - name: lead@example.com
      token: token-of-lead-000000
      scopes: [approvals:read, approvals:decide]
agents:
  support: examples.support_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: refund
    reviewers: [lead@example.com]
    editable: [amount, order_id]
webhooks:
  - {{name: ops, url: "{hook}", secret: {hook_secret}}}
"""


@dataclass
class Bot:
    served: Served
    client: httpx.AsyncClient
    receiver: Receiver

    async def pending(self) -> str:
        """A new run's refund, waiting for review (its webhook received)."""
        run = await self.client.post(
            "/runs", json={"agent": "support", "input": "Refund order A-1001"}, headers=STARTER
        )
        assert run.status_code == 201, run.text
        [pending] = run.json()["pending"]
        approval_id: str = pending["approval_id"]
        await self.receiver.wait_for(len(self.receiver.received) + 1)
        return approval_id

    async def alive(self) -> None:
        health = await self.client.get("/healthz")
        assert (health.status_code, health.json()["status"]) == (200, "ok")


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    monkeypatch.chdir(ROOT)
    async with slack_fake() as slack, receiving() as receiver:
        slack.add_user("lead", email="lead@example.com")
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
                hook=receiver.url,
                hook_secret=RECEIVER_SECRET,
            )
        )
        async with (
            serving(str(path)) as served,
            httpx.AsyncClient(base_url=served.url, timeout=30) as client,
        ):
            yield Bot(served, client, receiver)


def rss() -> int:
    """This process's resident memory, bytes (the bot serves in this process)."""
    status = Path("/proc/self/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None
    return int(found.group(1)) * 1024


def megabytes(total: int) -> Iterator[bytes]:
    chunk = b"x" * MB  # the same megabyte, sent `total` times
    for _ in range(total):
        yield chunk


async def post_streamed(
    url: str,
    path: str,
    chunks: Iterator[bytes],
    headers: dict[str, str],
    *,
    length: int | None = None,
) -> tuple[int, bytes, int]:
    """POST `chunks` to `path` (chunked, or with a Content-Length of `length`), stopping
    once the answer arrives; its status, body, and how many bytes were sent."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", framing]
    head += [f"{name}: {value}" for name, value in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    sent, answer = 0, b""
    try:
        for chunk in chunks:
            with contextlib.suppress(TimeoutError):
                answer += await asyncio.wait_for(reader.read(65536), 0.01)
            if answer:
                break
            writer.write(chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent += len(chunk)
        while b"\r\n\r\n" not in answer or not _complete(answer):
            more = await asyncio.wait_for(reader.read(65536), 10)
            if not more:
                break
            answer += more
    except (ConnectionResetError, BrokenPipeError):
        pass  # the bot closed the connection once it had answered
    finally:
        writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await writer.wait_closed()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 "), answer[:200]
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2], sent


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    return length is None or len(body) >= int(length.group(1))


async def test_an_unsigned_100_mb_body_to_slack_events_is_401_and_never_read(bot: Bot) -> None:
    before = rss()
    status, body, sent = await post_streamed(
        bot.served.url,
        "/slack/events",
        megabytes(100),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 401, body
    assert b"not signed by Slack" in body
    assert sent < 10 * MB
    assert rss() - before < 20 * MB
    await bot.alive()


async def test_a_100_mb_body_with_a_forged_signature_is_413_after_1_mb(bot: Bot) -> None:
    before = rss()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": "1700000000",
        "X-Slack-Signature": "v0=" + "0" * 64,
    }
    status, body, sent = await post_streamed(
        bot.served.url, "/slack/events", megabytes(100), headers
    )
    assert status == 413, body
    assert f"larger than {SLACK_BODY} bytes".encode() in body
    assert sent < 10 * MB
    assert rss() - before < 20 * MB
    await bot.alive()


async def test_a_body_declared_too_large_is_413_before_it_is_sent(bot: Bot) -> None:
    approval_id = await bot.pending()
    host, port = bot.served.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /approvals/{approval_id}/decide HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {LEAD['Authorization']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {100 * MB}\r\n\r\n".encode()
    )
    answer = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert (await bot.served.service.store.get(approval_id)).decision is None


async def test_a_10_mb_reason_is_refused_and_nothing_is_recorded_or_sent(bot: Bot) -> None:
    approval_id = await bot.pending()
    decide = f"/approvals/{approval_id}/decide"
    start, end = b'{"action": "deny", "reason": "', b'"}'
    reason = iter([start, *megabytes(10), end])
    headers = {**LEAD, "Content-Type": "application/json"}
    size = len(start) + 10 * MB + len(end)
    status, body, _ = await post_streamed(bot.served.url, decide, reason, headers, length=size)
    assert status == 413, body
    assert json.loads(body)["details"] == {"limit": DECIDE_BODY}
    long = await bot.client.post(
        decide, json={"action": "deny", "reason": "x" * 2001}, headers=LEAD
    )
    assert long.status_code == 422
    [error] = long.json()["details"]["errors"]
    assert error["field"] == "reason" and "2000" in error["message"]
    assert (await bot.served.service.store.get(approval_id)).decision is None
    kinds = [event.kind for event in await bot.served.service.store.events(approval_id)]
    assert "voted" not in kinds and "decided" not in kinds
    # The next decision is the first the webhook hears of: nothing was sent for the others.
    ok = await bot.client.post(decide, json={"action": "deny", "reason": "no"}, headers=LEAD)
    assert ok.status_code == 200, ok.text
    await bot.receiver.wait_for(2)
    assert [r.event for r in bot.receiver.received] == ["approval.pending", "approval.decided"]
    assert bot.receiver.received[1].body["approval"]["decision"]["reason"] == "no"


async def test_a_long_string_in_an_edit_is_422_naming_the_argument(bot: Bot) -> None:
    approval_id = await bot.pending()
    edit = {"action": "edit", "arguments": {"order_id": "A" * 10_001}}
    answer = await bot.client.post(f"/approvals/{approval_id}/decide", json=edit, headers=LEAD)
    assert answer.status_code == 422
    [error] = answer.json()["details"]["errors"]
    assert error["field"] == "arguments" and "arguments.order_id" in error["message"]
    assert (await bot.served.service.store.get(approval_id)).decision is None


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("[" * 30_000 + "]" * 30_000, "nests deeper than 32 levels"),
        ('{"action": "edit", "arguments": {"a": ' + "[" * 40 + "]" * 40 + "}}", "32 levels"),
        ('{"action": "deny", "reason": "\\ud800"}', "lone surrogate"),
        ('{"action": "edit", "arguments": {"amount": NaN}}', "NaN is not a JSON number"),
        ('{"action": "edit", "arguments": {"amount": -Infinity}}', "-Infinity"),
        ('{"action": "deny", "action": "approve"}', "the key 'action' is given twice"),
        (b'{"action": "deny", "reason": "\xff"}', "not valid UTF-8"),
        ('{"action": ', "not valid JSON"),
    ],
    ids=["deep", "deeper-than-32", "surrogate", "nan", "infinity", "duplicate", "utf8", "cut"],
)
async def test_hostile_json_is_422_and_the_bot_keeps_answering(
    bot: Bot, body: str | bytes, said: str
) -> None:
    approval_id = await bot.pending()
    answer = await bot.client.post(
        f"/approvals/{approval_id}/decide",
        content=body,
        headers={**LEAD, "Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert said in answer.json()["error"]
    assert (await bot.served.service.store.get(approval_id)).decision is None
    await bot.alive()


async def test_a_200_000_deep_run_body_is_refused_and_starts_nothing(bot: Bot) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    for body in (deep, '{"agent": "support", "input": ' + deep[:100_000] + deep[-100_000:] + "}"):
        answer = await bot.client.post(
            "/runs", content=body, headers={**STARTER, "Content-Type": "application/json"}
        )
        assert answer.status_code in (413, 422), answer.text
    lone = '{"agent": "support", "input": "refund \\udfff"}'
    answer = await bot.client.post(
        "/runs", content=lone, headers={**STARTER, "Content-Type": "application/json"}
    )
    assert answer.status_code == 422 and "lone surrogate" in answer.json()["error"]
    assert bot.served.service.counters["runs_started"] == 0
    await bot.alive()
