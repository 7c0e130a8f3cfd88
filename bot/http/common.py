"""Helpers every route module shares: parsing bodies and queries, JSON responses."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from nodbot.bot.http.auth import ApiError
from nodbot.bot.http.limits import loads
from nodbot.bot.http.schemas import field_errors

__all__ = ["json_body", "json_response", "parse"]

_M = TypeVar("_M", bound=BaseModel)


def parse(model: type[_M], data: Any, what: str) -> _M:
    """`data` as a `model`; a 422 `ApiError` listing every invalid field otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc)
        fields = ", ".join(error["field"] for error in errors)
        raise ApiError(422, f"{what}: {fields}", details={"errors": errors}) from None


async def json_body(request: Request) -> Any:
    """The request's body parsed as JSON (see `bot.http.limits.loads`: no NaN, no duplicate
    keys, no lone surrogates, nested at most 32 levels); a 422 `ApiError` otherwise, and 413
    when the body is over the route's limit."""
    return loads(await request.body())


def json_response(model: BaseModel, *, status: int = 200) -> Response:
    """The model as a JSON response, serialised straight to bytes (not dumped to a dict for
    `json.dumps` first: a third of the time)."""
    body = type(model).__pydantic_serializer__.to_json(model)
    return Response(body, status_code=status, media_type="application/json")
