"""The bot, on this machine: `make demo`.

Starts nodbot on a SQLite file with the example support agent, starts a run whose refund of
120.0 pauses for review, and prints a link that signs you in to the web inbox, where you
approve, edit or deny it (or the curl commands that do the same over the HTTP API). The
review is also emailed: a local SMTP server stands in for the reviewer's mailbox and writes
each message it gets to the demo's folder, and the demo writes a reply that approves, for
curl to hand to the bot's own SMTP listener. When you have decided, it shows the run finish,
and keeps serving (the inbox shows the decision and the tool's result) until Ctrl-C, when it
says it stopped.

    python examples/bot_demo.py                  # you decide, in the inbox, with curl or by email
    python examples/bot_demo.py --auto edit      # it decides for you (approve, edit, deny over
                                                 # HTTP, or email: a reply that approves), and
                                                 # ends once the run has finished
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import tempfile
from collections.abc import AsyncIterator
from email import message_from_bytes, policy
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any

import aiosmtplib
import httpx
from aiosmtpd.smtp import SMTP, Envelope, Session

from nodbot.bot.serve import Served, serving

ROOT = Path(__file__).resolve().parents[1]
REVIEWER = "demo-lead@example.com"
EMAIL_WAIT = 30.0
"""Seconds the demo waits for the review's email before saying it did not come."""

CONFIG = """\
store: {{url: "sqlite:///{folder}/nodbot.db"}}
server: {{host: 127.0.0.1, port: {port}}}
web:
  secret: ${{NODBOT_DEMO_WEB_SECRET}}
api:
  tokens:
    - name: {reviewer}
      token: ${{NODBOT_DEMO_TOKEN}}
      scopes: [runs:write, approvals:read, approvals:decide]
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    when: {{gt: {{amount: 100}}}}
    description: Refunds over 100 need a support lead.
    reviewers: [{reviewer}]  # an email address: the email channel emails it the review
    allow_self_approval: true
    editable: [amount]
email:
  from: nodbot@demo.example.com
  reply_to: approvals@demo.example.com
  smtp: {{host: 127.0.0.1, port: {smtp_port}, tls: none, timeout: 5}}
  inbound: {{listen: "127.0.0.1:0", protocol: smtp}}
  require_authenticated_sender: false  # the demo's loopback listener: nobody else can reach it
"""

ANSWERS: dict[str, dict[str, Any]] = {
    "approve": {"action": "approve"},
    "edit": {"action": "edit", "arguments": {"amount": 100.0}},
    "deny": {"action": "deny", "reason": "refund policy: at most 100 without a receipt"},
}
BY_EMAIL = "email"
"""The `--auto` choice that approves by replying to the review's email."""


class MailSink:
    """A local SMTP server standing in for the reviewer's mailbox: each message it is sent is
    written to `folder` as 001.eml, 002.eml, ... (the raw bytes, as sent)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(exist_ok=True)
        self.folder = folder
        self.received: list[Path] = []
        self.port = 0
        self._arrived = asyncio.Event()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content
        assert isinstance(raw, bytes)  # decode_data is off
        path = self.folder / f"{len(self.received) + 1:03d}.eml"
        path.write_bytes(raw)
        self.received.append(path)
        self._arrived.set()
        return "250 OK"

    async def first(self) -> Path:
        """The first message's file, once it has come. Raises `TimeoutError` after
        `EMAIL_WAIT` seconds without one."""
        async with asyncio.timeout(EMAIL_WAIT):
            await self._arrived.wait()
        return self.received[0]


@contextlib.asynccontextmanager
async def mail_sink(folder: Path) -> AsyncIterator[MailSink]:
    """A `MailSink` on a free loopback port, in this event loop, until the block ends."""
    sink = MailSink(folder)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(sink, hostname="localhost"), "127.0.0.1", 0)
    sink.port = server.sockets[0].getsockname()[1]
    try:
        yield sink
    finally:
        server.close()
        await server.wait_closed()


def read_email(path: Path) -> EmailMessage:
    parsed = message_from_bytes(path.read_bytes(), policy=policy.default)
    assert isinstance(parsed, EmailMessage)  # policy.default makes EmailMessages
    return parsed


def reply(request: EmailMessage, body: str) -> EmailMessage:
    """The reviewer's reply to `request`: to its Reply-To, in its thread, saying `body`."""
    message = EmailMessage()
    message["From"] = REVIEWER
    message["To"] = request["Reply-To"]
    message["Subject"] = f"Re: {request['Subject']}"
    message["In-Reply-To"] = request["Message-ID"]
    message["References"] = request["Message-ID"]
    message["Message-ID"] = make_msgid(domain=REVIEWER.rpartition("@")[2])
    message["Date"] = formatdate(localtime=True)
    message.set_content(body)
    return message


def instructions(url: str, token: str, approval_id: str, link: str) -> str:
    decide = (
        f"curl -s -X POST {url}/approvals/{approval_id}/decide -H 'Authorization: Bearer {token}'"
    )
    return "\n".join(
        [
            f"The refund waits for you. Open the inbox (signed in as {REVIEWER}) to decide it:",
            f"  {link}",
            "Or decide it over the HTTP API with one of:",
            f'  approve: {decide} -d \'{{"action": "approve"}}\'',
            f'  edit:    {decide} -d \'{{"action": "edit", "arguments": {{"amount": 100}}}}\'',
            f'  deny:    {decide} -d \'{{"action": "deny", "reason": "not without a receipt"}}\'',
            f"See it:    curl -s {url}/approvals/{approval_id} -H 'Authorization: Bearer {token}'",
        ]
    )


def email_instructions(mail_port: int, rcpt: str, reply_file: Path) -> str:
    return "\n".join(
        [
            f"Or reply by email: {reply_file.name} approves (make its last line"
            " 'deny <reason>' to deny); the bot's SMTP listener takes it:",
            f"  curl -s smtp://127.0.0.1:{mail_port} --mail-from {REVIEWER}"
            f" --mail-rcpt '{rcpt}' --upload-file {reply_file}",
        ]
    )


async def by_email(bot: Served, sink: MailSink, folder: Path, auto: str | None) -> None:
    """Print where the review's email is; then send the reply that approves (`--auto
    email`), or write it for a person to send with curl."""
    if bot.mail_port is None:
        raise SystemExit("the bot has no SMTP listener: email.inbound.listen was not served")
    try:
        path = await sink.first()
    except TimeoutError:
        if auto == BY_EMAIL:
            raise SystemExit(f"no email came to {REVIEWER} in {EMAIL_WAIT:.0f} s") from None
        print(f"No email came to {REVIEWER} in {EMAIL_WAIT:.0f} s", flush=True)
        return
    request = read_email(path)
    print(f"The review's email to {REVIEWER} arrived: cat {path}")
    approval = reply(request, "approve")
    if auto == BY_EMAIL:
        print(f"Deciding it: email, a reply saying approve to {approval['To']}")
        await aiosmtplib.send(
            approval, hostname="127.0.0.1", port=bot.mail_port, start_tls=False, timeout=10
        )
        return
    reply_file = folder / "reply.eml"
    reply_file.write_bytes(approval.as_bytes(policy=policy.SMTP))
    rcpt = request["Reply-To"].addresses[0].addr_spec
    print(email_instructions(bot.mail_port, rcpt, reply_file), flush=True)


async def finished(
    client: httpx.AsyncClient, run_id: str, headers: dict[str, str], stopped: asyncio.Task[None]
) -> Any:
    """The run, once it has finished or failed; None when the bot stopped first (Ctrl-C or
    SIGTERM while the run waits for a person)."""
    while not stopped.done():
        try:
            run = (await client.get(f"/runs/{run_id}", headers=headers)).json()
        except httpx.TransportError:
            # Stopping, the server closes its socket first and its task ends after.
            await asyncio.wait([stopped], timeout=10)
            if stopped.done():
                return None
            raise
        if run["status"] in ("finished", "failed"):
            return run
        await asyncio.wait([stopped], timeout=0.1)
    return None


def decided_line(approval: dict[str, Any]) -> str:
    """Who decided, through which channel, and how."""
    decided = [event for event in approval["events"] if event["kind"] == "decided"]
    channel = f" (channel {decided[-1]['channel']})" if decided else ""
    return f"Decided by {approval['decision']['decided_by']}{channel}: {approval['status']}"


async def report(
    client: httpx.AsyncClient, run: Any, approval_id: str, headers: dict[str, str]
) -> None:
    """Who decided the review, what the tool did, and how the run ended."""
    approval = (await client.get(f"/approvals/{approval_id}", headers=headers)).json()
    print(decided_line(approval))
    for result in run["tool_results"]:
        ran = f"ran with {result['arguments']}" if result["arguments"] else "did not run"
        print(f"The {result['tool']} {ran}: {result['content']}")
    print(f"Run {run['run_id']} {run['status']}: {run['final_text'] or run['error']}")


async def demo(auto: str | None, port: int, keep_serving: bool) -> None:
    token = secrets.token_urlsafe(32)
    # The secrets stay out of the file, as they should in a real nodbot.yml: the file names
    # the variables, and this process (the bot's) holds them. New at each start.
    os.environ["NODBOT_DEMO_TOKEN"] = token
    os.environ["NODBOT_DEMO_WEB_SECRET"] = secrets.token_urlsafe(32)
    headers = {"Authorization": f"Bearer {token}"}
    with tempfile.TemporaryDirectory(prefix="nodbot-demo-") as name:
        folder = Path(name)
        async with mail_sink(folder / "mail") as sink:
            config = folder / "nodbot.yml"
            config.write_text(
                CONFIG.format(
                    folder=folder,
                    port=port,
                    reviewer=REVIEWER,
                    smtp_port=sink.port,
                )
            )
            async with (
                serving(str(config)) as bot,
                httpx.AsyncClient(base_url=bot.url) as client,
            ):
                print(f"nodbot is serving {bot.url} (store {bot.store_url})")
                # Requested by the token's name: the demo's one person asks and decides (the
                # rule allows self-approval); naming someone else needs runs:write-as.
                body = {"agent": "support", "input": "Refund order A-1001"}
                run = (await client.post("/runs", json=body, headers=headers)).json()
                [pending] = run["pending"]
                print(f"Run {run['run_id']} asks: {pending['tool']} {pending['arguments']}")
                if auto is None:
                    link = bot.sign_in_link(REVIEWER)  # signed with the secret the bot uses
                    print(instructions(bot.url, token, pending["approval_id"], link), flush=True)
                    await by_email(bot, sink, folder, auto)
                elif auto == BY_EMAIL:
                    await by_email(bot, sink, folder, auto)
                else:
                    print(f"Deciding it: {auto}")
                    decide = f"/approvals/{pending['approval_id']}/decide"
                    await client.post(decide, json=ANSWERS[auto], headers=headers)
                run = await finished(client, run["run_id"], headers, bot.stopped)
                if run is None:
                    print("The refund still waits for a decision: nodbot stopped first.")
                else:
                    await report(client, run, pending["approval_id"], headers)
                if keep_serving and run is not None:
                    print(f"nodbot keeps serving {bot.url} until Ctrl-C", flush=True)
                    await asyncio.shield(bot.stopped)  # done when Ctrl-C (or SIGTERM) stops it
    print("nodbot stopped (the demo's store is gone with its folder)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--auto", choices=sorted([*ANSWERS, BY_EMAIL]), help="decide without a person"
    )
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--keep-serving",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve on once the run has finished, until Ctrl-C (the default without --auto)",
    )
    arguments = parser.parse_args()
    keep = arguments.keep_serving if arguments.keep_serving is not None else not arguments.auto
    os.chdir(ROOT)  # where examples.support_agent is imported from
    try:
        asyncio.run(demo(arguments.auto, arguments.port, keep))
    except KeyboardInterrupt:
        print("nodbot stopped", flush=True)


if __name__ == "__main__":
    main()
