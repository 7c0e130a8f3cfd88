"""The email channel of the outbox: review requests emailed to each email reviewer, and a
follow-up in the same thread once the review is decided.

Who is emailed comes from the review's policy (its rule's `reviewers`, reviewer groups
already expanded, and `escalate_to` at `escalate_after`): every entry that is an email
address is one delivery (`email:ana@example.com`), so each reviewer gets one message however
often its delivery is tried. Each message is multipart text + HTML (`templates/email/`, the
HTML autoescaped), from `from`, with `Reply-To` the reviewer's plus address of `reply_to`
(`approvals+<token>@example.com`, `bot/email/tokens.py`), `Auto-Submitted: auto-generated`
and a `Message-ID` made of the delivery id and the same token: the same on every attempt,
so a message sent twice (an answer lost after the server took it) is one message to mail
clients. No argument ever reaches a header: the subject names the tool (and the rule's
description), on one line, cut short.

Sent with aiosmtplib: 4xx answers, refused connections and timeouts are retried by the
outbox with backoff; 5xx answers give the delivery up (recorded `undelivered`). Once the
review is decided, from whichever channel, each reviewer whose request was sent gets the
outcome (`In-Reply-To`/`References` its request): who decided, when, the edited arguments.
With the rule's `remind_every`, each reminder step is one delivery (`email:reminder:2`): a
short message in the same thread (`In-Reply-To`/`References` the request, the same
`Reply-To`, so replying to it decides) to each reviewer whose request was sent and who has
not voted, each address kept in the delivery's progress once sent.

Escalation and reminders go to the delegates too (`bot.policy.delegation`): when a reminder
step or an escalation is sent (not when the review opened, so a delegation made since counts,
and an ended one no longer does), each reviewer it reaches who has handed their reviews to
someone is joined by that delegate's address: the delegate gets the review's request, named
"for" the delegator (`delegated_for`), with a `Reply-To` of their own token, so that their
reply decides as the delegator could ("bob for ana"). Each delegate's address is kept in the
delivery's progress once sent, as the reviewers' are, so it is emailed once per step. When the
delegations cannot be read, or a delegate not told, the reviewers are emailed as before and a
warning is logged: a delegate is never a reason to leave the reviewer out.

Each request also carries signed links (with `links_base`, the inbox's address): approve and
deny as the rule allows, edit when the call may be edited, each
`<links_base>/inbox/review?token=...` signed with `web.secret` for the reviewer, the
approval and that decision (`bot.web.signing.review_link`), expiring with the reply token.
A link decides nothing when opened (mail scanners open links): it signs its reviewer in to
the web inbox for that approval only, on a page whose form decides (`bot.web.app`). The
request, the reminders and the outcome also give the review's plain inbox page
(`<links_base>/inbox/approvals/<id>`, `page`), which asks to sign in first.

A question (`core.questions`) is emailed as a question (`templates/email/question*`), never
as a call to approve: the subject `Question: <its first line>`, the question, its choices
numbered, who asked, the deadline and how to answer by reply (`bot.email.questions`), with
one signed link to its page (signed as a deny's, the decision a question shares; the page
answers or declines it). Its reminders and its outcome say answered (with the answer),
declined or timed out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime
from typing import Any
from urllib.parse import quote

import aiosmtplib
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from nodbot.bot.config import EmailConfig, parse_reviewer
from nodbot.bot.email.questions import shown as question_shown
from nodbot.bot.email.reading import MARKER
from nodbot.bot.email.tokens import InvalidToken, ReplyTokens
from nodbot.bot.outbox import (
    DeliveryError,
    Moment,
    OutboxStore,
    acted,
    reminder_skipped,
    reminder_step,
    reminder_steps,
    reminder_target,
)
from nodbot.bot.policy.delegation import Delegations
from nodbot.bot.policy.people import IdentityUnavailable
from nodbot.bot.web.signing import ReviewAction, Signer, SignInLinkError, review_link
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, StoreError
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.questions import Question, question_of
from nodbot.core.store import utc_now

__all__ = ["EmailChannel", "email_addresses"]

log = logging.getLogger(__name__)

SUBJECT_LENGTH = 150
"""Characters of a subject at most: the tool and the rule's description, not a paragraph."""
TIMEOUT_DECIDER = "nodbot:timeout"
REVIEW_ACTIONS: tuple[ReviewAction, ...] = ("approve", "edit", "deny")
"""The decisions a request links to, in the order it lists them."""


def email_addresses(entries: object) -> list[str]:
    """The email addresses (lowercased, once each, in order) among stored reviewer entries."""
    found: list[str] = []
    for text in entries if isinstance(entries, list) else []:
        try:
            reviewer = parse_reviewer(text)
        except ValueError:
            continue
        if reviewer.kind == "email" and reviewer.value not in found:
            found.append(reviewer.value)
    return found


def one_line(text: str, limit: int = SUBJECT_LENGTH) -> str:
    """`text` fit for a header: every run of whitespace (CR and LF too) one space, other
    control characters dropped, at most `limit` characters."""
    kept = "".join(c for c in text if c.isprintable() or c.isspace())
    flat = " ".join(kept.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "\u2026"


class EmailChannel:
    """Emails the reviews' requests and outcomes (see the module's docstring)."""

    name = "email"
    answers = False
    makes_deliveries = False
    tells_outcomes = True

    def __init__(
        self,
        config: EmailConfig,
        store: OutboxStore,
        *,
        secret: str | None,
        links_base: str | None = None,
        clock: Callable[[], datetime] = utc_now,
        delegations: Delegations | None = None,
    ) -> None:
        if not secret:
            # Fail closed: unsigned, or signed with a key nobody keeps, replies would be
            # forgeable or stop verifying at the next start.
            raise ValueError("the email channel needs web.secret to sign its reply tokens")
        self.config = config
        self.store = store
        self._clock = clock
        self.tokens = ReplyTokens(secret)
        self.secret = secret
        self.links_base = links_base
        self.delegations = delegations
        """Who decides for whom (`bot.policy.delegation`), for escalations and reminders to
        reach the delegates too; None: nobody for anyone."""
        """Where the web inbox is reached (`web.public_url`, else the bot's own address), for
        the signed links of the requests; None sends requests without links."""
        self.domain = config.sender.rpartition("@")[2]
        self.templates = Environment(
            # Package data of `nodbot`, in the repository and in an installed wheel alike.
            loader=PackageLoader("nodbot", "templates/email"),
            autoescape=select_autoescape(("html",), default_for_string=False, default=False),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )

    # --- what to deliver ---------------------------------------------------------------------

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        policy = record.request.policy
        asked = email_addresses(policy.get("reviewers"))
        escalate_at = policy.get("escalate_at")
        later = [a for a in email_addresses(policy.get("escalate_to")) if a not in asked]
        later = later if escalate_at else []
        if stage == "outcome":
            # Only those whose request went out get one (`_outcome` checks).
            return [NewDelivery("outcome", f"{self.name}:{a}") for a in [*asked, *later]]
        if stage != "request":
            return []
        found = [NewDelivery("request", f"{self.name}:{a}") for a in asked]
        if escalate_at:
            when = datetime.fromisoformat(escalate_at)
            found += [NewDelivery("escalation", f"{self.name}:{a}", when) for a in later]
        if found:
            found += [
                NewDelivery("reminder", reminder_target(self.name, step), at)
                for step, at in reminder_steps(record)
            ]
        return found

    # --- delivering --------------------------------------------------------------------------

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        if delivery.kind == "reminder":
            return await self._remind(delivery, record)
        address = delivery.address
        try:
            Address(addr_spec=address)
        except (ValueError, IndexError) as exc:
            raise DeliveryError(f"not an address to send to: {exc}", permanent=True) from exc
        token = self._token(record, address)
        if delivery.kind == "outcome":
            request = await self._request_sent(delivery, record)
            if request is None:
                return {"skipped": "no request was emailed to this reviewer"}
            message = self._outcome(delivery, record, token, request)
        elif record.decision is not None:
            return {"skipped": "decided before it was sent"}
        elif delivery.kind == "escalation":
            return await self._escalate(delivery, record, token)
        else:
            message = self._request(delivery, record, token)
        await self._send(message, address)
        return {"message_id": message["Message-ID"], "to": address}

    async def _escalate(
        self, delivery: Delivery, record: ApprovalRecord, token: str
    ) -> dict[str, Any]:
        """An escalation: the request to whom it escalates to, then to each of their
        delegates at this moment, each address kept in the delivery's progress once sent."""
        address = delivery.address
        ref = dict(delivery.ref or {})
        if "message_id" not in ref:
            message = self._request(delivery, record, token)
            await self._send(message, address)
            ref.update(message_id=message["Message-ID"], to=address)
            await self._progress(delivery, ref)
        delegated: list[str] = [str(a) for a in ref.get("delegates") or []]
        for delegate, delegator in await self._delegates([address]):
            if delegate in delegated:
                continue
            await self._send_delegated(delivery, record, delegate, delegator)
            delegated.append(delegate)
            await self._progress(delivery, {**ref, "delegates": delegated})
        return {**ref, "delegates": delegated} if delegated else ref

    async def _progress(self, delivery: Delivery, ref: dict[str, Any]) -> None:
        if delivery.claimed_by is not None:
            await self.store.delivery_progress(
                delivery.delivery_id, worker=delivery.claimed_by, ref=ref
            )

    async def _send_delegated(
        self, delivery: Delivery, record: ApprovalRecord, delegate: str, delegator: str
    ) -> None:
        """The review's request to `delegate`, named for `delegator`, with the delegate's own
        reply token (its Message-ID is the delivery's and that token: one per step and
        delegate)."""
        token = self._token(record, delegate)
        message = self._request(delivery, record, token, to=delegate, delegated_for=delegator)
        await self._send(message, delegate)

    async def _delegates(self, addresses: list[str]) -> list[tuple[str, str]]:
        """`(delegate's address, delegator's address)` for each of `addresses` who has
        handed their reviews to someone with an address, now; none when the delegations
        cannot be read (logged: the reviewers are emailed as before)."""
        if self.delegations is None or not self.delegations.any_possible or not addresses:
            return []
        found: list[tuple[str, str]] = []
        moment = self._clock()
        try:
            for address in addresses:
                person = await self.delegations.people.person(address)
                for delegate in await self.delegations.delegates_of(person, moment):
                    emails = sorted(delegate.emails)
                    if emails and emails[0] not in addresses:
                        found.append((emails[0], address))
        except (StoreError, IdentityUnavailable) as exc:
            log.warning(
                "could not read who decides for %s (%s): their delegates are not emailed; "
                "the reviewers are, as without delegations",
                ", ".join(addresses),
                exc,
            )
            return []
        return found

    def _token(self, record: ApprovalRecord, address: str) -> str:
        """The reviewer's token: the same on every attempt (it is part of the Message-ID),
        so it expires at the review's deadline or `reply_ttl` after it opened."""
        expires = record.created_at + timedelta(seconds=self.config.reply_ttl)
        deadline = record.request.deadline
        if deadline is not None:
            expires = min(expires, deadline)
        return self.tokens.issue(record.approval_id, address, record.request.digest, expires)

    def _envelope(
        self, delivery: Delivery, token: str, subject: str, to: str | None = None
    ) -> EmailMessage:
        """A message of `delivery` to `to` (by default the delivery's address)."""
        message = EmailMessage(policy=SMTP)
        local, _, domain = self.config.reply_to.rpartition("@")
        message["From"] = self.config.sender
        message["To"] = to or delivery.address
        message["Reply-To"] = f"{local}+{token}@{domain}"
        message["Subject"] = one_line(subject)
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = f"<nodbot.{delivery.delivery_id}.{token}@{self.domain}>"
        message["Auto-Submitted"] = "auto-generated"
        # Asks Exchange not to answer with out-of-office replies and the like.
        message["X-Auto-Response-Suppress"] = "All"
        return message

    def _request(
        self,
        delivery: Delivery,
        record: ApprovalRecord,
        token: str,
        *,
        to: str | None = None,
        delegated_for: str | None = None,
    ) -> EmailMessage:
        question = question_of(record.request)
        if question is not None:
            return self._question(delivery, record, token, question, to, delegated_for)
        request, policy = record.request, record.request.policy
        allowed = policy.get("allowed_decisions") or ["approve", "edit", "deny"]
        editable = policy.get("editable")
        deadline = request.deadline
        can_edit = "edit" in allowed and request.approvals_required == 1 and editable != []
        context = {
            "marker": self.marker,
            "escalated": delivery.kind == "escalation",
            "delegated_for": delegated_for,
            "tool": request.tool,
            "description": policy.get("description"),
            "arguments": _shown(request.arguments),
            "requested_by": request.requested_by,
            "run_id": request.run_id,
            "approval_id": record.approval_id,
            "deadline": None if deadline is None else _when(deadline),
            "allowed": allowed,
            "editable": editable,
            "can_edit": can_edit,
            "links": self._links(to or delivery.address, record, token, allowed, can_edit),
            "page": self._page(record),
            "remember": _remembering(policy) if "approve" in allowed else None,
        }
        subject = self._render("request_subject.txt", context)
        message = self._envelope(delivery, token, subject, to=to)
        message.set_content(self._render("request.txt", context))
        message.add_alternative(self._render("request.html", context), subtype="html")
        return message

    def _question(
        self,
        delivery: Delivery,
        record: ApprovalRecord,
        token: str,
        question: Question,
        to: str | None,
        delegated_for: str | None,
    ) -> EmailMessage:
        """A question's request: the question, who asked, and how to answer by reply (never
        approve or edit: `bot.email.questions`)."""
        request = record.request
        deadline = request.deadline
        address = to or delivery.address
        # Its one link opens the question's page at its answer form (a respond).
        links = self._links(address, record, token, ["respond"], False, offer=("respond",))
        context = {
            **question_shown(question),
            "marker": self.marker,
            "escalated": delivery.kind == "escalation",
            "delegated_for": delegated_for,
            "description": request.policy.get("description"),
            "requested_by": request.requested_by,
            "run_id": request.run_id,
            "approval_id": record.approval_id,
            "deadline": None if deadline is None else _when(deadline),
            "longest": MAX_RESPONSE,
            "link": links[0][1] if links else None,
            "page": self._page(record),
        }
        subject = self._render("question_subject.txt", context)
        message = self._envelope(delivery, token, subject, to=to)
        message.set_content(self._render("question.txt", context))
        message.add_alternative(self._render("question.html", context), subtype="html")
        return message

    def _page(self, record: ApprovalRecord) -> str | None:
        """The review's page in the web inbox (it asks to sign in), or None without
        `links_base`."""
        if self.links_base is None:
            return None
        return f"{self.links_base.rstrip('/')}/inbox/approvals/{quote(record.approval_id, safe='')}"

    def _links(
        self,
        address: str,
        record: ApprovalRecord,
        token: str,
        allowed: list[str],
        can_edit: bool,
        *,
        offer: tuple[ReviewAction, ...] = REVIEW_ACTIONS,
    ) -> list[tuple[str, str]]:
        """The request's signed links, `(action, url)` for each decision offered: approve
        and deny as the rule allows, edit when the request says how. Each expires with the
        reply token `token` (its expiry is read back from it, so both end together). None
        without `links_base`, once the token has expired, or for an address the inbox cannot
        sign in (the reply still works)."""
        if self.links_base is None:
            return []
        try:
            claims = self.tokens.verify(token, reviewer=address, digest=record.request.digest)
        except InvalidToken:
            return []
        offered: list[ReviewAction] = [
            action for action in offer if (can_edit if action == "edit" else action in allowed)
        ]
        signer, base = Signer(self.secret), self.links_base
        expires = int(claims.expires_at.timestamp())
        try:
            return [
                (
                    action,
                    review_link(signer, base, address, record.approval_id, action, expires=expires),
                )
                for action in offered
            ]
        except SignInLinkError as exc:
            log.info("no links in the request to %s: %s", address, exc)
            return []

    def _outcome(
        self, delivery: Delivery, record: ApprovalRecord, token: str, request: Delivery
    ) -> EmailMessage:
        decision = record.decision
        assert decision is not None  # an outcome is announced once decided
        question = question_of(record.request)
        context = {
            **({} if question is None else question_shown(question)),
            "tool": record.request.tool,
            "approved": decision.approved,
            "timed_out": decision.decided_by == TIMEOUT_DECIDER,
            "decided_by": decision.decided_by,
            "decided_at": _when(record.decided_at or datetime.now(UTC)),
            "reason": decision.reason,
            "answer": decision.response,
            "edited": _shown(decision.edited_args or {}),
            "approval_id": record.approval_id,
            "run_id": record.request.run_id,
            "page": self._page(record),
        }
        name = "outcome" if question is None else "question_outcome"
        message = self._envelope(delivery, token, self._render(f"{name}_subject.txt", context))
        replied = str((request.ref or {})["message_id"])
        message["In-Reply-To"] = replied
        message["References"] = replied
        message.set_content(self._render(f"{name}.txt", context))
        message.add_alternative(self._render(f"{name}.html", context), subtype="html")
        return message

    async def _remind(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """A reminder step: one message to each reviewer whose request was emailed and who
        has not voted, in the thread of their request; each address kept in the delivery's
        progress once sent, so that a retry sends only to the rest."""
        skipped = reminder_skipped(record, delivery, self._clock())
        if skipped is not None:
            return {"skipped": skipped}
        voted = await acted(self.store, record.approval_id)
        ref = dict(delivery.ref or {})
        sent: list[str] = [str(a) for a in ref.get("sent") or []]
        reminded: list[str] = []
        for request in await self.store.deliveries(record.approval_id):
            address = request.address
            ref_of = request.ref or {}
            if request.channel != self.name or request.kind not in ("request", "escalation"):
                continue
            if request.status != "sent" or "message_id" not in ref_of:
                continue  # not emailed (yet): nothing to remind them of
            if address in voted or address in reminded:
                continue
            reminded.append(address)
            if address in sent:
                continue
            token = self._token(record, address)
            await self._send(self._reminder(delivery, record, token, request), address)
            sent.append(address)
            await self._progress(delivery, {**ref, "sent": sent})
        # Their delegates now get the request, once each (kept with the addresses sent).
        for delegate, delegator in await self._delegates(reminded):
            if delegate in sent or delegate in voted:
                continue
            await self._send_delegated(delivery, record, delegate, delegator)
            sent.append(delegate)
            await self._progress(delivery, {**ref, "sent": sent})
        return {"step": reminder_step(delivery), "sent": sent}

    def _reminder(
        self, delivery: Delivery, record: ApprovalRecord, token: str, request: Delivery
    ) -> EmailMessage:
        policy, deadline = record.request.policy, record.request.deadline
        question = question_of(record.request)
        context = {
            **({} if question is None else question_shown(question)),
            "marker": self.marker,
            "step": reminder_step(delivery),
            "limit": len(reminder_steps(record)),
            "tool": record.request.tool,
            "description": policy.get("description"),
            "approval_id": record.approval_id,
            "run_id": record.request.run_id,
            "deadline": None if deadline is None else _when(deadline),
            "allowed": policy.get("allowed_decisions") or ["approve", "edit", "deny"],
            "page": self._page(record),
        }
        name = "reminder" if question is None else "question_reminder"
        subject = self._render(f"{name}_subject.txt", context)
        message = self._envelope(delivery, token, subject, to=request.address)
        replied = str((request.ref or {})["message_id"])
        message["In-Reply-To"] = replied
        message["References"] = replied
        message.set_content(self._render(f"{name}.txt", context))
        return message

    async def _request_sent(self, delivery: Delivery, record: ApprovalRecord) -> Delivery | None:
        """The request delivery of this reviewer that was emailed, None when none was (or
        will be); raises `DeliveryError` (retried) while one is still on its way."""
        mine = [
            d
            for d in await self.store.deliveries(record.approval_id)
            if d.target == delivery.target and d.kind in ("request", "escalation")
        ]
        for earlier in mine:
            if earlier.status == "sent" and "message_id" in (earlier.ref or {}):
                return earlier
        decided_at = record.decided_at or datetime.now(UTC)
        if any(d.status == "due" and d.due_at <= decided_at for d in mine):
            raise DeliveryError("the request to this reviewer is not sent yet", retry_after=1)
        return None

    async def send(self, message: EmailMessage, address: str) -> None:
        """Send `message` to `address` through `smtp` once; raises `DeliveryError`
        (`permanent` for a 5xx answer)."""
        await self._send(message, address)

    async def _send(self, message: EmailMessage, address: str) -> None:
        smtp = self.config.smtp
        try:
            await aiosmtplib.send(
                message,
                sender=self.config.sender,
                recipients=[address],
                hostname=smtp.host,
                port=smtp.port_or_default,
                use_tls=smtp.tls == "tls",
                start_tls=smtp.tls == "starttls",
                username=smtp.username,
                password=None if smtp.password is None else smtp.password.get_secret_value(),
                timeout=smtp.timeout,
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            codes = [refused.code for refused in exc.recipients]
            raise _answered(min(codes, default=0), "; ".join(map(str, exc.recipients))) from exc
        except aiosmtplib.SMTPResponseException as exc:
            raise _answered(exc.code, exc.message) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            # Refused connections, timeouts, a server that hung up: all worth another try.
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise DeliveryError(
                f"the mail server {smtp.host} could not be reached: {reason}"
            ) from exc

    @property
    def marker(self) -> str:
        """The line a reply is cut at (what is above it counts), at the top of each request:
        the one `reading.reply_text` looks for."""
        return MARKER

    def _render(self, name: str, context: dict[str, Any]) -> str:
        return self.templates.get_template(name).render(context)

    async def close(self) -> None:
        return None


def _answered(code: int, text: str) -> DeliveryError:
    """The error of an SMTP answer: 5xx will not change (given up), anything else may."""
    return DeliveryError(f"the mail server answered {code} {text}".strip(), permanent=code >= 500)


def _remembering(policy: dict[str, Any]) -> str | None:
    """How long (and for which arguments) an `approve and remember` holds, in words; None
    when the review's rule remembers nothing."""
    seconds = policy.get("remember")
    if not isinstance(seconds, (int, float)) or not policy.get("rule_digest"):
        return None
    span = next(
        (
            f"{seconds / unit:g} {name}"
            for unit, name in ((86400, "days"), (3600, "hours"))
            if seconds >= unit
        ),
        f"{seconds / 60:g} minutes",
    )
    names = policy.get("remember_by")
    which = f" to the same {', '.join(map(str, names))}" if isinstance(names, list) else ""
    return f"approves later identical calls{which} for {span}"


def _shown(arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """Arguments as reviewers read them: strings as they are, other values as JSON."""
    return [
        (name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        for name, value in arguments.items()
    ]


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
