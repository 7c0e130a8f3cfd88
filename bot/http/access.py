"""One log line per HTTP request: `request` with its method, path, status and duration; and
one count of it by route template, method and status (`nodbot_http_requests_total`).

The path is logged without its query string, and no header is: a sign-in link carries its
token in the query (`/inbox/login?token=...`), and requests carry bearer tokens and session
cookies in their headers. Probes (`/healthz`, `/readyz`, `/metrics`, asked every few seconds by
an orchestrator or a scraper) are logged at debug, unless they fail with a 5xx.
"""

from __future__ import annotations

import logging
import time

from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nodbot.bot.metrics import METRICS

__all__ = ["AccessLog", "route_template"]

log = logging.getLogger(__name__)

PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths asked by machines every few seconds: their lines are debug ones."""


class AccessLog:
    """Pure ASGI middleware: it only watches the response start go by, so streamed and
    long-polled responses (`GET /runs/{id}?wait`) are not buffered. A request whose handler
    raised, or whose client went away before an answer, is logged with status 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            METRICS.request(route_template(scope), scope["method"], status)
            quiet = scope["path"] in PROBES and status < 500
            log.log(
                logging.DEBUG if quiet else logging.INFO,
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                },
            )


UNMATCHED = "unmatched"
"""The route of a request no route took (a 404 for any path): paths are not labels."""


def route_template(scope: Scope) -> str:
    """The template of the route that took the request (`/approvals/{approval_id}`), as the
    router left it in the scope; a mount's path with `/{path}` after it when no route of its
    own took it."""
    route: BaseRoute | None = scope.get("route")
    if isinstance(route, Route):
        return route.path
    if isinstance(route, Mount):
        return f"{route.path}/{{path}}"
    return UNMATCHED
