"""Limits applied before any work: the size of every request body, how JSON may be shaped,
and Slack's signature checked on the raw bytes before anything parses them.

| what                                   | limit                                      |
|----------------------------------------|--------------------------------------------|
| `POST /approvals/{id}/decide` body     | 64 KB (`DECIDE_BODY`)                      |
| `POST /approvals/decide` body          | 64 KB (`DEFAULT_BODY`; 100 ids are ~4 KB)  |
| `POST /runs` body                      | 256 KB (`RUNS_BODY`)                       |
| `POST /slack/events` body              | 1 MB (`SLACK_BODY`)                        |
| `POST /email/inbound` body             | 1 MB (`EMAIL_BODY`)                        |
| `/inbox/...` body                      | 2 MB (the inbox's own form limit is 1 MB)  |
| any other route's body                 | 64 KB (`DEFAULT_BODY`)                     |
| JSON nesting                           | 32 levels (`MAX_JSON_DEPTH`)               |

A body over its route's limit is refused with 413 as soon as it is known: from its
`Content-Length`, or while it is read, so no more than the limit is ever held.

An inbound email is also held, while it is parsed, to at most 100 MIME parts nested 10 deep,
200 header fields a part and 1,000 in all, and 16 KB of the fields the bot parses
(`EMAIL_PARTS` and the constants after it), whichever door it came through.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from slack_sdk.signature import SignatureVerifier
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nodbot.bot.http.auth import ApiError
from nodbot.bot.json_shape import LONE_SURROGATE, MAX_JSON_DEPTH, shape_problem

__all__ = [
    "DECIDE_BODY",
    "DEFAULT_BODY",
    "EMAIL_BODY",
    "EMAIL_DEPTH",
    "EMAIL_HEADERS",
    "EMAIL_HEADERS_TOTAL",
    "EMAIL_HEADER_BYTES",
    "EMAIL_HEADER_COMMENTS",
    "EMAIL_PARTS",
    "MAX_JSON_DEPTH",
    "RUNS_BODY",
    "SLACK_BODY",
    "BodyLimit",
    "SlackSignature",
    "loads",
]

KB = 1024
DECIDE_BODY = 64 * KB
RUNS_BODY = 256 * KB
SLACK_BODY = 1024 * KB
EMAIL_BODY = 1024 * KB
INBOX_BODY = 2048 * KB
DEFAULT_BODY = 64 * KB

_LIMITS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"/approvals/[^/]+/decide"), DECIDE_BODY),
    (re.compile(r"/runs"), RUNS_BODY),
    (re.compile(r"/slack/events"), SLACK_BODY),
    (re.compile(r"/email/inbound"), EMAIL_BODY),
    (re.compile(r"/inbox(/.*)?"), INBOX_BODY),
)


def body_limit(path: str) -> int:
    """The most bytes a request body of `path` may have."""
    for pattern, limit in _LIMITS:
        if pattern.fullmatch(path):
            return limit
    return DEFAULT_BODY


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"the body is larger than {limit} bytes; nothing was done", details={"limit": limit}
    )


class BodyLimit:
    """ASGI middleware: refuses a body over its route's limit (`body_limit`) with 413, from
    its `Content-Length` before reading anything, or as soon as the bytes read pass it (the
    `ApiError` is raised in the reading route and answered by the app's handlers)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope["path"])
        declared = _content_length(scope)
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            error = (
                _too_large(limit)
                if declared.isdigit()
                else ApiError(400, "the Content-Length header is not a number")
            )
            body = {"error": error.message, "details": error.details}
            response = JSONResponse(body, status_code=error.status, headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(limit)
            return message

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return str(value.decode("latin-1").strip())
    return None


class SlackSignature:
    """Checks Slack's `X-Slack-Signature` (v0, HMAC-SHA256 with the signing secret) over the
    raw body and `X-Slack-Request-Timestamp` (within 5 minutes), before anything parses the
    body."""

    def __init__(self, signing_secret: str) -> None:
        self._verifier = SignatureVerifier(signing_secret)

    async def check(self, request: Request) -> None:
        """Raises `ApiError` 401 for a request Slack did not sign, 413 for one too large."""
        timestamp = request.headers.get("x-slack-request-timestamp")
        signature = request.headers.get("x-slack-signature")
        if not timestamp or not signature or not timestamp.strip().isdigit():
            raise ApiError(401, "the request is not signed by Slack")
        body = await request.body()  # at most SLACK_BODY bytes: BodyLimit stops the rest
        if not self._verifier.is_valid(body, timestamp.strip(), signature):
            raise ApiError(401, "the request's Slack signature is not valid or has expired")


def loads(raw: bytes) -> Any:
    """`raw` parsed as JSON: UTF-8, no NaN or Infinity, no key given twice, nested at most
    `MAX_JSON_DEPTH` levels, no lone surrogate in any string. Raises `ApiError` 422 saying
    what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("the body is not valid UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise _invalid(f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except _Refused as exc:
        raise _invalid(str(exc)) from None
    except ValueError:
        raise _invalid("the body is not valid JSON") from None
    _check_shape(data)
    return data


class _Refused(ValueError):
    pass


def _invalid(message: str) -> ApiError:
    return ApiError(422, message, details={})


def _no_constant(name: str) -> Any:
    raise _Refused(f"the body is not valid JSON: {name} is not a JSON number")


def _no_duplicates(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _Refused(f"the body is not valid JSON: the key {key[:100]!r} is given twice")
        found[key] = value
    return found


def _check_shape(data: Any) -> None:
    problem = shape_problem(data)
    if problem == LONE_SURROGATE:
        raise _invalid(f"the body is not valid JSON: {problem}")
    if problem is not None:
        raise _invalid(f"the body {problem}")


# --- inbound email: what one message may hold (`email.reading.parse`) ----------------------

EMAIL_PARTS = 100
"""The most MIME parts of one inbound email, the message itself counted: a reply has one to
a few. Parsing stops at the one past it, so a message of 25,000 tiny parts (879 KB) costs
what its first hundred do, and what reads it later walks at most this many."""
EMAIL_DEPTH = 10
"""How deeply the MIME parts of one inbound email may nest (a multipart or `message/rfc822`
within another is one level down). The parser descends one generator per level, and a few
thousand levels raise `RecursionError`; a reply needs two or three."""
EMAIL_HEADERS = 200
"""The most header fields of the message, or of any one of its parts. A reply that crossed
many relays has 30 to 80 at the top; parts have a handful."""
EMAIL_HEADERS_TOTAL = 1000
"""The most header fields of the message and all its parts together."""
EMAIL_HEADER_BYTES = 16 * KB
"""The most bytes of the header fields the bot parses (addresses, Subject, Message-IDs,
Authentication-Results, `Content-*`: `email.reading.PARSED_FIELDS`), summed over the message
and its parts; a reply has 1 to 5 KB of them. The standard library parses an address list
at about 5 ms of CPU per KB, so 16 KB of addresses take 90 ms to read (900 KB took 10 s);
fields the bot never reads (Received, DKIM-Signature, ARC-*, X-*) are not counted."""
EMAIL_HEADER_COMMENTS = 50
"""The most comments (opening parentheses) in one header field the bot parses: comments nest,
and the standard library parses nested ones recursively (about 450 levels raise
`RecursionError`)."""
