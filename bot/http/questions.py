"""`POST /questions`: a program in any language asks a person a question (seed 001's
`interrupt()`, `ctx.ask` of nodbot's own tools) and reads the answer.

| route              | scope             | answers                                         |
|--------------------|-------------------|-------------------------------------------------|
| `POST /questions`  | approvals:request | 201 the question's view, 200 when it was asked   |
|                    |                   | already in this run                             |

The question is stored as `ctx.ask` stores one (`core.questions.question_request`): a review
of the pseudo-tool `ask`, call id `ask_<id>` in the run, its arguments the question. The
rules put it to the people of the first review rule that covers `ask` (else `defaults:`);
with nobody to ask it is declined at once, decided by `nodbot:no-rule` with the reason.
From there it is a review like any other: delivered on Slack, Teams, Discord, email and the
inbox, answered (a respond, one of the choices when it has choices) or declined (a deny) by
one person, or timed out, with its events in the audit chain. `GET /approvals/{id}?wait=N`
reads the answer once given (`answer`, and `question.state`).

The same question in the same run (the same `id`, or the same text and choices when no id
is given) is one question: asking it again answers 200 with it as it is now, answered or
not. The same `id` with another question or other choices is a 409. An `Idempotency-Key`
makes a request idempotent as for `POST /approvals`, under its own route.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from pydantic import StringConstraints, WithJsonSchema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nodbot.bot.http.auth import ApiError, TokenTable
from nodbot.bot.http.common import json_body, parse
from nodbot.bot.http.requests import asked_once, asking_as
from nodbot.bot.http.schemas import (
    _Model,
    idempotency_key,
)
from nodbot.bot.policy.rules import RulesPort
from nodbot.bot.service import BotService
from nodbot.core import ApprovalRecord, ApprovalRequest, InvalidQuestionError
from nodbot.core.questions import (
    MAX_CHOICE,
    MAX_CHOICES,
    MAX_QUESTION,
    QUESTION_TOOL,
    make_question,
    question_request,
)

__all__ = ["QuestionBody", "question_routes"]

QUESTION_ID = "^[A-Za-z0-9_-]{1,40}$"
"""What a question's id may be (`core.questions.make_question` checks it)."""
ROUTE = "POST /questions"
"""The route idempotency keys of questions are stored under."""

Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\s\x00-\x1f]+$")
]


QuestionText = Annotated[
    str, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_QUESTION})
]
ChoiceText = Annotated[
    str, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_CHOICE})
]
Choices = Annotated[
    list[ChoiceText],
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 2,
            "maxItems": MAX_CHOICES,
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_CHOICE},
        }
    ),
]
QuestionId = Annotated[str, WithJsonSchema({"type": "string", "pattern": QUESTION_ID})]
# The schemas say the bounds; `make_question` checks them, in words naming the field.


class QuestionBody(_Model):
    """The body of `POST /questions`."""

    run_id: Identifier
    """The run (thread, session) that asks: the question is one of its reviews."""
    question: QuestionText
    """The question, not blank, at most 2,000 characters."""
    choices: Choices | None = None
    """The answers to choose from: 2 to 25 distinct, non-blank lines of at most 75
    characters; left out (or null) for a free-text answer."""
    id: QuestionId | None = None
    """The question's id in the run: letters, digits, `_` and `-`, at most 40; by default a
    digest of the question and its choices."""
    requested_by: Annotated[str, StringConstraints(min_length=1, max_length=320)] | None = None
    """Who the question is asked for (an end user); by default the token's name. A token
    that may decide asks only as itself."""


def question_routes(service: BotService, tokens: TokenTable) -> list[Route]:
    """The route of the questions API (the answer is read with `GET /approvals/{id}`)."""
    store = service.store
    port = RulesPort(service.config, store, registry=service.registry, authorize=service.authorize)

    async def create(request: Request) -> Response:
        token = tokens.require_token(request, "approvals:request")
        payload = await json_body(request)
        body = parse(QuestionBody, payload, "invalid question")
        key = idempotency_key(request.headers, token=token.name, route=ROUTE, body=payload)
        requester = asking_as(token, body.requested_by)
        try:
            question = make_question(body.question, choices=body.choices, key=body.id)
        except InvalidQuestionError as exc:
            raise ApiError(422, exc.message, details=exc.details()) from None
        asked = question_request(question, run_id=body.run_id, call_id=None, requested_by=requester)
        asked = replace(
            asked, policy={**asked.policy, "requested_with": token.name}, idempotency=key
        )
        return await asked_once(service, port, asked, key, _same_question)

    return [Route("/questions", create, methods=["POST"])]


def _same_question(record: ApprovalRecord, asked: ApprovalRequest) -> None:
    """Refuse (409) a question whose id in the run names another question (or a call)."""
    if record.request.tool != QUESTION_TOOL or record.request.digest != asked.digest:
        raise ApiError(
            409,
            "this question's id was used in this run for another question or other choices: "
            "give the new question an id of its own",
            details={"approval_id": record.approval_id, "call_id": asked.call_id},
        )
