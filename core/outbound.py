"""The HTTP client nodbot sends with: webhooks, Slack's Web API, chat models."""

from __future__ import annotations

import aiohttp

__all__ = ["outbound_session"]


def outbound_session(*, limit: int = 100) -> aiohttp.ClientSession:
    """A new aiohttp session (make it in the running event loop) of at most `limit`
    connections at once, that keeps no cookies: what a receiver sets is never sent back, to
    it or to another service on its host, so each request carries only what nodbot wrote."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit), cookie_jar=aiohttp.DummyCookieJar()
    )
