"""One person, many handles: who a Slack user id, an email address, an API token's name or a
web sign-in stands for.

Every check that compares reviewers (self-approval, N-of-M distinctness, reviewer lists,
user groups, channels, escalation) compares `Person`s, never the handles themselves:

- `people:` in `nodbot.yml` names people with several handles explicitly;
- a Slack user id is linked to the email address Slack holds for it (`users.info`), and an
  email address to its Slack user (`users.lookupByEmail`), when the bot has Slack; the
  answers are cached for `slack.cache_ttl`;
- email addresses and names compare case-insensitively.

A person's `key` is `person:<name>` for an entry of `people:`, else `email:<address>` when an
address is known (so a Slack user and the address Slack holds for them are one person), else
`slack:<user id>`, `discord:<user id>` (a Discord user without an entry: a handle
`discord:<id>` in `people:` joins them to the person) or `name:<handle>`. A lookup that
fails raises `IdentityUnavailable`: the caller refuses, since who acted cannot be told.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import ClientError
from slack_sdk.errors import SlackApiError

from nodbot.bot.config.values import normalize_handle
from nodbot.bot.slack.directory import Directory

__all__ = ["IdentityUnavailable", "People", "Person", "normalize_handle"]

_SLACK_USER = re.compile(r"[UW][A-Z0-9]{8,}")
_DISCORD_USER = re.compile(r"discord:[0-9]{5,25}")
"""A Discord user, as the Discord channel names a clicker; a `people:` entry names them so
(Discord ids are not addresses: an entry is how one is a reviewer)."""
_NOT_FOUND = frozenset({"users_not_found", "user_not_found"})
"""Slack's answers that settle a lookup: there is no such user (not a failure)."""


class IdentityUnavailable(Exception):
    """Who a handle stands for cannot be told now (a Slack lookup failed or timed out)."""

    def __init__(self, handle: str, why: str) -> None:
        super().__init__(f"could not check who {handle} is ({why}); try again in a moment")
        self.handle = handle
        self.why = why


def _is_email(handle: str) -> bool:
    return "@" in handle


@dataclass(frozen=True)
class Person:
    """Whom one or more handles stand for."""

    key: str
    """What persons are compared by: `person:<name>`, `email:<address>`, `slack:<id>` or
    `name:<handle>`."""
    handles: frozenset[str]
    """Every handle known for them, normalized (`normalize_handle`)."""

    @property
    def emails(self) -> frozenset[str]:
        """Their email addresses."""
        return frozenset(h for h in self.handles if _is_email(h))

    @property
    def slack_ids(self) -> frozenset[str]:
        """Their Slack user ids, as far as known without asking Slack."""
        return frozenset(h for h in self.handles if _SLACK_USER.fullmatch(h))


class People:
    """Resolves handles to persons, from `people:` entries and, with a Slack `directory`,
    from Slack's users and their addresses."""

    def __init__(
        self,
        entries: Mapping[str, Sequence[str]] | None = None,
        *,
        directory: Directory | None = None,
        ttl: float = 300.0,
    ) -> None:
        self.directory = directory
        self.ttl = ttl
        self._entry_of: dict[str, str] = {}
        self._handles: dict[str, frozenset[str]] = {}
        for name, handles in (entries or {}).items():
            normalized = frozenset(normalize_handle(h) for h in handles)
            self._handles[name] = normalized
            for handle in normalized:
                self._entry_of[handle] = name
        # Looking an address up in Slack can only change who it is when an entry names a
        # Slack user: otherwise the user's key is their address already.
        self._entries_name_slack_users = any(_SLACK_USER.fullmatch(h) for h in self._entry_of)
        self._cache: dict[str, tuple[float, Person]] = {}

    async def person(self, handle: str) -> Person:
        """The person `handle` stands for. Raises `IdentityUnavailable`."""
        normalized = normalize_handle(handle)
        now = time.monotonic()
        cached = self._cache.get(normalized)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = await self._resolve(normalized)
        self._cache[normalized] = (now + self.ttl, found)
        return found

    async def same(self, first: str, second: str) -> bool:
        """Whether two handles stand for one person. Raises `IdentityUnavailable`."""
        return (await self.person(first)).key == (await self.person(second)).key

    async def slack_ids(self, person: Person) -> frozenset[str]:
        """Every Slack user id of `person`, asking Slack for those of their addresses.
        Raises `IdentityUnavailable`."""
        found = set(person.slack_ids)
        if self.directory is not None:
            for email in sorted(person.emails):
                user = await self._user_by_email(email)
                if user is not None:
                    found.add(user)
        return frozenset(found)

    async def _resolve(self, handle: str) -> Person:
        handles = self._with_entries({handle})
        if self.directory is not None:
            for user_id in sorted(h for h in handles if _SLACK_USER.fullmatch(h)):
                address = await self._email_of(user_id)
                if address is not None:
                    handles.add(address)
            if self._entries_name_slack_users:
                for email in sorted(h for h in handles if _is_email(h)):
                    user = await self._user_by_email(email)
                    if user is not None:
                        handles.add(user)
            handles = self._with_entries(handles)
        return Person(key=self._key(handle, handles), handles=frozenset(handles))

    def _with_entries(self, handles: Iterable[str]) -> set[str]:
        """`handles` and every handle of the `people:` entries they appear in."""
        found = set(handles)
        for handle in list(found):
            name = self._entry_of.get(handle)
            if name is not None:
                found |= self._handles[name]
        return found

    def _key(self, handle: str, handles: set[str]) -> str:
        names = sorted({self._entry_of[h] for h in handles if h in self._entry_of})
        if names:
            return f"person:{names[0]}"
        emails = sorted(h for h in handles if _is_email(h))
        if emails:
            return f"email:{emails[0]}"
        if _SLACK_USER.fullmatch(handle):
            return f"slack:{handle}"
        if _DISCORD_USER.fullmatch(handle):
            return handle  # `discord:<user id>`: an id, not a name anyone may type
        return f"name:{handle}"

    async def _email_of(self, user: str) -> str | None:
        assert self.directory is not None
        try:
            return await self.directory.email_of(user)
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "error")
            if error in _NOT_FOUND:
                return None
            raise IdentityUnavailable(user, f"Slack answered users.info with {error}") from None
        except (TimeoutError, ClientError, OSError) as exc:
            raise IdentityUnavailable(user, f"Slack could not be reached: {exc!r}") from None

    async def _user_by_email(self, email: str) -> str | None:
        assert self.directory is not None
        try:
            return await self.directory.user_by_email(email)
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "error")
            if error in _NOT_FOUND:
                return None
            why = f"Slack answered users.lookupByEmail with {error}"
            raise IdentityUnavailable(email, why) from None
        except (TimeoutError, ClientError, OSError) as exc:
            raise IdentityUnavailable(email, f"Slack could not be reached: {exc!r}") from None
