"""Discord's REST API, the few calls the channel makes, over the bot's one outbound session.

Messages are posted and edited with the bot's token (`Authorization: Bot <token>`); what
follows a click (a refusal told to the clicker alone) goes to the interaction's webhook,
which its token authorizes. An answer other than 2xx raises `DiscordApiError` with Discord's
code and, for a rate limit (429), how long to wait.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

__all__ = ["DEFAULT_API_URL", "DiscordApi", "DiscordApiError"]

DEFAULT_API_URL = "https://discord.com/api/v10"
TIMEOUT = aiohttp.ClientTimeout(total=15)
"""How long one call may take before it counts as failed (the outbox tries again)."""
EPHEMERAL = 64
"""The message flag of a message only the clicker sees."""
NO_MENTIONS: dict[str, Any] = {"parse": []}
"""Nothing in a message the bot posts pings anyone (`@everyone` in an argument stays text)."""


class DiscordApiError(Exception):
    """Discord answered a call with an error."""

    def __init__(self, status: int, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"Discord answered {status}: {message}")
        self.status = status
        self.retry_after = retry_after

    @property
    def permanent(self) -> bool:
        """Whether trying again cannot help (a missing channel or access, a refused body)."""
        return self.status in (400, 401, 403, 404)


class DiscordApi:
    """The calls of the Discord channel (see the module)."""

    def __init__(
        self, session: aiohttp.ClientSession, *, token: str, application_id: str, base: str
    ) -> None:
        self._session = session
        self._token = token
        self.application_id = application_id
        self.base = base.rstrip("/")

    async def post_message(self, channel: str, body: dict[str, Any]) -> dict[str, Any]:
        """Post a message to `channel`; Discord's message object."""
        found = await self._call("POST", f"/channels/{channel}/messages", body, bot=True)
        if not isinstance(found, dict) or not isinstance(found.get("id"), str):
            raise DiscordApiError(502, "the answer to a post is not a message")
        return found

    async def edit_message(self, channel: str, message: str, body: dict[str, Any]) -> None:
        """Replace the content and components of a message the bot posted."""
        await self._call("PATCH", f"/channels/{channel}/messages/{message}", body, bot=True)

    async def recent_messages(self, channel: str, *, limit: int = 50) -> list[dict[str, Any]]:
        """The channel's latest messages, newest first."""
        found = await self._call(
            "GET", f"/channels/{channel}/messages?limit={limit}", None, bot=True
        )
        return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []

    async def follow_up(self, token: str, content: str) -> None:
        """A message to the clicker alone, after the interaction of `token` was answered."""
        body = {"content": content, "flags": EPHEMERAL, "allowed_mentions": NO_MENTIONS}
        await self._call("POST", f"/webhooks/{self.application_id}/{token}", body, bot=False)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None, *, bot: bool) -> Any:
        headers = {"User-Agent": "DiscordBot (https://github.com/nodbot, 1)"}
        if bot:
            headers["Authorization"] = f"Bot {self._token}"
        async with self._session.request(
            method, self.base + path, json=body, headers=headers, timeout=TIMEOUT
        ) as answer:
            text = await answer.text()
            if answer.status == 204:
                return None
            try:
                found = json.loads(text) if text else None
            except ValueError:
                found = None
            if 200 <= answer.status < 300:
                return found
            message = str(found.get("message")) if isinstance(found, dict) else text[:200]
            wait = found.get("retry_after") if isinstance(found, dict) else None
            if wait is None:
                wait = answer.headers.get("Retry-After")
            raise DiscordApiError(answer.status, message, retry_after=_seconds(wait))


def _seconds(value: object) -> float | None:
    try:
        return None if value is None else max(0.0, float(str(value)))
    except ValueError:
        return None
