"""The Bot Framework's two kinds of token: the one each inbound activity carries (checked
here), and the bot's own, which it sends to the connector (fetched and kept here).

Inbound, as the Bot Framework requires of a bot: the `Authorization: Bearer <JWT>` header,
an RS256 token signed by one of the keys the Bot Framework publishes (its OpenID metadata
names `jwks_uri`); its issuer `https://api.botframework.com`; its audience the bot's app id;
not expired (with `LEEWAY` for clocks apart); its `serviceUrl` claim the activity's own; and
the key endorsed for the activity's channel (`msteams`) when the key lists endorsements.
The metadata and the keys are fetched through the bot's one outbound session and kept: an
unknown `kid` fetches them again, at most once per `REFETCH_EVERY` (a failed fetch is tried
again after `RETRY_FAILED`), so a flood of forged tokens cannot make the bot hammer the Bot
Framework; keys older than `KEYS_TTL` that cannot be fetched again are not used. A check
that cannot be made (no header, the keys unreachable) refuses (`Unverified`), as a failed
one does.

Outbound, the bot's token comes from the token endpoint (client credentials, scope
`https://api.botframework.com/.default`) and is kept until shortly before it expires.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import jwt
from jwt.algorithms import RSAAlgorithm

__all__ = [
    "LEEWAY",
    "BotToken",
    "TokenCheck",
    "Unverified",
]

LEEWAY = 300
"""Seconds a token's `exp` and `nbf` may be off (the Bot Framework allows five minutes)."""
REFETCH_EVERY = 60.0
"""Seconds at least between two fetches of the keys made by tokens naming an unknown key."""
RETRY_FAILED = 5.0
"""Seconds at least between two fetches of the keys after one that failed."""
KEYS_TTL = 24 * 3600.0
"""How long fetched keys are used before they are fetched again (the Bot Framework asks
bots to refresh them daily)."""
MAX_TOKEN = 8_192
"""The longest `Authorization` header looked at."""
MAX_METADATA = 1_000_000
"""The most bytes of the metadata or the keys read."""
TIMEOUT = aiohttp.ClientTimeout(total=10)
SCOPE = "https://api.botframework.com/.default"


class Unverified(Exception):
    """An inbound request that is not shown to come from the Bot Framework (or cannot be
    checked now): refused with 401."""


class TokenCheck:
    """Checks the Bot Framework's tokens for the bot `app_id` (see the module)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        app_id: str,
        openid_url: str,
        issuer: str = "https://api.botframework.com",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session = session
        self.app_id = app_id
        self.openid_url = openid_url
        self.issuer = issuer
        self._clock = clock
        self._keys: dict[str, tuple[Any, frozenset[str] | None]] = {}
        self._fetched_at: float | None = None
        self._next_fetch = float("-inf")
        """When the keys may be fetched again."""
        self._lock = asyncio.Lock()

    async def claims(self, header: str | None, activity: Mapping[str, Any]) -> dict[str, Any]:
        """The verified claims of the token in `header` (an `Authorization` value) for
        `activity`. Raises `Unverified`."""
        if not header or len(header) > MAX_TOKEN or not header.startswith("Bearer "):
            raise Unverified("no Bot Framework token (Authorization: Bearer ...)")
        token = header.removeprefix("Bearer ").strip()
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise Unverified(f"the token is not a JWT: {exc}") from None
        if not isinstance(kid, str) or not kid:
            raise Unverified("the token names no signing key")
        key, endorsements = await self._key(kid)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=["RS256"],
                audience=self.app_id,
                issuer=self.issuer,
                leeway=LEEWAY,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise Unverified(f"the token does not verify: {exc}") from None
        channel = str(activity.get("channelId") or "")
        if endorsements is not None and channel not in endorsements:
            raise Unverified(f"the signing key is not endorsed for channel {channel!r}")
        service_url = activity.get("serviceUrl")
        if not isinstance(service_url, str) or claims.get("serviceUrl") != service_url:
            raise Unverified("the token's serviceUrl is not the activity's")
        return claims

    async def _key(self, kid: str) -> tuple[Any, frozenset[str] | None]:
        """The public key `kid` and the channels it is endorsed for (None: any). The keys
        are fetched when there are none less than `KEYS_TTL` old, or `kid` is not among
        them: at most once per `REFETCH_EVERY` (`RETRY_FAILED` after a failed fetch), so
        that forged tokens cannot make the bot hammer the Bot Framework. Raises
        `Unverified` when `kid` is not a key fetched less than `KEYS_TTL` ago."""
        async with self._lock:
            now = self._clock()
            fetched = self._fetched_at
            fresh = fetched is not None and now - fetched <= KEYS_TTL
            if (not fresh or kid not in self._keys) and now >= self._next_fetch:
                try:
                    await self._fetch()
                    self._next_fetch = now + REFETCH_EVERY
                except Unverified:
                    self._next_fetch = now + RETRY_FAILED
                    raise
                fresh = True
            found = self._keys.get(kid) if fresh else None
        if not fresh:
            raise Unverified("the Bot Framework's keys could not be fetched lately")
        if found is None:
            raise Unverified(f"the token's key {kid!r} is not one the Bot Framework publishes")
        return found

    async def _fetch(self) -> None:
        try:
            metadata = await self._json(self.openid_url)
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
                raise Unverified("the OpenID metadata names no jwks_uri")
            keys = await self._json(jwks_uri)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise Unverified(f"the Bot Framework's keys could not be fetched: {exc!r}") from None
        found: dict[str, tuple[Any, frozenset[str] | None]] = {}
        for entry in keys.get("keys") or []:
            if not isinstance(entry, dict) or entry.get("kty") != "RSA":
                continue
            try:
                key = RSAAlgorithm.from_jwk(json.dumps(entry))
            except (jwt.PyJWTError, ValueError, TypeError, KeyError):
                continue
            endorsed = entry.get("endorsements")
            channels = frozenset(str(e) for e in endorsed) if isinstance(endorsed, list) else None
            found[str(entry.get("kid"))] = (key, channels)
        self._keys = found
        self._fetched_at = self._clock()

    async def _json(self, url: str) -> dict[str, Any]:
        async with self.session.get(url, timeout=TIMEOUT) as response:
            if response.status != 200:
                raise ValueError(f"{url} answered HTTP {response.status}")
            body = await response.content.read(MAX_METADATA + 1)
        if len(body) > MAX_METADATA:
            raise ValueError(f"{url} answered more than {MAX_METADATA} bytes")
        found = json.loads(body)
        if not isinstance(found, dict):
            raise ValueError(f"{url} answered JSON that is not an object")
        return found


class BotToken:
    """The bot's own token for the connector, from `token_url` (client credentials), kept
    until `MARGIN` seconds before it expires."""

    MARGIN = 300.0

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        app_id: str,
        password: str,
        token_url: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.app_id = app_id
        self._password = password
        self.token_url = token_url
        self._clock = clock
        self._token: tuple[str, float] | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> str:
        """The token. Raises `aiohttp.ClientError` or `ValueError` when none can be had."""
        async with self._lock:
            now = self._clock()
            if self._token is not None and self._token[1] > now:
                return self._token[0]
            form = {
                "grant_type": "client_credentials",
                "client_id": self.app_id,
                "client_secret": self._password,
                "scope": SCOPE,
            }
            async with self.session.post(self.token_url, data=form, timeout=TIMEOUT) as answer:
                if answer.status != 200:
                    raise ValueError(f"the token endpoint answered HTTP {answer.status}")
                found = await answer.json(content_type=None)
            if not isinstance(found, dict):
                raise ValueError("the token endpoint answered no JSON object")
            token, expires = found.get("access_token"), found.get("expires_in")
            if not isinstance(token, str) or not isinstance(expires, int | float):
                raise ValueError("the token endpoint answered no access_token")
            self._token = (token, now + max(0.0, float(expires) - self.MARGIN))
            return token

    def forget(self) -> None:
        """Drop the kept token (the connector refused it): the next `get` fetches one."""
        self._token = None
