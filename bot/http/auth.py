"""Bearer tokens: who is calling (`authenticate`) and whether the token may (`require`), and
`ApiError`, the error every route raises to answer with `{"error", "details"}`."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request

from nodbot.bot.config import ApiScope, ApiToken

__all__ = ["ApiError", "TokenTable", "missing_scope"]


class ApiError(Exception):
    """An error response: `status`, one sentence, structured `details` and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = dict(details or {})
        self.headers = dict(headers or {})


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class TokenTable:
    """The accepted tokens. Tokens are compared in constant time, and every token is
    compared on every request, so the timing tells nothing about which one nearly matched."""

    def __init__(self, tokens: Sequence[ApiToken]) -> None:
        self._tokens = [(token.token.get_secret_value().encode(), token) for token in tokens]

    def authenticate(self, request: Request) -> ApiToken:
        """The token of the request's `Authorization: Bearer` header. Raises `ApiError` 401
        when it is missing, malformed or unknown (the token is never echoed)."""
        header = request.headers.get("authorization")
        if header is None:
            raise ApiError(401, "a bearer token is required", headers=_CHALLENGE)
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise ApiError(401, "expected an Authorization: Bearer header", headers=_CHALLENGE)
        given = presented.strip().encode()
        found: ApiToken | None = None
        for secret, token in self._tokens:
            if hmac.compare_digest(secret, given):
                found = token
        if found is None:
            raise ApiError(401, "the bearer token is not valid", headers=_CHALLENGE)
        return found

    def require(self, request: Request, scope: ApiScope) -> str:
        """The principal (the token's name) of a request whose token has `scope`. Raises
        `ApiError` 401 (no valid token) or 403 (the scope is missing)."""
        return self.require_token(request, scope).name

    def require_any(self, request: Request, *scopes: ApiScope) -> ApiToken:
        """The token of a request, which has one of `scopes`. Raises `ApiError` 401 (no
        valid token) or 403 (naming the first scope)."""
        token = self.authenticate(request)
        if not any(scope in token.scopes for scope in scopes):
            raise missing_scope(scopes[0], f" (or {', '.join(scopes[1:])})" if scopes[1:] else "")
        return token

    def require_token(self, request: Request, scope: ApiScope) -> ApiToken:
        """The token of a request, which has `scope`. Raises `ApiError` 401 (no valid token)
        or 403 (the scope is missing)."""
        token = self.authenticate(request)
        if scope not in token.scopes:
            raise missing_scope(scope)
        return token


def missing_scope(scope: ApiScope, why: str = "") -> ApiError:
    """The 403 of a request whose token lacks `scope` (`why`: what needs it, if not all)."""
    return ApiError(403, f"this token lacks the scope {scope}{why}", details={"scope": scope})
