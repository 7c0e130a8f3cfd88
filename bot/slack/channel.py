"""The Slack channel of the outbox: review requests posted, and updated once decided.

Where a review goes comes from its rule (`post_to`, the reviewers), kept with the review:

- `post_to` absent: the reviewers that are channels get the request there, the people (user
  ids, user groups, email addresses) by direct message;
- `post_to: [#channel, C..., dm]`: those channels, and `dm` for the people.

Each place is one delivery (`slack:channel:#refunds`, `slack:dm:U0123ABCDE`), so each
message is posted once: a user group's delivery turns into one delivery per member. The
`escalate_to` places get the request when the rule escalates, if nobody has decided by
then. With the rule's `remind_every`, each reminder step is one delivery (`slack:reminder:2`):
a reply in the thread of each message posted for the review that mentions those it reached
who have not voted (for a direct message, its reviewer; for a channel post, the rule's
reviewers that are Slack users or addresses), each reply kept in the delivery's progress as it
is posted. Once the review is decided, from whichever channel, one delivery (`slack:messages`)
updates every message posted for it with `chat.update`: buttons gone, the outcome, who
decided and when, the edited arguments. `chat.update` can be repeated safely, so a retry
after a partial failure updates again rather than posting twice; a review approved with
"Approve & remember" says until when it is remembered (the update waits a little for the
remembered approval to be recorded, which follows the decision). When the run finishes, one
delivery (`answer`) replies with its answer in the thread of each message.

Escalation and reminders go to the delegates too (`bot.policy.delegation`): when a reminder
step or an escalation to a person is sent (not when the review opened, so a delegation made
since counts, and an ended one no longer does), each person it reaches who has handed their
reviews to someone is joined by that delegate. The delegate gets a direct message, not a
mention in the thread: a thread in the delegator's DM, or in a channel they are not in, is
not one they can see. It is the review's message with its buttons, headed "for @ana", so that
they decide as the delegator could ("bob for ana"). Each such message is kept in the
delivery's progress (`delegates`), read back from the DM's history after an attempt that may
have posted it, so it is posted once per step and delegate, and updated with the others once
the review is decided. When the delegations cannot be read, or a delegate not told, the
reviewers are reminded as before and a warning is logged.

Each message is posted once, however often its delivery is tried (`bot/slack/once.py`): a
delivery's steps (the message, the full arguments in its thread; one answer reply per
thread) are kept in its `ref` as each is done, so a retry goes on from the step that failed;
every post carries Slack message metadata (`event_type` `nodbot_review`, with the review, the
delivery and the part), and an attempt after one that may have posted without recording it
(a failure, or a worker that died while Slack answered: a marker in the ref says an attempt
began) first reads the conversation (`conversations.history`, `conversations.replies`) and
adopts the message it finds. If Slack will not show the conversation (a missing
`*:history` scope), a warning names the scope and the post is made: a duplicate is better
than a lost review. Every message a delivery recorded, also one whose delivery was given up
after it posted, is updated once the review is decided.

A question (`core.questions`) goes the same way, as a question's message
(`bot.slack.questions`: its choices or Answer, and Decline; once decided, how it ended) and
reminders that ask for its answer.

With `web.public_url` (`public_url`), every message links to the review's page in the web
inbox (`bot.slack.messages.inbox_page`). Whoever watches the reviews' messages (`watchers`: the
App Home, `bot.slack.home`) is told, after a request or escalation is posted and after the
messages of a decided review are updated, that the review changed (`ReviewWatcher.changed`,
called in the delivery, which must not wait for it); the watchers are closed with the channel.

A `post_to` channel that the bot has not been invited to refuses the post (`not_in_channel`,
or `channel_not_found` for a private one). The warning, and the delivery's error, name the
channel and the two fixes (`/invite @nodbot` there, or the `chat:write.public` scope), and
the post is tried again while the review is pending: at once when Slack tells the bot it
joined the channel (`member_joined_channel`: `joined`), else on the outbox's backoff (at
most five minutes apart). Either way it is posted once (a retry reads the channel's history
first). A review decided meanwhile is given up there, also when the bot has been invited
since.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import aiohttp
import jinja2
from aiohttp import ClientError
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from nodbot.bot.config import SlackConfig, parse_reviewer
from nodbot.bot.config.values import Reviewer, chat_of
from nodbot.bot.outbox import (
    DeliveryError,
    Moment,
    OutboxStore,
    acted,
    reminder_skipped,
    reminder_step,
    reminder_steps,
    reminder_target,
    retry_after,
    stored_reviewers,
)
from nodbot.bot.policy.delegation import Delegations
from nodbot.bot.policy.people import IdentityUnavailable
from nodbot.bot.policy.remember import remembered_of, scope_of
from nodbot.bot.slack.directory import Directory
from nodbot.bot.slack.messages import (
    ACTION_APPROVE_REMEMBER,
    Rendered,
    answer_text,
    decided_message,
    full_arguments,
    inbox_page,
    link,
    request_message,
    who,
)
from nodbot.bot.slack.once import Part, Progress, Unreadable, find_in_history, find_in_thread, tag
from nodbot.bot.slack.questions import question_decided, question_message, whole_question
from nodbot.bot.slack.text import clip, escape
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, StoreError, ToolRegistry
from nodbot.core.questions import is_question
from nodbot.core.store import utc_now

__all__ = [
    "MESSAGES_TARGET",
    "ReviewWatcher",
    "SlackChannel",
    "messages_of",
    "places",
    "slack_client",
]

log = logging.getLogger(__name__)

MESSAGES_TARGET = "slack:messages"
"""The delivery that updates a decided review's messages."""

NOT_INVITED = frozenset({"not_in_channel", "channel_not_found"})
"""Answers to a post to a channel that the bot is not a member of (a private channel is
hidden from it): fixed by inviting the bot, so tried again while the review is pending."""

PERMANENT_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "users_not_found",
        "user_not_found",
        "no_such_subteam",
        "invalid_blocks",
        "msg_too_long",
        "message_not_found",
        "cant_update_message",
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "missing_scope",
        "restricted_action",
    }
)
"""Answers that trying again will not change: the delivery is given up (and logged)."""

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/slack"),  # package data of `nodbot`
    autoescape=False,  # Slack text: values are escaped for Slack before they get here
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
)

REMEMBER_WAIT = timedelta(seconds=30)
"""How long after an "Approve & remember" the update of its messages waits for the
remembered approval to be recorded; past that, they show the approval only."""


class ReviewWatcher(Protocol):
    """Told when a review's Slack messages change (the App Home, `bot.slack.home`)."""

    def changed(self, record: ApprovalRecord) -> None:
        """The review was posted, or its messages updated once decided. Called in the
        delivery: it returns at once, and does not raise."""

    async def close(self) -> None:
        """Stop what `changed` started (the channel is closing)."""


def slack_client(
    config: SlackConfig, *, session: aiohttp.ClientSession | None = None
) -> AsyncWebClient:
    """The Web API client of `config`: rate limits (429, `Retry-After`), connection errors and
    5xx are retried a few times at once; what still fails is retried later by the outbox.
    `session`: the bot's one outbound HTTP session (slack_sdk leaves it open)."""
    handlers = [
        AsyncRateLimitErrorRetryHandler(max_retry_count=2),
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        AsyncServerErrorRetryHandler(max_retry_count=2),
    ]
    options: dict[str, Any] = {"retry_handlers": handlers, "timeout": 15}
    if config.api_url is not None:
        options["base_url"] = config.api_url
    if session is not None:
        options["session"] = session
    return AsyncWebClient(token=config.bot_token.get_secret_value(), **options)


def places(reviewers: Sequence[Reviewer], post_to: Sequence[str] | None) -> list[str]:
    """Where a review goes in Slack: `channel:<#name or id>` and `dm:<user, group or email>`
    (the other chats' places in `post_to` are theirs)."""
    people = [f"dm:{r.text}" for r in reviewers if r.kind != "slack_channel" and r.kind != "group"]
    channels = [f"channel:{r.text}" for r in reviewers if r.kind == "slack_channel"]
    found: list[str] = []
    slack = None if post_to is None else [t for t in post_to if chat_of(t) == "slack"]
    for target in slack if slack is not None else ["dm", *channels]:
        for place in (
            people if target == "dm" else [target if ":" in target else f"channel:{target}"]
        ):
            if place not in found:
                found.append(place)
    return found


class SlackChannel:
    """Posts and updates the reviews' Slack messages (see the module's docstring)."""

    name = "slack"
    answers = True
    makes_deliveries = True
    tells_outcomes = True

    def __init__(
        self,
        config: SlackConfig,
        store: OutboxStore,
        registry: ToolRegistry,
        *,
        client: AsyncWebClient | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], datetime] = utc_now,
        delegations: Delegations | None = None,
        public_url: str | None = None,
    ) -> None:
        self.config = config
        self.public_url = public_url
        """`web.public_url`: the messages link to the reviews' inbox pages under it; None,
        no link."""
        self.watchers: list[ReviewWatcher] = []
        """Told when a review's messages change (see the module)."""
        self._clock = clock
        self.delegations = delegations
        """Who decides for whom (`bot.policy.delegation`), for escalations and reminders to
        reach the delegates too; None: nobody for anyone."""
        self.store = store
        self.registry = registry
        self.client = client or slack_client(config, session=session)
        self.directory = Directory(self.client, ttl=config.cache_ttl)
        self.wake_outbox: Callable[[], None] | None = None
        """Tells the outbox that deliveries were made due now (`joined`): set by the bot's
        service to wake the outbox's lane, which then claims them."""
        self._me: tuple[str | None, str | None] | None = None
        """The bot user's name and id, once `auth.test` said them."""

    # --- what to deliver ---------------------------------------------------------------------

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        policy = record.request.policy
        asked = places(stored_reviewers(policy.get("reviewers")), policy.get("post_to"))
        escalate_at = policy.get("escalate_at")
        later = places(stored_reviewers(policy.get("escalate_to")), None) if escalate_at else []
        if stage == "outcome":
            return [NewDelivery("outcome", MESSAGES_TARGET)] if asked or later else []
        if stage == "answer":
            return [NewDelivery("answer", MESSAGES_TARGET)] if asked or later else []
        found = [NewDelivery("request", f"{self.name}:{place}") for place in asked]
        if escalate_at:
            when = datetime.fromisoformat(escalate_at)
            found += [
                NewDelivery("escalation", f"{self.name}:{place}", when)
                for place in later
                if place not in asked
            ]
        if found:
            found += [
                NewDelivery("reminder", reminder_target(self.name, step), at)
                for step, at in reminder_steps(record)
            ]
        return found

    # --- delivering --------------------------------------------------------------------------

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        try:
            if delivery.kind == "outcome":
                updated = await self._update_all(record)
                self._changed(record)
                return updated
            if delivery.kind == "answer":
                return await self._answer(delivery, record)
            if delivery.kind == "escalation" and record.decision is not None:
                return {"skipped": "decided before the escalation"}
            if delivery.kind == "reminder":
                return await self._remind(delivery, record)
            posted = await self._post(delivery, record)
            if "messages" in posted:
                self._changed(record)
            if delivery.kind == "escalation" and "messages" in posted:
                return await self._escalate_to_delegates(delivery, record, posted)
            return posted
        except SlackApiError as exc:
            raise _delivery_error(exc) from exc
        except (ClientError, TimeoutError) as exc:
            raise DeliveryError(f"Slack could not be reached: {type(exc).__name__}") from exc

    def _changed(self, record: ApprovalRecord) -> None:
        for watcher in self.watchers:
            try:
                watcher.changed(record)
            except Exception:  # a watcher's failure is not the delivery's
                log.exception("a watcher of review %s failed", record.approval_id)

    async def _post(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """The review's message, then its full arguments in the thread when they were cut:
        each step once (see the module's docstring)."""
        kind, _, who = delivery.address.partition(":")
        if kind == "channel":
            channel = who
        else:
            reviewer = parse_reviewer(who)
            if reviewer.kind == "slack_user_group":
                # One delivery per member, so that each gets one message however often
                # this one is tried.
                members = await self.directory.group_members(reviewer.value)
                wanted = [
                    NewDelivery(delivery.kind, f"{self.name}:dm:{member}") for member in members
                ]
                await self.store.announce(record.approval_id, "request", wanted)
                return {"expanded": members}
            if reviewer.kind == "email":
                channel = await self.directory.user_by_email(reviewer.value)
            else:
                channel = reviewer.value
        progress = Progress(self.store, delivery)
        rendered = self.render(record)
        known = messages_of(progress.ref)
        message = known[0] if known else None
        if message is None and progress.earlier:
            message = await self._earlier(progress, record, channel)
        # Posted by an earlier attempt: its thread reply may be there too.
        earlier = message is not None
        if message is None:
            refused = _refused_before(delivery) if kind == "channel" else None
            if refused is not None and record.decision is not None:
                # Not posted (the history says so): the bot may be in the channel by now, but
                # the review is decided, so it is not posted there after all.
                raise DeliveryError(
                    f"review {record.approval_id} was decided before it could be posted to "
                    f"channel {channel}, which refused it ({refused}): given up there",
                    permanent=True,
                )
            await progress.begin()
            try:
                posted = await self.client.chat_postMessage(
                    channel=channel,
                    text=rendered.text,
                    blocks=rendered.blocks,
                    unfurl_links=False,
                    unfurl_media=False,
                    metadata=tag(record, delivery, "request"),
                )
            except SlackApiError as exc:
                error = str(exc.response.get("error") or "")
                if kind == "channel" and error in NOT_INVITED:
                    raise await self._not_invited(channel, error, record) from exc
                raise
            message = {"channel": posted["channel"], "ts": posted["ts"]}
        if rendered.cut and "arguments" not in progress.ref:
            if not known:  # what follows may fail: the message is kept before
                await progress.save(messages=[message], begun=None)
            reply = await self._thread_earlier(progress, record, message) if earlier else None
            if reply is None:
                thread = await self.client.chat_postMessage(
                    channel=message["channel"],
                    thread_ts=message["ts"],
                    text=(
                        whole_question(record)
                        if is_question(record.request)
                        else full_arguments(record)
                    ),
                    unfurl_links=False,
                    unfurl_media=False,
                    metadata=tag(record, delivery, "arguments"),
                )
                reply = {"channel": thread["channel"], "ts": thread["ts"]}
            progress.ref["arguments"] = reply
        progress.ref.pop("begun", None)
        return {**progress.ref, "messages": [message]}

    async def _not_invited(self, channel: str, error: str, record: ApprovalRecord) -> DeliveryError:
        """The failure of a post to a channel that the bot is not a member of: logged with
        what the operator can do about it, and tried again (on the outbox's backoff, at
        most five minutes apart) while the review is pending, so that it is posted soon
        after the bot is invited; given up once the review is decided."""
        bot = await self._bot_name()
        what = (
            f"Slack refused to post review {record.approval_id} to channel {channel} "
            f"({error}): the bot is not a member of it"
        )
        if error == "channel_not_found":
            what = (
                f"Slack does not show the bot channel {channel} ({error}) to post review "
                f"{record.approval_id}: a private channel is hidden from a bot that is not in "
                "it, or the name or id in post_to is wrong"
            )
        fixes = (
            f"invite the bot: type /invite @{bot} in the channel, or (public channels only) "
            "add the scope chat:write.public to the Slack app and reinstall it"
        )
        if record.decision is not None:
            message = f"{what}; {fixes}. The review was decided before it could be posted there"
            log.warning("%s: given up", message)
            return DeliveryError(message, permanent=True)
        message = f"{what}. To fix it, {fixes}. The post is tried again until the review is decided"
        log.warning(message)
        return DeliveryError(message)

    async def joined(self, channel: str) -> int:
        """The bot has joined `channel` (an id; Slack's `member_joined_channel`): the posts
        waiting for it, refused before the bot was invited, are made due now (by id, and by
        `#name` when Slack says the name) and the outbox is woken, so that they are posted at
        once instead of at their next retry. How many were waiting. Raises `StoreError`."""
        targets = [f"{self.name}:channel:{channel}"]
        try:
            name = await self.directory.channel_name(channel)
        except (SlackApiError, ClientError, TimeoutError) as exc:
            error = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
            log.warning(
                "could not learn the name of channel %s (%s): reviews posted to it by #name "
                "wait for their next retry",
                channel,
                error,
            )
            name = None
        if name is not None:
            targets.append(f"{self.name}:channel:#{name.lower()}")
        waiting = await self.store.retry_deliveries_now(targets)
        if waiting and self.wake_outbox is not None:
            self.wake_outbox()
        return waiting

    async def bot_user_id(self) -> str | None:
        """The bot's user id (asked of Slack once); None while Slack cannot say."""
        return (await self._identity())[1]

    async def _bot_name(self) -> str:
        """The bot's user name, as `/invite @name` wants it (asked of Slack once)."""
        return (await self._identity())[0] or "<the app's bot user>"

    async def _identity(self) -> tuple[str | None, str | None]:
        """The bot user's name and id, as `auth.test` says them (asked again while it fails)."""
        if self._me is None:
            try:
                found = await self.client.auth_test()
            except (SlackApiError, ClientError, TimeoutError) as exc:
                log.debug("auth.test failed, the bot's name and id are not known: %s", exc)
                return None, None
            self._me = (
                str(found.get("user") or "") or None,
                str(found.get("user_id") or "") or None,
            )
        return self._me

    async def _earlier(
        self, progress: Progress, record: ApprovalRecord, channel: str
    ) -> dict[str, str] | None:
        """The review's message an earlier attempt posted to `channel` without recording it
        (found by its metadata), or None: also when the history cannot be read."""
        try:
            conversation = channel
            if channel[:1] in ("U", "W"):  # a post to a user goes to the bot's DM with them
                opened = await self.client.conversations_open(users=channel)
                conversation = str(opened["channel"]["id"])
            found = await find_in_history(
                self.client, conversation, record, progress.delivery, "request"
            )
        except Unreadable as exc:
            if exc.error in NOT_INVITED:
                # Not a member: the post that follows fails and says how to invite the bot
                # (or, with chat:write.public, goes through unchecked).
                log.debug("%s cannot be read before posting: %s", exc.channel, exc.error)
                return None
            _unchecked(exc, record)
            return None
        if found is not None:
            log.info("review %s was posted as %s already: kept", record.approval_id, found["ts"])
        return found

    async def _thread_earlier(
        self, progress: Progress, record: ApprovalRecord, message: dict[str, str]
    ) -> dict[str, str] | None:
        try:
            part: Part = "answer" if progress.delivery.kind == "answer" else "arguments"
            return await find_in_thread(self.client, message, record, progress.delivery, part)
        except Unreadable as exc:
            _unchecked(exc, record)
            return None

    async def posts(self, approval_id: str) -> list[Delivery]:
        """The review's request deliveries of this channel (`messages_of` their refs)."""
        return [
            d
            for d in await self.store.deliveries(approval_id)
            if d.channel == self.name and d.kind in ("request", "escalation")
        ]

    async def posted_channels(self, record: ApprovalRecord, reviewer: str) -> set[str]:
        """The ids of the channels the review was posted to for a channel reviewer (written
        as #name or as an id)."""
        found = {reviewer} if not reviewer.startswith("#") else set()
        for delivery in await self.posts(record.approval_id):
            if delivery.target == f"slack:channel:{reviewer}":
                found.update(message["channel"] for message in messages_of(delivery.ref))
        return found

    async def _update_all(self, record: ApprovalRecord) -> dict[str, Any]:
        posts = await self.posts(record.approval_id)
        messages = [message for d in posts for message in messages_of(d.ref)]
        messages += [
            {"channel": sent["channel"], "ts": sent["ts"]}
            for d in await self.store.deliveries(record.approval_id)
            if d.channel == self.name
            for sent in _delegated(d.ref or {}).values()
        ]
        if any(d.status == "due" for d in posts if d.due_at <= (record.decided_at or d.due_at)):
            raise DeliveryError("a request of this review is not posted yet", retry_after=1)
        page = inbox_page(self.public_url, record.approval_id)
        rendered = (
            question_decided(record, page=page)
            if is_question(record.request)
            else decided_message(
                record, remembered_until=await self._remembered_until(record), page=page
            )
        )
        for message in messages:
            await self.client.chat_update(
                channel=message["channel"],
                ts=message["ts"],
                text=rendered.text,
                blocks=rendered.blocks,
            )
        return {"updated": len(messages)}

    async def _remembered_until(self, record: ApprovalRecord) -> datetime | None:
        """Until when the approval of `record` is remembered; None when it is not (or no
        longer). Raises `DeliveryError` (to try again soon) while a remember asked for in
        Slack is not recorded yet."""
        kept = remembered_of(self.store)
        scope = scope_of(record.request)
        decision = record.decision
        if kept is None or scope is None or decision is None or not decision.approved:
            return None
        found = await kept.find(scope)
        if found is not None and found.approval_id == record.approval_id:
            return found.expires_at
        decided_at = record.decided_at or utc_now()
        if utc_now() - decided_at < REMEMBER_WAIT and await self._asked_to_remember(record):
            raise DeliveryError("the remembered approval is not recorded yet", retry_after=1)
        return None

    async def _asked_to_remember(self, record: ApprovalRecord) -> bool:
        """Whether the decision was an "Approve & remember" click (its evidence says so)."""
        for event in await self.store.events(record.approval_id):
            evidence = event.detail.get("evidence") if event.kind == "decided" else None
            if isinstance(evidence, dict) and evidence.get("action_id") == ACTION_APPROVE_REMEMBER:
                return True
        return False

    async def _answer(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """The run's final answer, in the thread of each message of the review: one reply
        per thread, each kept in the delivery's progress as it is posted."""
        get_run = getattr(self.store, "get_run", None)
        run = await get_run(record.request.run_id) if get_run is not None else None
        if run is None or run.final_text is None:
            return {"skipped": "the run has no answer"}
        text = answer_text(run.final_text)
        posts = await self.posts(record.approval_id)
        messages = [message for d in posts for message in messages_of(d.ref)]
        progress = Progress(self.store, delivery)
        replies = _replies(progress.ref)
        await self._reply_in_threads(progress, record, messages, text, replies)
        return {"replies": _replies_ref(replies)}

    async def _reply_in_threads(
        self,
        progress: Progress,
        record: ApprovalRecord,
        messages: list[dict[str, str]],
        text: str,
        replies: dict[tuple[str, str], str],
    ) -> None:
        """`text` as a reply in the thread of each of `messages` not replied to yet
        (`replies`: thread -> reply), each kept in the delivery's progress as it is posted,
        and looked for in the thread after an attempt that may have posted it unkept."""
        for message in messages:
            if (message["channel"], message["ts"]) in replies:
                continue
            reply = None
            if progress.earlier:
                reply = await self._thread_earlier(progress, record, message)
            if reply is None:
                await progress.begin()
                posted = await self.client.chat_postMessage(
                    channel=message["channel"],
                    thread_ts=message["ts"],
                    text=text,
                    unfurl_links=False,
                    unfurl_media=False,
                    # once.py's parts have no reminder: the delivery id tells them apart.
                    metadata=tag(record, progress.delivery, "answer"),
                )
                reply = {"channel": posted["channel"], "ts": posted["ts"]}
            replies[(message["channel"], message["ts"])] = reply["ts"]
            await progress.save(replies=_replies_ref(replies), begun=None)

    async def _remind(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any]:
        """A reminder step: a reply in the thread of each message of the review whose
        reviewers have not all voted, mentioning those who have not; each reply kept in the
        delivery's progress as it is posted, so that a retry posts only the rest."""
        skipped = reminder_skipped(record, delivery, self._clock())
        if skipped is not None:
            return {"skipped": skipped}
        voted = await acted(self.store, record.approval_id)
        progress = Progress(self.store, delivery)
        replies = _replies(progress.ref)
        reminded: list[str] = []
        for post in await self.posts(record.approval_id):
            mentions = await self._to_remind(post, record, voted)
            if mentions is None:
                continue
            reminded += [user for user in mentions if user not in reminded]
            text = self._reminder_text(record, delivery, mentions)
            await self._reply_in_threads(progress, record, messages_of(post.ref), text, replies)
        await self._to_delegates(progress, record, reminded, voted)
        found = {"step": reminder_step(delivery), "replies": _replies_ref(replies)}
        return (
            {**found, "delegates": progress.ref["delegates"]}
            if "delegates" in progress.ref
            else found
        )

    async def _escalate_to_delegates(
        self, delivery: Delivery, record: ApprovalRecord, posted: dict[str, Any]
    ) -> dict[str, Any]:
        """After an escalation's message to a person, the same to their delegates now."""
        kind, _, handle = delivery.address.partition(":")
        user = await self._slack_user(handle) if kind == "dm" else None
        if user is None:
            return posted
        progress = Progress(self.store, delivery)
        await progress.save(**posted)  # the message is kept before what may fail
        await self._to_delegates(progress, record, [user], frozenset())
        return dict(progress.ref)

    async def _to_delegates(
        self, progress: Progress, record: ApprovalRecord, users: list[str], voted: frozenset[str]
    ) -> None:
        """The review's message, headed "for" its reviewer, by direct message to the live
        delegates of `users` (Slack user ids) who are not among them and have not voted;
        each kept in the progress (`delegates`) once posted, and looked for in the DM's
        history after an attempt that may have posted it without keeping it."""
        sent = _delegated(progress.ref)
        for delegate, delegator in await self._delegates(users):
            if delegate in sent or await self._has_voted(delegate, voted):
                continue
            message = await self._earlier(progress, record, delegate) if progress.earlier else None
            if message is None:
                await progress.begin()
                rendered = self.render(record)
                header = f"For {who(delegator)}, who has handed their reviews to you for now:"
                posted = await self.client.chat_postMessage(
                    channel=delegate,
                    text=f"{header} {rendered.text}",
                    blocks=[
                        {"type": "section", "text": {"type": "mrkdwn", "text": header}},
                        *rendered.blocks,
                    ],
                    unfurl_links=False,
                    unfurl_media=False,
                    metadata=tag(record, progress.delivery, "request"),
                )
                message = {"channel": posted["channel"], "ts": posted["ts"]}
            sent[delegate] = {**message, "for": delegator}
            await progress.save(
                delegates=[{"user": user, **found} for user, found in sent.items()], begun=None
            )

    async def _delegates(self, users: list[str]) -> list[tuple[str, str]]:
        """`(delegate's user id, delegator's user id)` for each of `users` who has handed
        their reviews to someone Slack knows, now; none when the delegations cannot be read
        (logged: the reviewers are reminded as before)."""
        if self.delegations is None or not self.delegations.any_possible or not users:
            return []
        people, moment = self.delegations.people, self._clock()
        found: list[tuple[str, str]] = []
        try:
            for user in users:
                person = await people.person(user)
                for delegate in await self.delegations.delegates_of(person, moment):
                    ids = sorted(await people.slack_ids(delegate))
                    if ids and ids[0] not in users and ids[0] not in (d for d, _ in found):
                        found.append((ids[0], user))
        except (StoreError, IdentityUnavailable) as exc:
            log.warning(
                "could not read who decides for %s (%s): their delegates are not messaged; "
                "the reviewers are, as without delegations",
                ", ".join(users),
                exc,
            )
            return []
        return found

    async def _to_remind(
        self, post: Delivery, record: ApprovalRecord, voted: frozenset[str]
    ) -> list[str] | None:
        """The Slack users a reminder in the thread of `post`'s messages mentions: for a
        direct message its reviewer, for a channel post the rule's reviewers that are Slack
        users or addresses (those it escalated to too, for an escalation), in both cases
        only those who have not voted. None when nobody is left to remind there (a channel
        that is a reviewer itself is reminded without mentions)."""
        kind, _, place = post.address.partition(":")
        if kind == "dm":
            user = await self._slack_user(place)
            if user is None or await self._has_voted(user, voted):
                return None
            return [user]
        policy = record.request.policy
        entries = stored_reviewers(policy.get("reviewers"))
        if post.kind == "escalation":
            entries += stored_reviewers(policy.get("escalate_to"))
        users: list[str] = []
        for entry in entries:
            if entry.kind in ("slack_user", "email"):
                user = await self._slack_user(entry.text)
                if user and user not in users and not await self._has_voted(user, voted):
                    users.append(user)
        channel_reviews = any(entry.kind == "slack_channel" for entry in entries)
        return users if users or channel_reviews else None

    async def _slack_user(self, handle: str) -> str | None:
        """The Slack user id of a reviewer entry (a user id, or an address Slack knows);
        None for another kind, or when Slack cannot say (that one is not mentioned)."""
        try:
            reviewer = parse_reviewer(handle)
            if reviewer.kind == "slack_user":
                return reviewer.value
            if reviewer.kind == "email":
                return await self.directory.user_by_email(reviewer.value)
        except (ValueError, SlackApiError, ClientError, TimeoutError) as exc:
            log.info("reviewer %s is not reminded by name: %s", handle, exc)
        return None

    async def _has_voted(self, user: str, voted: frozenset[str]) -> bool:
        """Whether the Slack user `user` voted: with that id, or with the address Slack
        holds for them."""
        if user in voted:
            return True
        try:
            email = await self.directory.email_of(user)
        except (SlackApiError, ClientError, TimeoutError):
            return False  # reminded: a nudge too many rather than one missing
        return email is not None and email in voted

    def _reminder_text(self, record: ApprovalRecord, delivery: Delivery, users: list[str]) -> str:
        deadline = record.request.deadline
        fallback = None if deadline is None else deadline.strftime("%Y-%m-%d %H:%M UTC")
        shown = None
        if deadline is not None:
            shown = f"<!date^{int(deadline.timestamp())}^{{date_short_pretty}} {{time}}|{fallback}>"
        page = inbox_page(self.public_url, record.approval_id)
        return _templates.get_template("reminder.txt.j2").render(
            question=is_question(record.request),
            mentions=[who(user) for user in users],
            step=reminder_step(delivery),
            limit=len(reminder_steps(record)),
            tool=escape(clip(record.request.tool, 200)),
            deadline=shown,
            page_link=None if page is None else link(page, "its page in the inbox"),
        )

    def render(self, record: ApprovalRecord) -> Rendered:
        """The message of the review as it stands: the request, or the decided message (a
        question's own, `bot.slack.questions`, for a question)."""
        page = inbox_page(self.public_url, record.approval_id)
        question = is_question(record.request)
        if record.decision is not None:
            return (
                question_decided(record, page=page)
                if question
                else decided_message(record, page=page)
            )
        policy = record.request.policy
        if question:
            # Answered or declined, nothing else, whatever the policy kept with it says.
            asked = policy.get("allowed_decisions") or ["respond", "deny"]
            allowed = [action for action in asked if action in ("respond", "deny")]
            return question_message(record, allowed=allowed, page=page)
        allowed = policy.get("allowed_decisions") or ["approve", "edit", "deny"]
        tool = (
            self.registry.get(record.request.tool) if record.request.tool in self.registry else None
        )
        editable = policy.get("editable")
        # An external tool is edited only when its caller sent the arguments' schema, which
        # the edit is then checked against.
        checkable = tool is not None or isinstance(policy.get("schema"), dict)
        can_edit = checkable and record.request.approvals_required == 1 and editable != []
        return request_message(
            record,
            destructive=self.destructive(record),
            can_edit=can_edit,
            allowed=allowed,
            page=page,
        )

    def destructive(self, record: ApprovalRecord) -> bool:
        """Whether approving the review's call may change what cannot be undone: a tool
        marked destructive, or one this bot does not have (it may do anything)."""
        tool = (
            self.registry.get(record.request.tool) if record.request.tool in self.registry else None
        )
        return tool is None or tool.effects == "destructive"

    async def close(self) -> None:
        for watcher in self.watchers:
            await watcher.close()


def messages_of(ref: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """The messages (`{"channel", "ts"}`) a request delivery's ref says it posted."""
    if not ref:
        return []
    found = ref.get("messages")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def _replies(ref: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """The answers an answer delivery's ref says it posted: (channel, thread ts) -> ts."""
    found = ref.get("replies")
    return {
        (str(r["channel"]), str(r["thread_ts"])): str(r["ts"])
        for r in (found if isinstance(found, list) else [])
        if isinstance(r, dict) and {"channel", "thread_ts", "ts"} <= r.keys()
    }


def _delegated(ref: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The messages a delivery's ref says it posted to delegates: user -> channel, ts, for."""
    found = ref.get("delegates")
    return {
        str(d["user"]): {"channel": str(d["channel"]), "ts": str(d["ts"]), "for": str(d["for"])}
        for d in (found if isinstance(found, list) else [])
        if isinstance(d, dict) and {"user", "channel", "ts", "for"} <= d.keys()
    }


def _replies_ref(replies: Mapping[tuple[str, str], str]) -> list[dict[str, str]]:
    return [
        {"channel": channel, "thread_ts": thread, "ts": ts}
        for (channel, thread), ts in replies.items()
    ]


def _refused_before(delivery: Delivery) -> str | None:
    """Slack's answer (`not_in_channel`, `channel_not_found`) when the delivery's last attempt
    was refused because the bot was not in the channel (`_not_invited` puts it in the error)."""
    for error in sorted(NOT_INVITED):
        if delivery.error is not None and f"({error})" in delivery.error:
            return error
    return None


def _unchecked(exc: Unreadable, record: ApprovalRecord) -> None:
    scope = f"; the app needs the scope {exc.needed}" if exc.needed else ""
    log.warning(
        "could not read %s to check for an earlier post of review %s (%s%s): posting "
        "without checking, a duplicate is possible",
        exc.channel,
        record.approval_id,
        exc.error,
        scope,
    )


def _delivery_error(exc: SlackApiError) -> DeliveryError:
    response = exc.response
    error = str(response.get("error") or f"HTTP {response.status_code}")
    if response.status_code == 429:
        headers = {key.lower(): value for key, value in response.headers.items()}
        wait = retry_after(headers.get("retry-after"))
        return DeliveryError(f"Slack: {error}", retry_after=wait)
    return DeliveryError(f"Slack: {error}", permanent=error in PERMANENT_ERRORS)
