"""The Microsoft Teams channel of the outbox: review requests posted as Adaptive Cards, and
updated once decided. A review goes to the conversations its rule's `post_to` names
(`teams:<name or id>` of a conversation of `teams.post_to`), or to every conversation of
`teams.post_to` when its rule has no `post_to` (`teams_places`).

Each conversation is one delivery (`teams:<conversation id>`), so each card is posted once
however many replicas announce the review: the outbox claims a delivery for one worker at a
time. The card's activity id is kept in the delivery's progress as soon as the connector
answers (`Progress`, as the Slack channel keeps its messages), so a retry after a later
failure does not post again. The connector offers no way to read a conversation back, so an
attempt after one that died between the post and keeping its id posts again, with a warning:
a duplicate is better than a lost review. Once the review is decided, from whichever channel,
one delivery (`teams:cards`) replaces every card posted for it (PUT of the activity): the
actions gone, the outcome, who decided and when. A replace can be repeated safely: when
Teams throttles or fails, all are replaced again later; a card that can no longer be
replaced (deleted, the bot removed from its conversation) is logged and skipped, so it does
not keep the others as they were.

With the rule's `remind_every`, each reminder step is one delivery (`teams:reminder:2`, due at
its step's time, `bot.outbox.reminder_steps`): a reply under each card posted for the review
(a message activity with `replyToId` the card's id, through the connector that card was
posted through, never another), a card without actions saying that the review still waits
(the tool, the approvals still needed, the deadline) and naming the reviewers who have not
voted by their handles as the rules write them, escaped (the bot does not know their Teams
ids: nobody is @mentioned). A step is settled without a reply (`{"skipped": why}`) when
`reminder_skipped` says so (decided, past the deadline, or the next step due too), or when
every reviewer it could name has voted. With the rule's `escalate_to`, one delivery
(`teams:cards`, kind `escalation`, due at `escalate_at`) replies the same way that the review
is escalated and who may now decide too; skipped when the review was decided before.

Each reply's id is kept in its delivery's progress as soon as the connector answers, so a
retry after a later failure (Teams throttling one conversation) replies only where it has not
yet; as for cards, an attempt after one that died between the reply and keeping its id
replies again, with a warning. A card that can no longer be replied to (deleted, the bot
removed from its conversation) is logged and skipped, so it does not keep the others back;
a card not posted yet when a step is due gets no reply for that step.

A question (`core.questions`) is posted the same way, to the same conversations, as its own
card (`bot.teams.questions`: a button per choice, or an answer box, and Decline), replaced
once it is answered, declined or timed out, from whichever channel; its reminders and its
escalation ask for its answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import aiohttp

from nodbot.bot.config.models import TeamsConfig
from nodbot.bot.config.values import normalize_handle
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
    stored_reviewers,
)
from nodbot.bot.slack.once import Progress
from nodbot.bot.teams.auth import BotToken
from nodbot.bot.teams.cards import escalation_card, reminder_card, review_card
from nodbot.bot.teams.connector import Connector, ConnectorError, card_activity
from nodbot.bot.teams.questions import question_card, question_decided_card
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, ToolRegistry
from nodbot.core.questions import is_question
from nodbot.core.store import utc_now

__all__ = ["CARDS_TARGET", "TeamsChannel", "cards_of", "replies_of"]

log = logging.getLogger(__name__)

CARDS_TARGET = "teams:cards"
"""The delivery that updates a decided review's cards (kind `outcome`), and the one that
replies under them when the review escalates (kind `escalation`)."""


def teams_places(config: TeamsConfig, post_to: object) -> list[str]:
    """The conversations a review goes to: those its rule's `post_to` names (`teams:<name or
    id>` of `teams.post_to`), or every one of `teams.post_to` for a rule without it."""
    known = [entry.conversation for entry in config.post_to]
    if not isinstance(post_to, list):
        return known
    named = {entry.name: entry.conversation for entry in config.post_to if entry.name}
    found: list[str] = []
    for target in post_to:
        chat, _, place = str(target).partition(":")
        conversation = named.get(place, place) if chat == "teams" else None
        if conversation in known and conversation not in found:
            found.append(conversation)
    return found


class TeamsChannel:
    """Posts and updates the reviews' Teams cards (see the module's docstring)."""

    name = "teams"
    answers = False
    makes_deliveries = False
    tells_outcomes = True

    def __init__(
        self,
        config: TeamsConfig,
        store: OutboxStore,
        registry: ToolRegistry,
        *,
        session: aiohttp.ClientSession,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.config = config
        self._clock = clock
        self.store = store
        self.registry = registry
        self.session = session
        token = BotToken(
            session,
            app_id=config.app_id,
            password=config.app_password.get_secret_value(),
            token_url=config.token_url,
        )
        self.connector = Connector(session, token, ttl=config.cache_ttl)
        self._service_urls = {c.conversation: c.service_url for c in config.post_to}

    # --- what to deliver ---------------------------------------------------------------------

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        if not self._service_urls or stage == "answer":
            return []
        places = teams_places(self.config, record.request.policy.get("post_to"))
        if stage == "outcome":
            return [NewDelivery("outcome", CARDS_TARGET)] if places else []
        if not places:
            return []
        found = [NewDelivery("request", f"{self.name}:{conversation}") for conversation in places]
        escalate_at = _moment(record.request.policy.get("escalate_at"))
        if escalate_at is not None:
            found.append(NewDelivery("escalation", CARDS_TARGET, escalate_at))
        found += [
            NewDelivery("reminder", reminder_target(self.name, step), at)
            for step, at in reminder_steps(record)
        ]
        return found

    # --- delivering --------------------------------------------------------------------------

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        if delivery.kind == "outcome":
            return await self._update_all(record)
        if delivery.kind == "reminder":
            return await self._remind(delivery, record)
        if delivery.kind == "escalation":
            return await self._escalate(delivery, record)
        if delivery.kind != "request":
            return {"skipped": f"Teams delivers no {delivery.kind}"}
        return await self._post(delivery, record)

    async def _post(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        conversation = delivery.address
        service_url = self._service_urls.get(conversation)
        if service_url is None:
            raise DeliveryError(
                f"Teams conversation {conversation} is no longer in teams.post_to", permanent=True
            )
        progress = Progress(self.store, delivery)
        known = cards_of(progress.ref)
        if known:
            return {"cards": known}
        if progress.earlier:
            log.warning(
                "an earlier attempt to post review %s to Teams conversation %s may have posted "
                "it (the connector cannot be read back): posting again, a duplicate is possible",
                record.approval_id,
                conversation,
            )
        await progress.begin()
        card = self.card(record)
        posted = await self.connector.post(service_url, conversation, card_activity(card))
        found = [{"conversation": conversation, "service_url": service_url, "id": posted}]
        await progress.save(cards=found, begun=None)
        return {"cards": found}

    async def posts(self, approval_id: str) -> list[Delivery]:
        """The review's request deliveries of this channel."""
        return [
            d
            for d in await self.store.deliveries(approval_id)
            if d.channel == self.name and d.kind == "request"
        ]

    async def _update_all(self, record: ApprovalRecord) -> dict[str, Any]:
        posts = await self.posts(record.approval_id)
        if any(d.status == "due" for d in posts if d.due_at <= (record.decided_at or d.due_at)):
            raise DeliveryError("a card of this review is not posted yet", retry_after=1)
        activity = card_activity(self.card(record))
        cards = [card for d in posts for card in cards_of(d.ref)]
        gone: list[str] = []
        retry: ConnectorError | None = None
        for card in cards:
            try:
                await self.connector.update(
                    card["service_url"], card["conversation"], card["id"], activity
                )
            except ConnectorError as exc:
                # One card that cannot be replaced (deleted, the bot removed from its
                # conversation, Teams failing) does not keep the others as they were.
                if not exc.permanent:
                    retry = retry or exc
                    continue
                log.warning(
                    "the Teams card %s of review %s in conversation %s cannot be replaced: %s",
                    card["id"],
                    record.approval_id,
                    card["conversation"],
                    exc,
                )
                gone.append(card["id"])
        if retry is not None:
            raise retry  # all are replaced again: a replace can be repeated safely
        return {"updated": len(cards) - len(gone), "not_replaced": gone}

    async def _remind(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """A reminder step: a reply under each of the review's cards, naming the reviewers
        who have not voted (see the module's docstring)."""
        step = reminder_step(delivery)
        skipped = reminder_skipped(record, delivery, self._clock())
        if skipped is not None or step is None:
            return _skipped(delivery, skipped or "not a reminder")
        waiting = await self._not_voted(record)
        if waiting is None:
            return _skipped(delivery, f"every reviewer reminder {step} could name has voted")
        card = reminder_card(
            record,
            step=step,
            limit=len(reminder_steps(record)),
            waiting=waiting,
            needed=await approvals_needed(self.store, record),
        )
        return {"step": step, **await self._reply_to_cards(delivery, record, card)}

    async def _escalate(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """The escalation: a reply under each of the review's cards saying who may now
        decide too; skipped when the review was decided (or timed out) before."""
        if record.decision is not None:
            return _skipped(delivery, "decided before the escalation")
        deadline = record.request.deadline
        if deadline is not None and self._clock() >= deadline:
            return _skipped(delivery, "timed out before the escalation")
        escalated_to = [
            entry.text for entry in stored_reviewers(record.request.policy.get("escalate_to"))
        ]
        card = escalation_card(
            record, escalated_to=escalated_to, needed=await approvals_needed(self.store, record)
        )
        return await self._reply_to_cards(delivery, record, card)

    async def _reply_to_cards(
        self, delivery: Delivery, record: ApprovalRecord, card: dict[str, Any]
    ) -> dict[str, Any]:
        """`card` as a reply under each card posted for the review, through the connector
        that card was posted through; each reply's id kept in the delivery's progress as
        soon as the connector answers, so that a retry replies only where it has not yet."""
        progress = Progress(self.store, delivery)
        replies = replies_of(progress.ref)
        done = {(reply["conversation"], reply["card"]) for reply in replies}
        activity = card_activity(card)
        gone: list[str] = []
        retry: ConnectorError | None = None
        for post in await self.posts(record.approval_id):
            for posted in cards_of(post.ref):
                conversation, card_id = posted["conversation"], posted["id"]
                if (conversation, card_id) in done:
                    continue
                if progress.earlier:
                    log.warning(
                        "an earlier attempt of delivery %s may have replied under card %s in "
                        "Teams conversation %s (the connector cannot be read back): replying "
                        "again, a duplicate is possible",
                        delivery.target,
                        card_id,
                        conversation,
                    )
                await progress.begin()
                try:
                    reply = await self.connector.reply(
                        posted["service_url"], conversation, card_id, activity
                    )
                except ConnectorError as exc:
                    if not exc.permanent:
                        retry = retry or exc  # the others first; this one on the next attempt
                        continue
                    log.warning(
                        "cannot reply under Teams card %s of review %s in conversation %s: %s",
                        card_id,
                        record.approval_id,
                        conversation,
                        exc,
                    )
                    gone.append(card_id)
                    continue
                replies.append({"conversation": conversation, "card": card_id, "id": reply})
                done.add((conversation, card_id))
                await progress.save(replies=replies, begun=None)
        if retry is not None:
            raise retry
        return {"replies": replies, "not_replied": gone} if gone else {"replies": replies}

    async def _not_voted(self, record: ApprovalRecord) -> list[str] | None:
        """The handles of the reviewers (and, once escalated, of `escalate_to`) who have not
        voted, as the rules write them; None when every one a reminder could name has voted
        and no entry is a place (a Slack channel or user group) whose members the bot cannot
        tell apart, so that nobody is left to remind."""
        policy = record.request.policy
        entries = stored_reviewers(policy.get("reviewers"))
        escalate_at = _moment(policy.get("escalate_at"))
        if escalate_at is not None and self._clock() >= escalate_at:
            entries += stored_reviewers(policy.get("escalate_to"))
        if not entries:
            return []
        voted = await acted(self.store, record.approval_id)
        waiting: list[str] = []
        places = False
        for entry in entries:
            if not entry.is_individual:
                places = True
                continue
            has_voted = normalize_handle(entry.text) in voted or entry.value in voted
            if not has_voted and entry.text not in waiting:
                waiting.append(entry.text)
        return waiting if waiting or places else None

    def card(self, record: ApprovalRecord, *, error: str | None = None) -> dict[str, Any]:
        """The review's card as it stands (`error`: why the last action was refused); a
        question's own (`bot.teams.questions`) for a question."""
        policy = record.request.policy
        if is_question(record.request):
            if record.decision is not None:
                return question_decided_card(record)
            # Answered or declined, nothing else, whatever the policy kept with it says.
            asked = policy.get("allowed_decisions") or ["respond", "deny"]
            allowed = [action for action in asked if action in ("respond", "deny")]
            return question_card(record, allowed=allowed, error=error)
        allowed = policy.get("allowed_decisions") or ["approve", "edit", "deny"]
        tool_known = record.request.tool in self.registry
        # An external tool is edited only when its caller sent the arguments' schema.
        checkable = tool_known or isinstance(policy.get("schema"), dict)
        can_edit = (
            checkable and record.request.approvals_required == 1 and policy.get("editable") != []
        )
        return review_card(record, allowed=allowed, can_edit=can_edit, error=error)

    async def close(self) -> None:
        """Nothing of its own: the session is the bot's."""


def replies_of(ref: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """The replies (`{"conversation", "card", "id"}`) a reminder's or an escalation's ref
    says it posted."""
    found = (ref or {}).get("replies")
    return [
        {key: str(reply[key]) for key in ("conversation", "card", "id")}
        for reply in (found if isinstance(found, list) else [])
        if isinstance(reply, dict) and {"conversation", "card", "id"} <= reply.keys()
    ]


def _skipped(delivery: Delivery, why: str) -> dict[str, Any]:
    """A reminder or an escalation settled without a reply, keeping the replies an earlier
    attempt made (the review was decided between two attempts)."""
    replies = replies_of(delivery.ref)
    return {"skipped": why, "replies": replies} if replies else {"skipped": why}


def _moment(text: object) -> datetime | None:
    """A stored ISO moment (`escalate_at`), None when absent or not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        log.warning("escalate_at %r of a stored review is not a moment; not escalated here", text)
        return None


def cards_of(ref: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """The cards (`{"conversation", "service_url", "id"}`) a request delivery's ref says it
    posted."""
    found = (ref or {}).get("cards")
    return [
        {key: str(card[key]) for key in ("conversation", "service_url", "id")}
        for card in (found if isinstance(found, list) else [])
        if isinstance(card, dict) and {"conversation", "service_url", "id"} <= card.keys()
    ]
