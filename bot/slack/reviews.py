"""Decisions made in Slack: the Approve, Approve & remember, Edit, Deny and Respond buttons and
their modals, on a Bolt `AsyncApp` that Slack reaches over HTTP (`/slack/events`) or Socket
Mode. Respond (where the rule lists `respond`) opens a modal for the reviewer's answer, which
the agent gets as the call's result: the tool does not run.

Every click is answered (`ack`) at once, as Slack requires within 3 seconds. Who may decide is
the rule's say, kept with the review, checked person by person (`bot.authorize.Authorizer`):
its reviewers are Slack users, user groups (their members, asked of Slack and cached),
channels (the members of a channel the review was posted to) and email addresses (the
clicker's address, as Slack holds it); the run's requester, under any of their handles, may
not approve unless the rule allows it. A check that cannot be made (Slack failing to say who
the clicker is) refuses. A click decides only the review of the message it is on: the
approval its button names must be the one whose request (or escalation) was posted as that
message (channel and ts), and a modal, which the bot opens from such a click, keeps that
message in its metadata and is checked again on submission. Anyone refused gets an
ephemeral message, and the refused attempt goes to the review's events with the clicker's
person and the click's evidence. A decision is recorded through `Executor.decide` (an edit
is validated with the tool's model first, or for an external tool with the schema its
caller sent), with `decided_by` the Slack user id, the person and the click's evidence,
channel `slack`; the workers are woken, the run goes on, and the outbox updates the
messages. "Approve & remember" approves the same way, then remembers the approval
(`bot.remember`); a click of it on a review whose rule remembers nothing decides nothing.

A question (`core.questions`, its message `bot.slack.questions`) is answered the same way: a
choice button (`nodbot.answer.<i>`, its value `<approval id>:<i>`, the two checked to agree,
and the index against the question's own choices) records that choice as a respond; Answer
opens a modal for a free-text answer (checked with `answer_problem`: needed, bounded, one of
the choices when there are some); Decline opens the Deny modal's twin. Each is authorized,
bound to its message, recorded with its evidence and refused as a click is; an Approve, Edit
or Respond click on a question, or an answer's click on a review of a call, is refused and
recorded (`A_QUESTION`, `NOT_A_QUESTION`), and a click after the question was closed is told
how it was ("already answered by ...").

One event is listened to here, `member_joined_channel`: when the bot is invited to a channel
that refused its posts (`not_in_channel`), they are tried again at once
(`SlackChannel.joined`). A click of a message's "Open in inbox" link button is only
acknowledged (Slack opens the page).

The same app serves the App Home tab (`bot.slack.home`: `app_home_opened`, and the Home's
buttons, whose action ids are their own, so the binding above holds for every message button)
and the `/nodbot` slash command (`bot.slack.commands`); both decide through one
`bot.bulk.Decider` on channel `slack`, with the same authorizer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from slack_bolt.adapter.socket_mode.websockets import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.errors import SlackApiError

from nodbot.bot.bulk import Decider
from nodbot.bot.config import SlackConfig
from nodbot.bot.forms import FIELD_PREFIX, EditField, edit_fields, parse_edit, reason_too_long
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import Authorizer, Verdict
from nodbot.bot.policy.people import IdentityUnavailable, People
from nodbot.bot.policy.remember import NOT_REMEMBERED, remember_decision, scope_of
from nodbot.bot.slack.channel import SlackChannel, messages_of
from nodbot.bot.slack.commands import SlackCommands
from nodbot.bot.slack.home import SlackHome
from nodbot.bot.slack.messages import (
    ACTION_APPROVE,
    ACTION_APPROVE_REMEMBER,
    ACTION_DENY,
    ACTION_EDIT,
    ACTION_OPEN,
    ACTION_RESPOND,
    DENY_CALLBACK,
    EDIT_CALLBACK,
    RESPOND_CALLBACK,
    deny_modal,
    edit_modal,
    modal_fields,
    respond_modal,
)
from nodbot.bot.slack.questions import (
    ACTION_ANSWER,
    ACTION_CHOICE,
    ACTION_DECLINE,
    ANSWER_CALLBACK,
    DECLINE_CALLBACK,
    answer_modal,
    chosen,
    decline_modal,
)
from nodbot.bot.slack.text import clip, escape
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
    StoreError,
    ToolDecision,
    UnknownToolError,
)
from nodbot.core.decisions import response_problem
from nodbot.core.questions import answer_of, answer_problem, is_question, question_of
from nodbot.core.store import TIMEOUT_DECIDER, utc_now

__all__ = ["CHANNEL", "SlackReviews", "connect_socket_mode"]

log = logging.getLogger(__name__)

CHANNEL = "slack"

NOT_ITS_MESSAGE = "this button does not belong to this review"
A_QUESTION = "this is a question: answer it or decline it with the buttons of its message"
"""The refusal of an Approve, Edit or Respond click on a question (none is posted on one)."""
NOT_A_QUESTION = "this review is not a question: decide it with the buttons of its message"
"""The refusal of an answer button's click on a review of a call."""
NOT_A_CHOICE = "this button is not one of the question's answers"
"""The refusal of a choice button whose value and action id disagree, or whose choice the
question does not have."""
RESPOND_PROBE = "(the answer to come)"
"""The text of the respond a Respond click asks the rules about: only its kind counts."""
POSTED_WAIT = 5.0
"""How long (seconds) a click waits for the message it is on to be recorded: Slack answers
a post before the outbox records the message, and a click may come in between."""


class SlackReviews:
    """The Bolt app that turns clicks and modal submissions into decisions."""

    def __init__(
        self,
        config: SlackConfig,
        channel: SlackChannel,
        *,
        on_decided: Callable[[], None] | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.config = config
        self.channel = channel
        self.store = channel.store
        self.registry = channel.registry
        self.authorizer = authorizer or Authorizer(
            People(directory=channel.directory, ttl=config.cache_ttl),
            posted_channels=channel.posted_channels,
        )
        self.executor = Executor(self.registry, approval=DeferredApproval(self.store))
        self.on_decided = on_decided
        secret = config.signing_secret.get_secret_value() if config.signing_secret else None
        self.app = AsyncApp(
            client=channel.client,
            signing_secret=secret or "socket-mode-requests-are-not-signed",
            request_verification_enabled=config.mode == "http",
            ssl_check_enabled=False,
            url_verification_enabled=config.mode == "http",
        )
        self.app.action(ACTION_APPROVE)(self._approve)
        self.app.action(ACTION_APPROVE_REMEMBER)(self._approve_remember)
        self.app.action(ACTION_EDIT)(self._edit)
        self.app.action(ACTION_DENY)(self._deny)
        self.app.action(ACTION_RESPOND)(self._respond)
        self.app.action(ACTION_CHOICE)(self._choose)
        self.app.action(ACTION_ANSWER)(self._answer)
        self.app.action(ACTION_DECLINE)(self._deny)
        self.app.view(EDIT_CALLBACK)(self._edit_submitted)
        self.app.view(DENY_CALLBACK)(self._deny_submitted)
        self.app.view(DECLINE_CALLBACK)(self._deny_submitted)
        self.app.view(RESPOND_CALLBACK)(self._respond_submitted)
        self.app.view(ANSWER_CALLBACK)(self._answer_submitted)
        self.app.event("member_joined_channel")(self._joined)
        self.app.action(ACTION_OPEN)(_acknowledge)
        self.counters: dict[str, int] = {"decisions": 0}
        self.decider = Decider(
            self.store, self.registry, self.authorizer, CHANNEL, on_decided=self._decided
        )
        """Decides the App Home's and `/nodbot`'s decisions."""
        self.home = SlackHome(channel, self.authorizer, self.decider)
        self.home.register(self.app)
        self.commands = SlackCommands(channel, self.authorizer, self.decider, self.home)
        self.commands.register(self.app)

    # --- buttons ------------------------------------------------------------------------------

    async def _approve(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        click = _Click.of(body)
        record = await self._record(click, question=False)
        if record is None:
            return
        decision = Decision(approved=True, decided_by=click.user)
        verdict = await self._allowed(click, record, decision)
        if verdict is not None:
            await self._decide(click, record, decision, verdict)

    async def _approve_remember(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        click = _Click.of(body)
        # Kept with the decision: the outbox's update of the messages looks for it.
        click.evidence["action_id"] = ACTION_APPROVE_REMEMBER
        record = await self._record(click, question=False)
        if record is None:
            return
        if scope_of(record.request) is None:  # no such button was posted: a forged click
            await self._tell(click, NOT_REMEMBERED)
            return
        decision = Decision(approved=True, decided_by=click.user)
        verdict = await self._allowed(click, record, decision)
        if verdict is not None:
            await self._decide(click, record, decision, verdict, remember=True)

    async def _edit(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        click = _Click.of(body)
        record = await self._record(click, question=False)
        if record is None:
            return
        if "edit" not in (record.request.policy.get("allowed_decisions") or ["edit"]):
            await self._tell(click, "this call may not be edited; approve or deny it")
            return
        probe = Decision(approved=True, decided_by=click.user)
        if await self._allowed(click, record, probe) is None:
            return
        fields = self._fields(record)
        if not fields:
            await self._tell(click, "nothing of this call may be edited here")
            return
        if not modal_fields(fields)[0]:
            await self._tell(click, "nothing of this call fits a Slack form; edit it in the inbox")
            return
        await self.channel.client.views_open(
            trigger_id=click.trigger_id, view=_with_message(edit_modal(record, fields), click)
        )

    async def _deny(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        """Deny, or Decline on a question: a modal asks for an optional reason."""
        await ack()
        click = _Click.of(body)
        record = await self._record(click)
        if record is None:
            return
        probe = Decision(approved=False, decided_by=click.user)
        if await self._allowed(click, record, probe) is None:
            return
        modal = decline_modal(record) if is_question(record.request) else deny_modal(record)
        await self.channel.client.views_open(
            trigger_id=click.trigger_id, view=_with_message(modal, click)
        )

    async def _respond(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        await self._open_text_modal(_Click.of(body), question=False)

    async def _open_text_modal(self, click: _Click, *, question: bool) -> None:
        """Open the modal a respond (a call's review) or an answer (a question's) is written
        in, once the rule's say on it, whatever its text, allows the clicker."""
        record = await self._record(click, question=question)
        if record is None:
            return
        probe = Decision(approved=False, response=RESPOND_PROBE, decided_by=click.user)
        if await self._allowed(click, record, probe) is None:
            return
        modal = answer_modal(record) if question else respond_modal(record)
        await self.channel.client.views_open(
            trigger_id=click.trigger_id, view=_with_message(modal, click)
        )

    async def _choose(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        """A choice of a question: its answer, checked and recorded as a click's decision."""
        await ack()
        click = _Click.of(body)
        action = (body.get("actions") or [{}])[0]
        named = chosen(str(action.get("action_id") or ""), str(action.get("value") or ""))
        if named is None:
            await self._tell(click, NOT_A_CHOICE)  # names no review to record it on
            return
        click.approval_id, index = named
        record = await self._record(click, question=True)
        if record is None:
            return
        question = question_of(record.request)
        choices = None if question is None else question.choices
        if choices is None or index >= len(choices):  # no such button was posted
            await self._refuse(click, record, NOT_A_CHOICE)
            return
        answer = Decision(approved=False, response=choices[index], decided_by=click.user)
        verdict = await self._allowed(click, record, answer)
        if verdict is not None:
            await self._decide(click, record, answer, verdict)

    async def _answer(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        """Answer, on a free-text question: a modal asks for the answer."""
        await ack()
        await self._open_text_modal(_Click.of(body), question=True)

    # --- modals -------------------------------------------------------------------------------

    async def _edit_submitted(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        click = _Click.of_view(body, view)
        try:
            record = await self.store.get(click.approval_id)
        except ApprovalNotFound:
            await ack(response_action="errors", errors=_first(view, "this review no longer exists"))
            return
        if not await self._on_its_message(click, wait=False):
            await self._refuse_elsewhere(click, record)
            await ack(response_action="errors", errors=_first(view, NOT_ITS_MESSAGE))
            return
        fields = self._fields(record)
        form = _form(view, fields)
        parsed = parse_edit(fields, form, record.request.arguments)
        if parsed.errors:
            errors = {FIELD_PREFIX + name: message for name, message in parsed.errors.items()}
            await ack(response_action="errors", errors=errors)
            return
        if not parsed.edited:
            message = "nothing was changed: use Approve to run the call as it is"
            await ack(response_action="errors", errors=_first(view, message))
            return
        decision = ToolDecision(action="edit", arguments=parsed.edited).to_decision(click.user)
        verdict = await self.authorizer.check(click.user, record, decision)
        if verdict.refusal is not None:
            await self._record_refusal(click, record, verdict)
            await ack(response_action="errors", errors=_first(view, verdict.refusal))
            return
        try:
            edited = await self.executor.decide(
                record.approval_id,
                decision,
                decided_by=click.user,
                channel=CHANNEL,
                person=verdict.person,
                evidence=verdict.evidence(click.evidence),
            )
        except InvalidArgumentsError as exc:
            errors = {}
            for error in exc.errors:
                name = re.split(r"[.\[]", str(error.get("field", "")), maxsplit=1)[0]
                block = FIELD_PREFIX + name
                if any(spec.name == name for spec in fields):
                    errors[block] = clip(str(error.get("message", "not valid")), 150)
            await ack(response_action="errors", errors=errors or _first(view, str(exc)))
            return
        except (ApprovalAlreadyDecided, ApprovalAlreadyVoted, UnknownToolError) as exc:
            await ack(response_action="errors", errors=_first(view, _why(exc)))
            return
        await ack()
        METRICS.decided(edited, CHANNEL)
        self._decided()

    async def _deny_submitted(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        reason = _text_of(view, "reason") or None
        await self._text_submitted(
            ack, body, view, "reason", reason_too_long(reason),
            lambda user: Decision(approved=False, reason=reason, decided_by=user),
        )  # fmt: skip

    async def _respond_submitted(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        text = _text_of(view, "response")
        await self._text_submitted(
            ack, body, view, "response", response_problem(text),
            lambda user: Decision(approved=False, response=text, decided_by=user),
            question=False,
        )  # fmt: skip

    async def _answer_submitted(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        text = _text_of(view, "answer")
        try:
            record = await self.store.get(_Click.of_view(body, view).approval_id)
        except ApprovalNotFound:
            await ack(response_action="errors", errors={"answer": "this question no longer exists"})
            return
        problem = (
            answer_problem(record.request, text) if is_question(record.request) else NOT_A_QUESTION
        )
        await self._text_submitted(
            ack, body, view, "answer", problem,
            lambda user: Decision(approved=False, response=text, decided_by=user),
            question=True,
        )  # fmt: skip

    async def _text_submitted(
        self,
        ack: AsyncAck,
        body: dict[str, Any],
        view: dict[str, Any],
        block: str,
        problem: str | None,
        decision_of: Callable[[str], Decision],
        *,
        question: bool | None = None,
    ) -> None:
        """A deny, decline, respond or answer modal's submission: a text that is not accepted
        keeps the modal open, saying so under its `block`; otherwise the decision is checked
        and recorded as a click's is."""
        if problem is not None:
            await ack(response_action="errors", errors={block: clip(problem, 150)})
            return
        await ack()
        click = _Click.of_view(body, view)
        record = await self._record(click, wait=False, question=question)
        if record is None:
            return
        decision = decision_of(click.user)
        verdict = await self._allowed(click, record, decision)
        if verdict is not None:
            await self._decide(click, record, decision, verdict)

    # --- events -------------------------------------------------------------------------------

    async def _joined(self, event: dict[str, Any]) -> None:
        """Someone joined a channel the bot is in (Bolt acks the event): when it is the bot
        itself, invited to a channel, the posts that channel refused are tried now."""
        user, channel = str(event.get("user") or ""), str(event.get("channel") or "")
        bot = await self.channel.bot_user_id()
        if not channel or bot is None or user != bot:
            log.debug("%s joined %s: not the bot (%s), nothing to do", user, channel, bot)
            return
        try:
            waiting = await self.channel.joined(channel)
        except StoreError as exc:
            log.warning(
                "the bot joined %s, but the posts waiting for it could not be made due now "
                "(%s): they are tried at their next retry",
                channel,
                exc,
            )
            return
        log.info("the bot joined %s: %d post(s) waiting for it tried now", channel, waiting)

    # --- shared -------------------------------------------------------------------------------

    async def _decide(
        self,
        click: _Click,
        record: ApprovalRecord,
        decision: Decision,
        verdict: Verdict,
        *,
        remember: bool = False,
    ) -> None:
        """Record the decision; with `remember`, remember it once it approves the call."""
        try:
            decided = await self.executor.decide(
                record.approval_id,
                decision,
                decided_by=click.user,
                channel=CHANNEL,
                person=verdict.person,
                evidence=verdict.evidence(click.evidence),
            )
        except ApprovalAlreadyDecided as exc:
            await self._tell(click, await self._already(record, exc))
            return
        except (ApprovalAlreadyVoted, InvalidDecisionError) as exc:
            # An answer that is none of a question's choices: the modal checked it before.
            await self._tell(click, _why(exc))
            return
        METRICS.decided(decided, CHANNEL)
        if remember and decided.status == "approved":
            await self._remember(click, decided, verdict)
        self._decided()
        if decided.decision is None:  # a vote of several: say how far it is
            needed = decided.request.approvals_required
            await self._tell(click, f"your approval is counted; {needed} are needed in all")

    async def _remember(self, click: _Click, decided: ApprovalRecord, verdict: Verdict) -> None:
        """Remember the approval just made; the clicker is told when it cannot be."""
        try:
            kept = await remember_decision(self.store, decided, person=verdict.person)
        except (ValueError, StoreError) as exc:
            log.warning("approval %s could not be remembered: %s", decided.approval_id, exc)
            await self._tell(click, f"the call is approved, but not remembered: {exc}")
            return
        log.info(
            "approval remembered",
            extra={"approval_id": decided.approval_id, "remember_id": kept.remember_id},
        )

    async def _already(self, record: ApprovalRecord, exc: ApprovalAlreadyDecided) -> str:
        """What to tell a clicker whose decision came second: for a question, how it was
        closed (answered, declined, timed out) and by whom."""
        if not is_question(record.request):
            return _why(exc)
        try:
            record = await self.store.get(record.approval_id)
        except (ApprovalNotFound, StoreError):
            return f"this question was already closed by {exc.decided_by or 'someone'}"
        by = exc.decided_by or "someone"
        if answer_of(record) is not None:
            return f"this question was already answered by {by}"
        if by == TIMEOUT_DECIDER:
            return "nobody answered this question before its deadline: it is declined"
        return f"this question was already declined by {by}"

    def _decided(self) -> None:
        self.counters["decisions"] += 1
        if self.on_decided is not None:
            self.on_decided()

    async def _record(
        self, click: _Click, *, wait: bool = True, question: bool | None = None
    ) -> ApprovalRecord | None:
        """The review the click names, when the click is on one of its messages (and, with
        `question`, when it is a question, or is not); else None, once the clicker is told
        (and a click on another review's message, or a button a review of its kind does not
        have, recorded)."""
        try:
            record = await self.store.get(click.approval_id)
        except ApprovalNotFound:
            await self._tell(click, "this review no longer exists")
            return None
        if not await self._on_its_message(click, wait=wait):
            await self._refuse_elsewhere(click, record)
            await self._tell(click, NOT_ITS_MESSAGE)
            return None
        if question is not None and question != is_question(record.request):
            await self._refuse(click, record, NOT_A_QUESTION if question else A_QUESTION)
            return None
        return record

    async def _on_its_message(self, click: _Click, *, wait: bool) -> bool:
        """Whether the click is on a message posted for the review it names: a button's
        value (and a modal's metadata) come back from the client, which may change them;
        the message it is on is Slack's to say. With `wait`, a post of the review still
        being recorded is waited for (up to `POSTED_WAIT`)."""
        if click.message is None:
            return False
        deadline = time.monotonic() + (POSTED_WAIT if wait else 0.0)
        while True:
            posts = await self.channel.posts(click.approval_id)
            posted = {
                (str(m.get("channel")), str(m.get("ts"))) for d in posts for m in messages_of(d.ref)
            }
            if click.message in posted:
                return True
            now = utc_now()
            in_flight = any(d.status == "due" and d.due_at <= now for d in posts)
            if not in_flight or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def _refuse_elsewhere(self, click: _Click, record: ApprovalRecord) -> None:
        """Record, on the review the click names, a click made on another message."""
        await self._refused(click, record, NOT_ITS_MESSAGE)

    async def _refuse(self, click: _Click, record: ApprovalRecord, reason: str) -> None:
        """Refuse a click whatever the rules say (a button the message does not have):
        recorded on the review, and the clicker told."""
        await self._refused(click, record, reason)
        await self._tell(click, reason)

    async def _refused(self, click: _Click, record: ApprovalRecord, reason: str) -> None:
        """Record a refused click on the review, with the clicker's person when it can be
        told."""
        try:
            person: str | None = (await self.authorizer.people.person(click.user)).key
        except IdentityUnavailable:
            person = None
        METRICS.refused(CHANNEL, reason)
        await self.store.refuse(
            record.approval_id,
            actor=click.user,
            channel=CHANNEL,
            reason=reason,
            person=person,
            evidence=click.evidence,
        )

    async def _allowed(
        self, click: _Click, record: ApprovalRecord, decision: Decision
    ) -> Verdict | None:
        """The verdict when the clicker may make `decision`; else None, once they are told
        why and the refused attempt is recorded."""
        verdict = await self.authorizer.check(click.user, record, decision)
        if verdict.refusal is None:
            return verdict
        await self._record_refusal(click, record, verdict)
        await self._tell(click, verdict.refusal)
        return None

    async def _record_refusal(
        self, click: _Click, record: ApprovalRecord, verdict: Verdict
    ) -> None:
        METRICS.refused(CHANNEL, verdict.refusal or "refused")
        await self.store.refuse(
            record.approval_id,
            actor=click.user,
            channel=CHANNEL,
            reason=verdict.refusal or "refused",
            person=verdict.person,
            evidence=click.evidence,
        )

    def _fields(self, record: ApprovalRecord) -> list[EditField]:
        """The edit modal's inputs: from the tool's model, or for a tool of another process
        from the schema its caller sent (`POST /approvals`); none when there is neither."""
        request = record.request
        if request.tool in self.registry:
            schema = self.registry.get(request.tool).model.model_json_schema()
        else:
            sent = request.policy.get("schema")
            if not isinstance(sent, dict):
                return []
            schema = sent
        return edit_fields(schema, request.arguments, request.policy.get("editable"))

    async def _tell(self, click: _Click, text: str) -> None:
        """An ephemeral message to the clicker (seen by them only)."""
        if not click.channel:
            log.info("could not tell %s: %s", click.user, text)
            return
        try:
            await self.channel.client.chat_postEphemeral(
                channel=click.channel, user=click.user, text=escape(clip(text, 3000))
            )
        except SlackApiError as exc:
            log.warning("could not tell %s: %s", click.user, exc.response.get("error"))


async def _acknowledge(ack: AsyncAck) -> None:
    """A click Slack only tells of (a link button): acknowledged, nothing to do."""
    await ack()


async def connect_socket_mode(reviews: SlackReviews, config: SlackConfig) -> AsyncSocketModeHandler:
    """Open the Socket Mode connection of `reviews` in this event loop; close it with
    `close_async()`."""
    if config.app_token is None:
        raise ValueError("socket mode needs slack.app_token")
    handler = AsyncSocketModeHandler(reviews.app, app_token=config.app_token.get_secret_value())
    if config.api_url is not None:
        handler.client.web_client.base_url = config.api_url
    await handler.connect_async()  # type: ignore[no-untyped-call]
    return handler


class _Click:
    """Who did what on which review, from an interactive payload, and the payload's evidence
    of it (kept in the audit trail)."""

    def __init__(
        self,
        user: str,
        approval_id: str,
        channel: str,
        trigger_id: str,
        evidence: dict[str, str],
        message: tuple[str, str] | None,
    ) -> None:
        self.user = user
        self.approval_id = approval_id
        self.channel = channel
        self.trigger_id = trigger_id
        self.evidence = evidence
        self.message = message
        """The channel and ts of the message the click is on; None when not told, or told
        two ways that disagree."""

    @classmethod
    def of(cls, body: dict[str, Any]) -> _Click:
        action = (body.get("actions") or [{}])[0]
        user = str(body["user"]["id"])
        channel = str((body.get("channel") or {}).get("id") or "")
        container = body.get("container") or {}
        message = _message_of(
            [str(container.get("channel_id") or ""), channel],
            [
                str(container.get("message_ts") or ""),
                str((body.get("message") or {}).get("ts") or ""),
            ],
        )
        evidence = {
            "user": user,
            "team": _team(body),
            "action_ts": str(action.get("action_ts") or ""),
            "channel": channel,
            "message_ts": str(container.get("message_ts") or ""),
        }
        return cls(
            user=user,
            approval_id=str(action.get("value", "")),
            channel=channel,
            trigger_id=str(body.get("trigger_id") or ""),
            evidence={key: value for key, value in evidence.items() if value},
            message=message,
        )

    @classmethod
    def of_view(cls, body: dict[str, Any], view: dict[str, Any]) -> _Click:
        metadata = _metadata(str(view.get("private_metadata") or ""))
        approval_id, channel, ts = (
            metadata.get(key, "") for key in ("approval_id", "channel", "ts")
        )
        user = str(body["user"]["id"])
        evidence = {
            "user": user,
            "team": _team(body),
            "view_id": str(view.get("id") or ""),
            "channel": channel,
            "message_ts": ts,
        }
        kept = {key: value for key, value in evidence.items() if value}
        return cls(user, approval_id, channel, "", kept, _message_of([channel], [ts]))


def _team(body: dict[str, Any]) -> str:
    team = body.get("team") or {}
    return str(team.get("id") or body["user"].get("team_id") or "")


def _with_message(view: dict[str, Any], click: _Click) -> dict[str, Any]:
    """The modal, remembering (in its metadata, as JSON) the review and the message of the
    click that opened it: the submission is checked against that message again."""
    channel, ts = click.message or ("", "")
    metadata = {"approval_id": view["private_metadata"], "channel": channel, "ts": ts}
    return {**view, "private_metadata": json.dumps(metadata, separators=(",", ":"))}


def _metadata(text: str) -> dict[str, str]:
    """A modal's metadata (see `_with_message`); a modal opened by an older bot (the
    approval id, a space, the channel) keeps its approval id but names no message."""
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict):
        return {str(key): str(value) for key, value in found.items() if value is not None}
    return {"approval_id": text.partition(" ")[0]}


def _message_of(channels: list[str], stamps: list[str]) -> tuple[str, str] | None:
    """The one (channel, ts) that the payload's mentions of them agree on, else None."""
    channel, ts = {c for c in channels if c}, {t for t in stamps if t}
    if len(channel) != 1 or len(ts) != 1:
        return None
    return channel.pop(), ts.pop()


def _form(view: dict[str, Any], fields: list[EditField]) -> dict[str, str]:
    """The modal's inputs as the edit form's `arg.<name>` texts."""
    values = view.get("state", {}).get("values", {})
    form: dict[str, str] = {}
    for spec in fields:
        state = (values.get(FIELD_PREFIX + spec.name) or {}).get("value")
        if state is None:
            continue
        if "selected_option" in state:
            chosen = state.get("selected_option")
            form[spec.input_name] = str(chosen["value"]) if chosen else ""
        else:
            value = state.get("value")
            form[spec.input_name] = "" if value is None else str(value)
    return form


def _first(view: dict[str, Any], message: str) -> dict[str, str]:
    """An error shown on the modal's first input (Slack shows errors on inputs only)."""
    for block in view.get("blocks") or []:
        if block.get("type") == "input":
            return {str(block["block_id"]): clip(message, 150)}
    return {}


def _why(exc: Exception) -> str:
    if isinstance(exc, ApprovalAlreadyDecided):
        return f"this call was already decided by {exc.decided_by or 'someone'}"
    if isinstance(exc, ApprovalAlreadyVoted):
        return "you have voted on this call already"
    if isinstance(exc, UnknownToolError):
        return "this call's tool is not one this bot can check an edit of"
    if isinstance(exc, InvalidDecisionError):
        return f"nothing was recorded: {exc}"
    return str(exc)


def _text_of(view: dict[str, Any], block: str) -> str:
    """The text typed into a modal's input `block` (its action id is `value`), or ""."""
    state = view.get("state", {}).get("values", {})
    return str((state.get(block, {}).get("value", {}) or {}).get("value") or "")
