"""Decisions made in Microsoft Teams: the Approve, Edit and Deny actions (`Action.Execute`) of
a review's card, which Teams sends to `POST /teams/messages` as `adaptiveCard/action` invoke
activities, answered with the card to show in its place.

Nothing is read from an activity before its token is verified (`bot.teams.auth`): a request
that is not shown to come from the Bot Framework is refused with 401 and changes nothing. An
action decides only the review of the card it is on: the review its data names must be one
whose card was posted as that activity (`replyToId`) in that conversation. Only Teams'
activities (`channelId` `msteams`) are actions. Who acted is the member the connector the
card was posted through says they are (`GET .../members/{id}`; the bot's token goes to no
other connector, and an action whose `serviceUrl` is another is refused): their Azure AD
address (`email`, else `userPrincipalName`), which is the handle checked, person by person,
by the same `Authorizer` as every channel (reviewers, `people:` entries, self-approval, quorum by
person, delegations). When the connector cannot say, or says an address-less member or one
whose AAD object id is not the activity's, the action is refused (who acted cannot be told).
A refused action is recorded on the review (a `refused` event with the member's ids as its
evidence) and the card shows why; a decision is recorded through `Executor.decide` with
`decided_by` the address, channel `teams`, and the evidence, and the outbox then replaces
the card for everyone. Deny takes the reason typed on the card; Edit (on a review whose
rule allows edits and that needs one approval; a Save sent otherwise is refused and
recorded) answers with the edit form, typed from the tool's schema (`bot.forms`), whose
Save checks and records the edit as an approval with edited arguments (errors shown on the
form, under their inputs).

A question's card (`bot.teams.questions`) is answered the same way: a choice's button (or the
list's Answer) names the choice by its index, looked up in the question itself, and records
it as a respond; a free-text answer is checked (`answer_problem`: needed, bounded) and
recorded as a respond; Decline records a deny with the reason typed. Each goes through the
same `Authorizer` (only the question's reviewers answer) and `Executor.decide`, which checks
the answer against the choices again. A choice the question does not have, an answer or
decline on a call's card, or an approve, edit or deny on a question's card is refused and
recorded (`NOT_A_CHOICE`, `NOT_A_QUESTION`, `A_QUESTION`); an action on a question that was
closed meanwhile is told how ("already answered by ...").

Other activities (messages to the bot, conversation updates) are acknowledged and logged:
a conversation the bot is added to is logged with its id and service URL, which is what
`teams.post_to` names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nodbot.bot.forms import FIELD_PREFIX, EditField, edit_fields, parse_edit, reason_too_long
from nodbot.bot.http.auth import ApiError
from nodbot.bot.http.limits import loads
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import Authorizer, Verdict
from nodbot.bot.teams.auth import TokenCheck, Unverified
from nodbot.bot.teams.cards import edit_card
from nodbot.bot.teams.channel import TeamsChannel, cards_of
from nodbot.bot.teams.connector import CARD, ConnectorError
from nodbot.bot.teams.questions import QUESTION_VERBS, chosen, question_decided_card
from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalNotFound,
    ApprovalRecord,
    Decision,
    DeferredApproval,
    Executor,
    InvalidArgumentsError,
    InvalidDecisionError,
    ToolDecision,
    UnknownToolError,
)
from nodbot.core.questions import answer_of, answer_problem, is_question, question_of
from nodbot.core.store import TIMEOUT_DECIDER, utc_now

__all__ = ["CHANNEL", "MAX_ACTIVITY", "Action", "TeamsReviews", "parse_action"]

log = logging.getLogger(__name__)

CHANNEL = "teams"
TEAMS = "msteams"
"""The Bot Framework's `channelId` of Teams: the only channel whose actions are taken."""
MAX_ACTIVITY = 64 * 1024
"""The most bytes of an activity read, an edit form's inputs included (the app's `BodyLimit`
allows a route no more by default)."""
MAX_FIELD = 512
"""The most characters of an id (conversation, user, activity, review) taken from one."""
VERBS = frozenset({"approve", "edit", "save", "deny", "refresh", *QUESTION_VERBS})
NOT_ITS_CARD = "this card does not belong to this review"
POSTED_WAIT = 5.0
"""How long (seconds) an action waits for the card it is on to be kept (see `_on_its_card`)."""
WHO_UNKNOWN = "Teams could not say who you are (your address); try again in a moment"
OTHER_CONNECTOR = "this action did not come through the Teams connector its card was posted to"
"""The refusal of an action whose (verified) `serviceUrl` is not the connector the bot
posted the card through: the bot's token goes to that connector only."""
A_QUESTION = "this is a question: answer it or decline it with the actions of its card"
"""The refusal of an Approve, Edit or Deny on a question (its card has none)."""
NOT_A_QUESTION = "this review is not a question: decide it with the actions of its card"
"""The refusal of an Answer or Decline on a call's review."""
NOT_A_CHOICE = "this is not one of the question's answers"
"""The refusal of a choice the question does not have (a forged action)."""
NOT_PICKED = "pick one of the answers first"
NOT_EDITABLE = "this call may not be edited; approve or deny it"
"""The refusal of an Edit or Save where the rule allows no edit, or the review needs several
approvals (whose edit would win is unclear)."""
UNREADABLE_ANSWER = "this question cannot be read, so it cannot be answered: decline it"


class Action:
    """An `adaptiveCard/action` invoke, as far as a decision needs it."""

    def __init__(
        self,
        *,
        verb: str,
        approval_id: str,
        data: dict[str, Any],
        user: str,
        aad_object_id: str | None,
        conversation: str,
        card_id: str,
        service_url: str,
        evidence: dict[str, str],
    ) -> None:
        self.verb = verb
        self.approval_id = approval_id
        self.data = data
        self.user = user
        self.aad_object_id = aad_object_id
        self.conversation = conversation
        """The conversation's id, without a channel thread's `;messageid=` part."""
        self.card_id = card_id
        """The activity id of the card the action was taken on (`replyToId`)."""
        self.service_url = service_url
        self.evidence = evidence


def _text(value: object) -> str:
    return value[:MAX_FIELD] if isinstance(value, str) else ""


def parse_action(activity: dict[str, Any]) -> Action | None:
    """The action of an `adaptiveCard/action` invoke activity, or None for any other
    activity (or one missing what an action needs)."""
    if activity.get("type") != "invoke" or activity.get("name") != "adaptiveCard/action":
        return None
    if activity.get("channelId") != TEAMS:
        return None  # the cards are Teams': no other Bot Framework channel acts on them
    value = activity.get("value")
    action = value.get("action") if isinstance(value, dict) else None
    if not isinstance(action, dict) or action.get("type") != "Action.Execute":
        return None
    verb, data = action.get("verb"), action.get("data")
    sender, conversation = activity.get("from"), activity.get("conversation")
    if verb not in VERBS or not isinstance(data, dict):
        return None
    if not isinstance(sender, dict) or not isinstance(conversation, dict):
        return None
    approval_id, user = _text(data.get("approval_id")), _text(sender.get("id"))
    where = _text(conversation.get("id")).partition(";")[0]
    card_id, service_url = _text(activity.get("replyToId")), _text(activity.get("serviceUrl"))
    if not approval_id or not user or not where or not card_id or not service_url:
        return None
    channel_data = activity.get("channelData")
    tenant = channel_data.get("tenant") if isinstance(channel_data, dict) else None
    aad = _text(sender.get("aadObjectId")) or None
    evidence = {
        "user": user,
        "aad_object_id": aad or "",
        "tenant": _text(tenant.get("id")) if isinstance(tenant, dict) else "",
        "conversation": where,
        "card": card_id,
        "activity": _text(activity.get("id")),
        "verb": str(verb),
    }
    return Action(
        verb=str(verb),
        approval_id=approval_id,
        data=data,
        user=user,
        aad_object_id=aad,
        conversation=where,
        card_id=card_id,
        service_url=service_url,
        evidence={key: text for key, text in evidence.items() if text},
    )


class TeamsReviews:
    """The messaging endpoint: verifies activities and turns actions into decisions."""

    def __init__(
        self,
        channel: TeamsChannel,
        *,
        authorizer: Authorizer,
        on_decided: Callable[[], None] | None = None,
    ) -> None:
        self.channel = channel
        self.store = channel.store
        self.registry = channel.registry
        self.authorizer = authorizer
        self.on_decided = on_decided
        config = channel.config
        self.check = TokenCheck(
            channel.session,
            app_id=config.app_id,
            openid_url=config.openid_url,
            issuer=config.issuer,
        )
        self.executor = Executor(self.registry, approval=DeferredApproval(self.store))
        self.counters: dict[str, int] = {"decisions": 0}

    async def endpoint(self, request: Request) -> Response:
        """`POST /teams/messages`."""
        body = await _body(request)
        if body is None:
            return JSONResponse({"error": "the activity is too large"}, status_code=413)
        try:
            # Bounded as every body the bot reads: depth, duplicate keys, UTF-8.
            activity = await asyncio.to_thread(loads, body)
        except ApiError:
            activity = None
        if not isinstance(activity, dict):
            # Refused as unverified: nothing says the Bot Framework sent it.
            return JSONResponse({"error": "not a Bot Framework activity"}, status_code=401)
        try:
            await self.check.claims(request.headers.get("authorization"), activity)
        except Unverified as exc:
            log.warning("a request to /teams/messages was refused: %s", exc)
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        action = parse_action(activity)
        if action is None:
            _noted(activity)
            return Response(status_code=200)
        card = await self.act(action)
        return JSONResponse({"statusCode": 200, "type": CARD, "value": card})

    async def act(self, action: Action) -> dict[str, Any]:
        """The card to show after `action` (see the module)."""
        try:
            record = await self.store.get(action.approval_id)
        except ApprovalNotFound:
            return _note("this review no longer exists")
        card = await self._on_its_card(action)
        if card is None:
            await self._refused(action, record, NOT_ITS_CARD, person=None)
            return _note(NOT_ITS_CARD)
        question = is_question(record.request)
        if action.verb == "refresh" or record.decision is not None:
            if question and record.decision is not None and action.verb in QUESTION_VERBS:
                return question_decided_card(record, note=_closed(record))
            return self.channel.card(record)
        if not _same_connector(action.service_url, card["service_url"]):
            log.warning(
                "a Teams action on review %s came through %r, not %r, its card's connector",
                record.approval_id,
                action.service_url,
                card["service_url"],
            )
            await self._refused(action, record, OTHER_CONNECTOR, person=None)
            return self.channel.card(record, error=OTHER_CONNECTOR)
        handle = await self._who(action, card["service_url"])
        if handle is None:
            await self._refused(action, record, WHO_UNKNOWN, person=None)
            return self.channel.card(record, error=WHO_UNKNOWN)
        if question != (action.verb in QUESTION_VERBS):
            refusal = A_QUESTION if question else NOT_A_QUESTION
            await self._refused(action, record, refusal, person=None, by=handle)
            return self.channel.card(record, error=refusal)
        if question:
            return await self._answer(action, record, handle)
        if action.verb == "approve":
            return await self._decide(action, record, Decision(approved=True, decided_by=handle))
        if action.verb == "deny":
            reason = _text_value(action.data.get("reason")) or None
            problem = reason_too_long(reason)
            if problem is not None:
                return self.channel.card(record, error=problem)
            decision = Decision(approved=False, reason=reason, decided_by=handle)
            return await self._decide(action, record, decision)
        if action.verb == "edit":
            return await self._edit(action, record, handle)
        return await self._save(action, record, handle)

    async def _answer(self, action: Action, record: ApprovalRecord, handle: str) -> dict[str, Any]:
        """Answer or Decline on a question's card: the respond (the choice its index names,
        or the text typed) or the deny, checked and recorded as every decision is."""
        if action.verb == "decline":
            reason = _text_value(action.data.get("reason")) or None
            problem = reason_too_long(reason)
            if problem is not None:
                return self.channel.card(record, error=problem)
            decision = Decision(approved=False, reason=reason, decided_by=handle)
            return await self._decide(action, record, decision)
        question = question_of(record.request)
        if question is None:
            return self.channel.card(record, error=UNREADABLE_ANSWER)
        if question.choices is not None:
            picked = action.data.get("choice")
            if picked is None or picked == "":  # the list's Answer, with nothing picked
                return self.channel.card(record, error=NOT_PICKED)
            answer = chosen(question, picked)
            if answer is None:  # no such choice was offered on the card
                await self._refused(action, record, NOT_A_CHOICE, person=None, by=handle)
                return self.channel.card(record, error=NOT_A_CHOICE)
        else:
            answer = _text_value(action.data.get("answer"))
            problem = answer_problem(record.request, answer)
            if problem is not None:
                return self.channel.card(record, error=problem)
        decision = Decision(approved=False, response=answer, decided_by=handle)
        return await self._decide(action, record, decision)

    async def _on_its_card(self, action: Action) -> dict[str, str] | None:
        """The card (`cards_of`) the action was taken on, when it was posted for the review
        the action names; else None. The connector answers a post before the outbox keeps
        the card's id, and an action may come in between: while a post of the review is
        under way, it is waited for (up to `POSTED_WAIT`)."""
        deadline = time.monotonic() + POSTED_WAIT
        while True:
            posts = await self.channel.posts(action.approval_id)
            for d in posts:
                for card in cards_of(d.ref):
                    where = card["conversation"].partition(";")[0]
                    if (where, card["id"]) == (action.conversation, action.card_id):
                        return card
            now = utc_now()
            in_flight = any(d.status == "due" and d.due_at <= now for d in posts)
            if not in_flight or time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)

    async def _who(self, action: Action, service_url: str) -> str | None:
        """The address of the member who acted, as the connector `service_url` (the one the
        bot posted the card through, never one an activity names) says it, or None when it
        cannot be told."""
        try:
            member = await self.channel.connector.member(
                service_url, action.conversation, action.user
            )
        except ConnectorError as exc:
            log.warning("Teams could not say who %s is: %s", action.user, exc)
            return None
        if member.email is None:
            log.warning("Teams says no address for member %s", action.user)
            return None
        if action.aad_object_id and member.aad_object_id not in (None, action.aad_object_id):
            log.warning("member %s is not the AAD object the activity names", action.user)
            return None
        return member.email

    async def _decide(
        self, action: Action, record: ApprovalRecord, decision: Decision
    ) -> dict[str, Any]:
        handle = decision.decided_by or ""
        verdict = await self.authorizer.check(handle, record, decision)
        if verdict.refusal is not None:
            await self._refused(action, record, verdict.refusal, person=verdict.person, by=handle)
            return self.channel.card(record, error=verdict.refusal)
        try:
            decided = await self._record(action, record, decision, verdict)
        except (ApprovalAlreadyDecided, ApprovalAlreadyVoted, InvalidDecisionError) as exc:
            return await self._current(record, _why(exc))
        if decided.decision is None:  # a vote of several: say how far it is
            needed = decided.request.approvals_required
            return self.channel.card(
                decided, error=f"your approval is counted; {needed} are needed in all"
            )
        return self.channel.card(decided)

    async def _record(
        self, action: Action, record: ApprovalRecord, decision: Decision, verdict: Verdict
    ) -> ApprovalRecord:
        decided = await self.executor.decide(
            record.approval_id,
            decision,
            decided_by=decision.decided_by,
            channel=CHANNEL,
            person=verdict.person,
            evidence=verdict.evidence(action.evidence),
        )
        METRICS.decided(decided, CHANNEL)
        self.counters["decisions"] += 1
        if self.on_decided is not None:
            self.on_decided()
        return decided

    async def _edit(self, action: Action, record: ApprovalRecord, handle: str) -> dict[str, Any]:
        """Edit: the form, once the actor may approve the call and the rule lets it be
        edited."""
        if not _editable(record):
            return self.channel.card(record, error=NOT_EDITABLE)
        probe = Decision(approved=True, decided_by=handle)
        verdict = await self.authorizer.check(handle, record, probe)
        if verdict.refusal is not None:
            await self._refused(action, record, verdict.refusal, person=verdict.person, by=handle)
            return self.channel.card(record, error=verdict.refusal)
        fields = self._fields(record)
        if not fields:
            return self.channel.card(record, error="nothing of this call may be edited here")
        return edit_card(record, fields)

    async def _save(self, action: Action, record: ApprovalRecord, handle: str) -> dict[str, Any]:
        """The edit form's Save: the edit read, checked and recorded as an approval."""
        if not _editable(record):  # a Save no card of this review offers
            await self._refused(action, record, NOT_EDITABLE, person=None, by=handle)
            return self.channel.card(record, error=NOT_EDITABLE)
        fields = self._fields(record)
        form = {
            str(key): _text_value(value)
            for key, value in action.data.items()
            if isinstance(key, str) and key.startswith(FIELD_PREFIX)
        }
        parsed = parse_edit(fields, form, record.request.arguments)
        if parsed.errors:
            return edit_card(record, parsed.fields, error="some values are not valid")
        if not parsed.edited:
            message = "nothing was changed: use Approve to run the call as it is"
            return edit_card(record, parsed.fields, error=message)
        decision = ToolDecision(action="edit", arguments=parsed.edited).to_decision(handle)
        verdict = await self.authorizer.check(handle, record, decision)
        if verdict.refusal is not None:
            await self._refused(action, record, verdict.refusal, person=verdict.person, by=handle)
            return edit_card(record, parsed.fields, error=verdict.refusal)
        try:
            decided = await self._record(action, record, decision, verdict)
        except InvalidArgumentsError as exc:
            return edit_card(
                record, _with_errors(parsed.fields, exc), error="the edit is not valid"
            )
        except (
            ApprovalAlreadyDecided,
            ApprovalAlreadyVoted,
            UnknownToolError,
            InvalidDecisionError,
        ) as exc:
            return await self._current(record, _why(exc))
        return self.channel.card(decided)

    async def _current(self, record: ApprovalRecord, error: str) -> dict[str, Any]:
        """The review's card as the store has it now, `error` shown while it is pending."""
        try:
            record = await self.store.get(record.approval_id)
        except ApprovalNotFound:
            return _note("this review no longer exists")
        if is_question(record.request) and record.decision is not None:
            return question_decided_card(record, note=_closed(record))
        return self.channel.card(record, error=error)

    def _fields(self, record: ApprovalRecord) -> list[EditField]:
        """The form's inputs: from the tool's model, or for a tool of another process from
        the schema its caller sent; none when there is neither."""
        request = record.request
        if request.tool in self.registry:
            schema = self.registry.get(request.tool).model.model_json_schema()
        else:
            sent = request.policy.get("schema")
            if not isinstance(sent, dict):
                return []
            schema = sent
        return edit_fields(schema, request.arguments, request.policy.get("editable"))

    async def _refused(
        self,
        action: Action,
        record: ApprovalRecord,
        reason: str,
        *,
        person: str | None,
        by: str | None = None,
    ) -> None:
        METRICS.refused(CHANNEL, reason)
        await self.store.refuse(
            record.approval_id,
            actor=by or f"teams:{action.user}",
            channel=CHANNEL,
            reason=reason,
            person=person,
            evidence=action.evidence,
        )


async def _body(request: Request) -> bytes | None:
    """The request's body, or None past `MAX_ACTIVITY` bytes (read no further)."""
    found = bytearray()
    async for chunk in request.stream():
        found += chunk
        if len(found) > MAX_ACTIVITY:
            return None
    return bytes(found)


def _editable(record: ApprovalRecord) -> bool:
    """Whether the review may be edited from its card: its rule allows edits, and it needs
    one approval."""
    request = record.request
    allowed = request.policy.get("allowed_decisions") or ["edit"]
    return "edit" in allowed and request.approvals_required == 1


def _same_connector(said: str, posted_through: str) -> bool:
    """Whether the connector an activity names is the one a card was posted through (a
    trailing slash and the host's case aside)."""

    def key(url: str) -> tuple[str, str]:
        parts = urlsplit(url.strip())
        return f"{parts.scheme}://{parts.netloc}".lower(), parts.path.rstrip("/")

    return key(said) == key(posted_through)


def _text_value(value: object) -> str:
    """An input's value as text (Teams sends most as strings; a toggle or number may not
    be)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value)


def _noted(activity: dict[str, Any]) -> None:
    """Log what an activity other than an action tells the operator."""
    kind = _text(activity.get("type"))
    conversation = activity.get("conversation")
    where = _text(conversation.get("id")) if isinstance(conversation, dict) else ""
    if kind == "conversationUpdate" and where:
        log.info(
            "the Teams bot is in conversation %s (service URL %s): teams.post_to may name it",
            where,
            _text(activity.get("serviceUrl")),
        )
    else:
        log.debug("a Teams %s activity was acknowledged", kind or "unknown")


def _note(text: str) -> dict[str, Any]:
    """A card that only says `text` (no review to show)."""
    return {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.5",
        "body": [{"type": "TextBlock", "wrap": True, "text": text}],
    }


def _with_errors(fields: list[EditField], exc: InvalidArgumentsError) -> list[EditField]:
    """`fields` with the tool model's errors on the inputs they name."""
    errors: dict[str, str] = {}
    for error in exc.errors:
        name = re.split(r"[.\[]", str(error.get("field", "")), maxsplit=1)[0]
        errors.setdefault(name, str(error.get("message", "not valid"))[:300])
    return [replace(spec, error=errors.get(spec.name, spec.error)) for spec in fields]


def _closed(record: ApprovalRecord) -> str:
    """What to tell a person whose answer or decline came after the question was closed:
    how it was closed, and by whom."""
    by = (record.decision.decided_by if record.decision else None) or "someone"
    if answer_of(record) is not None:
        return f"this question was already answered by {by}"
    if by == TIMEOUT_DECIDER:
        return "nobody answered this question before its deadline: it is declined"
    return f"this question was already declined by {by}"


def _why(exc: Exception) -> str:
    if isinstance(exc, ApprovalAlreadyDecided):
        return f"this call was already decided by {exc.decided_by or 'someone'}"
    if isinstance(exc, ApprovalAlreadyVoted):
        return "you have voted on this call already"
    if isinstance(exc, UnknownToolError):
        return "this call's tool is not one this bot can check an edit of"
    return f"nothing was recorded: {exc}"
