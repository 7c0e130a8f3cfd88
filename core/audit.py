"""The audit chain: how each event is hashed and linked to the event before it in its review.

Every event of a review has a position `n` (1, 2, 3, ...), the hash of the event before it,
`prev` (none for `n` = 1), and its own `hash`: the hex digest of this message, UTF-8 encoded:

```
nodbot-event-v1\\n<prev>\\n<n>\\n<approval_id>\\n<kind>\\n<at>\\n<actor>\\n<person>\\n<channel>\\n<detail>
```

- each field is `~` when it is NULL, else `<length>:<value>`, the length counted in characters
  (as Python's `len` and PostgreSQL's `length` count them), so no value can pass for another;
- `n` is written in decimal; `at` is the UTC time as `YYYY-MM-DDTHH:MM:SS.ffffff`;
- `detail` is the stored JSON text, exactly as stored.

hash = HMAC-SHA256(K, message) with K = SHA-256(audit key) when the store has an audit key,
else SHA-256(message). Without a key anyone who can write to the database and knows this
format can forge a consistent chain; with one, only who holds the key can.

This module is the one definition in Python; the PostgreSQL trigger of migration 0007
computes the same message in SQL, and the tests hold the two to each other.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

__all__ = ["FORMAT", "HEADER", "EventHasher", "chain_key", "hmac_pads", "message", "moment_text"]

FORMAT = "v1"
"""The version of the message format; store connections announce it (`nodbot.audit`)."""
HEADER = "nodbot-event-v1\n"
_BLOCK = 64  # SHA-256's block size, for the HMAC pads


def moment_text(at: datetime) -> str:
    """`at` in UTC as the message has it: `YYYY-MM-DDTHH:MM:SS.ffffff` (a naive time is UTC)."""
    if at.tzinfo is not None and at.tzinfo is not UTC:
        at = at.astimezone(UTC)
    return at.isoformat("T", "microseconds")[:26]  # without the +00:00 of an aware time


def message(
    *,
    prev: str | None,
    n: int,
    approval_id: str,
    kind: str,
    at: datetime,
    actor: str | None,
    person: str | None,
    channel: str | None,
    detail: str,
) -> bytes:
    """The bytes an event's hash is made of (see the module's docstring)."""
    text = moment_text(at)
    return _message((prev, str(n), approval_id, kind, text, actor, person, channel, detail))


def _message(fields: tuple[str | None, ...]) -> bytes:
    """The message of the fields in its order, `n` and the time already written as text."""
    # Each field in place, with no call per field: every event a store writes comes here.
    return (
        HEADER + "\n".join(["~" if value is None else f"{len(value)}:{value}" for value in fields])
    ).encode("utf-8")


def chain_key(secret: str) -> bytes:
    """K: the 32-byte SHA-256 of the configured audit key."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def hmac_pads(secret: str) -> tuple[str, str]:
    """Hex of (K xor ipad) and (K xor opad), K padded to 64 bytes, so that
    sha256(opad_key || sha256(ipad_key || message)) is HMAC-SHA256(K, message): what the
    PostgreSQL trigger computes with its built-in sha256, without pgcrypto."""
    key = chain_key(secret).ljust(_BLOCK, b"\0")
    inner = bytes(byte ^ 0x36 for byte in key)
    outer = bytes(byte ^ 0x5C for byte in key)
    return inner.hex(), outer.hex()


class EventHasher:
    """Hashes events with the store's audit key, or with plain SHA-256 when it has none."""

    __slots__ = ("_key",)

    def __init__(self, secret: str | None = None) -> None:
        self._key = None if secret is None else chain_key(secret)

    @property
    def keyed(self) -> bool:
        """Whether hashes are HMACs with a key."""
        return self._key is not None

    def digest(self, data: bytes) -> str:
        """The hex hash of a message."""
        if self._key is None:
            return hashlib.sha256(data).hexdigest()
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def hash(
        self,
        *,
        prev: str | None,
        n: int,
        approval_id: str,
        kind: str,
        at: datetime,
        actor: str | None,
        person: str | None,
        channel: str | None,
        detail: str,
    ) -> str:
        """The hash of one event (see `message`)."""
        text = moment_text(at)
        return self.hash_at_text(prev, n, approval_id, kind, text, actor, person, channel, detail)

    def hash_at_text(
        self,
        prev: str | None,
        n: int,
        approval_id: str,
        kind: str,
        at_text: str,
        actor: str | None,
        person: str | None,
        channel: str | None,
        detail: str,
    ) -> str:
        """`hash` for a store that has formatted the time already: `at_text` is
        `moment_text(at)`. The fields are positional, in the message's order."""
        fields = (prev, str(n), approval_id, kind, at_text, actor, person, channel, detail)
        return self.digest(_message(fields))
