"""A small typed client of the bot's approval request API, for agents that run their tools
themselves (in another process, framework or language: this is the Python one).

```python
async with ApprovalClient("http://127.0.0.1:8080", token=os.environ["NODBOT_TOKEN"]) as nodbot:
    asked = await nodbot.request("refund", {"order_id": "o-7", "amount": 500},
                                 run_id="thread-42", call_id="call_1")
    decided = await nodbot.wait(asked.approval_id, within=3600)
    answer = await nodbot.consume(decided)   # once: a second one is refused
    if answer.approved:
        refund(**answer.arguments)                        # the arguments the reviewer saw or set
```

`consume` checks the one-use token it is handed (`core.approval_tokens`) against the call it
asked about, so a decision for another call, or one changed on the way, is refused here too.
The client acts only on the token's signed claims: `Consumed` (whether approved, edited, the
reason, who decided) is what they say, and its arguments are the ones their digests bind. An
answer whose other fields say anything else (a proxy that made a denial an approval, or
changed an edit or a reason) raises `UntrustedDecision`, naming the field: nothing runs.
`SyncApprovalClient` is the same over `httpx.Client`. Errors are `ApprovalClientError` with
the HTTP status and the bot's message (a wrong token is a 401, an unreachable bot status 0);
a decision handed out already is `DecisionAlreadyTaken`, an answer not as signed
`UntrustedDecision` (also an `InvalidApprovalToken`).

## Guarding a function

`guard` does the three steps for you: each call of the guarded function asks the bot, waits
for the decision, takes it once and runs the function with the arguments the reviewer saw or
edited; a respond (the reviewer answering in the function's place) is returned as the
call's result, and the function does not run; a denial raises `CallDenied` with the
reviewer's reason, a wait past `within` raises `DecisionTimeout`, and a decision whose
token is not for the call as the guard asked it (or an answer not as signed) raises
`UntrustedDecision`: in none of these cases did the function run. The guarded function's
result type is the function's own or `str` (a respond).

```python
@nodbot.guard(run_id="thread-42", within=600)   # ApprovalClient: an async function
async def refund(order_id: str, amount: float) -> str:
    ...

@sync_nodbot.guard("refund", run_id="thread-42", within=600)   # SyncApprovalClient: a sync one
def refund(order_id: str, amount: float) -> str:
    ...

try:
    done = await refund("o-7", amount=500)  # runs once approved, maybe with an edited amount;
                                            # or the reviewer's text, given in its place
except CallDenied as denied:
    print(denied.reason, denied.decided_by, denied.approval_id)
```

- The tool is the function's name unless given. The arguments are the call's bound
  arguments in keyword form, defaults filled in; each must be a JSON value (str, int, float,
  bool, None, lists and dicts with str keys) or the call raises `TypeError` before anything
  is asked. Parameters must be nameable: no positional-only ones, no `*args` or `**kwargs`.
- The schema sent with the review (the reviewer's edit form, and what the bot checks an
  edit against) is the JSON schema of a pydantic model of the signature (unknown arguments
  refused), unless `schema` is given. The call is checked against that model before it is
  asked about (`InvalidArgumentsError`), and so are the final arguments before it runs.
- The call id is `call_id` when given: a string (a guard made for one call, such as a
  framework's native call id) or a function of the JSON arguments (an idempotency key such
  as the order id). Otherwise it is derived: `<tool>-<digest>-<n>`, from the arguments'
  digest and a counter of this process: n is the lowest number (from 1) not held by another
  call with that run, tool and arguments that is in flight or took its decision (a call
  that ends before taking one, such as a timeout, gives its number back). Identical calls
  at once get reviews of their own, and a process that makes its calls again in the same
  order gives them the same ids.
- Retries. The bot keeps one approval per (run id, call id). A call retried after a
  timeout, or by a process restarted after a crash while it waited, gets the same review
  and waits on (or takes) its decision. A decision is handed out once: once taken, the same
  call id opens a new review instead of running again, so no decision runs a call twice. If
  a process crashed after taking a decision (whether or not its function had run), its retry
  is reviewed anew; the reviewer decides again, knowing the first one may have run.

## Deciding

With a token that has the scope `approvals:decide`, `decide(approval_id, answer)` decides a
review as that token's name (`POST /approvals/{id}/decide`), and returns the approval as
decided. `answer` is any form `as_decision` takes: `True`, `False`, `None`, a
`ToolDecision`, a `Decision` (without `decided_by`: over the API the decider is the token's
name), or a dict of one of the forms, LangChain's `{"type": "approve" | "edit" | "reject" |
"respond"}` among them. A respond (`{"type": "respond", "message": ...}`,
`ToolDecision(action="respond", message=...)`) answers in the tool's place: the agent gets
the message as the call's result, and the tool does not run; the call's rule must allow it.
`Approval.response` is that answer once given (its status is `denied`: nothing ran). The
one-use token a decision is taken with signs the answer (`Consumed.response`), and `guard`
returns it as the guarded call's result without running the function. An answer of no
known form raises `InvalidDecisionError` before
anything is sent; what only the bot can check (that an `edited_action` names the call's
tool, that the edit fits the tool, that this token may decide) comes back as an
`ApprovalClientError` with the bot's status and message.

## Asking a question

`ask` puts a question to a person for a run (`POST /questions`, seed 001's `interrupt()`
for programs that run their own loop) and returns the answer:

```python
warehouse = await nodbot.ask("Which warehouse ships A-1001?", run_id="thread-42",
                             choices=["Leeds", "Porto"], wait=600)
```

The bot's rules put it to the people of the first review rule that covers the tool `ask`
(else `defaults:`). The answer is one of `choices` (spelled as they are) or, without
choices, free text. `ask` waits up to `wait` seconds (`ASK_WAIT`, 60, by default), then
raises `QuestionPending` naming the question's approval; asking the same question again
(the same `id`, or the same text and choices, in the same run) is the same question, and
waits on. A question declined (its `reason`), timed out or with nobody to ask raises
`QuestionUnanswered`. A reviewer answers with `decide(approval_id, {"action": "respond",
"message": "Porto"})` (an answer that is none of the choices is refused) and declines with
a deny. `Approval.kind` is `question` for a question, with its `question` and `answer`.

## Retries

`request`, `ask` and `start_run` (which starts a run of one of the bot's agents, `POST
/runs`) send an `Idempotency-Key`, a new random one per call, and send the request again
with the same key when the bot could not be reached or its answer was lost (a connection
error, a timeout) or it answered 502, 503 or 504: `tries` times in all (`TRIES`, 3), pausing
`RETRY_PAUSE` seconds (0.5) before the second and twice as long before each next one. The
bot makes one approval or one run per key, so a request whose first answer was lost after
the bot had written what it asked for gets what the first made, not a second one. `tries=1`
sends it once. The other calls are reads, or, as `consume`, refused when repeated.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeAlias, TypeVar, get_type_hints

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nodbot.core.approval_tokens import ApprovalToken, InvalidApprovalToken, token_key
from nodbot.core.decisions import read_answer
from nodbot.core.errors import (
    ApprovalDenied,
    InvalidArgumentsError,
    InvalidDecisionError,
    NodbotError,
    QuestionPending,
    QuestionUnanswered,
)
from nodbot.core.questions import QUESTION_TOOL, Question, make_question
from nodbot.core.tools import arguments_digest

__all__ = [
    "ASK_WAIT",
    "IDEMPOTENCY_HEADER",
    "RETRIED_STATUSES",
    "RETRY_PAUSE",
    "TRIES",
    "Approval",
    "ApprovalClient",
    "ApprovalClientError",
    "CallDenied",
    "CallId",
    "Consumed",
    "DecisionAlreadyTaken",
    "DecisionTimeout",
    "QuestionPending",
    "QuestionUnanswered",
    "Run",
    "SyncApprovalClient",
    "UntrustedDecision",
]

MAX_WAIT = 60.0
"""The longest wait one request asks of the bot; longer waits ask again."""
IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The header with which the bot makes one run or one approval of a request sent again."""
ASK_WAIT = 60.0
"""Seconds `ask` waits for the answer by default; asking again waits on (see the module)."""
TRIES = 3
"""How many times `request` and `start_run` send their request at most (see the module)."""
RETRY_PAUSE = 0.5
"""Seconds before the second try; each next one waits twice as long as the one before."""
RETRIED_STATUSES = frozenset({502, 503, 504})
"""The answers after which a request is sent again: a proxy or the bot unable to serve it now."""
_LOST = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
"""The failures after which a request is sent again: the bot not reached, or its answer lost."""


class ApprovalClientError(NodbotError):
    """The bot refused a request or could not be reached; `status` is the HTTP status (0 when
    there was no answer)."""

    def __init__(self, message: str, *, status: int = 0, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self._details = details or {}

    def details(self) -> dict[str, Any]:
        return {"status": self.status, **self._details}


class DecisionAlreadyTaken(ApprovalClientError):
    """The decision was handed out already: it answers one call, once."""


class DecisionTimeout(ApprovalClientError):
    """Nobody decided within the time the caller would wait."""


class UntrustedDecision(ApprovalClientError, InvalidApprovalToken):
    """A consume answer the client does not act on: its one-use token does not verify or
    names another call, or the answer says otherwise than the token's signed claims (the
    message names what disagreed). Nothing ran, and the decision is spent. `status` is the
    consume answer's HTTP status (0 when `Consumed.answers` refused the decision)."""

    def __init__(self, message: str, *, status: int, approval_id: str) -> None:
        super().__init__(message, status=status, details={"approval_id": approval_id})
        self.approval_id = approval_id


class CallDenied(ApprovalDenied):
    """A guarded call was denied, by a reviewer or a rule; the function did not run. `reason`
    is the reviewer's reason, `decided_by` who decided and `approval_id` the review."""

    approval_id: str

    def __init__(
        self, *, tool: str, reason: str | None, decided_by: str | None, approval_id: str
    ) -> None:
        super().__init__(tool=tool, reason=reason, approval_id=approval_id, decided_by=decided_by)


@dataclass(frozen=True)
class Approval:
    """An approval as the bot shows it."""

    approval_id: str
    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    status: str
    """`pending`, `approved` or `denied`."""
    decided_by: str | None
    reason: str | None
    consumed: bool
    response: str | None = None
    """A respond's answer, given in the tool's place (the status is then `denied`); for a
    question, its answer."""
    kind: str = "review"
    """`review` (a call's) or `question` (a question put to a person)."""
    question: Question | None = None
    """The question a question asks (its text, choices, id, the tool that asked)."""
    answer: str | None = None
    """A question's answer once given; None while it waits, and when it was declined or
    timed out (the status is then `denied`: `reason` says why)."""

    @property
    def decided(self) -> bool:
        return self.status != "pending"

    @classmethod
    def of(cls, body: dict[str, Any]) -> Approval:
        decision = body.get("decision") or {}
        return cls(
            approval_id=body["approval_id"],
            run_id=body["run_id"],
            call_id=body["call_id"],
            tool=body["tool"],
            arguments=body["arguments"],
            status=body["status"],
            decided_by=decision.get("decided_by"),
            reason=decision.get("reason"),
            consumed=bool(body.get("consumed")),
            response=decision.get("response"),
            kind=str(body.get("kind") or "review"),
            question=_question_of(body.get("question")),
            answer=body.get("answer"),
        )


def _question_of(shown: object) -> Question | None:
    """The question of a view's `question` object; None for a call's review."""
    if not isinstance(shown, dict):
        return None
    choices = shown.get("choices")
    return Question(
        text=str(shown.get("text", "")),
        choices=None if choices is None else tuple(str(choice) for choice in choices),
        key=str(shown.get("key", "")),
        asked_by=shown.get("asked_by"),
    )


@dataclass(frozen=True)
class Run:
    """A run of one of the bot's agents as the bot shows it (`start_run`, `POST /runs`)."""

    run_id: str
    agent: str
    status: str
    """`running`, `waiting` (for the reviews in `pending`), `finished` or `failed`."""
    requested_by: str | None
    final_text: str | None
    """The agent's answer, once the run has finished."""
    error: str | None
    """Why the run failed, when it did."""
    pending: list[Approval]
    """The reviews the run waits for."""

    @classmethod
    def of(cls, body: dict[str, Any]) -> Run:
        return cls(
            run_id=body["run_id"],
            agent=body["agent"],
            status=body["status"],
            requested_by=body.get("requested_by"),
            final_text=body.get("final_text"),
            error=body.get("error"),
            pending=[Approval.of(each) for each in body.get("pending") or []],
        )


@dataclass(frozen=True)
class Consumed:
    """A decision, handed out once, as its verified one-use token carries it: every field
    but `token` comes from the signed claims (the arguments are bound by their digests)."""

    approval_id: str
    approved: bool
    """Whether the call may run, as the token says."""
    arguments: dict[str, Any]
    """The arguments to run the call with (a reviewer's edits merged in); their digest is
    the token's (`edited_digest` when edited, else `digest`)."""
    edited: bool
    """Whether a reviewer changed the arguments: the token has an `edited_digest`."""
    reason: str | None
    decided_by: str | None
    token: str
    """The one-use approval token's text."""
    claims: ApprovalToken
    """What the token says, verified."""
    response: str | None = None
    """A respond: the reviewer's answer, the call's result in the tool's place (`approved`
    is false: the tool does not run), as the token's signed claims carry it."""

    def answers(
        self, *, run_id: str, call_id: str | None, tool: str, arguments: Mapping[str, Any]
    ) -> None:
        """Raises `UntrustedDecision` unless this decision answers the call of `tool` with
        `arguments` that run `run_id` made as `call_id`: the call as its caller made it, not
        as an answer of the bot repeated it."""
        try:
            self.claims.check(
                run_id=run_id,
                call_id=call_id,
                tool=tool,
                arguments=arguments,
                final=self.arguments,
            )
        except InvalidApprovalToken as exc:
            raise UntrustedDecision(exc.message, status=0, approval_id=self.approval_id) from None


def _request_body(
    tool: str,
    arguments: dict[str, Any],
    run_id: str,
    call_id: str,
    schema: dict[str, Any] | None,
    requested_by: str | None,
    description: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tool": tool,
        "arguments": arguments,
        "run_id": run_id,
        "call_id": call_id,
    }
    for key, value in (
        ("schema", schema),
        ("requested_by", requested_by),
        ("description", description),
    ):
        if value is not None:
            body[key] = value
    return body


def _decide_body(answer: object, remember: bool) -> dict[str, Any]:
    """The body of `POST /approvals/{id}/decide` saying `answer`: a LangChain edit as such, so
    that the bot checks the tool it names against the call's; a respond as `action` and its
    `message`; the others as `action`, `arguments` and `reason`. Raises
    `InvalidDecisionError` for an answer of no known form, a malformed one, one naming its
    decider, and a respond with a reason beside its answer (the API carries one text)."""
    decision, named = read_answer(answer)
    if decision.decided_by is not None:
        why = "over the API the decider is the token's name: leave decided_by out"
        raise InvalidDecisionError(
            f"not a decision to send: {why}", errors=[{"field": "decided_by", "message": why}]
        )
    if decision.response is not None and decision.reason is not None:
        why = "a respond carries its answer alone over the API: leave reason out"
        raise InvalidDecisionError(
            f"not a decision to send: {why}", errors=[{"field": "reason", "message": why}]
        )
    body: dict[str, Any]
    if decision.response is not None:
        body = {"action": "respond", "message": decision.response}
    elif named is not None:
        body = {"type": "edit", "edited_action": {"name": named, "args": decision.edited_args}}
    elif decision.edited_args is not None:
        body = {"action": "edit", "arguments": decision.edited_args}
    else:
        body = {"action": "approve" if decision.approved else "deny"}
    if decision.reason is not None:
        body["reason"] = decision.reason
    if remember:
        body["remember"] = True
    return body


def _question_body(
    question: str,
    run_id: str,
    choices: Sequence[str] | None,
    key: str | None,
    requested_by: str | None,
) -> tuple[dict[str, Any], Question]:
    """The body of `POST /questions`, and the question as asked. Raises
    `InvalidQuestionError` (nothing is sent) for a question `ctx.ask` would refuse."""
    asked = make_question(question, choices=choices, key=key)
    body: dict[str, Any] = {"run_id": run_id, "question": asked.text}
    if asked.choices is not None:
        body["choices"] = list(asked.choices)
    if key is not None:
        body["id"] = key
    if requested_by is not None:
        body["requested_by"] = requested_by
    return body, asked


def _answer_to(found: Approval, asked: Question) -> str:
    """The answer of the question `asked`, as the bot shows it in `found`. Raises
    `QuestionPending` while it waits, and `QuestionUnanswered` when it was declined, timed
    out, could be put to nobody, or the bot's answer is none of the choices asked (or is not
    a question's at all: nothing is taken for an answer that is not one)."""
    key = found.question.key if found.question is not None else asked.key
    if not found.decided:
        raise QuestionPending(
            tool=QUESTION_TOOL, approval_id=found.approval_id, key=key, question=asked.text
        )
    answer = found.answer if found.kind == "question" else None
    reason = found.reason
    if answer is not None and asked.choices is not None and answer not in asked.choices:
        reason = f"the bot's answer {answer[:100]!r} is none of the choices"
        answer = None
    if answer is None:
        raise QuestionUnanswered(
            key=key, reason=reason, approval_id=found.approval_id, decided_by=found.decided_by
        )
    return answer


def _run_body(agent: str, text: str, requested_by: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": text}
    if requested_by is not None:
        body["requested_by"] = requested_by
    return body


def _tries(tries: int) -> Iterator[tuple[bool, float]]:
    """For each of `tries` tries: whether it is the last, and the pause after it (when it
    is not, and it failed so that it may be sent again)."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, not {tries}")
    for number in range(tries):
        yield number == tries - 1, RETRY_PAUSE * 2**number


def _key_headers() -> dict[str, str]:
    """A new idempotency key: one per logical request, sent with each of its tries."""
    return {IDEMPOTENCY_HEADER: secrets.token_urlsafe(24)}


def _unreachable(exc: httpx.HTTPError) -> ApprovalClientError:
    return ApprovalClientError(f"the bot could not be reached: {exc}")


def _answer(response: httpx.Response, *, taking: bool = False) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        message = message or f"the bot answered {response.status_code}"
        details = body.get("details") if isinstance(body, dict) else None
        kind = DecisionAlreadyTaken if taking and "handed out already" in message else None
        raise (kind or ApprovalClientError)(
            message, status=response.status_code, details=details or {}
        )
    if not isinstance(body, dict):
        raise ApprovalClientError(
            "the bot's answer is not a JSON object", status=response.status_code
        )
    return body


def _consumed(response: httpx.Response, key: bytes, asked: Approval) -> Consumed:
    """The decision of the consume answer `response`, as its token carries it. Raises what
    `_answer` raises, and `UntrustedDecision` when the token does not verify under `key`,
    names another call than `asked`, or the answer says anything its claims do not."""
    body = _answer(response, taking=True)
    try:
        claims = ApprovalToken.verify(str(body.get("token", "")), key)
        final = body.get("arguments")
        if not isinstance(final, dict):
            raise InvalidApprovalToken("the consume answer holds no arguments to run with")
        if claims.approval_id != asked.approval_id:
            raise InvalidApprovalToken(
                f"the approval token is for approval {claims.approval_id!r}, not "
                f"{asked.approval_id!r}"
            )
        _same_as_signed(body, claims)
        # The final arguments are bound by the claims' digests: the edited one when the
        # decision edited them, else the original one.
        claims.check(
            run_id=asked.run_id,
            call_id=asked.call_id,
            tool=asked.tool,
            arguments=asked.arguments,
            final=final,
        )
    except InvalidApprovalToken as exc:
        raise UntrustedDecision(
            exc.message, status=response.status_code, approval_id=asked.approval_id
        ) from None
    return Consumed(
        approval_id=claims.approval_id,
        approved=claims.approved,
        arguments=final,
        edited=claims.edited_digest is not None,
        reason=claims.reason,
        decided_by=claims.decided_by,
        token=str(body["token"]),
        claims=claims,
        response=claims.response,
    )


def _same_as_signed(body: dict[str, Any], claims: ApprovalToken) -> None:
    """Raises `InvalidApprovalToken` naming the first field of `body` that says otherwise than
    the verified `claims`: the answer's fields are only ever a copy of what the token says."""
    signed: dict[str, Any] = {
        "approval_id": claims.approval_id,
        "run_id": claims.run_id,
        "call_id": claims.call_id,
        "tool": claims.tool,
        "approved": claims.approved,
        "edited": claims.edited_digest is not None,
        "reason": claims.reason,
        "decided_by": claims.decided_by,
        "response": claims.response,
    }
    for name, value in signed.items():
        said = body.get(name, value)  # a field left out says nothing; the claims decide
        # `is` for booleans: JSON's 1 is not true, and a copy of a bool is a bool.
        if (said is not value) if isinstance(value, bool) else (said != value):
            raise InvalidApprovalToken(
                f"the consume answer says {name} is {said!r}, but its signed approval token "
                f"says {value!r}: the answer was changed on its way, so nothing runs"
            )


P = ParamSpec("P")
R = TypeVar("R")

CallId: TypeAlias = "str | Callable[[dict[str, Any]], str]"
"""A guard's call id: one string for every call, or a function of a call's JSON arguments."""

_ARGUMENTS_CONFIG = ConfigDict(
    extra="forbid", allow_inf_nan=False, validate_by_alias=True, validate_by_name=False
)


class _CallNumbers:
    """The derived call ids' counter of this process: per (run id, tool, arguments digest),
    the numbers held by calls in flight or that took their decision. A call takes the lowest
    free one; one that ends before taking its decision (a timeout) frees it again, so that
    its retry asks about the same review."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str, str], set[int]] = {}
        self._lock = threading.Lock()  # sync clients guard calls from several threads

    def take(self, key: tuple[str, str, str]) -> int:
        with self._lock:
            held = self._held.setdefault(key, set())
            number = 1
            while number in held:
                number += 1
            held.add(number)
            return number

    def free(self, key: tuple[str, str, str], number: int) -> None:
        with self._lock:
            self._held.get(key, set()).discard(number)


_NUMBERS = _CallNumbers()


@dataclass(frozen=True)
class _Call:
    """One call of a guarded function, as it is asked about."""

    request: dict[str, Any]
    """The keyword arguments of `request`."""
    number: tuple[tuple[str, str, str], int] | None
    """The derived call id's counter key and number; None for a given call id."""

    def free(self) -> None:
        if self.number is not None:
            _NUMBERS.free(*self.number)


@dataclass(frozen=True)
class _Responded:
    """A guarded call a reviewer answered in the function's place: `text` is its result."""

    text: str


class _Guard:
    """What the calls of one guarded function share: the tool, the signature and its model."""

    def __init__(
        self,
        function: Callable[..., Any],
        tool: str | None,
        *,
        run_id: str,
        within: float,
        call_id: CallId | None,
        schema: dict[str, Any] | None,
        requested_by: str | None,
        description: str | None,
    ) -> None:
        if within < 0:
            raise ValueError(f"within must be at least 0 seconds, not {within:g}")
        self.tool = tool or str(getattr(function, "__name__", ""))
        if not self.tool:
            raise TypeError("guard: name the tool (this callable has no __name__)")
        self.signature = inspect.signature(function)
        self.model = _signature_model(self.tool, function, self.signature)
        self.schema = self.model.model_json_schema() if schema is None else schema
        self.run_id = run_id
        self.within = within
        self.call_id = call_id
        self.requested_by = requested_by
        self.description = description

    def ask(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """The call of `args` and `kwargs`, checked. Raises `TypeError` for arguments that do
        not fit the signature or are not JSON, `InvalidArgumentsError` for ones its model
        refuses."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for name, value in arguments.items():
            _check_json(value, self.tool, name)
        self.values(arguments, source="arguments")
        number = None
        if self.call_id is None:
            key = (self.run_id, self.tool, arguments_digest(arguments))
            number = (key, _NUMBERS.take(key))
            call_id = f"{self.tool[:120]}-{key[2][:24]}-{number[1]}"
        elif isinstance(self.call_id, str):
            call_id = self.call_id
        else:
            call_id = self.call_id(arguments)
        request = {
            "tool": self.tool,
            "arguments": arguments,
            "run_id": self.run_id,
            "call_id": call_id,
            "schema": self.schema,
            "requested_by": self.requested_by,
            "description": self.description,
        }
        return _Call(request, number)

    def values(self, arguments: dict[str, Any], *, source: str) -> dict[str, Any]:
        """`arguments` as the function's parameters take them. Raises `InvalidArgumentsError`."""
        try:
            instance = self.model.model_validate(arguments)
        except ValidationError as exc:
            errors = [
                {
                    "field": ".".join(str(part) for part in error["loc"]) or "(arguments)",
                    "message": error["msg"],
                }
                for error in exc.errors(include_url=False)
            ]
            raise InvalidArgumentsError(tool=self.tool, errors=errors, source=source) from None
        return {
            field.alias or name: getattr(instance, name)
            for name, field in type(instance).model_fields.items()
        }

    def outcome(self, call: _Call, answer: Consumed) -> dict[str, Any] | _Responded:
        """The arguments to run `call` with, as `answer` decided, or the reviewer's answer
        in the function's place (a respond: it does not run). Raises `UntrustedDecision`
        when the answer's token is not for `call` as asked, `CallDenied`, or
        `InvalidArgumentsError` when the final arguments do not fit the signature."""
        asked = call.request
        answer.answers(
            run_id=asked["run_id"],
            call_id=asked["call_id"],
            tool=asked["tool"],
            arguments=asked["arguments"],
        )
        if not answer.approved and answer.response is not None:
            return _Responded(answer.response)
        if not answer.approved:
            raise CallDenied(
                tool=self.tool,
                reason=answer.reason,
                decided_by=answer.decided_by,
                approval_id=answer.approval_id,
            )
        source = "edited arguments" if answer.edited else "arguments"
        return self.values(answer.arguments, source=source)


def _signature_model(
    tool: str, function: Callable[..., Any], signature: inspect.Signature
) -> type[BaseModel]:
    """A pydantic model of the parameters of `function` (unknown arguments refused)."""
    try:
        hints = get_type_hints(function)
    except Exception as exc:
        raise TypeError(f"guard {tool!r}: cannot resolve the type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(
                f"guard {tool!r}: *{parameter.name} cannot be shown to a reviewer; name each"
                " argument"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"guard {tool!r}: argument {parameter.name!r} is positional-only; a guarded"
                " call runs with named arguments"
            )
        default = ... if parameter.default is parameter.empty else parameter.default
        # pydantic keeps `_x` private and warns about names such as `schema`: an alias then.
        name = parameter.name
        if name.startswith("_") or hasattr(BaseModel, name):
            name = f"argument_{index}"
        fields[name] = (hints.get(parameter.name, Any), Field(default, alias=parameter.name))
    model: type[BaseModel] = create_model(
        f"{tool}_arguments", __config__=_ARGUMENTS_CONFIG, **fields
    )
    return model


def _check_json(value: Any, tool: str, path: str) -> None:
    """Raises `TypeError` unless `value` is a JSON value (what a reviewer sees and edits)."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"guard {tool!r}: argument {path} is {value!r}, which is not JSON")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, tool, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"guard {tool!r}: argument {path} has the key {key!r}; JSON keys are strings"
                )
            _check_json(item, tool, f"{path}.{key}")
        return
    raise TypeError(
        f"guard {tool!r}: argument {path} is a {type(value).__name__}, not a JSON value"
        " (str, int, float, bool, None, or lists and dicts of them)"
    )


class ApprovalClient:
    """The approval request API over `httpx.AsyncClient` (see the module)."""

    def __init__(self, base_url: str, *, token: str, timeout: float = 30.0) -> None:
        self._key = token_key(token)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout + MAX_WAIT,
        )

    async def __aenter__(self) -> ApprovalClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        run_id: str,
        call_id: str,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
        tries: int = TRIES,
    ) -> Approval:
        """Put the call to the bot's rules: decided at once, or a review opened (asking again
        for the same call gives the same approval). Sent up to `tries` times with one
        idempotency key (see the module)."""
        body = _request_body(tool, arguments, run_id, call_id, schema, requested_by, description)
        return Approval.of(_answer(await self._send_keyed("/approvals", body, tries)))

    async def start_run(
        self, agent: str, input: str, *, requested_by: str | None = None, tries: int = TRIES
    ) -> Run:
        """Start a run of the bot's agent `agent` on `input` (`POST /runs`, with the scope
        runs:write; `requested_by` needs runs:write-as unless it is the token's own name):
        the run as far as it went without a person. Sent up to `tries` times with one
        idempotency key (see the module), so it starts one run."""
        body = _run_body(agent, input, requested_by)
        return Run.of(_answer(await self._send_keyed("/runs", body, tries)))

    async def get(self, approval_id: str, *, wait: float = 0) -> Approval:
        path = f"/approvals/{approval_id}"
        params = {"wait": str(min(wait, MAX_WAIT))} if wait > 0 else None
        return Approval.of(_answer(await self._send("GET", path, params=params)))

    async def wait(self, approval_id: str, *, within: float) -> Approval:
        """The approval once decided; raises `DecisionTimeout` after `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            found = await self.get(approval_id, wait=max(0.0, left))
            if found.decided:
                return found
            if deadline - time.monotonic() <= 0:
                raise DecisionTimeout(
                    f"nobody decided {approval_id} within {within:g} s",
                    details={"approval_id": approval_id},
                )

    async def decide(self, approval_id: str, answer: object, *, remember: bool = False) -> Approval:
        """Decide the review `approval_id` as this token's name (see the module), with an
        answer of any form `as_decision` takes; `remember` asks the call's rule to remember an
        approval. Returns the approval as decided (still pending when it needs more votes).
        Raises `InvalidDecisionError` (nothing sent) and `ApprovalClientError`."""
        body = _decide_body(answer, remember)
        path = f"/approvals/{approval_id}/decide"
        return Approval.of(_answer(await self._send("POST", path, json=body)))

    async def ask(
        self,
        question: str,
        *,
        run_id: str,
        choices: Sequence[str] | None = None,
        id: str | None = None,
        requested_by: str | None = None,
        wait: float = ASK_WAIT,
        tries: int = TRIES,
    ) -> str:
        """Ask a person `question` for the run `run_id` (`POST /questions`, with the scope
        approvals:request) and return the answer: one of `choices` when given, else free
        text. Waits up to `wait` seconds; asking the same question again (the same `id`, or
        the same text and choices) waits on the same question, answered or not. Raises
        `QuestionPending` (its `approval_id` names the question) when nobody answered
        within `wait`, `QuestionUnanswered` when it was declined (`reason`), timed out or
        could be put to nobody, `InvalidQuestionError` (nothing sent) for a question that
        cannot be asked, and `ApprovalClientError`. Sent up to `tries` times with one
        idempotency key."""
        body, asked = _question_body(question, run_id, choices, id, requested_by)
        found = Approval.of(_answer(await self._send_keyed("/questions", body, tries)))
        deadline = time.monotonic() + wait
        while not found.decided and (left := deadline - time.monotonic()) > 0:
            found = await self.get(found.approval_id, wait=left)
        return _answer_to(found, asked)

    async def consume(self, approval: Approval) -> Consumed:
        """Take the decision of `approval` (as `request` or `wait` gave it), once, as its
        token's signed claims carry it, checked against that call (`Consumed.answers` checks
        it against the call as you made it). Raises `DecisionAlreadyTaken`,
        `UntrustedDecision` or `ApprovalClientError`."""
        path = f"/approvals/{approval.approval_id}/consume"
        return _consumed(await self._send("POST", path), self._key, approval)

    def guard(
        self,
        tool: str | None = None,
        *,
        run_id: str,
        within: float,
        call_id: CallId | None = None,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R | str]]]:
        """A decorator of an async function: each call asks the bot, waits up to `within`
        seconds, and runs once approved, with the final arguments, or returns the reviewer's
        text when they answered in its place (a respond: it does not run; see the module). A
        call raises `CallDenied`, `DecisionTimeout`, `ApprovalClientError`, or `TypeError`
        and `InvalidArgumentsError` for arguments it cannot ask about."""

        def decorate(
            function: Callable[P, Awaitable[R]],
        ) -> Callable[P, Coroutine[Any, Any, R | str]]:
            if not inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"ApprovalClient.guard wraps an async function, and {function!r} is not"
                    " one: use SyncApprovalClient.guard"
                )
            rules = _Guard(
                function,
                tool,
                run_id=run_id,
                within=within,
                call_id=call_id,
                schema=schema,
                requested_by=requested_by,
                description=description,
            )
            run: Callable[..., Awaitable[R]] = function

            @functools.wraps(function)
            async def guarded(*args: P.args, **kwargs: P.kwargs) -> R | str:
                call = rules.ask(args, kwargs)
                try:
                    asked = await self.request(**call.request)
                    if not asked.decided:
                        asked = await self.wait(asked.approval_id, within=rules.within)
                    answer = await self.consume(asked)
                except UntrustedDecision:
                    raise  # the decision was taken, though not acted on: its number stays held
                except BaseException:
                    call.free()  # the decision was not taken: a retry asks about this review
                    raise
                final = rules.outcome(call, answer)
                if isinstance(final, _Responded):
                    return final.text
                return await run(**final)

            return guarded

        return decorate

    async def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc

    async def _send_keyed(self, path: str, body: dict[str, Any], tries: int) -> httpx.Response:
        """POST `body` with a new idempotency key, again with the same key after a lost
        answer or a 502, 503 or 504, `tries` times at most."""
        headers = _key_headers()
        for last, pause in _tries(tries):
            try:
                response = await self._http.post(path, json=body, headers=headers)
            except _LOST as exc:
                if last:
                    raise _unreachable(exc) from exc
            except httpx.HTTPError as exc:
                raise _unreachable(exc) from exc
            else:
                if last or response.status_code not in RETRIED_STATUSES:
                    return response
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")  # the last try returns or raises


class SyncApprovalClient:
    """The approval request API over `httpx.Client`: the same calls, blocking."""

    def __init__(self, base_url: str, *, token: str, timeout: float = 30.0) -> None:
        self._key = token_key(token)
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout + MAX_WAIT,
        )

    def __enter__(self) -> SyncApprovalClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        run_id: str,
        call_id: str,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
        tries: int = TRIES,
    ) -> Approval:
        """`ApprovalClient.request`, blocking."""
        body = _request_body(tool, arguments, run_id, call_id, schema, requested_by, description)
        return Approval.of(_answer(self._send_keyed("/approvals", body, tries)))

    def start_run(
        self, agent: str, input: str, *, requested_by: str | None = None, tries: int = TRIES
    ) -> Run:
        """`ApprovalClient.start_run`, blocking."""
        body = _run_body(agent, input, requested_by)
        return Run.of(_answer(self._send_keyed("/runs", body, tries)))

    def get(self, approval_id: str, *, wait: float = 0) -> Approval:
        path = f"/approvals/{approval_id}"
        params = {"wait": str(min(wait, MAX_WAIT))} if wait > 0 else None
        return Approval.of(_answer(self._send("GET", path, params=params)))

    def wait(self, approval_id: str, *, within: float) -> Approval:
        deadline = time.monotonic() + within
        while True:
            found = self.get(approval_id, wait=max(0.0, deadline - time.monotonic()))
            if found.decided:
                return found
            if deadline - time.monotonic() <= 0:
                raise DecisionTimeout(
                    f"nobody decided {approval_id} within {within:g} s",
                    details={"approval_id": approval_id},
                )

    def decide(self, approval_id: str, answer: object, *, remember: bool = False) -> Approval:
        """`ApprovalClient.decide`, blocking."""
        body = _decide_body(answer, remember)
        path = f"/approvals/{approval_id}/decide"
        return Approval.of(_answer(self._send("POST", path, json=body)))

    def ask(
        self,
        question: str,
        *,
        run_id: str,
        choices: Sequence[str] | None = None,
        id: str | None = None,
        requested_by: str | None = None,
        wait: float = ASK_WAIT,
        tries: int = TRIES,
    ) -> str:
        """`ApprovalClient.ask`, blocking."""
        body, asked = _question_body(question, run_id, choices, id, requested_by)
        found = Approval.of(_answer(self._send_keyed("/questions", body, tries)))
        deadline = time.monotonic() + wait
        while not found.decided and (left := deadline - time.monotonic()) > 0:
            found = self.get(found.approval_id, wait=left)
        return _answer_to(found, asked)

    def consume(self, approval: Approval) -> Consumed:
        """`ApprovalClient.consume`, blocking."""
        path = f"/approvals/{approval.approval_id}/consume"
        return _consumed(self._send("POST", path), self._key, approval)

    def guard(
        self,
        tool: str | None = None,
        *,
        run_id: str,
        within: float,
        call_id: CallId | None = None,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R | str]]:
        """`ApprovalClient.guard` for a sync function: each call blocks until decided."""

        def decorate(function: Callable[P, R]) -> Callable[P, R | str]:
            if inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"SyncApprovalClient.guard wraps a sync function, and {function!r} is"
                    " async: use ApprovalClient.guard"
                )
            rules = _Guard(
                function,
                tool,
                run_id=run_id,
                within=within,
                call_id=call_id,
                schema=schema,
                requested_by=requested_by,
                description=description,
            )
            run: Callable[..., R] = function

            @functools.wraps(function)
            def guarded(*args: P.args, **kwargs: P.kwargs) -> R | str:
                call = rules.ask(args, kwargs)
                try:
                    asked = self.request(**call.request)
                    if not asked.decided:
                        asked = self.wait(asked.approval_id, within=rules.within)
                    answer = self.consume(asked)
                except UntrustedDecision:
                    raise  # the decision was taken, though not acted on: its number stays held
                except BaseException:
                    call.free()  # the decision was not taken: a retry asks about this review
                    raise
                final = rules.outcome(call, answer)
                if isinstance(final, _Responded):
                    return final.text
                return run(**final)

            return guarded

        return decorate

    def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from exc

    def _send_keyed(self, path: str, body: dict[str, Any], tries: int) -> httpx.Response:
        """`ApprovalClient._send_keyed`, blocking."""
        headers = _key_headers()
        for last, pause in _tries(tries):
            try:
                response = self._http.post(path, json=body, headers=headers)
            except _LOST as exc:
                if last:
                    raise _unreachable(exc) from exc
            except httpx.HTTPError as exc:
                raise _unreachable(exc) from exc
            else:
                if last or response.status_code not in RETRIED_STATUSES:
                    return response
            time.sleep(pause)
        raise AssertionError("unreachable")  # the last try returns or raises
