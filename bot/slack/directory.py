"""Who is who in Slack, asked of the Web API and kept for a while: the members of user groups
and channels, the names of channels, users by email address and the email address of a
user."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

__all__ = ["Directory"]

T = TypeVar("T")


class Directory:
    """Cached lookups (for `ttl` seconds) of one workspace."""

    def __init__(self, client: AsyncWebClient, *, ttl: float = 300.0) -> None:
        self.client = client
        self.ttl = ttl
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    async def _cached(self, key: tuple[str, str], ask: Callable[[], Awaitable[T]]) -> T:
        now = time.monotonic()
        found = self._cache.get(key)
        if found is not None and found[0] > now:
            value: T = found[1]
            return value
        value = await ask()
        self._cache[key] = (now + self.ttl, value)
        return value

    async def group_members(self, group_id: str) -> list[str]:
        """The user ids of a user group."""

        async def ask() -> list[str]:
            answer = await self.client.usergroups_users_list(usergroup=group_id)
            return [str(user) for user in answer.get("users") or []]

        return await self._cached(("group", group_id), ask)

    async def channel_members(self, channel: str) -> list[str]:
        """The user ids of a channel's members (every page)."""

        async def ask() -> list[str]:
            members: list[str] = []
            cursor = None
            while True:
                answer = await self.client.conversations_members(
                    channel=channel, cursor=cursor, limit=1000
                )
                members += [str(user) for user in answer.get("members") or []]
                cursor = (answer.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    return members

        return await self._cached(("channel", channel), ask)

    async def channel_name(self, channel: str) -> str | None:
        """The name (without `#`) of a channel given by id; None for a conversation without
        one (a direct message). Raises `SlackApiError` (`channel_not_found` for a private
        channel the bot is not in)."""

        async def ask() -> str | None:
            answer = await self.client.conversations_info(channel=channel)
            name = (answer.get("channel") or {}).get("name")
            return str(name) if name else None

        return await self._cached(("channel name", channel), ask)

    async def user_by_email(self, email: str) -> str:
        """The user id of an email address. Raises `SlackApiError` (`users_not_found`)."""

        async def ask() -> str:
            answer = await self.client.users_lookupByEmail(email=email)
            return str(answer["user"]["id"])

        return await self._cached(("email", email.lower()), ask)

    async def email_of(self, user_id: str) -> str | None:
        """The email address of a user, when Slack shares it (scope users:read.email)."""

        async def ask() -> str | None:
            answer = await self.client.users_info(user=user_id)
            email = ((answer.get("user") or {}).get("profile") or {}).get("email")
            return str(email).lower() if email else None

        return await self._cached(("user", user_id), ask)
