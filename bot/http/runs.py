"""The runs API: start a run of a configured agent, and follow it.

| route               | scope          | answers                                          |
|---------------------|----------------|--------------------------------------------------|
| `POST /runs`        | runs:write     | 201, the run as far as it went without a person  |
| `GET /runs/{id}`    | approvals:read | the run, with the approvals its calls wait for   |

The run's requester is the token's name. A body naming another `requested_by` needs the
scope `runs:write-as` too (403 naming it otherwise, and nothing is started); a token with
that scope may deny calls but not approve or edit them (see `bot.http.approvals`), and the
run keeps it as `started_by`: on every channel, the person it stands for may not approve the
run's calls either (`bot.authorize`).

`GET /runs/{id}?wait=<seconds>` (at most 60) answers as soon as the run has settled (finished,
failed, or waiting for a review nobody has decided yet) or when the seconds have passed,
whichever comes first: a client follows a run without polling it.

`POST /runs` with an `Idempotency-Key` header (1 to 200 printable ASCII characters; 400
naming it otherwise) starts one run however often it is sent: the key, scoped to the token's
name, is written with the run, in its transaction, before the run's first step. A repeat
with the same body answers 201 with that run as it is now (still running, when the first is
under way: follow it with `GET /runs/{id}?wait=`); the same key with another body is a 409
naming the header. Keys are kept a day at least (`KEYS_KEPT`). A hosted agent's run
(`framework_agents:`) gets its key written just after its first step, in a transaction of
its own.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nodbot.bot.http.auth import ApiError, TokenTable, missing_scope
from nodbot.bot.http.common import json_body, json_response, parse
from nodbot.bot.http.schemas import ApprovalView, idempotency_key, kept_by, other_body
from nodbot.bot.policy.people import People
from nodbot.bot.service import BotService, UnknownAgentError
from nodbot.core import ApprovalRecord, RunNotFound, RunRecord, RunStatus, ToolMessage
from nodbot.core.store import IdempotencyKey, IdempotencyKeyUsed, KeptKey
from nodbot.core.waiting import set_within

__all__ = ["MAX_WAIT", "RunBody", "RunQuery", "RunView", "ToolResultView", "run_routes"]

MAX_WAIT = 60.0
"""The longest `wait` a request may ask for, seconds."""
ROUTE = "POST /runs"
"""The route idempotency keys of runs are stored under."""


class RunQuery(BaseModel):
    """The query of `GET /runs/{id}`."""

    model_config = ConfigDict(extra="forbid")

    wait: Annotated[float, Field(ge=0, le=MAX_WAIT)] = 0
    """Seconds to wait for the run to settle before answering (0: answer at once)."""


class RunBody(BaseModel):
    """What starts a run."""

    model_config = ConfigDict(extra="forbid")

    agent: str
    """The name of a configured agent."""
    input: Annotated[str, StringConstraints(min_length=1, max_length=20_000)]
    """What the person asked the agent."""
    requested_by: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = None
    """Who asked (a Slack user id, an address); by default, and unless the token has the
    scope runs:write-as, the token's name. The requester may not approve the run's calls."""


class ToolResultView(BaseModel):
    """One call of the run that has been answered: what ran, or why not."""

    tool: str
    status: Literal["ok", "error"]
    content: str
    """`{"result": ...}` or `{"error": ...}`, as the model read it."""
    arguments: dict[str, Any] | None
    """The arguments the tool ran with (after any edit); None when it did not run."""


class RunView(BaseModel):
    """A run as the API shows it."""

    run_id: str
    agent: str
    status: RunStatus
    requested_by: str | None
    started_by: str | None = None
    """The token that started the run for `requested_by`, when another did."""
    final_text: str | None
    """The agent's answer, once the run has finished."""
    error: str | None
    created_at: datetime
    updated_at: datetime
    pending: list[ApprovalView] = Field(default_factory=list)
    """The approvals the run waits for."""
    tool_results: list[ToolResultView] = Field(default_factory=list)
    """The run's answered calls, in order."""


def run_routes(service: BotService, tokens: TokenTable) -> list[Route]:
    """The routes of the runs API over `service`."""

    async def start(request: Request) -> Response:
        token = tokens.require_token(request, "runs:write")
        payload = await json_body(request)
        body = parse(RunBody, payload, "invalid run")
        key = idempotency_key(request.headers, token=token.name, route=ROUTE, body=payload)
        requester, starter = token.name, None
        if body.requested_by is not None and not await People().same(body.requested_by, token.name):
            if "runs:write-as" not in token.scopes:
                raise missing_scope("runs:write-as", " needed to start a run for someone else")
            requester, starter = body.requested_by, token.name
        if key is not None and (kept := await service.store.find_key(key)) is not None:
            return await _repeated(service, key, kept)
        try:
            run, pending = await service.begin_run(
                body.agent, body.input, requester, started_by=starter, idempotency=key
            )
        except UnknownAgentError as exc:
            raise ApiError(422, str(exc), details={"agent": exc.agent}) from None
        except IdempotencyKeyUsed as used:  # a repeat sent while the first was on its way
            return await _repeated(service, used.key, kept_by(used))
        return json_response(await _view(service, run, pending), status=201)

    async def show(request: Request) -> Response:
        tokens.require(request, "approvals:read")
        query = parse(RunQuery, dict(request.query_params), "invalid query parameters")
        run_id = request.path_params["run_id"]
        deadline = time.monotonic() + query.wait
        ended: RunRecord | None = None
        while True:
            changed = service.run_changes(run_id)  # taken before reading: no change is missed
            try:
                run = ended or await service.store.get_run(run_id)
            except RunNotFound:
                raise ApiError(404, "no run has this id", details={"run_id": run_id}) from None
            view = await _view(service, run)
            left = deadline - time.monotonic()
            if _settled(view) or left <= 0:
                return json_response(view)
            # Woken when this bot moves the run on, or when another replica saves it stopped
            # (the database's notice of it); anything else is seen within a poll interval.
            await set_within(changed, min(left, service.poll))
            # A run the step ended is shown as it saved it, not read again: it changes no more.
            if changed.run is not None and changed.run.status in ("finished", "failed"):
                ended = changed.run

    return [
        Route("/runs", start, methods=["POST"]),
        Route("/runs/{run_id}", show, methods=["GET"]),
    ]


async def _repeated(service: BotService, key: IdempotencyKey, kept: KeptKey) -> Response:
    """The answer to a repeat of a keyed start: the run its key names, as it is now (201, as
    the first answer), or a 409 when the body is not the first one's."""
    conflict = other_body(key, kept)
    if conflict is not None:
        raise conflict
    run = await service.store.get_run(kept.target_id)
    return json_response(await _view(service, run), status=201)


def _settled(view: RunView) -> bool:
    """Whether the run stays as it is until someone acts: ended, or waiting for a review."""
    return view.status in ("finished", "failed") or (
        view.status == "waiting" and bool(view.pending)
    )


async def _view(
    service: BotService, run: RunRecord, pending: list[ApprovalRecord] | None = None
) -> RunView:
    """The view of `run`; `pending`: the reviews it waits for, when the caller has read them."""
    if pending is None:
        # None of them pending, as the run was read: nothing to list.
        pending = (
            []
            if run.pending == 0
            else await service.store.list(run_id=run.run_id, status="pending")
        )
    return RunView(
        run_id=run.run_id,
        agent=run.agent,
        status=run.status,
        requested_by=run.requested_by,
        started_by=run.started_by,
        final_text=run.final_text,
        error=run.error,
        created_at=run.created_at,
        updated_at=run.updated_at,
        pending=[await ApprovalView.read(service.store, record) for record in pending],
        tool_results=[
            ToolResultView(
                tool=message.name,
                status=message.status,
                content=message.content,
                arguments=message.arguments,
            )
            for message in run.messages
            if isinstance(message, ToolMessage)
        ],
    )
