"""Decisions made in Discord: the Approve, Edit and Deny buttons of a review's message and
their forms, and a question's menu of choices, Answer and Decline buttons and their forms,
sent by Discord to `POST /discord/interactions`.

Every request is checked first (`bot.discord.signature`: Ed25519 over the timestamp and the
raw body, against the application's public key); an unsigned, forged or stale one is refused
with 401 before its body is read as JSON. A PING is answered with a PONG. Discord sends each
interaction once: the same interaction id again (a signed request replayed within its
signature's five minutes) is refused with 400 and records nothing (`_first_time`; each
replica remembers the ids it answered, and a replay to another one decides nothing a first
click did not: the first decision wins, and a vote counts once per person). The body is read
bounded (`bot.http.limits.loads`) into `Interaction`, which keeps only what is used, each
field checked (snowflakes are digits, ids and texts bounded); any other shape is refused with
400 and nothing is recorded.

Discord wants an answer within 3 seconds. Approve is answered at once with a deferred update
(type 6), and decided after; a Deny or Edit click is answered with its form (a modal, type
9) once the review, the message and the clicker are checked (within `FORM_WITHIN` seconds,
else the clicker is asked to try again: so is one on a message whose post Discord has shown
but not yet answered, rather than refused as a click on another review's message); a form's
submission is answered with a deferred update, or with what is wrong with it (an edit that
does not parse), and decided after. Whatever the clicker is told after that (a refusal, a
vote counted) is a follow-up message only they see.

Who may decide is the rule's say, kept with the review, checked person by person through the
bot's one `Authorizer` (`bot.policy.authorize`): the clicker is `discord:<user id>`, a person
through a `people:` entry that names that handle; the run's requester may not approve their
own call unless the rule allows it; votes count by person. A click decides only the review of
the message it is on (the message must be one posted for the review the button names), and a
form names the message it was opened from, checked again on submission. A refused attempt
goes to the review's events with the clicker's person and the click's evidence; a decision is
recorded through `Executor.decide` with `decided_by` the clicker's handle, channel `discord`
and the evidence (user, guild, channel, message, interaction). The outbox then edits the
review's messages (`bot.discord.channel`).

A question (`core.questions`, its message `bot.discord.questions`) is answered the same way.
A pick in its menu is answered at once with a deferred update and decided after: the pick's
value must be the index of one of the question's own choices (`choice_of`), and that choice
is the answer, so no text a client sends becomes one; any other value (no such option was
posted: a forged pick) is refused, told, and recorded as a refused attempt (`NOT_A_CHOICE`),
as Slack and Teams record one. Answer opens a form for a free-text answer, checked with
`answer_problem` (needed, bounded, one of the choices when there are some) before anything is
recorded; Decline opens a form for an optional reason. Each is authorized person by person,
bound to its message and recorded as a click is, as a respond (`Decision.response`) or a
deny; `Executor.decide` checks the answer against the choices once more. An Approve, Edit or
Deny click on a question, or an answer or Decline on a review of a call, is refused and
recorded (`A_QUESTION`, `NOT_A_QUESTION`); an answer after the first is told how the question
was closed ("already answered by ...").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nodbot.bot.config.models import DiscordConfig
from nodbot.bot.discord.api import EPHEMERAL, NO_MENTIONS, DiscordApiError
from nodbot.bot.discord.channel import DiscordChannel, posted_messages
from nodbot.bot.discord.messages import (
    Action,
    button_of,
    deny_modal,
    edit_modal,
    form_fields,
    form_of,
    told,
)
from nodbot.bot.discord.questions import answer_modal, choice_of
from nodbot.bot.discord.questions import decline_modal as question_decline_modal
from nodbot.bot.discord.signature import MAX_SKEW, NotSigned, Verifier
from nodbot.bot.forms import EditField, edit_fields, parse_edit, reason_too_long
from nodbot.bot.http.auth import ApiError
from nodbot.bot.http.limits import loads
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import Authorizer, Verdict
from nodbot.bot.policy.people import IdentityUnavailable
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
from nodbot.core.questions import answer_of, answer_problem, is_question, question_of
from nodbot.core.store import TIMEOUT_DECIDER, utc_now

__all__ = ["CHANNEL", "DiscordReviews", "Interaction"]

log = logging.getLogger(__name__)

CHANNEL = "discord"
PING, COMPONENT, MODAL_SUBMIT = 1, 3, 5
"""The interaction types answered (Discord's numbers)."""
PONG, REPLY, DEFERRED_UPDATE = 1, 4, 6
"""The answer types used (Discord's numbers)."""
FORM_WITHIN = 2.0
"""Seconds a Deny or Edit click may take to be checked before its form is shown: Discord
gives up on an answer after 3."""
SEEN_MAX = 10_000
"""Interaction ids kept to refuse a replay of one (`DiscordReviews._first_time`)."""
POSTED_WAIT = 5.0
"""How long (seconds) an Approve click waits for the message it is on to be recorded:
Discord answers a post before the outbox records it, and a click may come in between."""

NOT_ITS_MESSAGE = "this button does not belong to this review"
A_QUESTION = "this is a question: answer it or decline it with the menu and buttons of its message"
"""The refusal of an Approve, Edit or Deny click on a question (none is posted on one)."""
NOT_A_QUESTION = "this review is not a question: decide it with the buttons of its message"
"""The refusal of an answer's or a Decline's click on a review of a call."""
NOT_A_CHOICE = "that is not one of the question's choices"
"""A select menu's value that names none of the question's choices (a forged one)."""
RESPOND_PROBE = "(the answer to come)"
"""The text of the answer an Answer click asks the rules about: only its kind counts."""
GONE = "this review no longer exists"

Snowflake = Annotated[str, Field(pattern=r"^[0-9]{1,25}$")]


class _User(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: Snowflake


class _Member(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    user: _User


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: Snowflake


class _Input(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    custom_id: Annotated[str, Field(max_length=100)]
    value: Annotated[str | None, Field(max_length=4000)] = None


class _Row(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    components: Annotated[list[_Input], Field(max_length=5)] = Field(default_factory=list)


class _Data(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    custom_id: Annotated[str, Field(max_length=100)] = ""
    components: Annotated[list[_Row], Field(max_length=5)] = Field(default_factory=list)
    values: Annotated[list[Annotated[str, Field(max_length=100)]] | None, Field(max_length=25)] = (
        None
    )
    """The options picked in a select menu (a question's choices); None for a button."""


class Interaction(BaseModel):
    """What nodbot reads of an interaction Discord sends (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    id: Snowflake
    """The interaction's id (kept in the evidence)."""
    application_id: Snowflake
    type: int
    """1 PING, 3 a button's click, 5 a form's submission."""
    token: Annotated[str, Field(pattern=r"^[A-Za-z0-9._\-]{1,500}$")] = "-"
    """Authorizes the follow-up messages of this interaction."""
    data: _Data | None = None
    guild_id: Snowflake | None = None
    channel_id: Snowflake | None = None
    member: _Member | None = None
    """The clicker, in a server's channel."""
    user: _User | None = None
    """The clicker, in a direct message."""
    message: _Message | None = None
    """The message the button is on (a form opened from a button names it too)."""

    @property
    def clicker(self) -> str | None:
        """The clicker's Discord user id."""
        if self.member is not None:
            return self.member.user.id
        return self.user.id if self.user is not None else None

    def fields(self) -> dict[str, str]:
        """A submitted form's inputs: custom id -> text."""
        data = self.data or _Data()
        return {i.custom_id: i.value or "" for row in data.components for i in row.components}


class _Refused(Exception):
    """A click refused before any decision: the clicker is told `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Click:
    """Who clicked what, on which message, and the evidence of it (kept in the audit)."""

    def __init__(self, interaction: Interaction, approval_id: str, message: str) -> None:
        user = interaction.clicker or ""
        self.user = f"discord:{user}"
        self.approval_id = approval_id
        self.message = (interaction.channel_id or "", message)
        self.token = interaction.token
        evidence = {
            "user": user,
            "guild": interaction.guild_id or "",
            "channel": interaction.channel_id or "",
            "message": message,
            "interaction": interaction.id,
        }
        self.evidence = {key: value for key, value in evidence.items() if value}


class DiscordReviews:
    """The interactions endpoint: clicks and forms turned into decisions (see the module)."""

    def __init__(
        self,
        config: DiscordConfig,
        channel: DiscordChannel,
        *,
        authorizer: Authorizer,
        on_decided: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.channel = channel
        self.store = channel.store
        self.registry = channel.registry
        self.authorizer = authorizer
        self.on_decided = on_decided
        self.verifier = Verifier(config.public_key, clock=clock)
        self._clock = clock
        self._seen: dict[str, float] = {}
        """The interactions answered lately: id -> when (`_first_time`), oldest first."""
        self.executor = Executor(self.registry, approval=DeferredApproval(self.store))
        self.counters: dict[str, int] = {"decisions": 0}
        self._tasks: set[asyncio.Task[None]] = set()
        """What goes on after an answer to Discord (a decision, a follow-up)."""

    def routes(self) -> list[Route]:
        """`POST /discord/interactions`."""
        return [Route("/discord/interactions", self.endpoint, methods=["POST"])]

    async def endpoint(self, request: Request) -> Response:
        """One interaction: checked, read, answered (see the module)."""
        body = await request.body()  # at most the route's body limit (`BodyLimit`)
        try:
            self.verifier.check(request.headers, body)
        except NotSigned as exc:
            raise ApiError(401, str(exc)) from None
        interaction = _interaction(loads(body))
        if interaction.type == PING:
            return JSONResponse({"type": PONG})
        if interaction.application_id != self.config.application_id:
            raise ApiError(400, "the interaction is for another application")
        if not self._first_time(interaction.id):
            raise ApiError(400, "this interaction was received already")
        if interaction.clicker is None or interaction.data is None:
            raise ApiError(400, "the interaction names no user or no data")
        if interaction.type == COMPONENT:
            return await self._clicked(interaction)
        if interaction.type == MODAL_SUBMIT:
            return await self._submitted(interaction)
        raise ApiError(400, f"interactions of type {interaction.type} are not answered here")

    def _first_time(self, interaction_id: str) -> bool:
        """Whether the interaction `interaction_id` is new to this process: Discord sends
        each once, so the same one again is a replay of a signed request (within its
        signature's `MAX_SKEW`). Ids are kept for twice that (a timestamp may be ahead of
        now as much as behind), at most `SEEN_MAX` of them."""
        now = self._clock()
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if now - at <= 2 * MAX_SKEW and len(self._seen) < SEEN_MAX:
                break
            del self._seen[oldest]
        if interaction_id in self._seen:
            return False
        self._seen[interaction_id] = now
        return True

    async def close(self) -> None:
        """Wait a little for what follows answers already given (decisions being recorded)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    # --- buttons ------------------------------------------------------------------------------

    async def _clicked(self, interaction: Interaction) -> Response:
        assert interaction.data is not None
        named = button_of(interaction.data.custom_id)
        if named is None or interaction.message is None:
            raise ApiError(400, "the click is not on a button of a review's message")
        action, approval_id = named
        click = _Click(interaction, approval_id, interaction.message.id)
        values = interaction.data.values
        if action == "answer" and values is not None:  # a choice picked in the menu
            self._later(self._choose_later(click, values))
            return JSONResponse({"type": DEFERRED_UPDATE})
        if action == "approve":
            approval = Decision(approved=True, decided_by=click.user)
            self._later(self._decide_later(click, approval, wait=True))
            return JSONResponse({"type": DEFERRED_UPDATE})
        try:
            async with asyncio.timeout(FORM_WITHIN):
                return await self._form(click, action)
        except _Refused as exc:
            return _reply(told("refused", why=exc.reason))
        except (TimeoutError, StoreError):
            return _reply(told("refused", why="it could not be checked in time; try again"))

    async def _form(self, click: _Click, action: Action) -> Response:
        """The form of a Deny, Edit, Answer or Decline click, once the clicker may use it.
        Raises `_Refused`."""
        if action in ("answer", "decline"):
            return await self._question_form(click, action)
        # A post Discord has not answered yet may be shown already: waited for (within
        # `FORM_WITHIN`, then "try again"), not refused as another review's button.
        record = await self._bound(click, wait=True)
        probe = Decision(approved=action == "edit", decided_by=click.user)
        await self._allowed(click, record, probe)
        if action == "deny":
            return JSONResponse(deny_modal(record, click.message[1]))
        if "edit" not in (record.request.policy.get("allowed_decisions") or ["edit"]):
            raise _Refused("this call may not be edited; approve or deny it")
        fields = form_fields(self._fields(record))
        if not fields:
            raise _Refused("nothing of this call can be edited here; edit it in the inbox")
        return JSONResponse(edit_modal(record, fields, click.message[1]))

    async def _question_form(self, click: _Click, action: Action) -> Response:
        """The Answer or Decline form of a question, once the clicker may use it (the rules
        are asked about an answer whatever its text). Raises `_Refused`."""
        record = await self._bound(click, wait=True, question=True)
        if action == "decline":
            await self._allowed(click, record, Decision(approved=False, decided_by=click.user))
            return JSONResponse(question_decline_modal(record, click.message[1]))
        probe = Decision(approved=False, response=RESPOND_PROBE, decided_by=click.user)
        await self._allowed(click, record, probe)
        return JSONResponse(answer_modal(record, click.message[1]))

    async def _choose_later(self, click: _Click, values: list[str]) -> None:
        """After the answer to Discord: the choice picked in a question's menu, looked up in
        the question itself, checked and recorded as the answer; a value that names none of
        its choices is refused, told and recorded as a refused attempt."""
        try:
            record = await self._bound(click, wait=True, question=True)
            choice = choice_of(question_of(record.request), values)
            if choice is None:  # no such option was posted: recorded, as Slack and Teams do
                await self._refuse(click, record, NOT_A_CHOICE)
            answer = Decision(approved=False, response=choice, decided_by=click.user)
            verdict = await self._allowed(click, record, answer)
            await self._decide(click, record, answer, verdict)
        except _Refused as exc:
            await self._tell(click, told("refused", why=exc.reason))
        except StoreError as exc:
            log.warning("a Discord choice on %s was not recorded: %s", click.approval_id, exc)
            await self._tell(click, told("refused", why="the store failed; try again"))

    # --- forms --------------------------------------------------------------------------------

    async def _submitted(self, interaction: Interaction) -> Response:
        assert interaction.data is not None
        named = form_of(interaction.data.custom_id)
        if named is None:
            raise ApiError(400, "the submission is not of a review's form")
        action, approval_id, message = named
        click = _Click(interaction, approval_id, message)
        if interaction.message is not None and interaction.message.id != message:
            click.message = (click.message[0], "")  # not the message it was opened from
        fields = interaction.fields()
        if action in ("deny", "decline"):
            reason = fields.get("reason", "").strip() or None
            problem = reason_too_long(reason)
            if problem is not None:
                return _reply(told("refused", why=problem))
            denial = Decision(approved=False, reason=reason, decided_by=click.user)
            self._later(self._decide_later(click, denial, question=action == "decline"))
            return JSONResponse({"type": DEFERRED_UPDATE})
        if action == "answer":
            return await self._answered(click, fields.get("answer", ""))
        try:
            record = await self.store.get(approval_id)
        except ApprovalNotFound:
            return _reply(told("refused", why=GONE))
        specs = self._fields(record)
        parsed = parse_edit(specs, fields, record.request.arguments)
        if parsed.errors:
            return _reply(told("invalid", errors=sorted(parsed.errors.items())))
        if not parsed.edited:
            return _reply(told("unchanged"))
        edit = ToolDecision(action="edit", arguments=parsed.edited).to_decision(click.user)
        self._later(self._decide_later(click, edit))
        return JSONResponse({"type": DEFERRED_UPDATE})

    async def _answered(self, click: _Click, text: str) -> Response:
        """An Answer form's submission: a text that cannot be the question's answer (blank,
        too long, none of its choices) is answered with what is wrong, nothing recorded;
        otherwise it is decided after the answer to Discord."""
        try:
            record = await self.store.get(click.approval_id)
        except ApprovalNotFound:
            return _reply(told("refused", why=GONE))
        if is_question(record.request):
            problem = answer_problem(record.request, text)
            if problem is not None:
                return _reply(told("refused", why=problem))
        answer = Decision(approved=False, response=text, decided_by=click.user)
        self._later(self._decide_later(click, answer, question=True))
        return JSONResponse({"type": DEFERRED_UPDATE})

    async def _decide_later(
        self, click: _Click, decision: Decision, *, wait: bool = False, question: bool = False
    ) -> None:
        """After the answer to Discord: the click's decision, checked and recorded; the
        clicker is told when it is not. `wait`: for the message to be recorded (a click may
        come before the outbox records the post it is on; a form comes after a click).
        `question`: whether the decision is a question's (an answer, a decline)."""
        try:
            record = await self._bound(click, wait=wait, question=question)
            verdict = await self._allowed(click, record, decision)
            await self._decide(click, record, decision, verdict)
        except _Refused as exc:
            await self._tell(click, told("refused", why=exc.reason))
        except StoreError as exc:
            log.warning("a Discord click on %s was not recorded: %s", click.approval_id, exc)
            await self._tell(click, told("refused", why="the store failed; try again"))

    # --- shared -------------------------------------------------------------------------------

    async def _bound(self, click: _Click, *, wait: bool, question: bool = False) -> ApprovalRecord:
        """The review the click names, when the click is on one of its messages and is of
        its kind (`question`: an answer or a decline, for a question; else Approve, Edit or
        Deny, for a call's review); a click on another message, or of the other kind, is
        recorded on the review it names. Raises `_Refused`."""
        try:
            record = await self.store.get(click.approval_id)
        except ApprovalNotFound:
            raise _Refused(GONE) from None
        deadline = time.monotonic() + (POSTED_WAIT if wait else 0.0)
        while True:
            deliveries = await self.store.deliveries(click.approval_id)
            if click.message in posted_messages(deliveries):
                break
            now = utc_now()
            in_flight = any(
                d.channel == CHANNEL and d.status == "due" and d.due_at <= now for d in deliveries
            )
            if not in_flight or time.monotonic() >= deadline:
                await self._refuse(click, record, NOT_ITS_MESSAGE)
            await asyncio.sleep(0.1)
        if is_question(record.request) != question:
            await self._refuse(click, record, NOT_A_QUESTION if question else A_QUESTION)
        return record

    async def _allowed(self, click: _Click, record: ApprovalRecord, decision: Decision) -> Verdict:
        """The verdict when the clicker may make `decision`. Raises `_Refused` once the
        refused attempt is recorded."""
        verdict = await self.authorizer.check(click.user, record, decision)
        if verdict.refusal is not None:
            await self._refuse(click, record, verdict.refusal, person=verdict.person)
        return verdict

    async def _refuse(
        self, click: _Click, record: ApprovalRecord, reason: str, *, person: str | None = None
    ) -> NoReturn:
        """Record a refused attempt on the review, then raise `_Refused`."""
        if person is None:
            try:
                person = (await self.authorizer.people.person(click.user)).key
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
        raise _Refused(reason)

    async def _decide(
        self, click: _Click, record: ApprovalRecord, decision: Decision, verdict: Verdict
    ) -> None:
        """Record the decision; the clicker is told when it is not, or is one vote of several."""
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
            raise _Refused(await self._already(record, exc)) from None
        except ApprovalAlreadyVoted:
            raise _Refused("you have voted on this call already") from None
        except UnknownToolError:
            raise _Refused("this call's tool is not one this bot can check an edit of") from None
        except (InvalidArgumentsError, InvalidDecisionError) as exc:
            raise _Refused(str(exc)) from None
        METRICS.decided(decided, CHANNEL)
        self.counters["decisions"] += 1
        if self.on_decided is not None:
            self.on_decided()
        if decided.decision is None:  # a vote of several: say how far it is
            await self._tell(click, told("counted", needed=decided.request.approvals_required))

    async def _already(self, record: ApprovalRecord, exc: ApprovalAlreadyDecided) -> str:
        """What a clicker whose decision came second is told: for a question, how it was
        closed (answered, declined, timed out) and by whom."""
        by = exc.decided_by or "someone"
        if not is_question(record.request):
            return f"this call was already decided by {by}"
        try:
            record = await self.store.get(record.approval_id)
        except (ApprovalNotFound, StoreError):
            return f"this question was already closed by {by}"
        if answer_of(record) is not None:
            return f"this question was already answered by {by}"
        if by == TIMEOUT_DECIDER:
            return "nobody answered this question before its deadline: it is declined"
        return f"this question was already declined by {by}"

    def _fields(self, record: ApprovalRecord) -> list[EditField]:
        """The edit form's inputs: from the tool's model, or for a tool of another process
        from the schema its caller sent; none when there is neither."""
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
        """A follow-up message only the clicker sees."""
        try:
            await self.channel.api.follow_up(click.token, text)
        except (DiscordApiError, OSError, TimeoutError) as exc:
            log.warning("could not tell %s: %s", click.user, exc)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        """Go on with `work` after the answer to Discord; its failure is logged."""
        task = asyncio.get_running_loop().create_task(_logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _logged(work: Awaitable[None]) -> None:
    try:
        await work
    except Exception:
        log.exception("a Discord interaction could not be handled")


def _interaction(data: Any) -> Interaction:
    """`data` as an `Interaction`. Raises `ApiError` 400 saying what is wrong."""
    try:
        return Interaction.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise ApiError(400, f"not an interaction Discord sends: {where}: {first['msg']}") from None


def _reply(text: str) -> JSONResponse:
    """An answer only the clicker sees; nothing else happens."""
    data = {"content": text, "flags": EPHEMERAL, "allowed_mentions": NO_MENTIONS}
    return JSONResponse({"type": REPLY, "data": data})
