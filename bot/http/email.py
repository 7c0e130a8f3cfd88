"""`POST /email/inbound`: the door of mail providers' inbound webhooks. The body is one raw
`message/rfc822` reply (at most `limits.EMAIL_BODY`), the bearer token needs the scope
`email:ingest`, and the answer is 202 with what became of the message (`Inbound.ingest`):
202 whatever it was, since a provider retries what is not accepted, and a refused reply is
recorded on its review rather than worth another try. That includes a message over a limit
of its shape (MIME parts, nesting, header fields: `reading.parse`), refused or dropped.

Only failures are not acknowledged: 503 when the store cannot be used, and 500 (logged, with
the message's Message-ID) when its processing raises anything else, a bug. Acknowledging
would end the provider's retries for a message that may be a genuine decision, never read;
unacknowledged, it decides nothing meanwhile and is processed once the bug is fixed (its
Message-ID keeps it from deciding twice), or the provider gives up after its retries.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nodbot.bot.http.auth import ApiError, TokenTable
from nodbot.core import StoreError

if TYPE_CHECKING:  # the email package needs the web inbox's signing, which needs this one
    from nodbot.bot.email.inbound import Inbound

__all__ = ["email_routes"]

log = logging.getLogger(__name__)

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
        raw = await request.body()
        try:
            outcome = await inbound.ingest(raw)
        except StoreError:
            raise  # 503: try again
        except Exception:
            message_id = inbound.message_id_in(raw)
            log.error("email reply not processed", extra={"message_id": message_id})
            raise  # 500, logged in full by the app
        return JSONResponse(outcome.as_json(), status_code=202)

    return [Route("/email/inbound", receive, methods=["POST"])]
