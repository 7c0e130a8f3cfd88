"""Links from a review's inbox page back to its Slack messages.

The Slack channel keeps, in each delivery's `ref`, the messages it posted for the review
(`{"messages": [{"channel", "ts"}], ...}`, and `delegates` for those posted to a delegate;
`bot.slack.channel`). A message's link is, in order of preference:

1. its `permalink`, when the delivery kept one (`chat.getPermalink`'s answer);
2. `https://<workspace>.slack.com/archives/<channel>/p<ts without the dot>`, when the
   workspace's address is known (`auth.test`'s `url`): Slack opens the message itself;
3. `https://slack.com/app_redirect?channel=<channel>`: Slack opens the conversation.

Everything read from a ref is checked before it goes into a link (a channel id is capitals
and digits, a ts is digits with one dot, a permalink or workspace is an https address on
slack.com), so that a page only ever links to Slack, whatever a row holds; a message that
fails a check is left out.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias
from urllib.parse import quote

from nodbot.core import Delivery

__all__ = [
    "MOST",
    "SlackMessage",
    "Workspace",
    "message_link",
    "slack_messages",
    "workspace_of",
]

log = logging.getLogger(__name__)

MOST = 20
"""The most messages linked from one page."""

Place: TypeAlias = Literal["channel", "dm"]

_CHANNEL = re.compile(r"[A-Z0-9]{3,40}")
_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")
_SLACK_URL = re.compile(r"https://(?:[a-z0-9-]{1,63}\.){1,3}slack\.com/[A-Za-z0-9/._~%?=&-]{0,500}")
_WORKSPACE = re.compile(r"https://(?:[a-z0-9-]{1,63}\.){1,3}slack\.com/?")
_KINDS = frozenset({"request", "escalation"})
"""The deliveries whose messages are the review's own (not reminders or outcome replies)."""


@dataclass(frozen=True)
class SlackMessage:
    """One Slack message of a review, and where it was posted."""

    link: str
    place: Place
    """`channel`: posted in a channel; `dm`: a direct message."""
    to: str
    """The channel (`#refunds`, `C0123`) or the reviewer (`U0123`, an address) it went to."""


def workspace_of(url: Any) -> str | None:
    """The workspace's address from `auth.test`'s `url` (`https://acme.slack.com/`), or None
    for anything else."""
    if not isinstance(url, str) or _WORKSPACE.fullmatch(url) is None:
        return None
    return url.rstrip("/") + "/"


def message_link(message: Mapping[str, Any], workspace: str | None = None) -> str | None:
    """The link of one message (`{"channel", "ts"}`, maybe `permalink`), or None when what
    the ref holds is not a Slack message."""
    channel, ts = message.get("channel"), message.get("ts")
    if not isinstance(channel, str) or _CHANNEL.fullmatch(channel) is None:
        return None
    permalink = message.get("permalink")
    if isinstance(permalink, str) and _SLACK_URL.fullmatch(permalink):
        return permalink
    if not isinstance(ts, str) or _TS.fullmatch(ts) is None:
        return None
    found = workspace_of(workspace)
    if found is not None:
        return f"{found}archives/{channel}/p{ts.replace('.', '')}"
    return f"https://slack.com/app_redirect?channel={quote(channel)}"


def slack_messages(
    deliveries: Iterable[Delivery], workspace: str | None = None, *, channel: str = "slack"
) -> list[SlackMessage]:
    """The review's messages in Slack (`channel`, the Slack channel's name), from its request
    and escalation deliveries, each once, at most `MOST`."""
    found: dict[str, SlackMessage] = {}
    for delivery in deliveries:
        if delivery.channel != channel or delivery.kind not in _KINDS or not delivery.ref:
            continue
        kind, _, to = delivery.address.partition(":")
        place: Place = "dm" if kind == "dm" else "channel"
        posted = [(m, place, to) for m in _listed(delivery.ref, "messages")]
        posted += [(m, "dm", str(m.get("user", ""))) for m in _listed(delivery.ref, "delegates")]
        for message, where, whom in posted:
            link = message_link(message, workspace)
            if link is not None and link not in found:
                found[link] = SlackMessage(link, where, whom[:200])
    return list(found.values())[:MOST]


def _listed(ref: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = ref.get(key)
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, Mapping)]


class _AuthTest(Protocol):
    async def auth_test(self) -> Any: ...


class Workspace:
    """The workspace's address, asked of Slack (`auth.test`) once and then kept. A page
    waits at most `wait` seconds for it; while Slack does not answer it is unknown (the
    links open the conversation, not the message) and asked again after `retry` seconds,
    so that an outage of Slack costs a page little."""

    def __init__(
        self,
        *,
        wait: float = 2.0,
        retry: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.wait = wait
        self.retry = retry
        self._clock = clock
        self._address: str | None = None
        self._next_try = 0.0

    async def address(self, client: _AuthTest | None) -> str | None:
        """The workspace's address (`https://acme.slack.com/`), or None when there is no
        Slack `client` or it cannot be told now."""
        if self._address is not None or client is None or self._clock() < self._next_try:
            return self._address
        try:
            async with asyncio.timeout(self.wait):
                answer = await client.auth_test()
            self._address = workspace_of(answer.get("url"))
        except Exception as exc:  # a link is a convenience: nothing Slack does fails a page
            log.debug("auth.test failed, the Slack workspace's address is not known: %r", exc)
        if self._address is None:
            self._next_try = self._clock() + self.retry
        return self._address
