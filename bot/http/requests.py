"""The approval request API: any program (an agent of another framework, in any language) puts
a call to the bot's rules before it runs it, waits for the decision, and takes it once.

| route                             | scope             | does                                   |
|-----------------------------------|-------------------|----------------------------------------|
| `POST /approvals`                 | approvals:request | the rules decide the call at once, or  |
|                                   |                   | open a review (201; 200 when the call  |
|                                   |                   | was asked about already)               |
| `GET /approvals/{id}?wait=N`      | approvals:read or | the approval, once decided or after N  |
|                                   | approvals:request | seconds (at most 60)                   |
| `POST /approvals/{id}/consume`    | approvals:request | the decision, handed out once, with a  |
|                                   | (the asker's)     | one-use approval token (409 after; 403 |
|                                   |                   | to any token but the one that asked)   |

`POST /approvals` takes the tool, its arguments, optionally the arguments' JSON schema (kept
with the review, so that reviewers get a typed edit form and edits are checked against it
for tools the bot does not have), the run id and the framework's native call id, who asked,
and a description shown to reviewers. It is idempotent on (run id, call id): the same call
again gets the same approval; the same call id with another tool or other arguments is
refused (409), since a decision answers one call only. The rules decide it exactly as they
decide a call of the bot's own agents: a rule's `decision` at once (recorded, decided by
`nodbot:rules.<n>`), its reviewers otherwise. They judge the arguments as the tool will take
them: validated by the model of the bot's own tool of that name (coerced, defaults filled
in), else checked against `schema` (strictly, defaults filled in; arguments that break it
are approved by no rule), else as given. The token that asks (`requested_with`) counts as a
requester of the call, as `requested_by` does: its holder may not approve it unless the rule
allows self-approval.

`POST /approvals/{id}/consume` spends the decision: the answer says whether the call may
run, with which arguments (edited ones merged into the original), the reviewer's reason (or,
for a respond, `response`: the answer to give the model in the tool's place), and
`token`, a one-use approval token (`core.approval_tokens`) bound to the run, the call id, the
tool and the arguments' digest, signed with a key derived from the bearer token that
consumed it (so the client can check it, and nobody else can make one). Only the token that
asked for the call consumes it (or another token of the same person under `people:`, such
as the same agent's next key): any other gets a 403 and the decision stays for its asker. A
second consume is a 409: an external tool, too, runs at most once per decision. A replayed
call after that (the same run and call id) opens a new review. A question (`POST
/questions`) is no call: its answer is read with `GET /approvals/{id}`, and a consume of it
is a 409.

`POST /approvals` with an `Idempotency-Key` header (1 to 200 printable ASCII characters; 400
naming it otherwise) is idempotent on the key as well, after the decision is consumed too:
the key, scoped to the token's name, is written with the approval it made, in the same
transaction (or with the call's active record it answered with, just after). A repeat with
the same body answers 200 with that approval as it is now, as a repeat of the call does
while its record is active (a repeat sent while the first is under way, too: its rule's
decision may follow a moment later); the same key with another body is a 409 naming the
header. Keys are kept a day at least.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field, StringConstraints, field_validator
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nodbot.bot.config import ApiToken
from nodbot.bot.http.auth import ApiError, TokenTable
from nodbot.bot.http.common import json_body, json_response, parse
from nodbot.bot.http.schemas import (
    ApprovalView,
    _Model,
    idempotency_key,
    kept_by,
    other_body,
)
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.people import People
from nodbot.bot.policy.rules import Judged, RulesPort
from nodbot.bot.service import BotService
from nodbot.core import (
    ApprovalAlreadyConsumed,
    ApprovalNotDecided,
    ApprovalNotFound,
    ApprovalRecord,
    ApprovalRequest,
    InvalidArgumentsError,
    merge_edit,
)
from nodbot.core.approval_tokens import ApprovalToken, token_key
from nodbot.core.questions import is_question
from nodbot.core.store import IdempotencyKey, IdempotencyKeyUsed, KeptKey
from nodbot.core.tools import arguments_digest, canonical_json
from nodbot.core.waiting import set_within

__all__ = ["MAX_SCHEMA_BYTES", "request_routes"]

CHANNEL = "api"
ROUTE = "POST /approvals"
"""The route idempotency keys of approval requests are stored under."""
MAX_WAIT = 60.0
"""The longest `wait` a request may ask for, seconds."""
MAX_SCHEMA_BYTES = 65_536
"""The largest argument schema kept with a review (canonical JSON)."""
MAX_DESCRIPTION = 2_000

Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\s\x00-\x1f]+$")
]


class RequestBody(_Model):
    """The body of `POST /approvals`."""

    tool: Identifier
    """The tool's name, as the agent calls it."""
    arguments: dict[str, Any]
    """The call's arguments, as JSON values."""
    arguments_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    """The arguments' JSON schema (`schema` in the body), for reviewers' edit forms and to
    check their edits; the bot's own tools use their model instead."""
    run_id: Identifier
    """The run (thread, session) the call belongs to."""
    call_id: Identifier
    """The framework's native id of the call."""
    requested_by: Annotated[str, StringConstraints(min_length=1, max_length=320)] | None = None
    """Who the call is made for (an end user); by default the token's name."""
    description: Annotated[str, StringConstraints(max_length=MAX_DESCRIPTION)] | None = None
    """Why the agent makes the call, shown to reviewers when the rule gives no description."""

    @field_validator("arguments_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(canonical_json(value).encode()) > MAX_SCHEMA_BYTES:
            raise ValueError(f"the schema is over {MAX_SCHEMA_BYTES} bytes")
        if value is not None and value.get("type", "object") != "object":
            raise ValueError("the schema of a call's arguments describes an object")
        return value


class WaitQuery(_Model):
    wait: Annotated[float, Field(ge=0, le=MAX_WAIT)] = 0
    """Seconds to wait for a decision before answering (0: answer at once)."""


class ConsumedView(_Model):
    """The answer of `POST /approvals/{id}/consume`."""

    approval_id: str
    run_id: str
    call_id: str
    tool: str
    approved: bool
    """Whether the call may run."""
    arguments: dict[str, Any]
    """The arguments to run it with: the original ones with the reviewer's edits merged."""
    edited: bool
    """Whether a reviewer changed the arguments."""
    reason: str | None
    """The reviewer's reason (a denied call's model should be told it)."""
    decided_by: str | None
    response: str | None = None
    """A respond: the reviewer's answer, the call's result for the model in the tool's place
    (`approved` is false: the tool does not run); signed in the token's claims too. Null
    for the other decisions."""
    token: str
    """The one-use approval token of this decision (`core.approval_tokens`)."""


def request_routes(service: BotService, tokens: TokenTable) -> list[Route]:
    """The routes of the approval request API (the `GET` is the approvals API's own)."""
    store = service.store
    port = RulesPort(service.config, store, registry=service.registry, authorize=service.authorize)
    # Who asked and who consumes are API tokens: told apart by `people:` alone.
    people = People(service.config.people)

    async def create(request: Request) -> Response:
        token = tokens.require_token(request, "approvals:request")
        payload = await json_body(request)
        body = parse(RequestBody, payload, "invalid approval request")
        key = idempotency_key(request.headers, token=token.name, route=ROUTE, body=payload)
        requester = asking_as(token, body.requested_by)
        arguments = body.arguments
        judged = _validated(service, body.tool, arguments)
        asked = ApprovalRequest(
            run_id=body.run_id,
            call_id=body.call_id,
            tool=body.tool,
            arguments=arguments,
            digest=arguments_digest(arguments),
            requested_by=requester,
            policy=_extra_policy(body, token),
            idempotency=key,
        )
        extra = {"call_description": body.description} if body.description else None
        return await asked_once(
            service, port, asked, key, _same_call, judged=judged, policy_if_new=extra
        )

    async def consume(request: Request) -> Response:
        token = tokens.require_token(request, "approvals:request")
        approval_id = request.path_params["approval_id"]
        try:
            asked = await store.get(approval_id)
            if is_question(asked.request):
                raise ApiError(
                    409,
                    "a question's answer is read (GET /approvals/{id}), not taken: no call "
                    "waits on it",
                    details={"approval_id": approval_id},
                )
            await _check_asker(people, asked, token)
            record = await store.consume(approval_id, actor=token.name)
        except ApprovalNotFound:
            raise ApiError(
                404, "no approval has this id", details={"approval_id": approval_id}
            ) from None
        except ApprovalNotDecided:
            raise ApiError(
                409, "this approval is not decided yet", details={"approval_id": approval_id}
            ) from None
        except ApprovalAlreadyConsumed:
            raise ApiError(
                409,
                "this decision was handed out already: it answers one call, once",
                details={"approval_id": approval_id},
            ) from None
        METRICS.taken(record, "api")
        if not record.finished:
            # Handed out is as far as the bot sees the call; a replay opens a new review.
            record = await store.finish(approval_id, outcome="handed-out")
        return json_response(_consumed(record, token))

    return [
        Route("/approvals", create, methods=["POST"]),
        Route("/approvals/{approval_id}/consume", consume, methods=["POST"]),
    ]


async def wait_for_decision(
    service: BotService, approval_id: str, seconds: float
) -> ApprovalRecord:
    """The approval once decided, or as it is after `seconds`. Raises `ApprovalNotFound`."""
    deadline = time.monotonic() + seconds
    while True:
        decided = service.decisions()  # taken before reading: no decision is missed
        record = await service.store.get(approval_id)
        left = deadline - time.monotonic()
        if record.decision is not None or left <= 0:
            return record
        # Woken by this bot's decisions; another replica's are seen within a poll interval.
        await set_within(decided, min(left, service.poll))


async def asked_once(
    service: BotService,
    port: RulesPort,
    asked: ApprovalRequest,
    key: IdempotencyKey | None,
    same: Callable[[ApprovalRecord, ApprovalRequest], None],
    *,
    judged: Judged | None = None,
    policy_if_new: dict[str, Any] | None = None,
) -> Response:
    """The answer to a request that asks (`POST /approvals`, `POST /questions`), made once:
    the record its idempotency key names (200; 409 for another body), else the call's
    active record (200), else a new one as the rules make it (201), with `policy_if_new`
    added to its policy. `same` refuses (409) a record made for another call than `asked`
    (one found, or one that another request for the call made first)."""
    store = service.store
    try:
        if key is not None and (kept := await store.find_key(key)) is not None:
            return await _repeated(store, key, kept)
        existing = await store.find(asked.run_id, asked.call_id)
        if existing is not None and not existing.finished:
            same(existing, asked)
            if key is not None:
                await store.keep_key(key, existing.approval_id)
            return json_response(await ApprovalView.read(store, existing))
        if policy_if_new:
            asked = replace(asked, policy={**asked.policy, **policy_if_new})
        # With a key: written with the record it makes (see `ApprovalRequest.idempotency`).
        record, decided = await port.open_review(asked, judged=judged)
    except IdempotencyKeyUsed as used:  # a repeat sent while the first was on its way
        return await _repeated(store, used.key, kept_by(used))
    same(record, asked)  # another request for the call won a race: the same call?
    if decided:
        service.decided()  # decided at once (by a rule): wake whoever waits on it
    return json_response(await ApprovalView.read(store, record), status=201)


async def _repeated(store: Any, key: IdempotencyKey, kept: KeptKey) -> Response:
    """The answer to a repeat of a keyed request: the approval its key names, as it is now
    (200, as for a call asked about already), or a 409 when the body is not the first
    one's."""
    conflict = other_body(key, kept)
    if conflict is not None:
        raise conflict
    return json_response(await ApprovalView.read(store, await store.get(kept.target_id)))


def asking_as(token: ApiToken, requested_by: str | None) -> str:
    """Who a request (`POST /approvals`, `POST /questions`) asks for: its `requested_by`, by
    default the token's name. Raises `ApiError` 403 when a token that may decide asks for
    someone else (it could then approve what it asked for them)."""
    requester = requested_by or token.name
    if requester.lower() != token.name.lower() and "approvals:decide" in token.scopes:
        raise ApiError(
            403,
            "a token that may decide asks only as itself: requested_by must be its name",
            details={"requested_by": requester},
        )
    return requester


def _validated(service: BotService, tool: str, arguments: dict[str, Any]) -> Judged | None:
    """The arguments checked by the model of the bot's own tool of that name, when there is
    one: as the rules judge them (a 422 `ApiError` when they fail it). None for another
    tool: the rules judge them by the request's schema, or as given. The request keeps the
    arguments as given: they are what the caller will run, and what its digest is of."""
    if tool not in service.registry:
        return None
    try:
        validated = service.registry.get(tool).validate(arguments, source="arguments")
    except InvalidArgumentsError as exc:
        raise ApiError(422, exc.message, details=exc.details()) from None
    return Judged(validated.canonical)


async def _check_asker(people: People, record: ApprovalRecord, token: ApiToken) -> None:
    """Refuse (403) a token that did not ask for the call, nor stands for the same person
    as the one that did: a decision is the asking agent's to take. A call asked for by no
    token (a run of the bot's own, a hosted agent's) is taken by its worker, not here."""
    asker = record.request.policy.get("requested_with")
    details = {"approval_id": record.approval_id}
    if not isinstance(asker, str) or not asker:
        raise ApiError(403, "this call was not asked for over the API", details=details)
    if (await people.person(asker)).key != (await people.person(token.name)).key:
        raise ApiError(
            403, "only the token that asked for this call may take its decision", details=details
        )


def _extra_policy(body: RequestBody, token: ApiToken) -> dict[str, Any]:
    extra: dict[str, Any] = {"requested_with": token.name}
    if body.arguments_schema is not None:
        extra["schema"] = body.arguments_schema
    return extra


def _same_call(record: ApprovalRecord, asked: ApprovalRequest) -> None:
    if record.request.tool != asked.tool or record.request.digest != asked.digest:
        raise ApiError(
            409,
            "this call id was asked about with another tool or other arguments; a decision "
            "answers one call: give the new call an id of its own",
            details={"approval_id": record.approval_id, "call_id": asked.call_id},
        )


def _consumed(record: ApprovalRecord, token: ApiToken) -> ConsumedView:
    decision = record.decision
    assert decision is not None  # consume takes decided records only
    original = record.request.arguments
    final = merge_edit(original, decision.edited_args) if decision.edited_args else original
    edited = bool(decision.edited_args) and final != original
    claims = ApprovalToken(
        approval_id=record.approval_id,
        run_id=record.request.run_id,
        call_id=record.request.call_id,
        tool=record.request.tool,
        digest=record.request.digest,
        approved=decision.approved,
        decided_by=decision.decided_by,
        reason=decision.reason,
        edited_digest=arguments_digest(final) if edited else None,
        response=decision.response,
    )
    return ConsumedView(
        approval_id=record.approval_id,
        run_id=record.request.run_id,
        call_id=record.request.call_id,
        tool=record.request.tool,
        approved=decision.approved,
        arguments=final,
        edited=edited,
        reason=decision.reason,
        decided_by=decision.decided_by,
        response=decision.response,
        token=claims.sign(token_key(token.token.get_secret_value())),
    )
