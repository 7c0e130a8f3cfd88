"""What an operator reads in `nodbot serve`'s log: a rule's decision as a decision, one line
for the store's schema at start, one when the bot stops, and no chatter at `info` (probes,
the SMTP transcript, the migrations one by one); reply tokens masked like every secret."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import aiosmtplib
import httpx
import pytest

from nodbot.bot.logs import TextFormatter
from nodbot.core.sqlstore import head_revision
from tests.bot.processes import nodbot_serve
from tests.bot.webhook_receiver import SECRET as WEBHOOK_SECRET
from tests.bot.webhook_receiver import receiving
from tests.support import eventually

TOKEN = "token-of-agent-00000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WEB_SECRET = "web-secret-for-tests-0000"
REPLY_TOKEN = "abcdefghijklmnopqrstuvwxyz234567abcdefghijklm"  # 45 base32 characters
MIGRATIONS = len(
    list((Path(__file__).parents[2] / "core/sqlstore/migrations/versions").glob("[0-9]*.py"))
)


def write_config(tmp_path: Path, *, level: str = "info", rest: str = "") -> Path:
    """A bot whose first rule approves refunds under 10 and whose second has a lead review
    the rest; its token starts runs and asks about calls (`POST /approvals`)."""
    path = tmp_path / "nodbot.yml"
    scopes = "[runs:write, approvals:read, approvals:request]"
    path.write_text(
        f"log: {{level: {level}, format: text}}\n"
        f'store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}\n'
        "server: {host: 127.0.0.1, port: 0}\n"
        "workers: {poll: 0.1}\n"
        f"web: {{secret: {WEB_SECRET}}}\n"
        f"api:\n  tokens:\n    - {{name: agent, token: {TOKEN}, scopes: {scopes}}}\n"
        "agents:\n  ledger: tests.bot.ledger_agent:agent\n"
        "rules:\n"
        "  - {tool: refund, when: {lt: {amount: 10}}, decision: approve}\n"
        "  - {tool: refund, reviewers: [lead@example.com]}\n"
        f"{rest}"
    )
    return path


def lines_of(config: Path) -> list[str]:
    return config.with_suffix(".log").read_text().splitlines()


def with_message(lines: list[str], message: str) -> list[str]:
    """The text lines whose message (after time, level and logger) starts with `message`."""
    return [line for line in lines if line.split(" ", 3)[3].startswith(message)]


async def test_what_an_operator_reads_at_info(tmp_path: Path) -> None:
    async with receiving() as receiver:
        hook = f"webhooks: [{{name: ops, url: '{receiver.url}', secret: {WEBHOOK_SECRET}}}]\n"
        config = write_config(tmp_path, rest=hook)
        async with (
            nodbot_serve(config) as bot,
            httpx.AsyncClient(base_url=bot.url, headers=HEADERS) as client,
        ):
            for probe in ("/healthz", "/readyz", "/metrics"):
                assert (await client.get(probe)).status_code == 200
            body = {
                "tool": "refund",
                "arguments": {"order_id": "o-2", "amount": 3},
                "run_id": "run_ext",
                "call_id": "call_x",
            }
            asked = await client.post("/approvals", json=body)
            assert asked.status_code == 201, asked.text
            approval_id = asked.json()["approval_id"]

            async def decision_logged() -> bool:
                return bool(with_message(lines_of(config), "decision"))

            await eventually(decision_logged, "the rule's decision is logged")
    lines = lines_of(config)
    # The store's schema: one line, however many migrations ran; none of alembic's own.
    assert with_message(lines, "store migrated") == [
        line for line in lines if "nodbot.core.sqlstore.migrate" in line
    ]
    [migrated] = with_message(lines, "store migrated")
    assert f"store migrated to revision {head_revision()} ({MIGRATIONS} migrations applied)" in (
        migrated
    )
    assert not [line for line in lines if " alembic." in line]
    # The rule decided: a decision, not a review opened.
    [decision] = with_message(lines, "decision")
    assert " info nodbot.bot.outbox decision " in decision
    for field in (
        f"approval_id={approval_id}",
        "run_id=run_ext",
        "tool=refund",
        "call_id=call_x",
        "action=approve",
        "decided_by=nodbot:rules.0",
        "channel=rules",
    ):
        assert field in decision.split(), (field, decision)
    assert not with_message(lines, "review opened")
    # Probes are not at info; the other requests are.
    requests = with_message(lines, "request")
    assert any("path=/approvals" in line for line in requests)
    assert not [line for line in requests if re.search(r"path=/(healthz|readyz|metrics) ", line)]
    # The last line: the bot stopped, and why (nodbot_serve ends it with SIGINT).
    assert lines[-1].split(" ", 1)[1] == "info nodbot.bot.serve nodbot stopped reason=SIGINT"

    async with nodbot_serve(config):
        pass  # the same store again: nothing to migrate
    [schema] = [line for line in lines_of(config) if "nodbot.core.sqlstore.migrate" in line]
    assert f" store up to date at revision {head_revision()} store=" in schema


async def test_a_runs_call_decided_by_a_rule_is_logged_as_a_decision(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    async with (
        nodbot_serve(config) as bot,
        httpx.AsyncClient(base_url=bot.url, headers=HEADERS) as client,
    ):
        started = await client.post("/runs", json={"agent": "ledger", "input": "refund o-1 5"})
        assert started.json()["status"] == "finished", started.text
        run_id = started.json()["run_id"]
    [decision] = with_message(lines_of(config), "decision")
    for field in (f"run_id={run_id}", "tool=refund", "decided_by=nodbot:rules.0"):
        assert field in decision.split(), (field, decision)


EMAIL = """\
email:
  from: nodbot@example.com
  reply_to: approvals@example.com
  smtp: {{host: 127.0.0.1, port: 9, tls: none}}
  require_authenticated_sender: false
  inbound: {{listen: "127.0.0.1:0"}}
"""


async def hand_over(config: Path) -> None:
    """Hand the bot's SMTP listener a message for a reply address with a token in it."""
    port = None

    async def listening() -> bool:
        nonlocal port
        found = re.search(r"listen=127\.0\.0\.1:(\d+)", config.with_suffix(".log").read_text())
        port = int(found.group(1)) if found else None
        return port is not None

    await eventually(listening, "the email listener is logged")
    assert port is not None
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=15) as smtp:
        await smtp.mail("lead@example.com")
        await smtp.rcpt(f"approvals+{REPLY_TOKEN}@example.com")
        await smtp.data(b"From: lead@example.com\r\nSubject: Re: x\r\n\r\napprove\r\n")


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_the_smtp_transcript_is_debug_and_reply_tokens_are_masked(
    tmp_path: Path, level: str
) -> None:
    config = write_config(tmp_path, level=level, rest=EMAIL.format())
    async with nodbot_serve(config) as bot:
        await hand_over(config)
        async with httpx.AsyncClient(base_url=bot.url) as client:
            assert (await client.get("/healthz")).status_code == 200

        async def handled() -> bool:
            # The transcript's lines are written before the listener answers; the probe's
            # after its answer.
            text = config.with_suffix(".log").read_text()
            return level == "info" or ("path=/healthz" in text and "RCPT TO" in text)

        await eventually(handled, "the reply and the probe are logged")
    text = config.with_suffix(".log").read_text()
    assert REPLY_TOKEN not in text and REPLY_TOKEN.upper() not in text
    transcript = [line for line in text.splitlines() if " mail.log " in line]
    if level == "info":
        assert transcript == []
    else:
        assert any("approvals+[secret]@example.com" in line for line in transcript), transcript
        assert all(" debug mail.log " in line for line in transcript), transcript
        [probe] = [line for line in text.splitlines() if "path=/healthz" in line]
        assert " debug nodbot.bot.http.access request method=GET path=/healthz " in probe


def test_a_reply_token_is_masked_in_any_line() -> None:
    record = logging.LogRecord(
        "nodbot.test",
        logging.INFO,
        __file__,
        1,
        "sent to %s as %s",
        (f"approvals+{REPLY_TOKEN.upper()}@example.com", f"<nodbot.7.{REPLY_TOKEN}@example.com>"),
        None,
    )
    line = TextFormatter().format(record)
    assert line.endswith(
        " sent to approvals+[secret]@example.com as <nodbot.7.[secret]@example.com>"
    ), line
