"""The approvals API: a Starlette application over an `ApprovalStore`.

| route                          | scope             | answers                               |
|--------------------------------|-------------------|---------------------------------------|
| `GET /healthz`                 | none              | `{"status": "ok"}`, or 503 and why    |
| `GET /readyz`                  | none              | the same, once the workers have run   |
| `GET /approvals`               | approvals:read    | the approvals, filtered               |
| `GET /approvals/{id}`          | approvals:read    | one approval with its events          |
| `POST /approvals/{id}/decide`  | approvals:decide  | the approval, decided                 |
| `POST /approvals/decide`       | approvals:decide  | each listed approval's outcome        |
| `POST /questions`              | approvals:request | the question (`bot.http.questions`)   |
| `POST /email/inbound`          | email:ingest      | 202 and what the reply did            |

A decision is recorded with `decided_by` set to the token's name and channel `api`, through
`Executor.decide`, so an edit is validated with the tool's model before anything is recorded.
A token with the scope `runs:write-as` may have started any run for someone else, and the run
keeps only its requester: such a token may deny calls, never approve or edit them.

A question (`core.questions`: `kind` `question` in the views) is answered with a respond,
`{"action": "respond", "message": <the answer>}`, one of its choices when it has choices
(named as `choice_for` reads them, recorded as the question spells them), or declined with a
deny. An answer that is none of the choices, blank or too long, and an approve or an edit of
a question, are a 422 naming the field (`response`, `action`), and nothing is recorded.

`POST /approvals/decide` approves or denies up to `bot.bulk.MAX_ITEMS` approvals in one
request (`bot.bulk.Decider`): each is authorized, recorded (its own events, its own
transaction) and answered on its own, in the order listed, and one that is refused or
already decided does not stop the rest. Edits stay one at a time. A list that is not
accepted (empty, too long, an id twice) is a 422 and nothing is recorded.

Every route's body is limited (`bot.http.limits`), and `/slack/events` checks Slack's
signature on the raw body before Bolt parses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel
from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nodbot.bot.bulk import Decider
from nodbot.bot.config import ApiToken
from nodbot.bot.http.access import AccessLog
from nodbot.bot.http.auth import ApiError, TokenTable
from nodbot.bot.http.common import json_body, json_response, parse
from nodbot.bot.http.email import email_routes
from nodbot.bot.http.limits import BodyLimit, SlackSignature
from nodbot.bot.http.metrics import metrics_endpoint
from nodbot.bot.http.openapi import openapi_document
from nodbot.bot.http.questions import question_routes
from nodbot.bot.http.requests import WaitQuery, request_routes, wait_for_decision
from nodbot.bot.http.runs import run_routes
from nodbot.bot.http.schemas import (
    EDITS_ONE_AT_A_TIME,
    ApprovalDetail,
    ApprovalView,
    BulkDecideBody,
    DecideBody,
    ErrorBody,
    EventView,
    HealthView,
    ListQuery,
    bulk_view,
)
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import AuthorizeDecision, Verdict
from nodbot.bot.policy.people import People
from nodbot.bot.policy.remember import NOT_REMEMBERED, remember_decision, scope_of
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rule_refusal
from nodbot.bot.service import BotService, WorkerHealth
from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalNotFound,
    ApprovalRecord,
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    InvalidArgumentsError,
    InvalidDecisionError,
    StoreError,
    ToolRegistry,
    UnknownToolError,
)
from nodbot.core.questions import answer_problem, is_question

if TYPE_CHECKING:
    from nodbot.bot.discord.interactions import DiscordReviews
    from nodbot.bot.email.inbound import Inbound
    from nodbot.bot.slack.reviews import SlackReviews
    from nodbot.bot.teams.reviews import TeamsReviews
    from nodbot.bot.web import WebInbox

__all__ = ["SELF_APPROVAL_REASON", "AuthorizeDecision", "create_app", "refuse_self_approval"]

log = logging.getLogger(__name__)

HEALTH_TIMEOUT = 5.0
"""Seconds the health check waits for the store: a database that hangs is not healthy."""

"""`(handle, record, decision) -> Verdict`: the person the handle stands for, and the reason
to refuse (None to allow). The bot's is `bot.authorize.Authorizer`."""

CHANNEL = "api"

NOT_AN_ANSWER = (
    "a question is answered (action respond, the answer as message) or declined (action "
    "deny); it is not approved or edited"
)
"""Why an approve or an edit of a question is refused (422, nothing recorded)."""

STARTS_FOR_OTHERS_REASON = (
    "a token with the scope runs:write-as may deny calls but not approve, edit or answer them: "
    "it may have started this run for someone else"
)

_M = TypeVar("_M", bound=BaseModel)


async def refuse_self_approval(
    principal: str, record: ApprovalRecord, decision: Decision
) -> Verdict:
    """The default `authorize_decision`: whoever started the run may deny its calls, not
    approve or edit them (handles compared as written, addresses case-insensitively); and a
    respond needs a rule that allows it (`rule_refusal`: the review's policy lists it). A
    question is answered (a respond) or declined, never approved: its rule's policy, when
    it has one, says who and how, as for a call."""
    people = People()  # no entries, no Slack: handles as written
    person = await people.person(principal)
    if is_question(record.request):
        if decision.approved:
            return Verdict(person.key, NOT_AN_ANSWER)
        ruled = "allowed_decisions" in record.request.policy
        return Verdict(person.key, rule_refusal(record, decision) if ruled else None)
    requester = record.request.requested_by
    if decision.approved and requester is not None and await people.same(requester, principal):
        return Verdict(person.key, SELF_APPROVAL_REASON)
    if decision.response is not None:
        return Verdict(person.key, rule_refusal(record, decision))
    return Verdict(person.key, None)


def create_app(
    *,
    store: ApprovalStore,
    registry: ToolRegistry,
    tokens: Sequence[ApiToken],
    authorize_decision: AuthorizeDecision | None = None,
    service: BotService | None = None,
    inbox: WebInbox | None = None,
    slack: SlackReviews | None = None,
    email: Inbound | None = None,
    teams: TeamsReviews | None = None,
    discord: DiscordReviews | None = None,
) -> Starlette:
    """The approvals API over `store`; edits are validated with the tools of `registry`.

    `authorize_decision` may refuse a decision (403 with its reason); by default
    `refuse_self_approval`. With a `service`, the runs API is served too, and every decision
    wakes its workers. With an `inbox`, the web inbox is served under `/inbox`; with
    `email`, replies are taken at `POST /email/inbound`; with `teams`, the Bot Framework's
    activities at `POST /teams/messages` (each verified by its JWT there); with `discord`,
    Discord's interactions at `POST /discord/interactions` (each verified by its Ed25519
    signature there).
    """
    table = TokenTable(tokens)
    on_decided = service.decided if service is not None else None
    api = _ApprovalsApi(store, registry, table, authorize_decision, on_decided)
    api.workers = service.health if service is not None else None
    api.service = service
    routes = [
        Route("/healthz", api.health, methods=["GET"]),
        Route("/readyz", api.health, methods=["GET"]),
        Route("/approvals", api.list, methods=["GET"]),
        Route("/approvals/decide", api.decide_many, methods=["POST"]),
        Route("/approvals/{approval_id}", api.get, methods=["GET"]),
        Route("/approvals/{approval_id}/decide", api.decide, methods=["POST"]),
    ]
    if service is not None:
        routes += run_routes(service, table)
        routes += request_routes(service, table)
        routes += question_routes(service, table)
    if email is not None:
        routes += email_routes(email, table)
    document = openapi_document(with_runs=service is not None, with_email=email is not None)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes.append(Route("/openapi.json", openapi, methods=["GET"]))
    if inbox is not None:
        routes += inbox.routes()
    if slack is not None:
        # Slack's requests are signed with the app's signing secret: checked here on the raw
        # bytes (at most SLACK_BODY of them) before Bolt parses anything; Bolt checks again.
        slack_events = AsyncSlackRequestHandler(slack.app)
        secret = slack.config.signing_secret
        signed = SlackSignature(secret.get_secret_value() if secret is not None else "")

        async def slack_endpoint(request: Request) -> Response:
            await signed.check(request)
            return await slack_events.handle(request)

        routes.append(Route("/slack/events", slack_endpoint, methods=["POST"]))
    if teams is not None:
        routes.append(Route("/teams/messages", teams.endpoint, methods=["POST"]))
    if discord is not None:
        routes += discord.routes()

    def counters() -> dict[str, int]:
        found = {**api.counters, **(service.counters if service is not None else {})}
        if inbox is not None:
            found["decisions"] += inbox.counters["decisions"]
        return found

    routes.append(Route("/metrics", metrics_endpoint(store, counters, service), methods=["GET"]))
    return Starlette(
        routes=routes,
        middleware=[Middleware(AccessLog), Middleware(BodyLimit)],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            StoreError: _store_error,
            Exception: _unexpected_error,
        },
    )


class _ApprovalsApi:
    """The route handlers, bound to one store, registry and token table."""

    def __init__(
        self,
        store: ApprovalStore,
        registry: ToolRegistry,
        tokens: TokenTable,
        authorize_decision: AuthorizeDecision | None,
        on_decided: Callable[[], None] | None,
    ) -> None:
        self.store = store
        self.registry = registry
        self._made_pending: Callable[[str], ApprovalRecord | None] | None = getattr(
            store, "made_pending", None
        )
        """The store's reviews it made pending and still knows (`SqlApprovalStore`)."""
        self.executor = Executor(registry, approval=DeferredApproval(store))
        self.tokens = tokens
        self.authorize = authorize_decision or refuse_self_approval
        self.on_decided = on_decided
        self.counters: dict[str, int] = {"decisions": 0}
        self.workers: WorkerHealth | None = None
        self.service: BotService | None = None
        """Wakes waiting reads of an approval (`?wait`), when the bot serves runs."""

    async def health(self, request: Request) -> Response:
        """Whether this process can do its work: the store answers (within
        `HEALTH_TIMEOUT`), and the workers run, their steps succeed and the database's
        notices arrive. `/readyz` asks the same, and that the workers have done a step."""
        problems = []
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT):
                await self.store.list(limit=1)
        except StoreError as exc:
            log.warning("health check: the store cannot be used: %s", exc)
            problems.append(f"the approval store cannot be used ({exc.kind})")
        except TimeoutError:
            log.warning("health check: the store did not answer in %s s", HEALTH_TIMEOUT)
            problems.append(f"the approval store did not answer within {HEALTH_TIMEOUT:g} s")
        problems += getattr(self.store, "problems", list)()  # a SQL store's own (checkpoints)
        if self.workers is not None:
            problems += self.workers.problems()
            if request.url.path == "/readyz" and not self.workers.stepped:
                problems.append("the workers have not finished a step yet")
        if problems:
            view = HealthView(status="unavailable", error=problems[0], problems=problems)
            return json_response(view, status=503)
        return json_response(HealthView(status="ok"))

    async def list(self, request: Request) -> Response:
        self.tokens.require(request, "approvals:read")
        query = parse(ListQuery, dict(request.query_params), "invalid query parameters")
        records = await self.store.list(run_id=query.run_id, status=query.status, limit=query.limit)
        # The votes of the reviews that need several approvals are read, one read each.
        views = [(await ApprovalView.read(self.store, record)) for record in records]
        return JSONResponse([view.model_dump(mode="json") for view in views])

    async def get(self, request: Request) -> Response:
        self.tokens.require_any(request, "approvals:read", "approvals:request")
        query = parse(WaitQuery, dict(request.query_params), "invalid query parameters")
        approval_id = request.path_params["approval_id"]
        if query.wait and self.service is not None:
            try:
                record = await wait_for_decision(self.service, approval_id, query.wait)
            except ApprovalNotFound:
                raise ApiError(
                    404, "no approval has this id", details={"approval_id": approval_id}
                ) from None
        else:
            record = await self._record(approval_id)
        events = await self.store.events(record.approval_id)
        detail = ApprovalDetail(
            **ApprovalView.fields_of(record, events), events=[EventView.of(e) for e in events]
        )
        return json_response(detail)

    async def decide(self, request: Request) -> Response:
        token = self.tokens.require_token(request, "approvals:decide")
        principal = token.name
        body = parse(DecideBody, await json_body(request), "invalid decision")
        record = await self._deciding(request.path_params["approval_id"])
        try:
            decision = body.to_decision(principal, tool=record.request.tool)
        except InvalidDecisionError as exc:
            raise ApiError(422, exc.message, details=exc.details()) from None
        if is_question(record.request):
            _check_answer(record, decision)  # before anything is recorded, a refusal too
        as_is = decision.approved and decision.edited_args is None
        if body.remember and (not as_is or scope_of(record.request) is None):
            why = NOT_REMEMBERED if as_is else "only an approve is remembered"
            raise ApiError(422, why, details={"approval_id": record.approval_id})
        verdict = await self.authorize(principal, record, decision)
        if verdict.refusal is None and "runs:write-as" in token.scopes:
            verdict = _starts_for_others(record, decision, verdict)
        evidence = verdict.evidence({"token": principal})
        if verdict.refusal is not None:
            METRICS.refused(CHANNEL, verdict.refusal)
            await self.store.refuse(
                record.approval_id,
                actor=principal,
                channel=CHANNEL,
                reason=verdict.refusal,
                person=verdict.person,
                evidence=evidence,
            )
            raise ApiError(403, verdict.refusal, details={"approval_id": record.approval_id})
        try:
            decided = await self.executor.decide(
                record.approval_id,
                decision,
                decided_by=principal,
                channel=CHANNEL,
                person=verdict.person,
                evidence=evidence,
            )
        except ApprovalAlreadyDecided as exc:
            first = f" by {exc.decided_by}" if exc.decided_by else ""
            raise ApiError(
                409, f"this approval was already decided{first}", details=exc.details()
            ) from None
        except ApprovalAlreadyVoted:
            raise ApiError(
                409, "you have voted on this approval already", details={"voter": principal}
            ) from None
        except InvalidDecisionError as exc:
            raise ApiError(422, exc.message, details=exc.details()) from None
        except InvalidArgumentsError as exc:
            raise ApiError(
                422, "the edited arguments are not valid for the tool", details=exc.details()
            ) from None
        except UnknownToolError as exc:
            # A call paused by an app that runs its own tools: the bot cannot check an edit.
            message = (
                f"edits of {exc.tool} cannot be checked here (none of this bot's agents has "
                "that tool): approve or deny it, or edit it where the tool runs"
            )
            raise ApiError(422, message, details=exc.details()) from None
        self.counters["decisions"] += 1
        METRICS.decided(decided, CHANNEL)
        if body.remember and decided.status == "approved":
            kept = await remember_decision(self.store, decided, person=verdict.person)
            log.info(
                "approval remembered",
                extra={"approval_id": decided.approval_id, "remember_id": kept.remember_id},
            )
        if self.on_decided is not None:
            self.on_decided()  # the run may be ready to go on
        try:
            view = await ApprovalView.read(self.store, decided)
        except StoreError:  # the decision is recorded: say so, its votes not counted
            view = ApprovalView.of(decided)
        return json_response(view)

    async def decide_many(self, request: Request) -> Response:
        """`POST /approvals/decide`: approve or deny each approval listed, as the token's
        name, one by one in the order listed (`Decider`, channel `api`, the same checks as
        `decide`); 200 with each one's outcome, whatever they are. Raises `ApiError`: 422
        for a body that is not accepted (nothing is recorded then), 401 and 403 for the
        token.

        A store that fails midway is a 503, like any route's: the approvals before it are
        decided and recorded (each in a transaction of its own) and the rest are not;
        sending the same request again answers the recorded ones `already_decided` (or
        `already_voted`) and decides the others."""
        token = self.tokens.require_token(request, "approvals:decide")
        data = await json_body(request)
        if isinstance(data, dict) and data.get("action") == "edit":
            errors = [{"field": "action", "message": EDITS_ONE_AT_A_TIME}]
            raise ApiError(422, EDITS_ONE_AT_A_TIME, details={"errors": errors})
        body = parse(BulkDecideBody, data, "invalid bulk decision")
        check = _starts_for_others if "runs:write-as" in token.scopes else None
        decider = Decider(
            self.store,
            self.registry,
            self.authorize,
            CHANNEL,
            on_decided=self.on_decided,
            check=check,
        )
        outcomes = await decider.decide_many(
            body.approval_ids,
            approved=body.action == "approve",
            who=token.name,
            reason=body.reason,
            evidence={"token": token.name},
        )
        self.counters["decisions"] += sum(outcome.ok for outcome in outcomes)
        return json_response(await bulk_view(self.store, outcomes))

    async def _deciding(self, approval_id: str) -> ApprovalRecord:
        """The review to decide: as the store made it pending, when it still knows it (no
        read: who may decide it, and how, depends on its request alone, which never changes;
        a review decided elsewhere since is found so by the decision's write), else read."""
        known = self._made_pending(approval_id) if self._made_pending is not None else None
        return known or await self._record(approval_id)

    async def _record(self, approval_id: str) -> ApprovalRecord:
        try:
            return await self.store.get(approval_id)
        except ApprovalNotFound:
            raise ApiError(
                404, "no approval has this id", details={"approval_id": approval_id}
            ) from None


def _check_answer(record: ApprovalRecord, decision: Decision) -> None:
    """Refuse (422, nothing recorded) what does not answer or decline the question of
    `record`: an approve or an edit, or an answer `answer_problem` refuses (none of the
    choices, blank, too long)."""
    if decision.approved:
        errors = [{"field": "action", "message": NOT_AN_ANSWER}]
        raise ApiError(422, NOT_AN_ANSWER, details={"errors": errors})
    if decision.response is not None:
        problem = answer_problem(record.request, decision.response)
        if problem is not None:
            errors = [{"field": "response", "message": problem}]
            message = f"not an answer to this question: {problem}"
            raise ApiError(422, message, details={"errors": errors})


def _starts_for_others(record: ApprovalRecord, decision: Decision, verdict: Verdict) -> Verdict:
    """A `runs:write-as` token's check: it may deny, never approve, nor answer in the tool's
    place (it may have started the run for someone else, whose agent would take its answer
    for the tool's)."""
    if decision.approved or decision.response is not None:
        return Verdict(verdict.person, STARTS_FOR_OTHERS_REASON)
    return verdict


def _error(status: int, message: str, details: dict[str, Any], **headers: str) -> Response:
    body = ErrorBody(error=message, details=details)
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    response = _error(exc.status, exc.message, exc.details)
    response.headers.update(exc.headers)
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, str(exc.detail), {}, **(exc.headers or {}))


async def _store_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StoreError)
    log.warning("the store cannot be used: %s", exc)
    return _error(503, "the approval store cannot be used now", {"kind": exc.kind})


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # Logged in full here; the client learns only that it was not its fault.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, "the bot failed to answer this request; it is logged", {})
