"""The bot's answers to reviewers' replies: a short message in the reply's thread saying what
the reply did (decided, or counted as one of the approvals a review needs) or why it decided
nothing and how to reply instead.

Only a verified reviewer is answered: the sender authenticated as the `trusted_authserv_id`
server says, and the reply token issued to that very address. Automatic messages, forged or
unauthenticated senders, other people's tokens and repeats of a message already processed
get no answer (answering them could loop, or tell a stranger about a review). Each answer is
`Auto-Submitted: auto-replied` (RFC 3834), so that well-behaved responders do not answer it,
and carries the reviewer's reply address again, so that replying to it works like replying
to the request.

An answer is sent once, after the reply was recorded, outside the door's reply (the mail
server that handed the reply over is not kept waiting for another mail server); one that
cannot be sent is logged and not tried again: what the reply did is in the review's events,
and a decision is also announced by the outcome email of every emailed reviewer.

An answer to a reply to a question (`core.questions`) says what it was answered (or that it
was declined), or why the reply answered nothing and what to send: the choices, numbered, or
one line of text, or `decline <reason>`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime
from typing import Any

from jinja2 import Environment

from nodbot.bot.config import EmailConfig
from nodbot.bot.email.channel import one_line
from nodbot.bot.email.questions import shown
from nodbot.core import ApprovalRecord
from nodbot.core.questions import question_of

__all__ = ["Answers", "Send"]

log = logging.getLogger(__name__)

Send = Callable[[EmailMessage, str], Awaitable[None]]
"""Sends a message to an address (`EmailChannel.send`)."""

_MESSAGE_ID = re.compile(r"<[!-;=?-~]{1,250}>")
"""A Message-ID as RFC 5322 writes one: printable ASCII without < > or spaces, in < >."""
REFERENCES = 10
"""Message-IDs of the thread kept in an answer's References at most (the newest)."""


_SAID = {
    "approve": "approved",
    "deny": "denied",
    "edit": "approved, with edits,",
    "respond": "answered, in the tool's place,",
}
"""What a reply that decided did, as its answer says it."""


class Answers:
    """Writes and sends the answers (see the module)."""

    def __init__(self, config: EmailConfig, send: Send, templates: Environment) -> None:
        self.config = config
        self.send = send
        self.domain = config.sender.rpartition("@")[2]
        self.templates = templates
        """The email channel's templates (`templates/email/`)."""
        self._sending: set[asyncio.Task[None]] = set()
        self.sent = 0
        """Answers sent by this process."""

    def send_later(self, message: EmailMessage, address: str, approval_id: str) -> None:
        """Send an answer (`compose`) in the background, logged either way."""
        task = asyncio.create_task(self._send(message, address, approval_id))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def compose(
        self,
        reply: EmailMessage,
        *,
        address: str,
        token: str,
        record: ApprovalRecord,
        status: str,
        reason: str | None,
        said: str | None,
        pending: bool,
    ) -> EmailMessage:
        """The answer to `reply` of the verified reviewer `address` (whose token is `token`)
        on `record`: `status` "decided" (what it `said`, and whether the review is still
        `pending` other approvals) or "refused" with its `reason`. For a question
        (`core.questions`): what it was answered, or that it was declined, or how to answer."""
        policy = record.request.policy
        allowed = policy.get("allowed_decisions") or ["approve", "edit", "deny"]
        question = question_of(record.request)
        decision = record.decision
        context: dict[str, Any] = {
            **({} if question is None else shown(question)),
            "is_question": question is not None,
            "answer": None if decision is None else decision.response,
            "status": status,
            "reason": reason,
            "said": _SAID.get(said or "", "decided"),
            "tool": record.request.tool,
            "approval_id": record.approval_id,
            "address": address,
            "pending": pending,
            "required": record.request.approvals_required,
            "open": record.decision is None and status == "refused",
            "allowed": allowed,
            "can_edit": "edit" in allowed
            and record.request.approvals_required == 1
            and policy.get("editable") != [],
        }
        their_ids = _message_ids(reply.get("Message-ID"))
        their_id = their_ids[0] if their_ids else ""
        thread = _message_ids(reply.get("References"))
        references = [*thread[-(REFERENCES - 1) :], their_id] if their_id else thread[-REFERENCES:]
        message = EmailMessage(policy=SMTP)
        local, _, domain = self.config.reply_to.rpartition("@")
        message["From"] = self.config.sender
        message["To"] = address
        message["Reply-To"] = f"{local}+{token}@{domain}"
        subject = one_line(str(reply.get("Subject", "")) or record.request.tool)
        message["Subject"] = one_line(subject if subject[:3].lower() == "re:" else f"Re: {subject}")
        message["Date"] = format_datetime(datetime.now(UTC))
        digest = hashlib.sha256(their_id.encode()).hexdigest()[:16]
        message["Message-ID"] = f"<nodbot.answer-{digest}.{token}@{self.domain}>"
        if their_id:
            message["In-Reply-To"] = their_id
        if references:
            message["References"] = " ".join(references)
        message["Auto-Submitted"] = "auto-replied"
        message["X-Auto-Response-Suppress"] = "All"
        message.set_content(self.templates.get_template("answer.txt").render(context))
        return message

    async def _send(self, message: EmailMessage, address: str, approval_id: str) -> None:
        try:
            await self.send(message, address)
        except Exception as exc:  # logged: the reply's effect is recorded either way
            log.warning(
                "email answer not sent",
                extra={"approval_id": approval_id, "to": address, "error": str(exc)},
            )
            return
        self.sent += 1
        log.info("email answer sent", extra={"approval_id": approval_id, "to": address})

    async def close(self) -> None:
        """Wait for the answers on their way (a few seconds at most)."""
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=10)


def _message_ids(header: object) -> list[str]:
    """The Message-IDs written in a header, in order; anything else in it is left out, so
    nothing of the sender's but well-formed ids reaches the answer's headers."""
    return _MESSAGE_ID.findall(str(header or ""))
