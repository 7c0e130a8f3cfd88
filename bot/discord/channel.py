"""The Discord channel of the outbox: review requests posted, reminded of and escalated in
replies, and edited once decided.

Every review of a call (and every question: see below) is posted to each channel its rule's
`post_to` names (`discord:<channel id>`), or to each channel of `discord.channels` when its
rule has no `post_to` (`discord_places`), one delivery per channel (`discord:channel:<id>`),
so each message is posted once: a delivery's message is kept in its `ref` as soon as Discord
answers, each post carries a nonce made of the review and the delivery that Discord enforces
(a second post with it within minutes returns the first message instead of a new one), and
an attempt after one that may have posted without recording it first looks for the review's
message among the channel's latest messages and adopts it. Once the review is decided, from
whichever channel, one delivery (`discord:messages`) edits every message posted for it: the
buttons gone, the outcome, who decided and when. An edit can be repeated safely, so a retry
edits again; a message Discord says is gone (deleted, or its channel out of the bot's reach:
404, 403) is skipped and logged, so that it keeps none of the others from their outcome.

With the rule's `remind_every`, each reminder step is one delivery (`discord:reminder:2`,
due at its time, `bot.outbox.reminder_steps`), and with its `escalate_to`, the escalation is
one (`discord:escalation`, due at `escalate_at`). Each is a reply (`message_reference`) to
every message posted for the review (`messages.reminder_message`,
`messages.escalation_message`): a reminder says the review still waits, how many approvals it
still needs and by when, and mentions its reviewers (and, once escalated, those it escalated
to) who have not voted and whose `people:` entry names a Discord user (`people`: the bot's
one `People`, the authorizer's, which resolves a clicker too); an escalation says who may
now decide it too, mentioning those with a Discord id and naming the others. Only the users
mentioned may be pinged (`allowed_mentions: {"users": [...]}`: never a role, never
`@everyone`); with none known, the reply names no one and still says the review waits. A
step the review no longer needs (decided, timed out, or followed by a later step already
due: `reminder_skipped`), and an escalation of a review decided before, are settled as
`{"skipped": why}` without a post. Each reply is posted once as a review's message is: kept
in the delivery's progress as soon as Discord answers (a retry posts only the rest), posted
with a nonce of its delivery and channel that Discord enforces, and, after an attempt that
may have posted it unkept, looked for first among the channel's latest messages (the bot's
reply to that message ending in the same last line) and adopted. A message Discord will not
take a reply to (deleted, or out of reach: 400, 403, 404) is skipped there and logged; the
other channels get theirs.

Who may decide is the review's rule's say, checked by the interactions endpoint
(`bot.discord.interactions`) person by person: a Discord user is a reviewer through a
`people:` entry that names them (`discord:<user id>`) beside a handle the rule lists.

A question (`core.questions`) goes the same way, as a question's message
(`bot.discord.questions`: its choices as a select menu, or Answer, and Decline), posted to the
same channels and, once answered, declined or timed out, edited to say how.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import aiohttp

from nodbot.bot.config.models import DiscordConfig
from nodbot.bot.config.values import normalize_handle
from nodbot.bot.discord.api import DEFAULT_API_URL, DiscordApi, DiscordApiError
from nodbot.bot.discord.messages import (
    button_of,
    decided_message,
    escalation_message,
    reminder_message,
    request_message,
)
from nodbot.bot.discord.questions import question_decided, question_message
from nodbot.bot.outbox import (
    DeliveryError,
    Moment,
    OutboxStore,
    acted,
    approvals_needed,
    reminder_skipped,
    reminder_step,
    reminder_steps,
    reminder_target,
)
from nodbot.bot.policy.people import IdentityUnavailable, People
from nodbot.bot.slack.messages import inbox_page
from nodbot.bot.slack.once import Progress
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, ToolRegistry
from nodbot.core.questions import is_question
from nodbot.core.store import utc_now

__all__ = [
    "ESCALATION_TARGET",
    "MESSAGES_TARGET",
    "DiscordChannel",
    "discord_places",
    "posted_messages",
]

log = logging.getLogger(__name__)

MESSAGES_TARGET = "discord:messages"
"""The delivery that edits a decided review's messages."""
ESCALATION_TARGET = "discord:escalation"
"""The delivery that replies to a review's messages when its rule escalates it."""
REFUSED_REPLY = (400, 403, 404)
"""Discord's answers to a reply to a message that is no longer there (deleted: 400, its
reference unknown; its channel out of the bot's reach: 403, 404): that channel is skipped,
the others get the reply."""
_DISCORD_USER = re.compile(r"discord:([0-9]{5,25})")
"""A Discord user's handle, as a `people:` entry names them."""
NONCE_LENGTH = 25
"""Characters of a message's nonce at most (Discord's limit)."""
GONE = (403, 404)
"""Discord's answers to an edit of a message that is no longer there to edit (deleted, or
its channel no longer readable by the bot): that message is skipped, the others edited."""


def posted_messages(deliveries: list[Delivery]) -> set[tuple[str, str]]:
    """The (channel id, message id) of every message the Discord request deliveries of a
    review say they posted."""
    found: set[tuple[str, str]] = set()
    for delivery in deliveries:
        if delivery.channel != "discord" or delivery.kind != "request":
            continue
        for message in (delivery.ref or {}).get("messages") or []:
            if isinstance(message, dict):
                found.add((str(message.get("channel")), str(message.get("id"))))
    return found


def discord_places(config: DiscordConfig, post_to: object) -> list[str]:
    """The channels a review goes to: those its rule's `post_to` names (`discord:<channel
    id>`), or every one of `discord.channels` for a rule without it."""
    if not isinstance(post_to, list):
        return list(config.channels)
    found: list[str] = []
    for target in post_to:
        chat, _, place = str(target).partition(":")
        if chat == "discord" and place.isascii() and place.isdigit() and place not in found:
            found.append(place)
    return found


class DiscordChannel:
    """Posts and edits the reviews' Discord messages (see the module's docstring)."""

    name = "discord"
    answers = False
    makes_deliveries = False
    tells_outcomes = True

    def __init__(
        self,
        config: DiscordConfig,
        store: OutboxStore,
        registry: ToolRegistry,
        *,
        session: aiohttp.ClientSession,
        public_url: str | None = None,
        people: People | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.config = config
        self.store = store
        self.registry = registry
        self.public_url = public_url
        """`web.public_url`: the messages link to the reviews' inbox pages under it."""
        self.people = people
        """Who the reviewers are (`people:`, as the authorizer resolves them): a reminder or
        an escalation mentions the Discord users of their entries. None: nobody is known by
        a Discord id, so the replies mention no one (they still say the review waits)."""
        self._clock = clock
        self.api = DiscordApi(
            session,
            token=config.bot_token.get_secret_value(),
            application_id=config.application_id,
            base=config.api_url or DEFAULT_API_URL,
        )

    # --- what to deliver ---------------------------------------------------------------------

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        channels = discord_places(self.config, record.request.policy.get("post_to"))
        if stage == "outcome":
            return [NewDelivery("outcome", MESSAGES_TARGET)] if channels else []
        if stage != "request" or record.decision is not None or not channels:
            return []  # decided as it was asked (a rule's decision): nothing to review
        found = [NewDelivery("request", f"{self.name}:channel:{c}") for c in channels]
        policy = record.request.policy
        escalate_at = policy.get("escalate_at")
        if isinstance(escalate_at, str) and policy.get("escalate_to"):
            when = datetime.fromisoformat(escalate_at)
            found.append(NewDelivery("escalation", ESCALATION_TARGET, when))
        found += [
            NewDelivery("reminder", reminder_target(self.name, step), at)
            for step, at in reminder_steps(record)
        ]
        return found

    # --- delivering --------------------------------------------------------------------------

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        try:
            if delivery.kind == "outcome":
                return await self._edit_all(record)
            if delivery.kind == "request":
                return await self._post(delivery, record)
            if delivery.kind == "reminder":
                return await self._remind(delivery, record)
            if delivery.kind == "escalation":
                return await self._escalate(delivery, record)
            return {"skipped": f"the Discord channel does not send {delivery.kind} deliveries"}
        except DiscordApiError as exc:
            raise DeliveryError(
                str(exc), permanent=exc.permanent, retry_after=exc.retry_after
            ) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"Discord could not be reached: {type(exc).__name__}") from exc

    async def _post(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """The review's message in the delivery's channel, posted once (see the module)."""
        kind, _, channel = delivery.address.partition(":")
        if kind != "channel" or not channel.isdigit():
            raise DeliveryError(f"not a Discord channel: {delivery.target}", permanent=True)
        progress = Progress(self.store, delivery)
        known = progress.ref.get("messages")
        if isinstance(known, list) and known:
            return {"messages": known}
        message = await self._earlier(channel, record) if progress.earlier else None
        if message is None:
            if record.decision is not None:
                return {"skipped": "decided before it was posted"}
            await progress.begin()
            body = {
                **self.render(record),
                "nonce": _nonce(record, delivery),
                "enforce_nonce": True,
            }
            posted = await self.api.post_message(channel, body)
            message = {"channel": str(posted.get("channel_id") or channel), "id": str(posted["id"])}
        return {"messages": [message]}

    async def _earlier(self, channel: str, record: ApprovalRecord) -> dict[str, str] | None:
        """The review's message an earlier attempt posted to `channel` without recording it
        (its buttons name the review), or None, also when the channel cannot be read (then
        the nonce still stops a repeat within minutes)."""
        try:
            recent = await self.api.recent_messages(channel)
        except (DiscordApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "could not read Discord channel %s to check for an earlier post of review %s "
                "(%s): posting with its nonce only",
                channel,
                record.approval_id,
                exc,
            )
            return None
        for message in recent:
            author = message.get("author")
            mine = isinstance(author, dict) and str(author.get("id")) == self.config.application_id
            if mine and record.approval_id in _reviews_of(message):
                log.info("review %s was posted to Discord already: kept", record.approval_id)
                return {"channel": channel, "id": str(message.get("id"))}
        return None

    async def _edit_all(self, record: ApprovalRecord) -> dict[str, Any]:
        """Every message posted for the review, edited to its outcome."""
        deliveries = await self.store.deliveries(record.approval_id)
        posts = [d for d in deliveries if d.channel == self.name and d.kind == "request"]
        if any(d.status == "due" for d in posts):
            raise DeliveryError("a request of this review is not posted yet", retry_after=1)
        page = inbox_page(self.public_url, record.approval_id)
        if is_question(record.request):
            body = question_decided(record, page=page)
        else:
            body = decided_message(record, page=page)
        updated, gone = 0, []
        for channel, message in sorted(posted_messages(posts)):
            try:
                await self.api.edit_message(channel, message, body)
            except DiscordApiError as exc:
                if exc.status not in GONE:
                    raise  # tried again (or failed) whole: editing again is safe
                # Deleted, or its channel out of reach: the review's other messages still
                # get their outcome (none of them keeps live buttons because of this one).
                log.warning(
                    "could not edit Discord message %s in channel %s to review %s's outcome "
                    "(%s): left as it is",
                    message,
                    channel,
                    record.approval_id,
                    exc,
                )
                gone.append({"channel": channel, "id": message, "status": exc.status})
                continue
            updated += 1
        return {"updated": updated, "gone": gone} if gone else {"updated": updated}

    # --- reminders and escalation -------------------------------------------------------------

    async def _remind(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """A reminder step: a reply to each message of the review, mentioning its reviewers
        who have not voted (see the module); skipped as `reminder_skipped` says."""
        skipped = reminder_skipped(record, delivery, self._clock())
        if skipped is not None:
            return {"skipped": skipped}
        voted = await acted(self.store, record.approval_id)
        policy = record.request.policy
        listed = _entries(policy.get("reviewers"))
        if self._escalated(record):
            listed += _entries(policy.get("escalate_to"))
        users: list[str] = []
        for handle in listed:
            for user in await self._to_mention(handle, voted) or []:
                if user not in users:
                    users.append(user)
        step = reminder_step(delivery) or 0
        body = reminder_message(
            record,
            step=step,
            limit=len(reminder_steps(record)),
            needed=await approvals_needed(self.store, record),
            users=users,
            page=inbox_page(self.public_url, record.approval_id),
        )
        return {"step": step, **await self._reply(delivery, record, body)}

    async def _escalate(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """The escalation: a reply to each message of the review saying who may now decide
        it too, mentioning those of them known by a Discord id who have not voted; skipped
        when the review was decided before."""
        if record.decision is not None:
            return {"skipped": "decided before the escalation"}
        voted = await acted(self.store, record.approval_id)
        users: list[str] = []
        named: list[str] = []
        for handle in _entries(record.request.policy.get("escalate_to")):
            found = await self._to_mention(handle, voted)
            if found is None:
                named.append(handle)  # no Discord id known: named, not pinged
            users += [user for user in found or [] if user not in users]
        body = escalation_message(
            record,
            needed=await approvals_needed(self.store, record),
            users=users,
            named=named,
            page=inbox_page(self.public_url, record.approval_id),
        )
        return await self._reply(delivery, record, body)

    def _escalated(self, record: ApprovalRecord) -> bool:
        escalate_at = record.request.policy.get("escalate_at")
        return isinstance(escalate_at, str) and self._clock() >= datetime.fromisoformat(escalate_at)

    async def _to_mention(self, handle: str, voted: frozenset[str]) -> list[str] | None:
        """The Discord user ids of the person reviewer entry `handle` stands for (through
        `people:`), none when they have voted; None when no Discord id of theirs is known (no
        entry names one, or who they are cannot be told now: logged, not mentioned)."""
        if self.people is None:
            return None
        try:
            person = await self.people.person(handle)
        except IdentityUnavailable as exc:
            log.info("reviewer %s is not mentioned in Discord: %s", handle, exc)
            return None
        ids = sorted(
            found[1] for h in person.handles if (found := _DISCORD_USER.fullmatch(h)) is not None
        )
        if not ids:
            return None
        if normalize_handle(person.key) in voted or person.handles & voted:
            return []
        return ids

    async def _reply(
        self, delivery: Delivery, record: ApprovalRecord, body: dict[str, Any]
    ) -> dict[str, Any]:
        """`body` as a reply to each message posted for the review, once each (see the
        module): each reply kept in the delivery's progress as it is posted, so that a retry
        posts only the rest; after an attempt that may have posted one without keeping it,
        the channel's latest messages are read for it first, and every post carries a nonce
        Discord enforces. A message whose reply Discord refuses (deleted, or out of reach)
        is skipped and logged."""
        posts = [
            d
            for d in await self.store.deliveries(record.approval_id)
            if d.channel == self.name and d.kind == "request"
        ]
        progress = Progress(self.store, delivery)
        replies = _replies(progress.ref)
        gone = [g for g in progress.ref.get("gone") or [] if isinstance(g, dict)]
        skipped = {(str(g.get("channel")), str(g.get("message"))) for g in gone}
        footer = str(body.get("content") or "").rpartition("\n")[2]
        for channel, message in sorted(posted_messages(posts)):
            if (channel, message) in replies or (channel, message) in skipped:
                continue
            reply = None
            if progress.earlier:
                reply = await self._earlier_reply(channel, message, footer, record)
            if reply is None:
                await progress.begin()
                sent = {
                    **body,
                    "message_reference": {"message_id": message, "channel_id": channel},
                    "nonce": _nonce(record, delivery, channel),
                    "enforce_nonce": True,
                }
                try:
                    reply = str((await self.api.post_message(channel, sent))["id"])
                except DiscordApiError as exc:
                    if exc.status not in REFUSED_REPLY:
                        raise
                    log.warning(
                        "could not reply to Discord message %s in channel %s of review %s "
                        "(%s): skipped",
                        message,
                        channel,
                        record.approval_id,
                        exc,
                    )
                    gone.append({"channel": channel, "message": message, "status": exc.status})
                    await progress.save(gone=gone)
                    continue
            replies[(channel, message)] = reply
            await progress.save(replies=_replies_ref(replies), begun=None)
        done: dict[str, Any] = {
            "replies": _replies_ref(replies),
            "mentioned": list(body.get("allowed_mentions", {}).get("users") or []),
        }
        return {**done, "gone": gone} if gone else done

    async def _earlier_reply(
        self, channel: str, message: str, footer: str, record: ApprovalRecord
    ) -> str | None:
        """The id of the reply to `message` an earlier attempt posted without keeping it (the
        bot's, referencing `message`, ending in the same last line), or None, also when the
        channel cannot be read (then the nonce still stops a repeat within minutes)."""
        try:
            recent = await self.api.recent_messages(channel)
        except (DiscordApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "could not read Discord channel %s to check for an earlier reply of review %s "
                "(%s): posting with its nonce only",
                channel,
                record.approval_id,
                exc,
            )
            return None
        for found in recent:
            author = found.get("author")
            mine = isinstance(author, dict) and str(author.get("id")) == self.config.application_id
            reference = found.get("message_reference")
            replying = isinstance(reference, dict) and str(reference.get("message_id")) == message
            if mine and replying and str(found.get("content") or "").endswith(footer):
                log.info(
                    "a reply of review %s was posted to Discord already: kept", record.approval_id
                )
                return str(found.get("id"))
        return None

    def render(self, record: ApprovalRecord) -> dict[str, Any]:
        """The review's request message (a question's own, `bot.discord.questions`), its
        buttons those its rule allows."""
        policy = record.request.policy
        page = inbox_page(self.public_url, record.approval_id)
        if is_question(record.request):
            asked = policy.get("allowed_decisions") or ["respond", "deny"]
            return question_message(record, allowed=asked, page=page)
        allowed = policy.get("allowed_decisions") or ["approve", "edit", "deny"]
        checkable = record.request.tool in self.registry or isinstance(policy.get("schema"), dict)
        can_edit = (
            "edit" in allowed
            and checkable
            and record.request.approvals_required == 1
            and policy.get("editable") != []
        )
        return request_message(
            record,
            can_approve="approve" in allowed,
            can_edit=can_edit,
            can_deny="deny" in allowed,
            page=page,
        )

    async def close(self) -> None:
        """Nothing of its own to let go of: the session is the bot's."""


def _nonce(record: ApprovalRecord, delivery: Delivery, channel: str | None = None) -> str:
    """The post's nonce: the same for every attempt of one delivery (and, for a reply, one
    channel), and no other's."""
    seed = f"{record.approval_id}:{delivery.delivery_id}"
    if channel is not None:
        seed += f":{channel}"
    return hashlib.sha256(seed.encode()).hexdigest()[:NONCE_LENGTH]


def _entries(value: object) -> list[str]:
    """The reviewer entries of a policy's `reviewers` or `escalate_to`, as written."""
    return [str(entry) for entry in value] if isinstance(value, list) else []


def _replies(ref: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """The replies a reminder's or escalation's ref says it posted: (channel, message) ->
    the reply's id."""
    found = ref.get("replies")
    return {
        (str(r["channel"]), str(r["message"])): str(r["id"])
        for r in (found if isinstance(found, list) else [])
        if isinstance(r, dict) and {"channel", "message", "id"} <= r.keys()
    }


def _replies_ref(replies: Mapping[tuple[str, str], str]) -> list[dict[str, str]]:
    return [
        {"channel": channel, "message": message, "id": reply}
        for (channel, message), reply in replies.items()
    ]


def _reviews_of(message: dict[str, Any]) -> set[str]:
    """The approval ids a message's components (buttons, a question's select menu) name."""
    found: set[str] = set()
    for row in message.get("components") or []:
        for button in (row.get("components") or []) if isinstance(row, dict) else []:
            named = (
                button_of(str(button.get("custom_id") or "")) if isinstance(button, dict) else None
            )
            if named is not None:
                found.add(named[1])
    return found
