"""The Discord channel of the outbox: review requests posted, and edited once decided.

Every review of a call (and every question: see below) is posted to each channel its rule's
`post_to` names (`discord:<channel id>`), or to each channel of `discord.channels` when its
rule has no `post_to` (`discord_places`), one delivery per channel (`discord:channel:<id>`),
so each message is
posted once: a delivery's message is kept in its `ref` as soon as Discord answers, each post
carries a nonce made of the review and the delivery that Discord enforces (a second post with
it within minutes returns the first message instead of a new one), and an attempt after one
that may have posted without recording it first looks for the review's message among the
channel's latest messages and adopts it. Once the review is decided, from whichever channel,
one delivery (`discord:messages`) edits every message posted for it: the buttons gone, the
outcome, who decided and when. An edit can be repeated safely, so a retry edits again; a
message Discord says is gone (deleted, or its channel out of the bot's reach: 404, 403) is
skipped and logged, so that it keeps none of the others from their outcome.

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
from typing import Any

import aiohttp

from nodbot.bot.config.models import DiscordConfig
from nodbot.bot.discord.api import DEFAULT_API_URL, DiscordApi, DiscordApiError
from nodbot.bot.discord.messages import button_of, decided_message, request_message
from nodbot.bot.discord.questions import question_decided, question_message
from nodbot.bot.outbox import DeliveryError, Moment, OutboxStore
from nodbot.bot.slack.messages import inbox_page
from nodbot.bot.slack.once import Progress
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, ToolRegistry
from nodbot.core.questions import is_question

__all__ = ["MESSAGES_TARGET", "DiscordChannel", "discord_places", "posted_messages"]

log = logging.getLogger(__name__)

MESSAGES_TARGET = "discord:messages"
"""The delivery that edits a decided review's messages."""
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
    ) -> None:
        self.config = config
        self.store = store
        self.registry = registry
        self.public_url = public_url
        """`web.public_url`: the messages link to the reviews' inbox pages under it."""
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
        if stage != "request" or record.decision is not None:
            return []  # decided as it was asked (a rule's decision): nothing to review
        return [NewDelivery("request", f"{self.name}:channel:{c}") for c in channels]

    # --- delivering --------------------------------------------------------------------------

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        try:
            if delivery.kind == "outcome":
                return await self._edit_all(record)
            if delivery.kind == "request":
                return await self._post(delivery, record)
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


def _nonce(record: ApprovalRecord, delivery: Delivery) -> str:
    """The post's nonce: the same for every attempt of one delivery, and no other's."""
    seed = f"{record.approval_id}:{delivery.delivery_id}".encode()
    return hashlib.sha256(seed).hexdigest()[:NONCE_LENGTH]


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
