"""Delegations: a reviewer hands their reviews to another person for a period (out of office),
kept in the store so that every process on it, and every restart, sees the same ones.

A delegation names two handles as they were given (normalized: addresses in lower case); who
they stand for is the bot's to tell (`bot.policy.delegation`), at the moment a delegate
decides. Each lasts from `since` until `until`, or until it is ended (`end`: from the CLI or
the inbox); the store keeps ended and past ones for the record, and `live` skips them.

```python
kept = await store.delegations.add(
    delegator="ana@example.com", delegate="bob@example.com", since=now, until=back
)
await store.delegations.live(now)                  # [kept] until `back`, or until ended
```
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, runtime_checkable

from nodbot.core.calls import new_id
from nodbot.core.errors import NodbotError

__all__ = [
    "Delegation",
    "DelegationNotFound",
    "Delegations",
    "MemoryDelegations",
]


class DelegationNotFound(NodbotError):
    """No delegation has this id."""

    kind = "delegation-not-found"

    def __init__(self, delegation_id: str) -> None:
        super().__init__(f"no delegation has the id {delegation_id!r}")
        self.delegation_id = delegation_id


@dataclass(frozen=True)
class Delegation:
    """One reviewer's reviews handed to another person for a period."""

    delegation_id: str
    delegator: str
    """Whose reviews are handed on: a handle (an email address, a Slack user id, a name)."""
    delegate: str
    """Who may decide them meanwhile: a handle."""
    since: datetime
    until: datetime | None
    """When it ends by itself; None for a standing one of the configuration, which lasts
    as long as the file names it."""
    reason: str | None = None
    created_by: str | None = None
    """Who made it: `cli:<user>`, `inbox:<handle>`, or `config` for a standing one."""
    created_at: datetime | None = None
    ended_at: datetime | None = None
    ended_by: str | None = None

    @classmethod
    def made(
        cls,
        *,
        delegator: str,
        delegate: str,
        since: datetime,
        until: datetime,
        reason: str | None,
        created_by: str | None,
        at: datetime,
    ) -> Delegation:
        """A new delegation, made at `at`, with an id of its own (what `add` keeps)."""
        return cls(
            delegation_id=new_id("dlg_"),
            delegator=delegator,
            delegate=delegate,
            since=since,
            until=until,
            reason=reason,
            created_by=created_by,
            created_at=at,
        )

    def live(self, at: datetime) -> bool:
        """Whether it hands the reviews on at `at`."""
        if self.ended_at is not None and self.ended_at <= at:
            return False
        return self.since <= at and (self.until is None or at < self.until)


@runtime_checkable
class Delegations(Protocol):
    """Where delegations are kept (a store's `delegations`)."""

    async def add(
        self,
        *,
        delegator: str,
        delegate: str,
        since: datetime,
        until: datetime,
        reason: str | None = None,
        created_by: str | None = None,
    ) -> Delegation:
        """Keep a new one. Raises `StoreError`."""
        ...

    async def live(self, at: datetime) -> Sequence[Delegation]:
        """Those that hand reviews on at `at`, oldest first. Raises `StoreError`."""
        ...

    async def list(self, *, live: bool = True) -> Sequence[Delegation]:
        """Newest first: those that are live now or start later, or all (`live=False`).
        Raises `StoreError`."""
        ...

    async def end(self, delegation_id: str, *, by: str | None = None) -> Delegation:
        """End one now (an ended one stays as it was). Raises `DelegationNotFound`,
        `StoreError`."""
        ...


class MemoryDelegations:
    """`Delegations` in this process's memory (`MemoryApprovalStore.delegations`)."""

    def __init__(self, *, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, Delegation] = {}

    async def add(
        self,
        *,
        delegator: str,
        delegate: str,
        since: datetime,
        until: datetime,
        reason: str | None = None,
        created_by: str | None = None,
    ) -> Delegation:
        kept = Delegation.made(
            delegator=delegator,
            delegate=delegate,
            since=since,
            until=until,
            reason=reason,
            created_by=created_by,
            at=self._clock(),
        )
        with self._lock:
            self._kept[kept.delegation_id] = kept
        return kept

    async def live(self, at: datetime) -> Sequence[Delegation]:
        with self._lock:
            found = [d for d in self._kept.values() if d.live(at)]
        return sorted(found, key=_made)

    async def list(self, *, live: bool = True) -> Sequence[Delegation]:
        now = self._clock()
        with self._lock:
            found = [d for d in self._kept.values() if not live or _current(d, now)]
        return sorted(found, key=_made, reverse=True)

    async def end(self, delegation_id: str, *, by: str | None = None) -> Delegation:
        with self._lock:
            kept = self._kept.get(delegation_id)
            if kept is None:
                raise DelegationNotFound(delegation_id)
            if kept.ended_at is None:
                kept = replace(kept, ended_at=self._clock(), ended_by=by)
                self._kept[delegation_id] = kept
        return kept


def _made(delegation: Delegation) -> datetime:
    return delegation.created_at or delegation.since


def _current(delegation: Delegation, now: datetime) -> bool:
    """Live now, or to start later: not ended, not past."""
    ended = delegation.ended_at is not None
    return not ended and (delegation.until is None or now < delegation.until)
