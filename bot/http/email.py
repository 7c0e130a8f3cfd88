"""`POST /email/inbound`: the door of mail providers' inbound webhooks. The body is one raw
`message/rfc822` reply (at most `limits.EMAIL_BODY`), the bearer token needs the scope
`email:ingest`, and the answer is 202 with what became of the message (`Inbound.ingest`):
202 whatever it was, since a provider retries what is not accepted, and a refused reply is
recorded on its review rather than worth another try."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nodbot.bot.authorize import AuthorizeDecision
from nodbot.bot.email.inbound import Inbound
from nodbot.bot.http.auth import ApiError, TokenTable
from nodbot.bot.service import BotService

__all__ = ["email_routes"]

CONTENT_TYPES = ("message/rfc822", "application/octet-stream")
"""`message/rfc822` as the issue asks; `application/octet-stream` for providers that cannot
set a type of their own."""


def email_routes(
    service: BotService, tokens: TokenTable, authorize: AuthorizeDecision
) -> list[Route]:
    """The route, when the bot has an `email:` section (none otherwise)."""
    config = service.config
    if config.email is None:
        return []
    secret = config.web.secret.get_secret_value() if config.web.secret else None
    inbound = Inbound(
        config.email,
        service.store,
        service.registry,
        secret=secret,
        authorize=authorize,
        on_decided=service.decided,
    )

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
