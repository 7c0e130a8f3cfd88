"""Live updates of the inbox's list: a server-sent event stream (`GET /inbox/events`) that
tells an open list page when the pending reviews its reviewer may decide have changed, so the
page's small script fetches the list again and a new review shows without a reload.

What is sent is a version: a digest of the ids of the pending reviews the reviewer may decide
(`version`). The list page carries the version it was rendered with; a stream sends the
current one as soon as it opens (a review that came between the page and the stream is not
missed), then again whenever it changes. The page refreshes when the two differ.

    retry: 5000

    event: pending
    data: 3f9a0c21d4e5b6a7

The work is bounded, whatever the number of open pages:

- one poll of the store for every stream (`POLL` seconds apart, while any stream is open):
  the newest `WINDOW` pending reviews, then for each reviewer with a stream whether they may
  decide each one, an answer kept `RECHECK` seconds (escalations and delegations change it
  with time);
- at most `MAX_STREAMS` streams, `MAX_PER_REVIEWER` of them for one reviewer (a refused one
  is a 503: the page then looks again later);
- a stream ends after `LIFETIME` seconds (the browser's EventSource opens a new one, and the
  session is checked again), and at once when the inbox is closed (`close`, when the server
  shuts down: an open response would keep it waiting);
- a comment line every `HEARTBEAT` seconds keeps proxies from closing a quiet stream and
  finds a closed connection.

A poll that fails (the store cannot be read) is logged and tried again at the next one;
a reviewer's check that fails counts as "may not decide" (their page is refreshed when it
can be told).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from nodbot.core import ApprovalRecord, ApprovalStore, StoreError

__all__ = [
    "HEARTBEAT",
    "LIFETIME",
    "MAX_PER_REVIEWER",
    "MAX_STREAMS",
    "POLL",
    "LiveUpdates",
    "StreamRefused",
]

log = logging.getLogger(__name__)

POLL = 2.0
"""Seconds between two reads of the store while any stream is open."""
HEARTBEAT = 15.0
"""Seconds of quiet after which a stream sends a comment line."""
LIFETIME = 300.0
"""Seconds a stream lasts; the browser then opens a new one."""
RETRY = 5000
"""Milliseconds the browser waits before it opens a new stream."""
MAX_STREAMS = 200
"""The most streams open at once."""
MAX_PER_REVIEWER = 8
"""The most streams one reviewer has open at once (their tabs)."""
WINDOW = 500
"""The most pending reviews a poll reads (the newest)."""
RECHECK = 60.0
"""Seconds a reviewer's "may decide" answer for one review is kept."""
MAX_KNOWN = 50_000
"""The most answers kept."""

MayDecide = Callable[[str, ApprovalRecord], Awaitable[bool]]
"""Whether a reviewer may decide a pending review (the list's own test)."""


class StreamRefused(Exception):
    """No stream is opened now: too many are open, or the inbox is closing."""


@dataclass(eq=False)
class _Stream:
    principal: str
    opened: float
    sent: str | None = None
    """The version it sent last."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when its reviewer's version is no longer `sent` (or the inbox closes)."""


class LiveUpdates:
    """The inbox's live streams and the one poll that feeds them all."""

    def __init__(
        self,
        store: ApprovalStore,
        may_decide: MayDecide,
        *,
        poll: float = POLL,
        lifetime: float = LIFETIME,
        heartbeat: float = HEARTBEAT,
        max_streams: int = MAX_STREAMS,
        per_reviewer: int = MAX_PER_REVIEWER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.may_decide = may_decide
        self.poll = poll
        self.lifetime = lifetime
        self.heartbeat = heartbeat
        self.max_streams = max_streams
        self.per_reviewer = per_reviewer
        self._clock = clock
        self._streams: set[_Stream] = set()
        self._versions: dict[str, str] = {}  # reviewer (lower case) -> version at the last poll
        self._known: dict[tuple[str, str], tuple[bool, float]] = {}  # (reviewer, id) -> answer
        self._poller: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        self.closed = False

    @property
    def open_streams(self) -> int:
        """How many streams are open now."""
        return len(self._streams)

    async def version(self, principal: str) -> str:
        """The current version of `principal`'s pending reviews (see the module). Raises
        `StoreError` when the store cannot be read."""
        records = await self._pending()
        found = await self._version_of(principal, records)
        self._forget(records, {principal.lower(), *(s.principal.lower() for s in self._streams)})
        return found

    def stream(self, principal: str) -> AsyncGenerator[str, None]:
        """A new stream of `principal`'s versions, as server-sent event text. Raises
        `StreamRefused` when it may not be opened now."""
        if self.closed:
            raise StreamRefused("the inbox is shutting down")
        now = self._clock()
        # A response that never started its body never ran its stream's `finally`.
        stale = now - self.lifetime - self.heartbeat - 60
        self._streams -= {stream for stream in self._streams if stream.opened < stale}
        if len(self._streams) >= self.max_streams:
            raise StreamRefused(f"{self.max_streams} live lists are open already")
        key = principal.lower()
        mine = sum(stream.principal.lower() == key for stream in self._streams)
        if mine >= self.per_reviewer:
            raise StreamRefused(f"you have {self.per_reviewer} live lists open already")
        stream = _Stream(principal, now)
        self._streams.add(stream)  # counted from now, before its first byte
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._polling(), name="inbox live updates")
        return self._events(stream)

    def wake(self) -> None:
        """Poll now rather than at the next interval (something changed here)."""
        self._woken.set()

    def close(self) -> None:
        """End every stream now and open no more: the server is stopping."""
        self.closed = True
        for stream in self._streams:
            stream.changed.set()
        self._woken.set()

    async def _events(self, stream: _Stream) -> AsyncGenerator[str, None]:
        key = stream.principal.lower()
        try:
            yield f"retry: {RETRY}\n\n"
            try:
                stream.sent = await self.version(stream.principal)
            except StoreError as exc:
                log.warning("a live list cannot be told its version: %s", exc)
                return  # the browser opens a new stream later
            yield _event(stream.sent)
            deadline = stream.opened + self.lifetime
            quiet_since = self._clock()
            while not self.closed:
                now = self._clock()
                wait = min(deadline - now, quiet_since + self.heartbeat - now)
                if deadline <= now:
                    break
                if wait > 0 and not stream.changed.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await stream.changed.wait()
                if self.closed:
                    break
                current = self._versions.get(key)
                if stream.changed.is_set():
                    stream.changed.clear()
                    if current is not None and current != stream.sent:
                        stream.sent = current
                        yield _event(current)
                        quiet_since = self._clock()
                        continue
                if self._clock() - quiet_since >= self.heartbeat:
                    yield ": still here\n\n"
                    quiet_since = self._clock()
        finally:
            self._streams.discard(stream)

    async def _polling(self) -> None:
        """The one poll: while any stream is open, read the store, tell the streams whose
        version changed."""
        while self._streams and not self.closed:
            self._woken.clear()  # a wake from now on asks for the next poll
            try:
                await self._poll_once()
            except StoreError as exc:
                log.warning("the live lists cannot read the store now: %s", exc)
            except Exception as exc:  # the poll goes on: a stream must not go quiet for good
                log.error("the live lists' poll failed", exc_info=exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await self._woken.wait()
        self._versions.clear()
        self._known.clear()

    async def _poll_once(self) -> None:
        records = await self._pending()
        reviewers = {stream.principal.lower(): stream.principal for stream in self._streams}
        for key, principal in reviewers.items():
            self._versions[key] = await self._version_of(principal, records)
        for stream in list(self._streams):
            if self._versions.get(stream.principal.lower()) != stream.sent:
                stream.changed.set()
        self._forget(records, reviewers)
        for gone in [key for key in self._versions if key not in reviewers]:
            del self._versions[gone]

    def _forget(self, records: Sequence[ApprovalRecord], reviewers: Iterable[str]) -> None:
        """Let go of the answers kept for reviews no longer pending, and of reviewers with
        no stream (all of them past `MAX_KNOWN`: the cache stays small)."""
        pending = {record.approval_id for record in records}
        keep = set(reviewers)
        if len(self._known) > MAX_KNOWN:
            self._known.clear()
        for known in [k for k in self._known if k[0] not in keep or k[1] not in pending]:
            del self._known[known]

    async def _pending(self) -> Sequence[ApprovalRecord]:
        return await self.store.list(status="pending", limit=WINDOW, newest_first=True)

    async def _version_of(self, principal: str, records: Sequence[ApprovalRecord]) -> str:
        ids = sorted([r.approval_id for r in records if await self._may(principal, r)])
        return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]

    async def _may(self, principal: str, record: ApprovalRecord) -> bool:
        key = (principal.lower(), record.approval_id)
        now = self._clock()
        known = self._known.get(key)
        if known is not None and now - known[1] < RECHECK:
            return known[0]
        try:
            answer = await self.may_decide(principal, record)
        except StoreError:
            raise
        except Exception as exc:  # told later, when it can be: not counted now
            log.warning("whether %s may decide %s cannot be told: %s", principal, key[1], exc)
            return False
        self._known[key] = (answer, now)
        return answer


def _event(version: str) -> str:
    return f"event: pending\ndata: {version}\n\n"
