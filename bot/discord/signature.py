"""Discord's signature on an interaction: Ed25519 over the timestamp and the raw body.

Discord signs every request to an interactions endpoint with the application's key: the
header `X-Signature-Ed25519` is the hex signature of `X-Signature-Timestamp` (seconds)
followed by the body's bytes, checked against the application's public key. A request
without them, with a signature that does not verify, or with a timestamp further than
`MAX_SKEW` from now is refused before anything reads the body; Discord itself pings the
endpoint with a bad signature when it is configured, and takes a 401 as the right answer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["MAX_SKEW", "NotSigned", "Verifier"]

MAX_SKEW = 300
"""Seconds a signed timestamp may be from now (either way): an older request is a replay."""
_TIMESTAMP = re.compile(r"[0-9]{1,20}")
"""A timestamp: ASCII digits (seconds since 1970 have 10 for a long while)."""


class NotSigned(Exception):
    """The request is not signed by Discord: no headers, a bad signature, a stale timestamp."""


class Verifier:
    """Checks interactions against the application's public key (hex, as the portal shows)."""

    def __init__(self, public_key: str, *, clock: Callable[[], float] = time.time) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))
        self._clock = clock

    def check(self, headers: Mapping[str, str], body: bytes) -> None:
        """Raises `NotSigned` unless Discord signed `body` with these headers, lately."""
        signature = headers.get("x-signature-ed25519", "").strip()
        timestamp = headers.get("x-signature-timestamp", "").strip()
        if not signature or not timestamp:
            raise NotSigned("the request is not signed by Discord")
        if not _TIMESTAMP.fullmatch(timestamp):
            raise NotSigned("the request's signature timestamp is not a number of seconds")
        if abs(self._clock() - int(timestamp)) > MAX_SKEW:
            raise NotSigned("the request's signature has expired")
        try:
            raw = bytes.fromhex(signature)
        except ValueError:
            raise NotSigned("the request's signature is not hex") from None
        if len(raw) != 64:
            raise NotSigned("the request's signature is not an Ed25519 signature")
        try:
            self._key.verify(raw, timestamp.encode("ascii") + body)
        except InvalidSignature:
            raise NotSigned("the request's Discord signature is not valid") from None
