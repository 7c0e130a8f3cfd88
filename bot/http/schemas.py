"""What crosses the HTTP boundary: request bodies, query parameters and response views, as
pydantic models that refuse unknown fields."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.datastructures import Headers

from nodbot.bot.bulk import MAX_ITEMS, ItemStatus, bulk_problem
from nodbot.bot.forms import MAX_ARGUMENT_TEXT, MAX_REASON, text_too_long
from nodbot.bot.http.auth import ApiError
from nodbot.core import (
    ApprovalEvent,
    ApprovalRecord,
    ApprovalStatus,
    ApprovalStore,
    Decision,
    StoreError,
    as_decision,
)
from nodbot.core.questions import answer_of, question_of
from nodbot.core.store import TIMEOUT_DECIDER, IdempotencyKey, IdempotencyKeyUsed, KeptKey
from nodbot.core.tools import canonical_json

if TYPE_CHECKING:
    from nodbot.bot.bulk import ItemOutcome

__all__ = [
    "EDITS_ONE_AT_A_TIME",
    "IDEMPOTENCY_HEADER",
    "MAX_ARGUMENT_TEXT",
    "MAX_REASON",
    "ApprovalDetail",
    "ApprovalView",
    "BulkDecideBody",
    "BulkDecideView",
    "BulkItemView",
    "DecideBody",
    "DecisionView",
    "EditedAction",
    "ErrorBody",
    "EventView",
    "HealthView",
    "ListQuery",
    "QuestionState",
    "QuestionView",
    "approvals_of",
    "bulk_view",
    "field_errors",
    "idempotency_key",
    "kept_by",
    "other_body",
    "question_state",
    "votes_of",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The header that makes `POST /runs` and `POST /approvals` idempotent (see `idempotency_key`)."""
_KEY_TEXT = re.compile(r"[\x20-\x7e]{1,200}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ErrorBody(_Model):
    """Every error response."""

    error: str
    """One sentence saying what went wrong."""
    details: dict[str, Any] = Field(default_factory=dict)
    """Structured facts: the offending fields, the missing scope, who decided first, ..."""


class HealthView(_Model):
    """`GET /healthz`."""

    status: Literal["ok", "unavailable"]
    """`ok` when the store answered and the workers are well."""
    error: str | None = None
    """The first of `problems`, when there are any."""
    problems: list[str] = Field(default_factory=list)
    """Everything that is wrong: the store unreachable, the workers down or failing, the
    database's notices not arriving."""


class ListQuery(_Model):
    """The query parameters of `GET /approvals`."""

    status: ApprovalStatus | None = None
    """Only approvals in this state: pending, approved or denied."""
    run_id: str | None = None
    """Only the approvals of this run."""
    limit: Annotated[int, Field(ge=1, le=500)] = 50
    """At most this many, oldest first (1 to 500)."""


MAX_TOOL_NAME = 200
"""The longest tool name an `edited_action` may give (the call's own is what counts)."""


class EditedAction(_Model):
    """LangChain's `edited_action`: the call as the reviewer would run it."""

    name: Annotated[str, StringConstraints(max_length=MAX_TOOL_NAME)]
    """The call's own tool: another one is refused (an edit changes the arguments, never the
    tool)."""
    args: dict[str, Any]
    """The arguments; merged like any edit (keys given replace the call's, the others keep
    their values), then validated with the tool's model."""

    @field_validator("args")
    @classmethod
    def _bounded(cls, args: dict[str, Any]) -> dict[str, Any]:
        _check_texts(args, "edited_action.args")
        return args


Reason = Annotated[str, StringConstraints(max_length=MAX_REASON)]


class DecideBody(_Model):
    """The body of `POST /approvals/{id}/decide`, in nodbot's form (`action`) or in
    LangChain's (`type`), as `as_decision` takes them; the decider is the token's name."""

    action: Literal["approve", "edit", "deny", "respond"] | None = None
    """`approve` runs the call, `edit` runs it with changed arguments, `deny` refuses it,
    `respond` answers in the tool's place: the tool does not run, and the agent gets
    `message` (needed) as the call's result. The rule must list `respond` in its
    `allowed_decisions`."""
    type: Literal["approve", "edit", "reject", "respond"] | None = None
    """LangChain's decision, instead of `action`: `approve`, `edit` (with `edited_action`),
    `reject` or `respond` (with `message`, the answer)."""
    arguments: dict[str, Any] | None = None
    """With `action: edit`: the arguments to change; the others keep their values."""
    edited_arguments: dict[str, Any] | None = None
    """The same as `arguments`, by another name; both given must be equal."""
    edited_action: EditedAction | None = None
    """With `type: edit`: `{"name": <the call's tool>, "args": {...}}`."""
    reason: Reason | None = None
    """Why, at most 2,000 characters; a denied call's model is told this reason. With
    `respond`: the answer the model gets as the call's result."""
    message: Reason | None = None
    """The same as `reason` (its name in LangChain and `ToolDecision`); both given must be
    equal."""
    remember: bool = False
    """With an approval (not an edit), and when the call's rule has `remember:`: later
    identical calls under that rule are approved at once, as this decision, until it expires
    or is forgotten."""

    @field_validator("arguments", "edited_arguments")
    @classmethod
    def _bounded(
        cls, arguments: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if arguments is not None:
            _check_texts(arguments, info.field_name or "arguments")
        return arguments

    @field_validator("message")
    @classmethod
    def _one_reason(cls, message: str | None, info: ValidationInfo) -> str | None:
        reason = info.data.get("reason")
        if message is not None and reason is not None and message != reason:
            raise ValueError("differs from reason: they are one field, give one")
        return message

    @model_validator(mode="after")
    def _one_form(self) -> DecideBody:
        if (self.action is None) == (self.type is None):
            given = "both are given" if self.action is not None else "neither is given"
            raise ValueError(
                "give `action` (approve, edit, deny or respond) or LangChain's `type` "
                f"(approve, edit, reject or respond): {given}"
            )
        return self

    def answer(self) -> dict[str, Any]:
        """The body as an answer `as_decision` takes (without `remember`)."""
        said = self.model_dump(exclude_none=True, exclude={"remember", "reason", "message"})
        note = self.message if self.message is not None else self.reason
        if note is not None:
            said["message"] = note
        return said

    def to_decision(self, decided_by: str, *, tool: str) -> Decision:
        """The decision this body asks for, made by `decided_by`, on a call of `tool`. Raises
        `InvalidDecisionError` (nothing to record) for a form `as_decision` refuses: an edit
        without arguments, arguments beside an approval, an `edited_action` naming another
        tool, ..."""
        return as_decision(self.answer(), decided_by=decided_by, tool=tool)


EDITS_ONE_AT_A_TIME = "edits are one at a time: use POST /approvals/{id}/decide"
"""Why `POST /approvals/decide` refuses an edit: an edit needs its own values, checked
against one call's tool."""

MAX_ID = 200
"""The longest approval id a bulk decision may list (the bot's are much shorter)."""

ApprovalId = Annotated[str, StringConstraints(max_length=MAX_ID)]


class BulkDecideBody(_Model):
    """The body of `POST /approvals/decide`: one approve or deny for several reviews."""

    approval_ids: list[ApprovalId] = Field(
        json_schema_extra={"minItems": 1, "maxItems": MAX_ITEMS, "uniqueItems": True}
    )
    """The reviews to decide, each listed once, 1 to 100 of them; they are decided in this
    order and answered in it."""
    action: Literal["approve", "deny"]
    """`approve` or `deny`, the same for every review listed; an edit is made one at a
    time (`POST /approvals/{id}/decide`)."""
    reason: Annotated[str, StringConstraints(max_length=MAX_REASON)] | None = None
    """Why, at most 2,000 characters, recorded with each decision; a denied call's model is
    told this reason."""

    @field_validator("approval_ids")
    @classmethod
    def _a_list_to_decide(cls, approval_ids: list[str]) -> list[str]:
        problem = bulk_problem(approval_ids)
        if problem is not None:
            raise ValueError(problem)
        return approval_ids

    @field_validator("action", mode="before")
    @classmethod
    def _no_edit(cls, action: Any) -> Any:
        if action == "edit":
            raise ValueError(EDITS_ONE_AT_A_TIME)
        return action


class DecisionView(_Model):
    """A recorded decision."""

    approved: bool
    """Whether the call may run."""
    edited_args: dict[str, Any] | None
    """The reviewer's changes to the arguments, if any."""
    reason: str | None
    """Why, if a reason was given."""
    decided_by: str | None
    """Who decided: the API token's name for decisions made here."""
    response: str | None = None
    """A respond: the reviewer's answer, given to the agent as the call's result in the
    tool's place (the tool did not run; the status is `denied`); for a question, its answer.
    Null for the others (a declined question's reason is `reason`)."""


class EventView(_Model):
    """One line of an approval's audit log."""

    seq: int
    """The event's position in the whole log."""
    kind: str
    """created, voted, decided, consumed, finished, refused, delivered or undelivered."""
    at: datetime
    """When it happened (UTC)."""
    actor: str | None
    """Who acted: the handle used (a Slack user id, an address, a token's name)."""
    person: str | None
    """The person that handle resolved to (`person:ana`, `email:ana@example.com`), if any."""
    channel: str | None
    """Through which channel: api, slack, executor, ..."""
    detail: dict[str, Any]
    """The outcome, or the reason of a refusal; for votes and decisions the action, reason,
    edit, the arguments' digest and the channel's evidence."""

    @classmethod
    def of(cls, event: ApprovalEvent) -> EventView:
        """The view of a stored event."""
        return cls(
            seq=event.seq,
            kind=event.kind,
            at=event.at,
            actor=event.actor,
            person=event.person,
            channel=event.channel,
            detail=event.detail,
        )


QuestionState = Literal["waiting", "answered", "declined", "timed_out"]
"""Where a question stands: `waiting` for its answer; `answered` (the answer is the view's
`answer`); `declined` by a person (or at once, by `nodbot:no-rule`, when no rule names
anyone to ask); `timed_out`, nobody answered before its deadline."""


class QuestionView(_Model):
    """The question a review asks (`core.questions`): what, with which choices, and where it
    stands."""

    text: str
    """The question, as asked."""
    choices: list[str] | None
    """The answers to choose from; null for a free-text answer."""
    key: str
    """The question's id within its call (or its run): the `id` it was asked with, or a
    digest of its text and choices."""
    asked_by: str | None
    """The tool that asked it; null for a question of the run itself (`POST /questions`)."""
    state: QuestionState
    """`waiting`, `answered`, `declined` or `timed_out` (the store's status of an answered
    or declined question is `denied`: this says which)."""

    @classmethod
    def of(cls, record: ApprovalRecord) -> QuestionView | None:
        """The question of a stored review; None for a call's review."""
        question = question_of(record.request)
        if question is None:
            return None
        return cls(
            text=question.text,
            choices=None if question.choices is None else list(question.choices),
            key=question.key,
            asked_by=question.asked_by,
            state=question_state(record),
        )


def question_state(record: ApprovalRecord) -> QuestionState:
    """Where the question of `record` stands (see `QuestionState`)."""
    decision = record.decision
    if decision is None:
        return "waiting"
    if answer_of(record) is not None:
        return "answered"
    return "timed_out" if decision.decided_by == TIMEOUT_DECIDER else "declined"


class ApprovalView(_Model):
    """A stored approval as the API shows it (`ApprovalView.read` counts its votes): a call's
    review (`kind` `review`), or a question put to a person (`kind` `question`, its tool
    `ask`, its arguments the question)."""

    approval_id: str
    kind: Literal["review", "question"]
    """`review`: a call waits for approval; `question`: a person is asked a question (see
    `question` and `answer`)."""
    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    """The validated arguments of the call, as the reviewer sees them."""
    status: ApprovalStatus
    requested_by: str | None
    """Who started the run."""
    created_at: datetime
    decision: DecisionView | None
    decided_at: datetime | None
    consumed: bool
    """Whether a call has taken the decision (it is taken once)."""
    finished: bool
    """Whether the call that took the decision has ended."""
    outcome: str | None
    """How that call ended: ok, error, denied, ..."""
    deadline: datetime | None
    """When the review expires if nobody has decided it (UTC): its rule's `timeout` after it
    opened; None when the rule has no timeout."""
    timeout_decision: Literal["approve", "deny"] | None
    """What the review becomes at its deadline (decided by `nodbot:timeout`): the rule's
    `timeout_decision`; None without a deadline."""
    approvals_required: int
    """How many distinct reviewers must approve (the rule's `approvals_required`); any deny
    denies at once."""
    approvals: int | None
    """How many reviewers have approved so far (a review that needs one approval: 1 once
    approved). None only in a view made without reading the votes of a review that needs
    several (a run's pending reviews, a webhook's body)."""
    question: QuestionView | None
    """For a question: its text, choices, id and where it stands; null for a call's
    review."""
    answer: str | None
    """For a question: the answer once given (one of its choices, spelled as they are),
    else null (waiting, declined, timed out). A question answered or declined has the
    status `denied` (nothing ran); `answer`, or `question.state`, tells the two apart."""

    @classmethod
    def fields_of(
        cls, record: ApprovalRecord, events: Sequence[ApprovalEvent] | None = None
    ) -> dict[str, Any]:
        """The view's fields for a stored record; `events`, its audit log, count the votes
        of a review that needs several approvals."""
        request, decision = record.request, record.decision
        question = QuestionView.of(record)
        return {
            "approval_id": record.approval_id,
            "kind": "review" if question is None else "question",
            "run_id": request.run_id,
            "call_id": request.call_id,
            "tool": request.tool,
            "arguments": request.arguments,
            "status": record.status,
            "requested_by": request.requested_by,
            "created_at": record.created_at,
            "decision": None if decision is None else DecisionView(**decision.model_dump()),
            "decided_at": record.decided_at,
            "consumed": record.consumed,
            "finished": record.finished,
            "outcome": record.outcome,
            "deadline": request.deadline,
            "timeout_decision": None if request.deadline is None else request.on_timeout,
            "approvals_required": request.approvals_required,
            "approvals": approvals_of(record, events),
            "question": question,
            "answer": None if question is None else answer_of(record),
        }

    @classmethod
    def of(
        cls, record: ApprovalRecord, events: Sequence[ApprovalEvent] | None = None
    ) -> ApprovalView:
        """The view of a stored record (with its audit log `events`, its votes counted)."""
        return cls(**cls.fields_of(record, events))

    @classmethod
    async def read(cls, store: ApprovalStore, record: ApprovalRecord) -> ApprovalView:
        """The view of a stored record with its votes counted: the store's events are read
        for a review that needs several approvals, the others need none."""
        return cls.of(record, await votes_of(store, record))


class BulkItemView(_Model):
    """What became of one review listed in `POST /approvals/decide`."""

    approval_id: str
    """The review, as listed."""
    status: ItemStatus
    """`decided` (recorded: the decision, or a vote when the review needs several
    approvals), `refused` (the rules or the token do not allow it: a `refused` event says
    so), `not_found`, `already_decided`, `already_voted` (this person's vote is counted
    already) or `invalid` (a decision the review does not accept)."""
    error: str | None
    """Why it was not decided, in one sentence; null when it was."""
    approval: ApprovalView | None
    """The review after the request (as it was, when it was not decided); null for an
    unknown id."""


class BulkDecideView(_Model):
    """The answer to `POST /approvals/decide`."""

    results: list[BulkItemView]
    """One per review listed, in the order listed."""
    decided: int
    """How many were decided (or voted on)."""
    not_decided: int
    """How many were not: refused, unknown, decided already, ..."""


async def bulk_view(store: ApprovalStore, outcomes: Sequence[ItemOutcome]) -> BulkDecideView:
    """The answer to a bulk decision: each outcome with the view of its review, votes
    counted (a read each for a review that needs several approvals; when that read fails,
    the view without the count: the decisions are recorded)."""
    results = []
    for outcome in outcomes:
        view = None
        if outcome.record is not None:
            try:
                view = await ApprovalView.read(store, outcome.record)
            except StoreError:
                view = ApprovalView.of(outcome.record)
        results.append(
            BulkItemView(
                approval_id=outcome.approval_id,
                status=outcome.status,
                error=outcome.error,
                approval=view,
            )
        )
    decided = sum(outcome.ok for outcome in outcomes)
    return BulkDecideView(results=results, decided=decided, not_decided=len(outcomes) - decided)


def approvals_of(record: ApprovalRecord, events: Sequence[ApprovalEvent] | None) -> int | None:
    """How many reviewers have approved `record` so far: its `voted` events that approve or
    edit, when it needs several approvals; else 1 once approved, 0 before. None for a review
    that needs several, without `events`."""
    if record.request.approvals_required <= 1:
        return int(record.status == "approved")
    if events is None:
        return None
    return sum(
        1 for e in events if e.kind == "voted" and e.detail.get("action") in ("approve", "edit")
    )


async def votes_of(store: ApprovalStore, record: ApprovalRecord) -> list[ApprovalEvent] | None:
    """The events that count the votes of `record`: read only when it needs several
    approvals (None otherwise: its status says)."""
    if record.request.approvals_required <= 1:
        return None
    return await store.events(record.approval_id)


class ApprovalDetail(ApprovalView):
    """An approval with its audit log: `GET /approvals/{id}`."""

    events: list[EventView]
    """Every change and refused attempt, oldest first."""


def _check_texts(value: Any, path: str) -> None:
    problem = text_too_long(value, path)
    if problem is not None:
        raise ValueError(problem)


def field_errors(error: ValidationError) -> list[dict[str, str]]:
    """One `{"field", "message"}` per problem, fields dotted (`arguments.amount`)."""
    return [
        {
            "field": ".".join(str(part) for part in detail["loc"]) or "(body)",
            "message": detail["msg"].removeprefix("Value error, "),
        }
        for detail in error.errors(include_url=False)
    ]


def idempotency_key(
    headers: Headers, *, token: str, route: str, body: Any
) -> IdempotencyKey | None:
    """The request's `Idempotency-Key` (1 to 200 printable ASCII characters), scoped to the
    token's name and the route, with the digest of its JSON `body`; None without the header.
    Raises `ApiError` (400, naming the header) for a malformed one, or several."""
    found = headers.getlist(IDEMPOTENCY_HEADER)
    if not found:
        return None
    if len(found) > 1 or not _KEY_TEXT.fullmatch(found[0]):
        raise ApiError(
            400,
            f"the {IDEMPOTENCY_HEADER} header must be one value of 1 to 200 printable ASCII "
            "characters",
            details={"header": IDEMPOTENCY_HEADER},
        )
    digest = hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()
    return IdempotencyKey(token_name=token, route=route, key=found[0], body_digest=digest)


def other_body(key: IdempotencyKey, kept: KeptKey) -> ApiError | None:
    """The 409 for a key sent again with another body than the first; None for a repeat."""
    if kept.body_digest == key.body_digest:
        return None
    return ApiError(
        409,
        f"this {IDEMPOTENCY_HEADER} was sent before with another body: a key names one "
        "request; give a new request a new key",
        details={"header": IDEMPOTENCY_HEADER, "key": key.key},
    )


def kept_by(used: IdempotencyKeyUsed) -> KeptKey:
    """What the key a write found stored names. Raises `ApiError` (409) in the rare case
    that it was deleted since (past `KEYS_KEPT`): sending the request again starts anew."""
    if used.kept is None:
        raise ApiError(
            409,
            f"this {IDEMPOTENCY_HEADER} was in use by another request a moment ago: send the "
            "request again",
            details={"header": IDEMPOTENCY_HEADER, "key": used.key.key},
        )
    return used.kept
