"""The App Home tab: the reviews waiting for the Slack user who opens it, with Approve, Deny
and "Open in inbox", kept up to date while they change.

When a user opens the app's Home tab, Slack sends `app_home_opened`, and the bot publishes
(`views.publish`) a Home view for them: the pending reviews they may decide, newest first
(the web inbox's test: the rules allow them to approve or to deny, person by person through
the same `Authorizer` as a click), each with its tool, who asked, the rule's description and
a short view of the arguments (escaped, cut), and the buttons they may use. At most `SHOWN`
reviews are listed (a Home view holds 100 blocks); past that, the Home says how many more wait
in the inbox. Only the newest `SCAN` pending reviews are looked through. A question
(`core.questions`) is listed as one (`bot.slack.questions.question_summary`: the question, its
choices, how to answer it), with Decline in place of Deny and no Approve, and for whoever may
decline it a way to answer it here: a button per choice (`nodbot.home.answer.<i>`, valued
`<approval id>:<i>`; the answer is the question's own choice of that index, never the
button's text), at most `HOME_CHOICES` of them (a question with more is answered with the
buttons of its message, or in the inbox), or Answer and the answer modal for a question
without choices. An answer goes through the same `Decider` as a decline, as a respond.

A Home button is not on a review's message, so it is not bound to one (the binding of a
message's buttons, `bot.slack.reviews`, stays as it is: the Home's buttons have action ids of
their own). Its decision goes through `bot.bulk.Decider` on channel `slack`, as one of
`/nodbot`'s does: the rules' check of the clicker, person by person, a refused attempt
recorded in the review's events with the click's evidence (`via: app home`), then
`Executor.decide` with `decided_by` the Slack user id. Approve asks Slack's confirm dialog
first for a destructive tool (or one this bot does not have); Deny opens a modal for an
optional reason, whose submission decides (a refusal is shown in the modal). After a Home
button decides, the Home is published again, headed by what became of it (a refusal's
reason included). The same path answers the Approve button of `/nodbot approve` for a
destructive tool (an ephemeral message, `bot.slack.commands`): there the answer replaces the
message, through its response URL.

Kept up to date: the bot keeps, in this process, who opened their Home and when (at most
`WATCHED` users, for `WATCH_FOR` after they last opened it; the oldest are forgotten first).
When a review's request is posted in Slack, or its messages are updated once it is decided
(`SlackChannel.watchers`), the Homes of those users are published again, `REFRESH_DELAY`
after the change (changes of one moment are published once, and the outbox has recorded the
post by then). A review that is posted nowhere in Slack changes no Home until it is opened
again. Another replica of the bot does not know who opened their Home here: its changes are
seen at the next opening.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from aiohttp import ClientError
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.errors import SlackApiError

from nodbot.bot.bulk import Decider, ItemOutcome
from nodbot.bot.forms import reason_too_long
from nodbot.bot.policy.authorize import AuthorizeDecision
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.slack.messages import ACTION_OPEN, deny_modal, inbox_page, link, when, who
from nodbot.bot.slack.questions import answer_modal, chosen, decline_modal, question_summary
from nodbot.bot.slack.text import clip, code, escape, plain, shown_value
from nodbot.core import ApprovalNotFound, ApprovalRecord, Decision, StoreError
from nodbot.core.decisions import response_problem
from nodbot.core.questions import is_question, question_of

__all__ = [
    "ACTION_HOME_ANSWER",
    "ACTION_HOME_APPROVE",
    "ACTION_HOME_CHOICE",
    "ACTION_HOME_DENY",
    "HOME_ANSWER_CALLBACK",
    "HOME_CHOICES",
    "HOME_DENY_CALLBACK",
    "NOTICE_FOR",
    "SCAN",
    "SHOWN",
    "WATCHED",
    "WATCH_FOR",
    "Listing",
    "SlackHome",
    "Waiting",
    "home_view",
    "intro",
    "outcome_text",
    "render",
    "render_text",
    "review_item",
    "summary",
]

log = logging.getLogger(__name__)

ACTION_HOME_APPROVE = "nodbot.home.approve"
"""Approve, on the Home (and on `/nodbot approve`'s answer for a destructive tool)."""
ACTION_HOME_DENY = "nodbot.home.deny"
HOME_DENY_CALLBACK = "nodbot.home.deny"
"""The Deny modal opened from the Home."""
ACTION_HOME_CHOICE = re.compile(r"\Anodbot\.home\.answer\.(?P<index>[0-9]{1,2})\Z")
"""The action ids of a question's choice buttons on the Home (`nodbot.home.answer.<i>`),
each valued `<approval id>:<i>` as a message's are (`bot.slack.questions.chosen`)."""
ACTION_HOME_ANSWER = "nodbot.home.answer"
"""Answer, on the Home, for a question without choices: it opens the answer modal."""
HOME_ANSWER_CALLBACK = "nodbot.home.answer"
"""The answer modal opened from the Home."""
HOME_CHOICES = 5
"""The most choices a question on the Home offers as buttons; a question with more is
answered with the buttons of its message, or in the inbox."""

SHOWN = 25
"""The most reviews a Home lists: 3 blocks each, within a view's 100."""
SCAN = 500
"""The most pending reviews (the newest) looked through for one user."""
WATCHED = 500
"""The most users whose Home is kept up to date."""
WATCH_FOR = 12 * 3600.0
"""For how long (seconds) after a user last opened their Home it is kept up to date."""
REFRESH_DELAY = 0.5
"""Seconds between a change and the Homes published for it."""
NOTICE_FOR = 300.0
"""For how long (seconds) what became of a user's last decision on their Home heads it (the
Homes published meanwhile keep it), unless they open their Home again."""

ARGUMENTS_SHOWN = 8
"""Arguments listed for a review; the rest are counted."""
VALUE_SHOWN = 150
"""Characters of an argument's value shown."""

_APPROVAL_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,30}")

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("nodbot", "templates/slack"),  # package data of `nodbot`
    autoescape=False,  # JSON, not HTML: values are escaped for Slack, then made JSON by tojson
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
)

ACTIONS = {
    "approve": ACTION_HOME_APPROVE,
    "deny": ACTION_HOME_DENY,
    "open": ACTION_OPEN,
    "answer": ACTION_HOME_ANSWER,
}
"""The action ids of a review's buttons (templates/slack/_review_buttons.j2)."""


@dataclass(frozen=True)
class Waiting:
    """A pending review one user may decide, and how."""

    record: ApprovalRecord
    approve: bool
    """Whether the rules let them approve it."""
    deny: bool
    """Whether the rules let them deny it."""


@dataclass(frozen=True)
class Listing:
    """What waits for one user."""

    waiting: list[Waiting]
    """Newest first."""
    scanned_all: bool
    """Whether every pending review was looked through (only the newest `SCAN` are)."""
    problem: str | None = None
    """Why some reviews may be missing: who the user is could not be told (Slack failing)."""


def render(name: str, **context: Any) -> Any:
    """A JSON template of `templates/slack/`, parsed."""
    return json.loads(_templates.get_template(name).render(actions=ACTIONS, **context))


def render_text(name: str, **context: Any) -> str:
    """A text template of `templates/slack/`."""
    return _templates.get_template(name).render(**context).strip()


def _arguments(record: ApprovalRecord) -> str:
    """The first arguments, one `name: value` line each, cut short, as a code block."""
    items = list(record.request.arguments.items())
    lines = [
        f"{clip(str(name), 100)}: {clip(shown_value(value).replace(chr(10), ' '), VALUE_SHOWN)}"
        for name, value in items[:ARGUMENTS_SHOWN]
    ]
    if len(items) > ARGUMENTS_SHOWN:
        lines.append(f"… and {len(items) - ARGUMENTS_SHOWN} more arguments")
    return code("\n".join(lines) or "(no arguments)", 1800)


def summary(record: ApprovalRecord, *, inbox: bool = False) -> str:
    """A review in a few lines of mrkdwn (at most 3,000 characters): the tool, who asked and
    when, the rule's description, the arguments, its id and run. A question is shown as one
    (`bot.slack.questions.question_summary`; `inbox`: it may be answered in the inbox too)."""
    if is_question(record.request):
        return question_summary(record, inbox=inbox)
    request = record.request
    head = f"*{escape(clip(request.tool, 200))}*, asked by {who(request.requested_by)}, "
    head += when(record.created_at)
    description = request.policy.get("description")
    if isinstance(description, str) and description.strip():
        head += "\n" + escape(clip(description.strip(), 300))
    facts = f"Review `{escape(record.approval_id)}` · run `{escape(clip(request.run_id, 100))}`"
    if request.deadline is not None:
        facts += f" · decide by {when(request.deadline)}"
    if request.approvals_required > 1:
        facts += f" · {request.approvals_required} approvals needed"
    return clip(f"{head}\n{_arguments(record)}\n{facts}", 3000)


def review_item(
    waiting: Waiting, index: int, *, public_url: str | None, destructive: bool
) -> dict[str, Any]:
    """The template values of one review with its buttons (`_review_buttons.j2`). A question
    has no Approve, and its Deny says "Decline"; whoever may decline it may answer it: a
    button per choice (at most `HOME_CHOICES`; with more, it is answered with the buttons of
    its message or in the inbox), or Answer for a question without choices."""
    record = waiting.record
    tool = escape(clip(record.request.tool, 200))
    question = is_question(record.request)
    asked = question_of(record.request) if question else None
    allowed = record.request.policy.get("allowed_decisions") or ["respond", "deny"]
    answers: list[dict[str, str]] = []
    answer = False
    if asked is not None and waiting.deny and "respond" in allowed:
        if asked.choices is None:
            answer = True
        elif len(asked.choices) <= HOME_CHOICES:
            answers = [
                {
                    "action_id": f"nodbot.home.answer.{index}",
                    "label": plain(choice, 75),
                    "value": f"{record.approval_id}:{index}",
                }
                for index, choice in enumerate(asked.choices)
            ]
    return {
        "answers": answers,
        "answer": answer,
        "approval_id": record.approval_id,
        "block_id": f"nodbot.review.{index}",
        "tool": tool,
        "text": summary(record, inbox=public_url is not None),
        "approve": waiting.approve and not question,
        "deny": waiting.deny,
        "deny_label": "Decline" if question else "Deny",
        "confirm": f"*{tool}* changes things that may not be undone." if destructive else None,
        "page": inbox_page(public_url, record.approval_id),
    }


def home_view(
    waiting: Sequence[Waiting],
    *,
    public_url: str | None,
    destructive: Callable[[ApprovalRecord], bool],
    notice: str | None = None,
    scanned_all: bool = True,
    problem: str | None = None,
) -> dict[str, Any]:
    """The Home view of one user: `notice` (mrkdwn), then the first `SHOWN` of `waiting`
    with their buttons, then how many more there are."""
    items = [
        review_item(w, i, public_url=public_url, destructive=destructive(w.record))
        for i, w in enumerate(waiting[:SHOWN])
    ]
    view: dict[str, Any] = render(
        "home.json.j2",
        notice=None if notice is None else clip(notice, 3000),
        intro=intro(len(waiting), problem),
        items=items,
        more=_more(len(waiting) - len(items), public_url, scanned_all),
    )
    return view


def intro(count: int, problem: str | None = None) -> str:
    """How many reviews wait (and why some may be missing)."""
    if count == 0:
        found = "Nothing waits for your decision."
    else:
        reviews = "review waits" if count == 1 else "reviews wait"
        found = f"{count} {reviews} for your decision, newest first."
    if problem is not None:
        found += f" Some may be missing: {escape(clip(problem, 300))}"
    return found


def _more(hidden: int, public_url: str | None, scanned_all: bool) -> str | None:
    """What the list leaves out, and where to see it."""
    parts = []
    if hidden > 0:
        inbox = link(f"{public_url}/inbox", "the inbox") if public_url else "the web inbox"
        parts.append(f"… and {hidden} more in {inbox}.")
    if not scanned_all:
        parts.append(f"Only the newest {SCAN} pending reviews are looked through here.")
    return " ".join(parts) or None


def outcome_text(outcome: ItemOutcome, *, approved: bool) -> str:
    """What became of a decision made on the Home or with `/nodbot`, in mrkdwn."""
    record = outcome.record
    counted = record is not None and record.decision is None and outcome.ok
    decision = None if record is None else record.decision
    answer = None if decision is None else decision.response
    return render_text(
        "outcome.txt.j2",
        question=record is not None and is_question(record.request),
        answer=None if answer is None else escape(clip(answer, 500)),
        status=outcome.status,
        approved=approved,
        counted=counted,
        needed=record.request.approvals_required if record is not None else 1,
        tool=escape(clip(record.request.tool, 200)) if record is not None else "",
        approval_id=escape(clip(outcome.approval_id, 100)),
        error=escape(clip((outcome.error or "refused").rstrip("."), 1500)),
    )


class SlackHome:
    """The App Home of each user, and its buttons (see the module)."""

    def __init__(
        self,
        channel: SlackChannel,
        authorize: AuthorizeDecision,
        decider: Decider,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channel = channel
        self.authorize = authorize
        self.decider = decider
        self._clock = clock
        self._watched: OrderedDict[str, float] = OrderedDict()
        """User -> when they last opened their Home, the least recent first."""
        self._locks: dict[str, asyncio.Lock] = {}
        """One publication at a time per user, so the last one published is the newest."""
        self._notices: dict[str, tuple[str, float]] = {}
        """User -> what became of their last decision on their Home, and when (see
        `NOTICE_FOR`); kept for watched users only."""
        self._dirty: set[str] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._changes = 0
        """Counts the changes seen (`changed`, and decisions made here): a list of pending
        reviews read before the last one is read again before it is published."""

    def register(self, app: AsyncApp) -> None:
        """Listen on `app` for the Home's event and buttons; watch the channel's reviews."""
        app.event("app_home_opened")(self._opened)
        app.action(ACTION_HOME_APPROVE)(self._approve)
        app.action(ACTION_HOME_DENY)(self._deny)
        app.view(HOME_DENY_CALLBACK)(self._deny_submitted)
        app.action(ACTION_HOME_CHOICE)(self._choice)
        app.action(ACTION_HOME_ANSWER)(self._answer_form)
        app.view(HOME_ANSWER_CALLBACK)(self._answer_submitted)
        self.channel.watchers.append(self)

    @property
    def watched(self) -> list[str]:
        """The users whose Home is kept up to date, the least recent first."""
        self._forget_old()
        return list(self._watched)

    # --- what waits for whom -----------------------------------------------------------------

    async def pending(self) -> list[ApprovalRecord]:
        """The newest `SCAN` pending reviews, newest first. Raises `StoreError`."""
        return await self.channel.store.list(status="pending", limit=SCAN, newest_first=True)

    async def waiting(self, user: str, pending: Sequence[ApprovalRecord] | None = None) -> Listing:
        """The pending reviews (of `pending`, by default `pending()`) that `user` may approve
        or deny, newest first. Raises `StoreError`."""
        records = await self.pending() if pending is None else pending
        found = []
        problem = None
        for record in records:
            approve = await self.authorize(user, record, Decision(approved=True, decided_by=user))
            deny = await self.authorize(user, record, Decision(approved=False, decided_by=user))
            if approve.allowed or deny.allowed:
                found.append(Waiting(record, approve.allowed, deny.allowed))
            elif approve.person is None:  # who they are could not be told: a check not made
                problem = approve.refusal
        return Listing(found, len(records) < SCAN, problem)

    async def publish(
        self,
        user: str,
        notice: str | None = None,
        *,
        pending: tuple[Sequence[ApprovalRecord], int] | None = None,
    ) -> bool:
        """Publish `user`'s Home as it stands, headed by `notice`, else by the notice still
        kept for them; whether it was published (a failure is logged). `pending`: the pending
        reviews, and the count of changes when they were read (read again now if any change
        came since); by default they are read now."""
        now = self._clock()
        if notice is not None:
            self._notices[user] = (notice, now)
        kept = self._notices.get(user)
        if kept is not None and now - kept[1] > NOTICE_FOR:
            del self._notices[user]
            kept = None
        lock = self._locks.setdefault(user, asyncio.Lock())
        async with lock:
            try:
                fresh = pending is not None and pending[1] == self._changes
                listing = await self.waiting(user, pending[0] if pending and fresh else None)
                view = home_view(
                    listing.waiting,
                    public_url=self.channel.public_url,
                    destructive=self.channel.destructive,
                    notice=None if kept is None else kept[0],
                    scanned_all=listing.scanned_all,
                    problem=listing.problem,
                )
                await self.channel.client.views_publish(user_id=user, view=view)
            except SlackApiError as exc:
                log.warning("the Home of %s was not published: %s", user, exc.response.get("error"))
                return False
            except (StoreError, ClientError, TimeoutError) as exc:
                log.warning("the Home of %s was not published: %s", user, exc)
                return False
        return True

    # --- kept up to date ---------------------------------------------------------------------

    def watch(self, user: str) -> None:
        """`user` opened their Home now: keep it up to date for `WATCH_FOR`."""
        self._watched[user] = self._clock()
        self._watched.move_to_end(user)
        while len(self._watched) > WATCHED:
            forgotten, _ = self._watched.popitem(last=False)
            self._forget(forgotten)
        self._forget_old()

    def changed(self, record: ApprovalRecord) -> None:
        """A review was posted or decided: the watched Homes are published again soon."""
        self._changes += 1
        self._forget_old()
        self._dirty.update(self._watched)
        if self._dirty and (self._refresher is None or self._refresher.done()):
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def close(self) -> None:
        """Stop publishing (the channel is closing)."""
        task, self._refresher = self._refresher, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _refresh(self) -> None:
        while self._dirty:
            await asyncio.sleep(REFRESH_DELAY)
            users, self._dirty = self._dirty, set()
            seen = self._changes
            try:
                pending = await self.pending()  # read once for all of them
            except StoreError as exc:
                log.warning("the Homes of %d user(s) were not published: %s", len(users), exc)
                continue
            for user in users:
                try:
                    await self.publish(user, pending=(pending, seen))
                except Exception:  # one user's Home does not stop the others'
                    log.exception("the Home of %s could not be published", user)

    def _forget_old(self) -> None:
        now = self._clock()
        while self._watched:
            user, seen = next(iter(self._watched.items()))
            if now - seen <= WATCH_FOR:
                break
            del self._watched[user]
            self._forget(user)

    def _forget(self, user: str) -> None:
        lock = self._locks.get(user)
        if lock is not None and not lock.locked():
            del self._locks[user]
        self._dirty.discard(user)
        self._notices.pop(user, None)

    # --- the event and the buttons -----------------------------------------------------------

    async def _opened(self, event: dict[str, Any]) -> None:
        """Someone opened the app's Home tab (Bolt acks the event): their Home is published."""
        user = event.get("user")
        if event.get("tab") != "home" or not isinstance(user, str) or not _USER_ID.fullmatch(user):
            return
        self.watch(user)
        self._notices.pop(user, None)  # opened again: the list as it stands
        await self.publish(user)

    async def _approve(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        press = _Press.of(body)
        outcome = await self._decide(press, approved=True)
        await self._answer(press, outcome, respond, approved=True)

    async def _deny(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        """Deny: a modal asks for an optional reason (its submission decides)."""
        await ack()
        press = _Press.of(body)
        try:
            record = await self.channel.store.get(press.approval_id)
        except (ApprovalNotFound, StoreError):
            record = None
        if record is None or record.decision is not None:  # said as a decision would say it
            outcome = await self._decide(press, approved=False)
            await self._answer(press, outcome, respond, approved=False)
            return
        modal = decline_modal(record) if is_question(record.request) else deny_modal(record)
        await self._open(press, record, modal, HOME_DENY_CALLBACK)

    async def _deny_submitted(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        values = view.get("state", {}).get("values", {})
        reason = (values.get("reason", {}).get("value", {}) or {}).get("value") or None
        too_long = reason_too_long(reason)
        if too_long is not None:
            await ack(response_action="errors", errors={"reason": clip(too_long, 150)})
            return
        press = _Press.of_view(body, view)
        outcome = await self._decide(press, approved=False, reason=reason)
        if not outcome.ok:  # the modal stays open, saying why
            text = outcome_text(outcome, approved=False)
            await ack(response_action="errors", errors={"reason": clip(text, 150)})
            return
        await ack()
        if press.via == "app home":
            await self.publish(press.user, outcome_text(outcome, approved=False))

    async def _choice(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        """A question's choice button: the answer is the question's own choice of that
        index (never the button's text); a click that names none is answered as such."""
        await ack()
        press = _Press.of(body)
        action = (body.get("actions") or [{}])[0]
        named = chosen(str(action.get("action_id") or ""), press.approval_id, ACTION_HOME_CHOICE)
        if named is None:
            outcome = ItemOutcome(press.approval_id, "invalid", "the button names no choice")
        else:
            press.approval_id, index = named
            outcome = await self._answer_choice(press, index)
        await self._answer(press, outcome, respond, approved=False)

    async def _answer_choice(self, press: _Press, index: int) -> ItemOutcome:
        if not _APPROVAL_ID.fullmatch(press.approval_id):
            return ItemOutcome(press.approval_id, "not_found", "no approval has this id")
        try:
            record = await self.channel.store.get(press.approval_id)
        except ApprovalNotFound:
            return ItemOutcome(press.approval_id, "not_found", "no approval has this id")
        except StoreError:
            return ItemOutcome(
                press.approval_id, "invalid", "the bot's store cannot be used now; try again"
            )
        asked = question_of(record.request)
        if asked is None or asked.choices is None or not 0 <= index < len(asked.choices):
            return ItemOutcome(press.approval_id, "invalid", "that is not one of its choices")
        return await self._decide(press, approved=False, response=asked.choices[index])

    async def _answer_form(
        self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond
    ) -> None:
        """Answer, for a question without choices: the answer modal (its submission answers)."""
        await ack()
        press = _Press.of(body)
        try:
            record = await self.channel.store.get(press.approval_id)
        except (ApprovalNotFound, StoreError):
            record = None
        if record is None or record.decision is not None or not is_question(record.request):
            outcome = ItemOutcome(press.approval_id, "invalid", "it waits for no answer")
            await self._answer(press, outcome, respond, approved=False)
            return
        await self._open(press, record, answer_modal(record), HOME_ANSWER_CALLBACK)

    async def _open(
        self, press: _Press, record: ApprovalRecord, modal: dict[str, Any], callback: str
    ) -> None:
        """Open `modal` for the review, its submission sent to `callback` with the review's
        id and where it was opened from."""
        metadata = json.dumps({"approval_id": record.approval_id, "via": press.via})
        view = {**modal, "callback_id": callback, "private_metadata": metadata}
        try:
            await self.channel.client.views_open(trigger_id=press.trigger_id, view=view)
        except SlackApiError as exc:
            log.warning("the %s modal was not opened: %s", callback, exc.response.get("error"))

    async def _answer_submitted(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        values = view.get("state", {}).get("values", {})
        text = (values.get("answer", {}).get("value", {}) or {}).get("value") or ""
        press = _Press.of_view(body, view)
        problem = response_problem(text) if text.strip() else "an answer is needed"
        if problem is not None:
            await ack(response_action="errors", errors={"answer": clip(problem, 150)})
            return
        outcome = await self._decide(press, approved=False, response=text.strip())
        if not outcome.ok:  # the modal stays open, saying why
            text = outcome_text(outcome, approved=False)
            await ack(response_action="errors", errors={"answer": clip(text, 150)})
            return
        await ack()
        if press.via == "app home":
            await self.publish(press.user, outcome_text(outcome, approved=False))

    async def _decide(
        self,
        press: _Press,
        *,
        approved: bool,
        reason: str | None = None,
        response: str | None = None,
    ) -> ItemOutcome:
        """The decision through the Decider; an id that is not one is not looked up."""
        if not _APPROVAL_ID.fullmatch(press.approval_id):
            return ItemOutcome(press.approval_id, "not_found", "no approval has this id")
        try:
            outcome = await self.decider.decide_one(
                press.approval_id,
                approved=approved,
                who=press.user,
                reason=reason,
                evidence=press.evidence,
                response=response,
            )
        except StoreError as exc:
            log.warning("a decision from Slack (%s) could not be recorded: %s", press.via, exc)
            return ItemOutcome(
                press.approval_id, "invalid", "the bot's store cannot be used now; try again"
            )
        self._changes += 1  # a Home read before this one lists it still
        return outcome

    async def _answer(
        self, press: _Press, outcome: ItemOutcome, respond: AsyncRespond, *, approved: bool
    ) -> None:
        """Tell the clicker what became of it: on their Home, published again; in place of
        the ephemeral message the button was on."""
        text = outcome_text(outcome, approved=approved)
        if press.via == "app home":
            self.watch(press.user)
            await self.publish(press.user, text)
            return
        if respond.response_url is None:
            log.info("could not tell %s: %s", press.user, text)
            return
        try:
            # In place of the ephemeral answer the button was on; beside any other message.
            await respond(text=text, replace_original=press.ephemeral)
        except (ClientError, TimeoutError) as exc:
            log.warning("could not tell %s through the response URL: %s", press.user, exc)


class _Press:
    """Who pressed a Home (or `/nodbot` answer) button for which review, and the payload's
    evidence of it (kept in the audit trail)."""

    def __init__(
        self,
        user: str,
        approval_id: str,
        via: str,
        trigger_id: str,
        evidence: dict[str, str],
        *,
        ephemeral: bool = False,
    ) -> None:
        self.user = user
        self.approval_id = approval_id
        self.via = via
        """`app home`, or `slash command` for a button of a `/nodbot` answer."""
        self.trigger_id = trigger_id
        self.evidence = evidence
        self.ephemeral = ephemeral
        """Whether the button was on an ephemeral message (a `/nodbot` answer)."""

    @classmethod
    def of(cls, body: dict[str, Any]) -> _Press:
        action = (body.get("actions") or [{}])[0]
        container = body.get("container") or {}
        via = "app home" if container.get("type") == "view" else "slash command"
        user = str(body["user"]["id"])
        evidence = {
            "user": user,
            "team": _team(body),
            "action_ts": str(action.get("action_ts") or ""),
            "view_id": str(container.get("view_id") or ""),
            "channel": str(container.get("channel_id") or ""),
            "via": via,
        }
        return cls(
            user,
            str(action.get("value") or ""),
            via,
            str(body.get("trigger_id") or ""),
            {key: value for key, value in evidence.items() if value},
            ephemeral=container.get("is_ephemeral") is True,
        )

    @classmethod
    def of_view(cls, body: dict[str, Any], view: dict[str, Any]) -> _Press:
        try:
            metadata = json.loads(str(view.get("private_metadata") or ""))
        except ValueError:
            metadata = {}
        if not isinstance(metadata, dict):
            metadata = {}
        via = "slash command" if metadata.get("via") == "slash command" else "app home"
        user = str(body["user"]["id"])
        evidence = {
            "user": user,
            "team": _team(body),
            "view_id": str(view.get("id") or ""),
            "via": via,
        }
        return cls(
            user,
            str(metadata.get("approval_id") or ""),
            via,
            "",
            {key: value for key, value in evidence.items() if value},
        )


def _team(body: dict[str, Any]) -> str:
    team = body.get("team") or {}
    return str(team.get("id") or body["user"].get("team_id") or "")
