"""The Bot Framework connector's REST API, as far as the Teams channel uses it: post an
activity to a conversation, reply to one (a reminder or an escalation under a review's
card), replace one, and read a member (their address), each with the bot's own token
(`BotToken`) through the bot's one outbound session."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import aiohttp

from nodbot.bot.outbox import DeliveryError, retry_after
from nodbot.bot.teams.auth import TIMEOUT, BotToken

__all__ = ["CARD", "Connector", "ConnectorError", "Member", "card_activity"]

CARD = "application/vnd.microsoft.card.adaptive"
"""The content type of an Adaptive Card attachment."""
MAX_ANSWER = 1_000_000
"""The most bytes of a connector's answer read."""
MAX_MEMBERS = 10_000
"""The most members whose addresses are kept at once."""


class ConnectorError(DeliveryError):
    """The connector refused or could not be reached (a `DeliveryError` for the outbox)."""


def card_activity(card: dict[str, Any]) -> dict[str, Any]:
    """A message activity carrying the Adaptive Card `card`."""
    return {"type": "message", "attachments": [{"contentType": CARD, "content": card}]}


class Member:
    """A conversation member as the connector says them."""

    def __init__(self, found: dict[str, Any]) -> None:
        self.id = str(found.get("id") or "")
        self.aad_object_id = str(found.get("aadObjectId") or "") or None
        email = found.get("email") or found.get("userPrincipalName")
        self.email = str(email).strip().lower() if isinstance(email, str) and "@" in email else None


class Connector:
    """Talks to the connectors of the activities' `serviceUrl`s."""

    def __init__(self, session: aiohttp.ClientSession, token: BotToken, *, ttl: float) -> None:
        self.session = session
        self.token = token
        self.ttl = ttl
        self._members: dict[tuple[str, str], tuple[float, Member]] = {}

    async def post(self, service_url: str, conversation: str, activity: dict[str, Any]) -> str:
        """Post `activity`; its id. Raises `ConnectorError`."""
        url = f"{_base(service_url)}/v3/conversations/{quote(conversation, safe='')}/activities"
        found = await self._call("POST", url, activity)
        posted = found.get("id")
        if not isinstance(posted, str) or not posted:
            raise ConnectorError("the connector answered a post without the activity's id")
        return posted

    async def reply(
        self, service_url: str, conversation: str, activity_id: str, activity: dict[str, Any]
    ) -> str:
        """Post `activity` as a reply to activity `activity_id` (`replyToId`); the reply's id.
        Raises `ConnectorError`."""
        url = (
            f"{_base(service_url)}/v3/conversations/{quote(conversation, safe='')}"
            f"/activities/{quote(activity_id, safe='')}"
        )
        found = await self._call("POST", url, {**activity, "replyToId": activity_id})
        posted = found.get("id")
        if not isinstance(posted, str) or not posted:
            raise ConnectorError("the connector answered a reply without the activity's id")
        return posted

    async def update(
        self, service_url: str, conversation: str, activity_id: str, activity: dict[str, Any]
    ) -> None:
        """Replace activity `activity_id` with `activity`. Raises `ConnectorError`."""
        url = (
            f"{_base(service_url)}/v3/conversations/{quote(conversation, safe='')}"
            f"/activities/{quote(activity_id, safe='')}"
        )
        await self._call("PUT", url, {**activity, "id": activity_id})

    async def member(self, service_url: str, conversation: str, user: str) -> Member:
        """Member `user` of `conversation`, kept for `ttl` seconds. Raises
        `ConnectorError`."""
        key = (conversation, user)
        now = time.monotonic()
        kept = self._members.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        url = (
            f"{_base(service_url)}/v3/conversations/{quote(conversation, safe='')}"
            f"/members/{quote(user, safe='')}"
        )
        found = Member(await self._call("GET", url, None))
        if len(self._members) >= MAX_MEMBERS:
            self._members.clear()  # bounded: looked up again as they act
        self._members[key] = (now + self.ttl, found)
        return found

    async def _call(self, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            token = await self.token.get()
            headers = {"Authorization": f"Bearer {token}"}
            data = None
            if body is not None:
                # UTF-8, not \u escapes: a card's size is counted as sent (`cards.size`).
                data = json.dumps(body, ensure_ascii=False).encode()
                headers["Content-Type"] = "application/json; charset=utf-8"
            async with self.session.request(
                method, url, data=data, headers=headers, timeout=TIMEOUT
            ) as answer:
                raw = await answer.content.read(MAX_ANSWER + 1)
                status, wait = answer.status, retry_after(answer.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ConnectorError(f"Teams could not be reached: {type(exc).__name__}") from exc
        if status == 401:
            self.token.forget()  # the next attempt asks for a new one
        if status == 429 or status >= 500:
            raise ConnectorError(f"Teams: HTTP {status}", retry_after=wait)
        if status >= 400:
            # 404 (no such conversation or activity), 403 (the bot was removed): trying
            # again will not change it.
            raise ConnectorError(f"Teams: HTTP {status}", permanent=status in (400, 403, 404))
        if len(raw) > MAX_ANSWER:
            raise ConnectorError("Teams answered too much")
        try:
            found = json.loads(raw) if raw.strip() else {}
        except ValueError:
            found = {}
        return found if isinstance(found, dict) else {}


def _base(service_url: str) -> str:
    return service_url.rstrip("/")
