"""The OpenAPI document of the HTTP API, built from the pydantic models the routes use, so
the document and the code cannot drift apart. Served at `/openapi.json`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from nodbot.bot.bulk import MAX_ITEMS
from nodbot.bot.http.questions import QuestionBody
from nodbot.bot.http.requests import ConsumedView, RequestBody
from nodbot.bot.http.runs import RunBody, RunView
from nodbot.bot.http.schemas import (
    IDEMPOTENCY_HEADER,
    ApprovalDetail,
    ApprovalView,
    BulkDecideBody,
    BulkDecideView,
    DecideBody,
    ErrorBody,
    HealthView,
)
from nodbot.core import __version__

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{model}"
_ERRORS = {
    "400": f"a malformed {IDEMPOTENCY_HEADER} header (or several)",
    "401": "no token, or an unknown one",
    "403": "the token lacks the scope, or the rules refuse the decision",
    "404": "no such approval or run",
    "409": "already decided (the first decision wins), already voted, a call id asked about "
    f"with other arguments (a question id with another question), a decision not made yet or "
    f"handed out already (or of a question), an {IDEMPOTENCY_HEADER} sent before with another "
    "body",
    "413": "the body is larger than the route's limit",
    "422": "invalid fields, each named, or a body that is not acceptable JSON",
}


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _answers(ok: str, model: type[BaseModel], *errors: str, many: bool = False) -> dict[str, Any]:
    schema = {"type": "array", "items": _ref(model)} if many else _ref(model)
    answers = {ok: {"description": "done", **_json(schema)}}
    for status in errors:
        answers[status] = {"description": _ERRORS[status], **_json(_ref(ErrorBody))}
    return answers


def _health_answers() -> dict[str, Any]:
    ok = {"description": "healthy", **_json(_ref(HealthView))}
    return {"200": ok, "503": {"description": "unhealthy, and why", **_json(_ref(HealthView))}}


def _operation(
    summary: str, scope: str | None, answers: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": answers, **extra}
    if scope is not None:
        operation["security"] = [{"bearer": []}]
        operation["description"] = f"Needs a token with the scope `{scope}`."
    return operation


def _param(name: str, where: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


def _idempotency(what: str) -> dict[str, Any]:
    """The optional `Idempotency-Key` header of a route that makes `what`."""
    return {
        "name": IDEMPOTENCY_HEADER,
        "in": "header",
        "required": False,
        "description": f"Makes one {what} however often the request is sent (a retry after a "
        "timeout or a 503): a repeat with the same key and body answers what the first made, "
        "as it is now; the same key with another body is a 409. Scoped to the token's name, "
        "kept a day at least.",
        "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[ -~]+$"},
    }


def _bulk_answers() -> dict[str, Any]:
    """The answers of `POST /approvals/decide`: each listed approval's outcome is in the 200;
    the errors are of the request as a whole, and record nothing (but a 503's)."""
    answers = _answers("200", BulkDecideView, "401", "413")
    answers["200"]["description"] = (
        "each approval decided or not, in the order listed, each with why not: refused by "
        "the rules or the token, unknown, already decided, already voted"
    )
    for status, description in (
        ("403", "the token lacks the scope approvals:decide"),
        (
            "422",
            f"a list that is not accepted (none, more than {MAX_ITEMS}, an empty id, an id "
            "listed twice), an edit (one at a time), or other invalid fields, each named; "
            "nothing is recorded",
        ),
        (
            "503",
            "the store failed midway: the approvals before it are decided, the rest are "
            "not; the same request again decides the rest",
        ),
    ):
        answers[status] = {"description": description, **_json(_ref(ErrorBody))}
    return dict(sorted(answers.items()))


def _approval_paths() -> dict[str, Any]:
    approval_id = _param("approval_id", "path", {"type": "string"})
    query = [
        _param("status", "query", {"enum": ["pending", "approved", "denied"]}),
        _param("run_id", "query", {"type": "string"}),
        _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 500}),
    ]
    return {
        "/healthz": {
            "get": _operation(
                "Whether the bot can use its store and its workers are well",
                None,
                _health_answers(),
            )
        },
        "/readyz": {
            "get": _operation(
                "The same, and the workers have done a step: whether to send traffic here",
                None,
                _health_answers(),
            )
        },
        "/approvals": {
            "get": _operation(
                "Approvals in creation order",
                "approvals:read",
                _answers("200", ApprovalView, "401", "403", "422", many=True),
                parameters=query,
            )
        },
        "/approvals/decide": {
            "post": _operation(
                f"Approve or deny several approvals at once (at most {MAX_ITEMS}), each "
                "authorized, recorded and answered on its own",
                "approvals:decide",
                _bulk_answers(),
                requestBody={"required": True, **_json(_ref(BulkDecideBody))},
            )
        },
        "/approvals/{approval_id}": {
            "get": _operation(
                "One approval with its events; with `wait`, once decided (or after it)",
                "approvals:read or approvals:request",
                _answers("200", ApprovalDetail, "401", "403", "404", "422"),
                parameters=[
                    approval_id,
                    _param("wait", "query", {"type": "number", "minimum": 0, "maximum": 60}),
                ],
            )
        },
        "/approvals/{approval_id}/decide": {
            "post": _operation(
                "Approve, edit, deny or respond (a vote when the review needs several "
                "approvals); answer a question (respond) or decline it (deny)",
                "approvals:decide",
                _answers("200", ApprovalView, "401", "403", "404", "409", "413", "422"),
                parameters=[approval_id],
                requestBody={"required": True, **_json(_ref(DecideBody))},
            )
        },
    }


def _request_paths() -> dict[str, Any]:
    return {
        "/approvals": {
            "post": _operation(
                "Put a call of a tool that runs elsewhere to the rules: decided at once, or a "
                "review opened (idempotent on run id and call id, and on its Idempotency-Key)",
                "approvals:request",
                _answers("201", ApprovalView, "400", "401", "403", "409", "413", "422"),
                parameters=[_idempotency("approval")],
                requestBody={"required": True, **_json(_ref(RequestBody))},
            )
        },
        "/approvals/{approval_id}/consume": {
            "post": _operation(
                "Take the decision, once, with its one-use approval token (not of a "
                "question: its answer is read)",
                "approvals:request",
                _answers("200", ConsumedView, "401", "403", "404", "409"),
                parameters=[_param("approval_id", "path", {"type": "string"})],
            )
        },
        "/questions": {
            "post": _operation(
                "Ask a person a question for a run: put to the people of the rule that "
                "covers `ask` (declined at once when none does); its answer is read with "
                "GET /approvals/{id}?wait= (idempotent on run id and question id, and on "
                "its Idempotency-Key)",
                "approvals:request",
                _answers("201", ApprovalView, "400", "401", "403", "409", "413", "422"),
                parameters=[_idempotency("question")],
                requestBody={"required": True, **_json(_ref(QuestionBody))},
            )
        },
    }


def _run_paths() -> dict[str, Any]:
    return {
        "/runs": {
            "post": _operation(
                "Start a run of a configured agent (once per Idempotency-Key)",
                "runs:write (and runs:write-as to name another `requested_by`)",
                _answers("201", RunView, "400", "401", "403", "409", "413", "422"),
                parameters=[_idempotency("run")],
                requestBody={"required": True, **_json(_ref(RunBody))},
            )
        },
        "/runs/{run_id}": {
            "get": _operation(
                "A run, with the approvals it waits for; with `wait`, once it has settled",
                "approvals:read",
                _answers("200", RunView, "401", "403", "404", "422"),
                parameters=[
                    _param("run_id", "path", {"type": "string"}),
                    _param("wait", "query", {"type": "number", "minimum": 0, "maximum": 60}),
                ],
            )
        },
    }


def _email_paths() -> dict[str, Any]:
    text = {"type": "string"}
    nullable = {"type": ["string", "null"]}
    outcome = {
        "type": "object",
        "properties": {
            "status": {"enum": ["decided", "refused", "dropped"]},
            "reason": nullable,
            "approval_id": nullable,
            "message_id": nullable,
            "answered": {
                "type": "boolean",
                "description": "an answer is on its way to the sender, a verified reviewer",
            },
        },
        "required": ["status", "reason", "approval_id", "message_id", "answered"],
    }
    answers: dict[str, Any] = {
        "202": {
            "description": "taken: decided, refused (an event on its review says why) or "
            "dropped (an automatic message, or one naming no review)",
            "content": {"application/json": {"schema": outcome}},
        }
    }
    for status in ("401", "403", "413"):
        answers[status] = {"description": _ERRORS[status], **_json(_ref(ErrorBody))}
    answers["415"] = {"description": "not a raw email", **_json(_ref(ErrorBody))}
    operation = _operation(
        "A reply to a review email, as a mail provider hands it on", "email:ingest", answers
    )
    operation["requestBody"] = {
        "required": True,
        "content": {"message/rfc822": {"schema": text}},
    }
    return {"/email/inbound": {"post": operation}}


def openapi_document(*, with_runs: bool, with_email: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API (with the runs routes and the email door when
    they are served)."""
    models: list[type[BaseModel]] = [
        ApprovalDetail,
        ApprovalView,
        DecideBody,
        BulkDecideBody,
        BulkDecideView,
        ErrorBody,
        HealthView,
        RunBody,
        RunView,
        RequestBody,
        ConsumedView,
        QuestionBody,
    ]
    _, schemas = models_json_schema(
        [(model, "serialization") for model in models], ref_template=_REF
    )
    paths = _approval_paths() | (_run_paths() if with_runs else {})
    if with_runs:  # served beside the runs: the request API needs the bot's rules
        for path, operations in _request_paths().items():
            paths[path] = {**paths.get(path, {}), **operations}
    if with_email:
        paths |= _email_paths()
    return {
        "openapi": "3.1.0",
        "info": {"title": "nodbot", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
