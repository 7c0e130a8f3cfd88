"""Webhooks: reviews told to HTTP endpoints, signed so the receiver knows they came from here.

Each delivery is one POST of a JSON body:

```json
{"event": "approval.pending", "delivery_id": 17, "sent_at": "2026-11-29T12:00:00+00:00",
 "approval": {"approval_id": "apr_...", "run_id": "...", "call_id": "...", "tool": "refund",
              "arguments": {...}, "status": "pending", "decision": null, ...}}
```

with the headers `X-Nodbot-Event`, `X-Nodbot-Delivery` (the same on every attempt of one
delivery: receivers use it to drop repeats), `X-Nodbot-Timestamp` (Unix seconds) and
`X-Nodbot-Signature: v1=<hex>`, the HMAC-SHA256 under the webhook's secret of
`v1:<timestamp>:<body>`. `verify_signature` checks one, for receivers written in Python.

Events: `approval.pending` when a review opens, `approval.escalated` when it is still open at
its rule's `escalate_after`, `approval.decided` when it is decided. An answer 2xx delivers;
408, 429 (its `Retry-After` honoured), 5xx, timeouts and refused connections are retried
with backoff; any other answer gives the delivery up (it is recorded as `undelivered`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import aiohttp

from nodbot.bot.config import Webhook, WebhookEvent
from nodbot.bot.http.schemas import ApprovalView
from nodbot.bot.outbox import DeliveryError, Moment, retry_after
from nodbot.core import ApprovalRecord, Delivery, NewDelivery, __version__
from nodbot.core.outbound import outbound_session

__all__ = ["SIGNATURE_VERSION", "InvalidSignature", "WebhookChannel", "sign", "verify_signature"]

SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE = 300.0
"""Seconds a signed request stays acceptable (against replays)."""

_EVENTS: dict[str, WebhookEvent] = {
    "request": "approval.pending",
    "escalation": "approval.escalated",
    "outcome": "approval.decided",
}
_RETRIED = {408, 425, 429}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Nodbot-Signature` value of `body` sent at `timestamp`."""
    message = f"{SIGNATURE_VERSION}:{timestamp}:".encode() + body
    digest = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={digest}"


class InvalidSignature(ValueError):
    """A webhook request that did not come from the bot, or came too late."""


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check a received webhook request (its headers, case-insensitively, and its raw body).
    Raises `InvalidSignature` saying what is wrong: a missing header, a timestamp older or
    newer than `tolerance` seconds, or a signature that does not match."""
    lower = {key.lower(): value for key, value in headers.items()}
    timestamp = lower.get("x-nodbot-timestamp")
    signature = lower.get("x-nodbot-signature")
    if not timestamp or not signature:
        raise InvalidSignature("X-Nodbot-Timestamp and X-Nodbot-Signature are required")
    try:
        sent = float(timestamp)
    except ValueError:
        raise InvalidSignature(f"X-Nodbot-Timestamp is not a number: {timestamp!r}") from None
    if abs((time.time() if now is None else now) - sent) > tolerance:
        raise InvalidSignature(f"the timestamp is more than {tolerance:g} s away from now")
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        raise InvalidSignature("the signature does not match the body")


ANSWER_BYTES = 65_536
"""The most of a receiver's answer read (and thrown away) before the connection is reused."""


class WebhookChannel:
    """Delivers the configured webhooks' events."""

    name = "webhook"
    answers = False
    makes_deliveries = False

    def __init__(self, hooks: Sequence[Webhook], *, session: aiohttp.ClientSession | None = None):
        self.hooks = {hook.name: hook for hook in hooks}
        self.tells_outcomes = any("approval.decided" in hook.events for hook in hooks)
        """Whether a hook takes `approval.decided` (the only event of a review's outcome)."""
        self._session = session
        self._own_session = session is None
        """aiohttp, as slack_sdk uses: a fraction of httpx's CPU per POST. Made on the first
        delivery (it needs the running loop) unless one is given."""

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        found = []
        escalate_at = record.request.policy.get("escalate_at")
        for hook in self.hooks.values():
            target = f"{self.name}:{hook.name}"
            if stage == "request" and "approval.pending" in hook.events:
                found.append(NewDelivery("request", target))
            if stage == "request" and escalate_at and "approval.escalated" in hook.events:
                found.append(NewDelivery("escalation", target, datetime.fromisoformat(escalate_at)))
            if stage == "outcome" and "approval.decided" in hook.events:
                found.append(NewDelivery("outcome", target))
        return found

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        hook = self.hooks.get(delivery.address)
        if hook is None:
            raise DeliveryError(f"no webhook is named {delivery.address!r}", permanent=True)
        if delivery.kind == "escalation" and record.decision is not None:
            return {"skipped": "decided before the escalation"}
        event = _EVENTS[delivery.kind]
        body = json.dumps(
            {
                "event": event,
                "delivery_id": delivery.delivery_id,
                "sent_at": datetime.now().astimezone().isoformat(),
                "approval": ApprovalView.of(record).model_dump(mode="json"),
            },
            separators=(",", ":"),
        ).encode()
        timestamp = str(int(time.time()))
        headers = {
            "User-Agent": f"nodbot/{__version__}",
            "Content-Type": "application/json",
            "X-Nodbot-Event": event,
            "X-Nodbot-Delivery": str(delivery.delivery_id),
            "X-Nodbot-Timestamp": timestamp,
            "X-Nodbot-Signature": sign(hook.secret.get_secret_value(), timestamp, body),
        }
        try:
            async with self._client().post(
                hook.url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=hook.timeout),
                allow_redirects=False,
            ) as answer:
                await answer.content.read(ANSWER_BYTES)  # the answer itself is not used
                status, after = answer.status, answer.headers.get("retry-after")
        except (aiohttp.ClientError, TimeoutError) as exc:
            kind = "TimeoutError" if isinstance(exc, TimeoutError) else type(exc).__name__
            raise DeliveryError(f"{kind}: {exc}".rstrip(": ")) from exc
        if 200 <= status < 300:
            return {"status": status}
        reason = f"HTTP {status} from {hook.url}"
        if status in _RETRIED or status >= 500:
            raise DeliveryError(reason, retry_after=retry_after(after))
        raise DeliveryError(reason, permanent=True)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = outbound_session()
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
