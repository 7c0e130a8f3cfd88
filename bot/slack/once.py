"""Each Slack post of a delivery once, however often the delivery is tried.

A delivery is at least once (`core.outbox`): a retry follows a failed step, and a worker that
died while Slack was answering is followed by another once its lease has run out. Slack has
no idempotency key, so two things make a post happen once:

- `Progress`: what a delivery has posted is kept in its `ref` as soon as it is posted
  (`Outbox.delivery_progress`), and a retry goes on from the step that failed. Before a first
  post, a marker says that an attempt has begun, so the next attempt knows to look.
- `tag`: every post carries Slack message metadata (`nodbot_review`: the review, the delivery
  and which part it is). An attempt after one that may have posted without recording it
  reads the conversation (`conversations.history`, or `conversations.replies` for a thread)
  and adopts the message it finds instead of posting again.

Reading needs the history scopes (`channels:history`, `groups:history`, `im:history`,
`mpim:history`). Where Slack refuses (`Unreadable`), the channel posts anyway: a duplicate
is better than a lost review.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any, Literal, TypeAlias

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from nodbot.bot.outbox import OutboxStore
from nodbot.core import ApprovalRecord, Delivery

__all__ = [
    "EVENT_TYPE",
    "Part",
    "Progress",
    "Unreadable",
    "find_in_history",
    "find_in_thread",
    "tag",
]

EVENT_TYPE = "nodbot_review"
"""The `event_type` of the metadata of every message the bot posts."""

Part: TypeAlias = Literal["request", "arguments", "answer"]
"""Which post of a delivery a message is: the review, its full arguments in the thread, the
run's answer in the thread."""

LOOK_BACK = timedelta(minutes=10)
"""How long before the review was created the history is read from: room for clocks apart."""
PAGE = 200
MAX_PAGES = 25
"""At most this many pages of history are read (5,000 messages since the review opened)."""

HISTORY_SCOPES = {"C": "channels:history", "G": "groups:history", "D": "im:history"}
"""The scope reading a conversation needs, by the first letter of its id (a G id may also be
a group DM: `mpim:history`)."""

UNREADABLE = frozenset(
    {
        "missing_scope",
        "channel_not_found",
        "not_in_channel",
        "thread_not_found",
        "access_denied",
        "restricted_action",
        "not_allowed_token_type",
    }
)
"""Answers to a read that trying again will not change."""


class Unreadable(Exception):
    """Slack will not show the bot a conversation (a missing scope, say): whether something
    was posted there before cannot be checked."""

    def __init__(self, channel: str, error: str, needed: str | None) -> None:
        super().__init__(f"{channel}: {error}" + (f" (needs {needed})" if needed else ""))
        self.channel = channel
        self.error = error
        self.needed = needed


def tag(record: ApprovalRecord, delivery: Delivery, part: Part) -> dict[str, Any]:
    """The metadata of a post: what `find_in_history` and `find_in_thread` look for."""
    payload = {"approval_id": record.approval_id, "delivery": delivery.delivery_id, "part": part}
    return {"event_type": EVENT_TYPE, "event_payload": payload}


def _tagged(
    message: Mapping[str, Any], record: ApprovalRecord, delivery: Delivery, part: Part
) -> bool:
    metadata = message.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("event_type") != EVENT_TYPE:
        return False
    payload = metadata.get("event_payload")
    wanted = tag(record, delivery, part)["event_payload"]
    return isinstance(payload, Mapping) and all(payload.get(k) == v for k, v in wanted.items())


class Progress:
    """How far a delivery got: its ref, kept in the store as each step is done."""

    def __init__(self, store: OutboxStore, delivery: Delivery) -> None:
        self.store = store
        self.delivery = delivery
        self.ref: dict[str, Any] = dict(delivery.ref or {})
        self.earlier = delivery.attempts > 0 or bool(delivery.ref)
        """Whether an earlier attempt may have posted something it did not record: one
        failed, or one began (its marker is there) and never finished."""

    async def save(self, **changes: Any) -> None:
        """Apply `changes` to the ref (None removes a key) and keep it. Raises `DeliveryLost`
        when the delivery is no longer this worker's: it must not go on."""
        for key, value in changes.items():
            if value is None:
                self.ref.pop(key, None)
            else:
                self.ref[key] = value
        worker = self.delivery.claimed_by
        if worker is not None:  # always set for a delivery the dispatcher claimed
            await self.store.delivery_progress(
                self.delivery.delivery_id, worker=worker, ref=self.ref
            )

    async def begin(self) -> None:
        """Mark that an attempt is about to post, unless the ref says so already."""
        if not self.ref:
            await self.save(begun=True)


async def find_in_history(
    client: AsyncWebClient,
    channel: str,
    record: ApprovalRecord,
    delivery: Delivery,
    part: Part,
) -> dict[str, str] | None:
    """The message (`{"channel", "ts"}`) posted as `part` of `delivery` in `channel` since
    the review was created, or None. Raises `Unreadable`, or `SlackApiError` for a failure
    worth trying again."""
    oldest = f"{(record.created_at - LOOK_BACK).timestamp():.6f}"

    def ask(cursor: str | None) -> Awaitable[AsyncSlackResponse]:
        return client.conversations_history(
            channel=channel, oldest=oldest, limit=PAGE, cursor=cursor, include_all_metadata=True
        )

    return await _find(channel, ask, lambda m: _tagged(m, record, delivery, part))


async def find_in_thread(
    client: AsyncWebClient,
    message: Mapping[str, str],
    record: ApprovalRecord,
    delivery: Delivery,
    part: Part,
) -> dict[str, str] | None:
    """The reply posted as `part` of `delivery` in the thread of `message`, or None. Raises
    as `find_in_history` does."""
    channel, ts = message["channel"], message["ts"]

    def ask(cursor: str | None) -> Awaitable[AsyncSlackResponse]:
        return client.conversations_replies(
            channel=channel, ts=ts, limit=PAGE, cursor=cursor, include_all_metadata=True
        )

    def wanted(found: Mapping[str, Any]) -> bool:
        return found.get("ts") != ts and _tagged(found, record, delivery, part)

    return await _find(channel, ask, wanted)


async def _find(
    channel: str,
    ask: Callable[[str | None], Awaitable[AsyncSlackResponse]],
    wanted: Callable[[Mapping[str, Any]], bool],
) -> dict[str, str] | None:
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        try:
            answer = await ask(cursor)
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "")
            if error not in UNREADABLE:
                raise
            needed = exc.response.get("needed") or HISTORY_SCOPES.get(channel[:1])
            raise Unreadable(channel, error, str(needed) if needed else None) from exc
        for message in answer.get("messages") or []:
            if isinstance(message, Mapping) and wanted(message):
                return {"channel": channel, "ts": str(message["ts"])}
        cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
        if not answer.get("has_more") or cursor is None:
            return None
    return None
