"""Signed tokens of the web inbox: sign-in links, review links, session cookies and form
(CSRF) tokens.

A token is `<payload>.<signature>`: the payload is base64url JSON (`{"p": principal,
"exp": unix seconds, ...}`) and the signature HMAC-SHA256 over the token's purpose and the
payload, so a link cannot be used as a session cookie or the other way round. A session
also carries its id (`sid`) and when it was made (`iat`). Whoever holds the secret can check
a token, which is why several bot replicas that share `web.secret` accept each other's links
and sessions; what ends a session before its expiry (a sign-out, `nodbot sessions revoke`) is
kept in the store instead, where every replica looks for it (`bot.web.app`).

A review link (purpose `review`, in the review emails) names a reviewer (`p`), one approval
(`a`), the decision its button offers (`act`: approve, edit or deny) and when it was made
(`iat`); it expires when the email's reply token does. It signs its reviewer in for that
approval only: the session it makes carries the approval id (`only`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode

from nodbot.bot.config import Config, ServerConfig, WebConfig
from nodbot.core import NodbotError

__all__ = [
    "LOGIN_PATH",
    "REVIEW_PATH",
    "ReviewLink",
    "Session",
    "SignInLinkError",
    "Signer",
    "TokenError",
    "base_url",
    "link_for",
    "review_link",
    "sign_in_link",
]

LOGIN_PATH = "/inbox/login"
REVIEW_PATH = "/inbox/review"

Purpose = Literal["link", "session", "review"]
ReviewAction = Literal["approve", "edit", "deny", "respond"]

_PRINCIPAL = re.compile(r"[A-Za-z0-9_.+@-]+")
"""The characters of a principal, as for API token names (bot.config)."""
_APPROVAL_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
_REVIEW_ACTIONS: tuple[ReviewAction, ...] = ("approve", "edit", "deny", "respond")


class SignInLinkError(NodbotError):
    """A sign-in link cannot be made: no secret to sign it with, or a malformed principal."""

    kind = "sign-in-link"


class TokenError(Exception):
    """A link or session token that is not accepted: `expired`, or `invalid` (altered, cut
    short, or signed with another secret)."""

    def __init__(self, reason: Literal["invalid", "expired"]) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Session:
    """A signed-in reviewer: who, which session (the CSRF tokens derive from it), until when,
    and since when."""

    principal: str
    session_id: str
    expires: int
    issued_at: float | None = None
    """When it was made (unix seconds), so that revoking every session of a principal made
    until now leaves the later ones; None in cookies made before sessions carried it, which
    every such revocation ends."""
    only: str | None = None
    """The one approval this session may see and decide (a review link's), None for the whole
    inbox."""


@dataclass(frozen=True)
class ReviewLink:
    """What a review link says: who it signs in, for which approval, the decision it offers,
    when it was made and until when it works (unix seconds)."""

    principal: str
    approval_id: str
    action: ReviewAction
    issued_at: float
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and checks the inbox's tokens with one secret. Every comparison of a signature
    is made in constant time."""

    def __init__(self, secret: str | bytes, *, clock: Callable[[], float] = time.time) -> None:
        self._key = secret.encode() if isinstance(secret, str) else secret
        self._clock = clock

    def _mac(self, purpose: str, payload: str) -> str:
        message = f"nodbot-web.{purpose}.{payload}".encode()
        return _b64(hmac.new(self._key, message, hashlib.sha256).digest())

    def sign(self, purpose: Purpose, claims: dict[str, Any], ttl: int) -> str:
        """A token of `purpose` carrying `claims`, valid for `ttl` seconds from now."""
        return self.sign_until(purpose, claims, int(self._clock()) + ttl)

    def sign_until(self, purpose: Purpose, claims: dict[str, Any], expires: int) -> str:
        """A token of `purpose` carrying `claims`, valid until `expires` (unix seconds)."""
        body = {**claims, "exp": expires}
        payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        return f"{payload}.{self._mac(purpose, payload)}"

    def verify(self, purpose: Purpose, token: str) -> dict[str, Any]:
        """The claims of a token of `purpose`. Raises `TokenError`."""
        payload, dot, signature = token.partition(".")
        expected = self._mac(purpose, payload)
        if not dot or not hmac.compare_digest(
            expected.encode(), signature.encode("utf-8", "replace")
        ):
            raise TokenError("invalid")
        try:
            claims = json.loads(_unb64(payload))
        except (ValueError, binascii.Error):  # signed by us, so never; still fail closed
            raise TokenError("invalid") from None
        if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int):
            raise TokenError("invalid")
        if claims["exp"] <= self._clock():
            raise TokenError("expired")
        return claims

    def link_token(self, principal: str, ttl: int) -> str:
        """The token of a sign-in link for `principal`."""
        return self.sign("link", {"p": principal}, ttl)

    def principal_of_link(self, token: str) -> str:
        """Who a sign-in link's token is for. Raises `TokenError`."""
        principal = self.verify("link", token).get("p")
        if not isinstance(principal, str) or not _PRINCIPAL.fullmatch(principal):
            raise TokenError("invalid")
        return principal

    def review_token(
        self, principal: str, approval_id: str, action: ReviewAction, *, expires: int
    ) -> str:
        """The token of a review link: `principal` may see and decide `approval_id` (the
        link offers `action`) until `expires` (unix seconds)."""
        claims = {"p": principal, "a": approval_id, "act": action, "iat": round(self._clock(), 6)}
        return self.sign_until("review", claims, expires)

    def review_of(self, token: str) -> ReviewLink:
        """What a review link's token says. Raises `TokenError`."""
        claims = self.verify("review", token)
        principal, approval_id = claims.get("p"), claims.get("a")
        action, issued = claims.get("act"), claims.get("iat")
        if not isinstance(principal, str) or not _PRINCIPAL.fullmatch(principal):
            raise TokenError("invalid")
        if not isinstance(approval_id, str) or not _APPROVAL_ID.fullmatch(approval_id):
            raise TokenError("invalid")
        if isinstance(issued, bool) or not isinstance(issued, int | float):
            raise TokenError("invalid")
        for known in _REVIEW_ACTIONS:
            if action == known:
                return ReviewLink(principal, approval_id, known, float(issued), claims["exp"])
        raise TokenError("invalid")

    def new_session(
        self, principal: str, ttl: int, *, only: str | None = None
    ) -> tuple[Session, str]:
        """A new session for `principal` and its cookie value; `only` limits it to one
        approval."""
        session_id = secrets.token_urlsafe(16)
        # Microseconds: a session made just after a revocation of its principal is not
        # taken for one made before it.
        issued = round(self._clock(), 6)
        claims: dict[str, Any] = {"p": principal, "sid": session_id, "iat": issued}
        if only is not None:
            claims["only"] = only
        cookie = self.sign("session", claims, ttl)
        return self.session(cookie), cookie

    def session(self, cookie: str) -> Session:
        """The session of a cookie value. Raises `TokenError`."""
        claims = self.verify("session", cookie)
        principal, session_id = claims.get("p"), claims.get("sid")
        issued, only = claims.get("iat"), claims.get("only")
        if not isinstance(principal, str) or not isinstance(session_id, str):
            raise TokenError("invalid")
        if issued is not None and (isinstance(issued, bool) or not isinstance(issued, int | float)):
            raise TokenError("invalid")
        if only is not None and not isinstance(only, str):
            raise TokenError("invalid")
        return Session(principal, session_id, claims["exp"], issued, only)

    def csrf(self, session: Session) -> str:
        """The form token of a session: every form of the session carries it."""
        return self._mac("csrf", session.session_id)

    def check_csrf(self, session: Session, given: str | None) -> bool:
        """Whether `given` is the form token of `session` (compared in constant time)."""
        return hmac.compare_digest(
            self.csrf(session).encode(), (given or "").encode("utf-8", "replace")
        )


def base_url(web: WebConfig, server: ServerConfig) -> str:
    """Where reviewers reach the bot: `web.public_url`, or the server's own address (an
    address that listens everywhere is written as 127.0.0.1: set `public_url` for reviewers
    on other machines)."""
    if web.public_url is not None:
        return web.public_url
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(server.host, server.host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{server.port}"


def _check_principal(principal: str) -> None:
    if not _PRINCIPAL.fullmatch(principal):
        raise SignInLinkError(
            "a reviewer is named with letters, digits and - _ . + @ (a Slack user id or an "
            f"email address, as in the rules' reviewers), not {principal!r}"
        )


def link_for(signer: Signer, web: WebConfig, principal: str, base: str) -> str:
    """A sign-in link for `principal` signed by `signer`, at `web.public_url` or else `base`.
    Raises `SignInLinkError`."""
    _check_principal(principal)
    token = signer.link_token(principal, web.link_ttl)
    return f"{web.public_url or base}{LOGIN_PATH}?{urlencode({'token': token})}"


def review_link(
    signer: Signer,
    base: str,
    principal: str,
    approval_id: str,
    action: ReviewAction,
    *,
    expires: int,
) -> str:
    """A review link at `base` (the inbox's address): it signs `principal` in for
    `approval_id` only, offering `action`, until `expires` (unix seconds). Raises
    `SignInLinkError` for a malformed principal or approval id."""
    _check_principal(principal)
    if not _APPROVAL_ID.fullmatch(approval_id):
        raise SignInLinkError(f"not an approval id: {approval_id!r}")
    token = signer.review_token(principal, approval_id, action, expires=expires)
    return f"{base.rstrip('/')}{REVIEW_PATH}?{urlencode({'token': token})}"


def sign_in_link(
    config: Config,
    principal: str,
    *,
    secret: str | bytes | None = None,
    base: str | None = None,
    clock: Callable[[], float] = time.time,
) -> str:
    """A link that signs `principal` in to the web inbox, valid for `web.link_ttl` seconds:
    `<public_url or http://host:port>/inbox/login?token=...`.

    It is signed with `secret`, by default `web.secret`. A bot without `web.secret` signs
    with a random secret of its own, made at start, so only that process can make links it
    accepts (`Served.sign_in_link`), and they stop working when it restarts. `base` replaces
    the address derived from `server` (`web.public_url` still wins). Raises
    `SignInLinkError`.
    """
    _check_principal(principal)
    if secret is None:
        if config.web.secret is None:
            raise SignInLinkError(
                "web.secret is not set, so the running bot signs with a random secret of its "
                "own and would not accept a link made here; set web.secret (for example "
                "${NODBOT_WEB_SECRET}, at least 16 characters) and restart the bot"
            )
        secret = config.web.secret.get_secret_value()
    signer = Signer(secret, clock=clock)
    return link_for(signer, config.web, principal, base or base_url(config.web, config.server))
