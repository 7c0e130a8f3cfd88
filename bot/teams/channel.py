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

A question (`core.questions`) is posted the same way, to the same conversations, as its own
card (`bot.teams.questions`: a button per choice, or an answer box, and Decline), replaced
once it is answered, declined or timed out, from whichever channel.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from nodbot.bot.config.models import TeamsConfig
from nodbot.bot.outbox import DeliveryError, Moment, OutboxStore
from nodbot.bot.slack.once import Progress
from nodbot.bot.teams.auth import BotToken
from nodbot.bot.teams.cards import review_card
from nodbot.bot.teams.connector import Connector, ConnectorError, card_activity
from nodbot.bot.teams.questions import question_card, question_decided_card
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, ToolRegistry
from nodbot.core.questions import is_question

__all__ = ["CARDS_TARGET", "TeamsChannel", "cards_of"]

log = logging.getLogger(__name__)

CARDS_TARGET = "teams:cards"
"""The delivery that updates a decided review's cards."""


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
    ) -> None:
        self.config = config
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
        return [NewDelivery("request", f"{self.name}:{conversation}") for conversation in places]

    # --- delivering --------------------------------------------------------------------------

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        if delivery.kind == "outcome":
            return await self._update_all(record)
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


def cards_of(ref: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """The cards (`{"conversation", "service_url", "id"}`) a request delivery's ref says it
    posted."""
    found = (ref or {}).get("cards")
    return [
        {key: str(card[key]) for key in ("conversation", "service_url", "id")}
        for card in (found if isinstance(found, list) else [])
        if isinstance(card, dict) and {"conversation", "service_url", "id"} <= card.keys()
    ]
