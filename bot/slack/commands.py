"""The `/nodbot` slash command: the reviews waiting for whoever types it, and their decisions,
answered to them alone.

- `/nodbot pending`: an ephemeral list of the pending reviews the caller may approve or deny
  (the App Home's test, `bot.slack.home`), newest first, at most `LISTED`, each with its whole
  id and, with `web.public_url`, a link to its inbox page;
- `/nodbot approve <id>`, `/nodbot deny <id> [reason...]`: one decision through
  `bot.bulk.Decider` on channel `slack`, with the same authorization as a button click (the
  rules' check of the caller, person by person, `decided_by` their Slack user id; a refused
  attempt is recorded in the review's events with the command's evidence, `via: slash
  command`, and answered with its reason). Slack slash commands cannot ask to confirm: an
  approval of a destructive tool (or of one this bot does not have) that the caller may make
  is answered with an ephemeral message whose Approve button asks Slack's confirm dialog first,
  and that button decides (the App Home's path, `bot.slack.home`); nothing is approved before;
- a question (`core.questions`) is listed as one (the question, its choices), answered with
  the buttons of its message (or in the inbox); `/nodbot deny <id>` declines it, and
  `/nodbot approve <id>` is refused (`QUESTION_APPROVED`, recorded in its events as a refused
  click is): a question is answered, not approved;
- `/nodbot help`, or anything else: how to use it.

Ids are given whole (`apr_...`, as the list and the messages show them): letters, digits, `_`
and `-`, at most 100. The text is read only up to `MAX_TEXT` characters; a reason has at most
2,000 (`bot.forms.MAX_REASON`). Bad input is answered saying what is wrong, and decides
nothing.

Slack waits 3 seconds for an answer: the command is acknowledged at once, then answered
through its `response_url` (`respond`), ephemeral, seen by the caller only. Commands come to
`/slack/events` like every request of Slack (the manifest points the command there), its
signature checked on the raw body before Bolt reads it (`bot.http`), or over Socket Mode.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import ClientError
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.context.respond.async_respond import AsyncRespond

from nodbot.bot.bulk import Decider, ItemOutcome
from nodbot.bot.forms import reason_too_long
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import AuthorizeDecision
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.slack.home import (
    Listing,
    SlackHome,
    Waiting,
    intro,
    outcome_text,
    render,
    render_text,
    review_item,
    summary,
)
from nodbot.bot.slack.messages import inbox_page, link
from nodbot.bot.slack.text import clip, escape
from nodbot.core import ApprovalNotFound, ApprovalRecord, Decision, StoreError
from nodbot.core.questions import is_question

__all__ = [
    "COMMAND",
    "LISTED",
    "MAX_TEXT",
    "QUESTION_APPROVED",
    "Command",
    "CommandError",
    "SlackCommands",
    "parse",
]

log = logging.getLogger(__name__)

COMMAND = "/nodbot"
LISTED = 20
"""The most reviews `/nodbot pending` lists (one block each, within a message's 50)."""
MAX_TEXT = 2_200
"""The most characters of a command's text read: a reason of 2,000 and an id fit."""

_APPROVAL_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")

QUESTION_APPROVED = "questions are answered: open it, or use the buttons of its message"
"""The refusal of `/nodbot approve` on a question."""

Verb = Literal["help", "pending", "approve", "deny"]


@dataclass(frozen=True)
class Command:
    """What `/nodbot` was asked to do."""

    verb: Verb
    approval_id: str | None = None
    """The review, for `approve` and `deny`."""
    reason: str | None = None
    """The reason of a `deny`, if one was given."""


class CommandError(ValueError):
    """What is wrong with a command's text (shown to whoever typed it, escaped)."""


def parse(text: str) -> Command:
    """The command `text` (what follows `/nodbot`) asks for. Raises `CommandError` saying what
    is wrong with it."""
    if len(text) > MAX_TEXT:
        raise CommandError(
            f"the command has {len(text):,} characters; at most {MAX_TEXT:,} are read"
        )
    words = text.split(maxsplit=2)
    if not words or words[0].lower() == "help":
        return Command("help")
    verb = words[0].lower()
    if verb == "pending":
        if len(words) > 1:
            raise CommandError("`pending` takes nothing after it")
        return Command("pending")
    if verb not in ("approve", "deny"):
        raise CommandError(f"there is no command “{clip(words[0], 40)}”")
    if len(words) < 2:
        raise CommandError(f"`{verb}` needs the whole id of a review: {COMMAND} {verb} apr_…")
    approval_id = words[1]
    if not _APPROVAL_ID.fullmatch(approval_id):
        raise CommandError(
            f"“{clip(approval_id, 40)}” is not a review id: an id is made of letters, digits, "
            "_ and - (at most 100), given whole, such as apr_…"
        )
    reason = words[2].strip() if len(words) > 2 else None
    if verb == "approve":
        if reason:
            raise CommandError("`approve` takes only the review's id")
        return Command("approve", approval_id)
    too_long = reason_too_long(reason)
    if too_long is not None:
        raise CommandError(too_long)
    return Command("deny", approval_id, reason or None)


class SlackCommands:
    """Answers `/nodbot` (see the module)."""

    def __init__(
        self,
        channel: SlackChannel,
        authorize: AuthorizeDecision,
        decider: Decider,
        home: SlackHome,
    ) -> None:
        self.channel = channel
        self.authorize = authorize
        self.decider = decider
        self.home = home

    def register(self, app: AsyncApp) -> None:
        """Listen for `/nodbot` on `app`."""
        app.command(COMMAND)(self._command)

    async def _command(self, ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()  # within Slack's 3 seconds; the answer follows through the response URL
        user = str(command.get("user_id") or "")
        text = command.get("text")
        try:
            asked = parse(text if isinstance(text, str) else "")
        except CommandError as exc:
            await _say(respond, text=_usage(f"That did not work: {escape(str(exc))}."))
            return
        try:
            if asked.verb == "pending":
                await self._pending(user, respond)
            elif asked.verb == "approve" and asked.approval_id is not None:
                await self._approve(user, asked.approval_id, command, respond)
            elif asked.verb == "deny" and asked.approval_id is not None:
                outcome = await self._decide(user, asked, command, approved=False)
                await _say(respond, text=outcome_text(outcome, approved=False))
            else:
                await _say(respond, text=_usage(None))
        except StoreError as exc:
            log.warning("%s %s by %s could not be answered: %s", COMMAND, asked.verb, user, exc)
            await _say(
                respond, text="The bot's store cannot be used now; nothing was decided. Try again."
            )

    async def _pending(self, user: str, respond: AsyncRespond) -> None:
        listing = await self.home.waiting(user)
        await _say(
            respond,
            text=intro(len(listing.waiting), listing.problem),
            blocks=pending_message(listing, public_url=self.channel.public_url),
        )

    async def _approve(
        self, user: str, approval_id: str, command: dict[str, Any], respond: AsyncRespond
    ) -> None:
        """Approve, or for a destructive tool that `user` may approve, answer with a button
        that asks Slack's confirm dialog before it approves."""
        try:
            record = await self.channel.store.get(approval_id)
        except ApprovalNotFound:
            record = None
        if record is not None and record.decision is None and is_question(record.request):
            await self._question_approved(user, record, command, respond)
            return
        if record is not None and record.decision is None and self.channel.destructive(record):
            verdict = await self.authorize(user, record, Decision(approved=True, decided_by=user))
            if verdict.allowed:
                # Approve only: a denial is typed, with its reason.
                item = review_item(
                    Waiting(record, approve=True, deny=False),
                    0,
                    public_url=self.channel.public_url,
                    destructive=True,
                )
                await _say(
                    respond,
                    text=f"Approve {item['tool']}? Nothing is approved yet.",
                    blocks=render("confirm.json.j2", item=item),
                )
                return
        outcome = await self._decide(user, Command("approve", approval_id), command, approved=True)
        await _say(respond, text=outcome_text(outcome, approved=True))

    async def _question_approved(
        self, user: str, record: ApprovalRecord, command: dict[str, Any], respond: AsyncRespond
    ) -> None:
        """`/nodbot approve` on a pending question: refused whoever types it (recorded with
        their person, when it can be told), and answered with where to answer it."""
        verdict = await self.authorize(user, record, Decision(approved=True, decided_by=user))
        METRICS.refused("slack", QUESTION_APPROVED)
        await self.channel.store.refuse(
            record.approval_id,
            actor=user,
            channel="slack",
            reason=QUESTION_APPROVED,
            person=verdict.person,
            evidence=_evidence(user, command),
        )
        page = inbox_page(self.channel.public_url, record.approval_id)
        where = f" ({link(page, 'open it in the inbox')})" if page is not None else ""
        await _say(
            respond,
            text=(
                f"Nothing was decided: `{escape(record.approval_id)}` is a question, and "
                f"{QUESTION_APPROVED}{where}. `{COMMAND} deny {escape(record.approval_id)}` "
                "declines it."
            ),
        )

    async def _decide(
        self, user: str, asked: Command, command: dict[str, Any], *, approved: bool
    ) -> ItemOutcome:
        assert asked.approval_id is not None
        return await self.decider.decide_one(
            asked.approval_id,
            approved=approved,
            who=user,
            reason=asked.reason,
            evidence=_evidence(user, command),
        )


def _evidence(user: str, command: dict[str, Any]) -> dict[str, str]:
    """What the command says of who typed it, where (kept in the audit trail)."""
    evidence = {
        "user": user,
        "team": str(command.get("team_id") or ""),
        "channel": str(command.get("channel_id") or ""),
        "via": "slash command",
    }
    return {key: value for key, value in evidence.items() if value}


def pending_message(listing: Listing, *, public_url: str | None) -> list[dict[str, Any]]:
    """The blocks of `/nodbot pending`'s answer."""
    waiting = listing.waiting
    items = []
    for entry in waiting[:LISTED]:
        text = summary(entry.record, inbox=public_url is not None)
        page = inbox_page(public_url, entry.record.approval_id)
        if page is not None:
            text = clip(text, 2900) + f"\n{link(page, 'Open in inbox')}"
        items.append({"text": text})
    hidden = len(waiting) - len(items)
    more = []
    if hidden > 0:
        more.append(f"… and {hidden} more: see the App Home tab, or the web inbox.")
    if not listing.scanned_all:
        more.append("Only the newest pending reviews are looked through here.")
    blocks: list[dict[str, Any]] = render(
        "pending.json.j2",
        intro=intro(len(waiting), listing.problem)
        + (
            f" Decide with `{COMMAND} approve <id>` or `{COMMAND} deny <id> [reason]`."
            if waiting
            else ""
        )
        + (
            f" A question is answered with the buttons of its message; `{COMMAND} deny <id>` "
            "declines it."
            if any(is_question(entry.record.request) for entry in waiting[:LISTED])
            else ""
        ),
        items=items,
        more=" ".join(more) or None,
    )
    return blocks


def _usage(problem: str | None) -> str:
    return render_text("usage.txt.j2", problem=problem, command=COMMAND)


async def _say(
    respond: AsyncRespond, *, text: str, blocks: list[dict[str, Any]] | None = None
) -> None:
    """An ephemeral answer to the command, through its response URL."""
    try:
        answer = await respond(text=clip(text, 3000), blocks=blocks, response_type="ephemeral")
    except (ValueError, ClientError, TimeoutError) as exc:
        log.warning("a %s answer could not be sent: %s", COMMAND, exc)
        return
    if answer.status_code != 200:
        log.warning("a %s answer was refused: HTTP %s %s", COMMAND, answer.status_code, answer.body)
