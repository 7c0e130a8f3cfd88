"""`POST /email/inbound`: the door of mail providers' inbound webhooks. The body is one raw
`message/rfc822` reply (at most `limits.EMAIL_BODY`), the bearer token needs the scope
`email:ingest`, and the answer is 202 with what became of the message (`Inbound.ingest`):
202 whatever it was, since a provider retries what is not accepted, and a refused reply is
recorded on its review rather than worth another try."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nodbot.bot.http.auth import ApiError, TokenTable

if TYPE_CHECKING:  # the email package needs the web inbox's signing, which needs this one
    from nodbot.bot.email.inbound import Inbound

__all__ = ["email_routes"]

CONTENT_TYPES = ("message/rfc822", "application/octet-stream")
"""`message/rfc822` as the issue asks; `application/octet-stream` for providers that cannot
set a type of their own."""


def email_routes(inbound: Inbound, tokens: TokenTable) -> list[Route]:
    """The route of the bot's inbound email."""

    async def receive(request: Request) -> Response:
        tokens.require(request, "email:ingest")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in CONTENT_TYPES:
            raise ApiError(
                415, "the body must be a raw message/rfc822 email", details={"type": kind}
            )
        outcome = await inbound.ingest(await request.body())
        return JSONResponse(outcome.as_json(), status_code=202)

    return [Route("/email/inbound", receive, methods=["POST"])]
