"""Reply tokens: the `+tag` of a reviewer's reply address (`approvals+<token>@example.com`)
and part of every Message-ID the bot sends, so that a reply names its review and reviewer.

A token is 45 characters of lowercase RFC 4648 base32 (no padding) over 28 bytes:

- 14 bytes: the approval id (`apr_` and 28 hex digits, as the stores make them);
- 4 bytes: when it expires, Unix seconds (big-endian);
- 10 bytes: HMAC-SHA256, cut to 80 bits, of the approval id, the reviewer's address
  (lowercased), the call's argument digest and the expiry.

The reviewer and the digest are bound by the signature rather than carried: whoever verifies
knows them (the reply's From, the stored review), which keeps the token short enough for an
address's 64-character local part. Base32 survives mail servers that change an address's
case. The key is derived from `web.secret` (the secret the web inbox signs its links with,
which signs the emails' links too), separated from its other uses by a
label, so a token is never a valid inbox signature and the other way round.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "TOKEN_LENGTH",
    "InvalidToken",
    "ReplyClaims",
    "ReplyTokens",
]

TOKEN_LENGTH = 45
"""Characters of a token; `EmailConfig` leaves room for it (and its `+`) in `reply_to`."""

_LABEL = b"nodbot email reply token v1"
_APPROVAL_ID = re.compile(r"apr_([0-9a-f]{28})")
_MAC_BYTES = 10
_TOKEN = re.compile(rf"[a-z2-7]{{{TOKEN_LENGTH}}}")


class InvalidToken(ValueError):
    """A token that is malformed, was not signed by this bot for this reviewer and call, or
    has expired; the message says which."""


@dataclass(frozen=True)
class ReplyClaims:
    """What a verified token says."""

    approval_id: str
    """The review it answers."""
    reviewer: str
    """The address it was issued to (lowercased)."""
    digest: str
    """The argument digest of the call it was issued for."""
    expires_at: datetime
    """When it stops working."""


class ReplyTokens:
    """Issues and verifies reply tokens under one secret."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("reply tokens need a signing secret (web.secret)")
        self._key = hmac.new(secret.encode(), _LABEL, hashlib.sha256).digest()

    def issue(self, approval_id: str, reviewer: str, digest: str, expires_at: datetime) -> str:
        """The token of `reviewer` for the call (`digest`) of `approval_id`, until
        `expires_at`. Raises `ValueError` for an approval id not made by the stores."""
        found = _APPROVAL_ID.fullmatch(approval_id)
        if found is None:
            raise ValueError(f"not an approval id of the stores: {approval_id!r}")
        expiry = int(expires_at.timestamp()).to_bytes(4, "big")
        body = bytes.fromhex(found.group(1)) + expiry
        raw = body + self._mac(approval_id, reviewer, digest, expiry)
        return base64.b32encode(raw).decode().rstrip("=").lower()

    def approval_of(self, token: str) -> str:
        """The approval id a token names, unverified: to find the review whose reviewer and
        digest `verify` needs. Raises `InvalidToken` when it is not a token at all."""
        return _split(token)[0]

    def verify(
        self, token: str, *, reviewer: str, digest: str, now: datetime | None = None
    ) -> ReplyClaims:
        """The claims of `token`, checked: its shape, its signature for `reviewer` and
        `digest`, and that it has not expired. Raises `InvalidToken` saying which failed."""
        approval_id, expiry, mac = _split(token)
        if not hmac.compare_digest(mac, self._mac(approval_id, reviewer, digest, expiry)):
            raise InvalidToken("the token was not issued for this reviewer and call")
        expires_at = datetime.fromtimestamp(int.from_bytes(expiry, "big"), UTC)
        if (now or datetime.now(UTC)) >= expires_at:
            raise InvalidToken(f"the token expired at {expires_at.isoformat()}")
        return ReplyClaims(approval_id, reviewer.lower(), digest, expires_at)

    def _mac(self, approval_id: str, reviewer: str, digest: str, expiry: bytes) -> bytes:
        # NUL-separated: none of the parts can hold a NUL, so no two inputs read the same.
        message = b"\0".join([approval_id.encode(), reviewer.lower().encode(), digest.encode()])
        return hmac.new(self._key, message + b"\0" + expiry, hashlib.sha256).digest()[:_MAC_BYTES]


def _split(token: str) -> tuple[str, bytes, bytes]:
    text = token.lower()  # mail servers may change the case of an address
    if not _TOKEN.fullmatch(text):
        raise InvalidToken(f"not a reply token: expected {TOKEN_LENGTH} base32 characters")
    try:
        raw = base64.b32decode(text.upper() + "===")
    except binascii.Error:
        raise InvalidToken("not a reply token: not base32") from None
    if base64.b32encode(raw).decode().rstrip("=").lower() != text:
        raise InvalidToken("not a reply token: stray bits")  # one spelling per token
    return "apr_" + raw[:14].hex(), raw[14:18], raw[18:]
