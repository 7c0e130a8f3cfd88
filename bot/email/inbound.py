"""Inbound email: `Inbound.ingest(raw)` reads one reviewer's reply and decides its review, the
one step behind every door (the HTTP endpoint, the SMTP / LMTP listener, the IMAP reader).

In order, stopping at the first refusal: automatic messages and bounces are dropped unread
(`reading.screen`: answering them could loop, and they carry no decision), with an event on
the review their token names, if any; the reply token is found in the plus part of the
To/Delivered-To address of `reply_to`, else in the Message-IDs of In-Reply-To/References
(clients that drop the plus part still thread); the message must have exactly one
Message-ID (none cannot be told apart from a copy, and a signature covers only one of two:
one added above it would make a copy look new); the sender (`reading.sender`) must be the
token's reviewer and authenticated by the trusted server; the token must verify for them and
the stored call's digest, and the review be open; then the message is read as its reviewer
saw it (`reading.reply_command`: the text above the quote, hidden HTML left out, text and
HTML parts that disagree refused; a question's reply, its answer or decline, by
`questions.reply_answer`, a choice checked again by `core.questions.answer_problem`) and
decided through the same `Authorizer` and `Executor.decide` as every other channel.

A message is processed once, whatever review it names: the store records its Message-ID
(`core.store.MESSAGE_ID`, a unique key shared by every replica) in the same transaction as
what the message did, its decision or vote, or its refusal once its sender and token were
verified; a copy (a re-sent or re-injected reply, a redelivery, or a copy handed over at the
same moment), aimed at this review or any other, decides nothing and is refused with the
reason and the Message-ID, and never answered. A crash before that transaction commits leaves
nothing recorded, and the door has not acknowledged the message, so it is processed again;
after it, the copy processed again finds it done. A message whose sender or token could not
be verified records no Message-ID: a forgery cannot use up the id of a genuine reply.

Every message that names a review but decides nothing leaves a `refused` event on it with the
reason and the Message-ID, so a reviewer's "I replied" can be checked in the audit log.
Parsing and reading run off the event loop, over at most `limits.EMAIL_BODY` bytes, in time
linear in their size.

A message over a limit of `reading.parse` (more than `limits.EMAIL_PARTS` MIME parts, nested
deeper than `EMAIL_DEPTH`, too many header fields or too long parsed ones) is parsed no
further than the limit and read in its own header fields only: its token and sender are
found there as for any message, and it decides nothing. From its verified reviewer it is
refused with the limit as the reason (an event with its Message-ID, processed once,
answered once); from anyone else it is refused or dropped as such a sender's message is,
unanswered. Its `Outcome.too_complex` names the limit, and a log line says it with its
Message-ID. One whose own header fields are over a limit is dropped unread, with a log line.
What `ingest` raises (`StoreError`, or whatever a bug raises) is left to the door: each says
what becomes of the message then.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from email.message import EmailMessage
from typing import Any, Literal

from nodbot.bot.config import EmailConfig
from nodbot.bot.email.answers import Answers
from nodbot.bot.email.channel import TIMEOUT_DECIDER
from nodbot.bot.email.questions import reply_answer
from nodbot.bot.email.reading import (
    Approve,
    Command,
    Deny,
    Edit,
    MessageTooComplex,
    Refused,
    Respond,
    Sender,
    Unclear,
    parse,
    parse_head,
    reply_command,
    screen,
)
from nodbot.bot.email.reading import sender as sender_of
from nodbot.bot.email.tokens import TOKEN_LENGTH, InvalidToken, ReplyTokens
from nodbot.bot.forms import FIELD_PREFIX, edit_fields, parse_edit, reason_too_long
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import AuthorizeDecision
from nodbot.bot.policy.remember import NOT_REMEMBERED, remember_decision, scope_of
from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalNotFound,
    ApprovalRecord,
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    InvalidArgumentsError,
    InvalidDecisionError,
    ToolRegistry,
    UnknownToolError,
)
from nodbot.core.decisions import response_problem
from nodbot.core.questions import answer_problem, is_question, question_of
from nodbot.core.store import MESSAGE_ID, MESSAGE_ID_BYTES, MessageAlreadyProcessed

__all__ = ["CHANNEL", "Inbound", "Outcome"]

log = logging.getLogger(__name__)

CHANNEL = "email"


_TOKEN_IN_ID = re.compile(rf"\.([a-z2-7]{{{TOKEN_LENGTH}}})@", re.IGNORECASE)
_HEAD_END = re.compile(rb"\n\r?\n")
_MESSAGE_ID_FIELD = re.compile(rb"^message-id:[ \t]*(<[!-;=?-~]{1,250}>)", re.I | re.M)


@dataclass(frozen=True)
class Outcome:
    """What became of one message."""

    status: Literal["decided", "refused", "dropped"]
    """`decided`: the reply was recorded as the reviewer's decision (or vote); `refused`: it
    named a review but decided nothing (an event says why); `dropped`: automatic, or naming
    no review, so nothing was recorded."""
    reason: str | None = None
    """Why it was refused or dropped."""
    approval_id: str | None = None
    """The review it named, when it named one."""
    message_id: str | None = None
    record: ApprovalRecord | None = field(default=None, repr=False, compare=False)
    """The review as the decision left it (a vote leaves it pending), once decided."""
    answered: bool = False
    """An answer is on its way to the sender (only verified reviewers get one)."""
    too_complex: str | None = None
    """The limit the message is over (`reading.parse`), when it is: it was not read past its
    own header fields, and the SMTP / LMTP listener refuses it (550 5.3.4)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "approval_id": self.approval_id,
            "message_id": self.message_id,
            "answered": self.answered,
        }


@dataclass(frozen=True)
class _Read:
    """What a message says of itself, read off the event loop (`Inbound._read`)."""

    message: EmailMessage
    message_ids: int
    """How many Message-ID headers it has."""
    message_id: str | None
    """The first one, on one line."""
    automatic: str | None
    """Why it is automatic (`reading.screen`), or None."""
    token: str | None
    claimed: str
    """The From address as written (for the events of a refused message only)."""
    sender: Sender | Refused
    too_complex: str | None
    """The limit the message is over: `message` is then only its own header fields."""


class Inbound:
    """Decides reviews by reply (see the module)."""

    def __init__(
        self,
        config: EmailConfig,
        store: ApprovalStore,
        registry: ToolRegistry,
        *,
        secret: str | None,
        authorize: AuthorizeDecision,
        on_decided: Callable[[], None] | None = None,
        answers: Answers | None = None,
    ) -> None:
        if not secret:
            raise ValueError("inbound email needs web.secret to verify reply tokens")
        self.config = config
        self.store = store
        self.registry = registry
        self.tokens = ReplyTokens(secret)
        self.authorize = authorize
        self.on_decided = on_decided
        self.answers = answers
        """Answers verified reviewers in their reply's thread (none without)."""
        self.executor = Executor(registry, approval=DeferredApproval(store))
        local, _, domain = config.reply_to.rpartition("@")
        self._local, self._domain = local.lower(), domain.lower()

    @staticmethod
    def message_id_in(raw: bytes) -> str | None:
        """The first Message-ID of `raw`'s own header fields, found without parsing it (for
        the logs of a message that could not be read), or None."""
        end = _HEAD_END.search(raw)
        found = _MESSAGE_ID_FIELD.search(raw, 0, len(raw) if end is None else end.start())
        return found.group(1).decode() if found is not None else None

    def is_reply_address(self, address: str) -> bool:
        """Whether `address` is the `reply_to` mailbox, with or without a +tag."""
        local, _, domain = address.strip().strip("<>").rpartition("@")
        mailbox = local.lower().partition("+")[0]
        return mailbox == self._local and domain.lower().rstrip(".") == self._domain

    async def ingest(self, raw: bytes, *, recipients: Sequence[str] = ()) -> Outcome:
        """Read `raw` (one RFC 5322 message) and decide its review if it says so.
        `recipients` are the envelope's (RCPT TO), when the message came over SMTP or LMTP:
        the plus address there names the review even when the headers do not."""
        try:
            read = await asyncio.to_thread(self._read, raw, tuple(recipients))
        except MessageTooComplex as exc:  # its own header fields are over a limit
            message_id = self.message_id_in(raw)
            log.warning(
                "email message dropped unread: its header fields are over a limit",
                extra={"reason": exc.reason, "message_id": message_id},
            )
            return Outcome("dropped", exc.reason, message_id=message_id, too_complex=exc.reason)
        if read.too_complex is not None:
            log.warning(
                "email message over a limit: only its header fields are read",
                extra={"reason": read.too_complex, "message_id": read.message_id},
            )
        outcome = await self._ingest(read)
        return replace(outcome, too_complex=read.too_complex)

    async def _ingest(self, read: _Read) -> Outcome:
        """What the message `read` does (see the module), its answer sent if it gets one."""
        message_id, automatic, token = read.message_id, read.automatic, read.token
        if token is None:
            why = automatic or "no reply token in its addresses or Message-IDs"
            return Outcome("dropped", why, message_id=message_id)
        try:
            approval_id = self.tokens.approval_of(token)
            record = await self.store.get(approval_id)
        except (InvalidToken, ApprovalNotFound):
            why = automatic or "its reply token names no review"
            return Outcome("dropped", why, message_id=message_id)
        refuse = _Refuser(self.store, record, message_id, read.claimed)
        if automatic is not None:
            # Read no further and never answered (an answer could loop), but recorded on the
            # review it names: "the reviewer replied" can be checked against the events.
            await refuse(f"an automatic message decides nothing: {automatic}")
            return Outcome("dropped", automatic, approval_id, message_id)
        outcome = await self._act(read, token, record, refuse)
        if self.answers is not None and refuse.verified:
            answer = await asyncio.to_thread(
                self.answers.compose,
                read.message,
                address=refuse.actor,
                token=token,
                record=outcome.record or record,
                status=outcome.status,
                reason=outcome.reason,
                said=refuse.said,
                pending=outcome.record is not None and outcome.record.decision is None,
            )
            self.answers.send_later(answer, refuse.actor, record.approval_id)
            outcome = replace(outcome, answered=True)
        return outcome

    def _read(self, raw: bytes, recipients: Sequence[str]) -> _Read:
        """What a message says of itself (run off the event loop: parsing is the costly
        part, linear in the message's size and bounded by `reading.parse`'s limits). A
        message over one is read in its own header fields only. Raises `MessageTooComplex`
        when those alone are over one."""
        too_complex = None
        try:
            parsed = parse(raw)
        except MessageTooComplex as exc:
            if exc.head:
                raise
            too_complex = exc.reason
            parsed = parse_head(raw)
        ids = parsed.get_all("Message-ID") or []
        return _Read(
            message=parsed,
            message_ids=len(ids),
            message_id=_one_line(ids[0]) if ids else None,
            automatic=screen(parsed),
            token=self._token(parsed, recipients),
            claimed=_bare_from(parsed),
            sender=sender_of(
                parsed,
                trusted_authserv_id=self.config.trusted_authserv_id,
                require_authenticated=self.config.require_authenticated_sender,
            ),
            too_complex=too_complex,
        )

    async def _act(
        self, read: _Read, token: str, record: ApprovalRecord, refuse: _Refuser
    ) -> Outcome:
        """What the message of a review's token does, refusals recorded by `refuse`."""
        message_id = refuse.message_id
        if read.message_ids > 1:
            return await refuse(
                f"the message has {read.message_ids} Message-ID headers; exactly one is needed"
            )
        if message_id is None:
            return await refuse("the message has no Message-ID, so it cannot be told apart")
        if len(message_id.encode()) > MESSAGE_ID_BYTES:
            return await refuse(f"the message's Message-ID is over {MESSAGE_ID_BYTES} bytes")
        found = read.sender
        if isinstance(found, Refused):
            return await refuse(found.reason)
        address = found.address
        refuse.actor = address
        try:
            self.tokens.verify(token, reviewer=address, digest=record.request.digest)
        except InvalidToken as exc:
            return await refuse(f"the reply token does not hold for {address}: {exc}")
        refuse.verified = True  # the reviewer the token was issued to: worth an answer
        if read.too_complex is not None:
            return await refuse(read.too_complex)  # unread: the reviewer is told why
        if record.decision is not None:
            return await refuse(_decided_before(record, record.decision.decided_by))
        question = question_of(record.request)
        said: Command | Unclear
        if question is not None:
            said = await asyncio.to_thread(reply_answer, read.message, choices=question.choices)
        else:
            editable = self._editable(record)
            said = await asyncio.to_thread(reply_command, read.message, editable=editable)
        if isinstance(said, Unclear):
            return await refuse(said.reason)
        refuse.said = said.kind
        refuse.remember = isinstance(said, Approve) and said.remember
        decision = self._decision(said, record, address)
        if isinstance(decision, str):
            return await refuse(decision)
        return await self._decide(record, decision, address, refuse)

    def _token(self, message: EmailMessage, recipients: Sequence[str]) -> str | None:
        """The token of the plus address of `reply_to` the message was sent to (the
        envelope's, then the headers'), else the one in the Message-IDs it answers."""
        for recipient in recipients:
            if self.is_reply_address(recipient):
                tag = recipient.strip().strip("<>").rpartition("@")[0].partition("+")[2]
                if tag:
                    return tag.lower()
        for name in ("To", "Delivered-To", "Cc"):
            for header in message.get_all(name) or []:
                for address in getattr(header, "addresses", ()):
                    local = str(address.username).lower()
                    mailbox, plus, tag = local.partition("+")
                    domain = str(address.domain).lower().rstrip(".")
                    if plus and mailbox == self._local and domain == self._domain and tag:
                        return tag
        for name in ("In-Reply-To", "References"):
            for header in message.get_all(name) or []:
                for found in _TOKEN_IN_ID.finditer(str(header)):
                    return found.group(1).lower()
        return None

    def _schema(self, record: ApprovalRecord) -> dict[str, Any] | None:
        """The arguments' schema: the bot's own tool's, else the one the caller of an
        external tool sent (`POST /approvals`), else None (edits cannot be checked)."""
        tool = record.request.tool
        if tool not in self.registry:
            schema = record.request.policy.get("schema")
            return schema if isinstance(schema, dict) else None
        return self.registry.get(tool).model.model_json_schema()

    def _editable(self, record: ApprovalRecord) -> Sequence[str]:
        """The arguments a reply may edit: the rule's `editable`, else every argument."""
        editable = record.request.policy.get("editable")
        if editable is not None:
            return [str(name) for name in editable]
        schema = self._schema(record) or {}
        return [*schema.get("properties", {}), *record.request.arguments]

    def _decision(self, said: Any, record: ApprovalRecord, address: str) -> Decision | str:
        """The decision a command asks for, or why it cannot be made."""
        if isinstance(said, Deny):
            too_long = reason_too_long(said.reason)
            if too_long is not None:
                return too_long
            return Decision(approved=False, reason=said.reason, decided_by=address)
        if isinstance(said, Respond):
            if is_question(record.request):  # an answer: one of its choices, if it has any
                wrong = answer_problem(record.request, said.text)
            else:
                wrong = response_problem(said.text)
            if wrong is not None:
                return wrong
            return Decision(approved=False, response=said.text, decided_by=address)
        if not isinstance(said, Edit):
            if said.remember and scope_of(record.request) is None:
                return NOT_REMEMBERED
            return Decision(approved=True, decided_by=address)
        schema = self._schema(record)
        if schema is None:
            return f"edits of {record.request.tool} cannot be checked here; approve or deny it"
        arguments = record.request.arguments
        fields = edit_fields(schema, arguments, self._editable(record))
        form = {FIELD_PREFIX + name: value for name, value in said.arguments.items()}
        parsed = parse_edit(fields, form, arguments)
        if parsed.errors:
            return "; ".join(f"{name}: {why}" for name, why in parsed.errors.items())
        if not parsed.edited:
            return "the edit changes nothing; reply approve to run the call as it is"
        return Decision(approved=True, edited_args=parsed.edited, decided_by=address)

    async def _decide(
        self, record: ApprovalRecord, decision: Decision, address: str, refuse: _Refuser
    ) -> Outcome:
        verdict = await self.authorize(address, record, decision)
        person = verdict.person
        refuse.person = person
        if verdict.refusal is not None:
            return await refuse(str(verdict.refusal))
        try:
            decided = await self.executor.decide(
                record.approval_id,
                decision,
                decided_by=address,
                channel=CHANNEL,
                person=person,
                evidence=verdict.evidence({MESSAGE_ID: refuse.message_id}),
            )
        except MessageAlreadyProcessed as exc:
            return refuse.repeated(exc)
        except ApprovalAlreadyDecided as exc:
            refuse.recorded = True  # the store processed the message with its refusal
            return await refuse(_decided_before(record, exc.decided_by))
        except ApprovalAlreadyVoted:
            refuse.recorded = True
            return await refuse("you have voted on this review already")
        except InvalidDecisionError as exc:
            return await refuse(exc.message)
        except InvalidArgumentsError as exc:
            wrong = "; ".join(f"{e['field']}: {e['message']}" for e in exc.errors)
            return await refuse(f"the edited arguments are not valid for the tool: {wrong}")
        except UnknownToolError as exc:
            return await refuse(f"edits of {exc.tool} cannot be checked here")
        METRICS.decided(decided, CHANNEL)
        if refuse.remember and decided.status == "approved":
            await remember_decision(self.store, decided, person=person)
        if self.on_decided is not None:
            self.on_decided()  # the run may go on
        return Outcome("decided", None, decided.approval_id, refuse.message_id, decided)


class _Refuser:
    """Records why a message naming `record` decided nothing, and says so as an `Outcome`."""

    def __init__(
        self, store: ApprovalStore, record: ApprovalRecord, message_id: str | None, actor: str
    ) -> None:
        self.store = store
        self.record = record
        self.message_id = message_id
        self.actor = actor
        self.person: str | None = None
        self.verified = False
        """The sender is the token's reviewer, authenticated: an answer may go to them."""
        self.said: str | None = None
        """The command the reply gave: approve, deny, edit or respond (a question's answer;
        its decline is a deny)."""
        self.remember = False
        """The reply said `approve and remember`."""
        self.recorded = False
        """The store has processed the message already (refusing the act it asked for)."""

    async def __call__(self, reason: str) -> Outcome:
        """Record the refusal; once the sender is `verified`, it processes the message (a
        copy of it decides nothing after)."""
        approval_id = self.record.approval_id
        log.info(
            "email reply refused",
            extra={"approval_id": approval_id, "reason": reason, "message_id": self.message_id},
        )
        try:
            await self.store.refuse(
                approval_id,
                actor=self.actor or None,
                channel=CHANNEL,
                reason=reason,
                person=self.person,
                evidence={MESSAGE_ID: self.message_id},
                record_message=self.verified and not self.recorded,
            )
        except MessageAlreadyProcessed as exc:
            return self.repeated(exc)
        METRICS.refused(CHANNEL, reason)  # once: a copy of the message is repeated above
        return Outcome("refused", reason, approval_id, self.message_id)

    def repeated(self, exc: MessageAlreadyProcessed) -> Outcome:
        """The outcome of a copy of a message processed before (the store recorded its
        refusal): never answered, whoever sent it."""
        self.verified = False
        log.info(
            "email reply refused: processed already",
            extra={"approval_id": exc.approval_id, "message_id": exc.message_id},
        )
        return Outcome("refused", str(exc), self.record.approval_id, self.message_id)


def _decided_before(record: ApprovalRecord, decided_by: str | None) -> str:
    """Why a reply to a review decided before decides nothing (a question's says answered or
    declined, as its record tells, when it is the one read)."""
    by = f" by {decided_by}" if decided_by else ""
    if not is_question(record.request):
        return f"the review was already decided{by}"
    if decided_by == TIMEOUT_DECIDER:
        return "the question timed out: nobody answered before its deadline"
    if record.decision is None:  # decided while this reply was read
        return f"the question was already answered or declined{by}"
    done = "answered" if record.decision.response is not None else "declined"
    return f"the question was already {done}{by}"


def _one_line(value: object) -> str | None:
    text = " ".join(str(value).split()) if value is not None else ""
    return text or None


def _bare_from(message: EmailMessage) -> str:
    """The first From address as written (for the events of a refused message only)."""
    addresses = getattr(message.get("From"), "addresses", ())
    return str(addresses[0].addr_spec)[:320] if addresses else ""
