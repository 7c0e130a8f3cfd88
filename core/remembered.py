"""Remembered approvals: a reviewer's "approve, and remember" (a rule's `remember: 1d`), so that
a later identical call is approved at once, as that reviewer's decision.

What is remembered is a *scope*: the SHA-256 of the tool, the digest of the rule's text and
the arguments the rule names (`remember_by`, by default all of them), so the same call of the
same tool under the same rule matches, and a rule whose text changed matches nothing it
remembered before. Each lasts until its expiry, or until it is forgotten (`forget`: from the
CLI or the inbox); the store keeps forgotten and expired ones for the record, and `find`
skips them.

```python
scope = remember_scope("refund", rule_digest, {"order_id": "o-7", "amount": 20})
kept = await store.remembered.remember(scope=scope, tool="refund", ...)
found = await store.remembered.find(scope)            # None once expired or forgotten
```
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from nodbot.core.calls import new_id
from nodbot.core.errors import NodbotError
from nodbot.core.tools import canonical_json

__all__ = [
    "MemoryRememberedApprovals",
    "RememberedApproval",
    "RememberedApprovals",
    "RememberedNotFound",
    "remember_scope",
]


class RememberedNotFound(NodbotError):
    """No remembered approval has this id."""

    kind = "remembered-not-found"

    def __init__(self, remember_id: str) -> None:
        super().__init__(f"no remembered approval has the id {remember_id!r}")
        self.remember_id = remember_id


def remember_scope(tool: str, rule_digest: str, arguments: Mapping[str, Any]) -> str:
    """The scope of a remembered approval: what a later call must match."""
    text = canonical_json({"tool": tool, "rule": rule_digest, "arguments": dict(arguments)})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RememberedApproval:
    """One remembered approval."""

    remember_id: str
    scope: str
    tool: str
    arguments: dict[str, Any]
    """The arguments it covers (those the rule names), as they were approved."""
    rule: str
    """The digest of the rule's text it was made under."""
    decided_by: str
    """Who approved, and is recorded as approving the calls it covers."""
    person: str | None
    approval_id: str
    """The review it was made in."""
    created_at: datetime
    expires_at: datetime
    forgotten_at: datetime | None = None
    forgotten_by: str | None = None

    def live(self, now: datetime) -> bool:
        return self.forgotten_at is None and now < self.expires_at

    @classmethod
    def new(
        cls,
        *,
        scope: str,
        tool: str,
        arguments: Mapping[str, Any],
        rule: str,
        decided_by: str,
        person: str | None,
        approval_id: str,
        created_at: datetime,
        until: datetime,
    ) -> RememberedApproval:
        """A new one, with an id of its own."""
        return cls(
            remember_id=new_id("rem_"),
            scope=scope,
            tool=tool,
            arguments=dict(arguments),
            rule=rule,
            decided_by=decided_by,
            person=person,
            approval_id=approval_id,
            created_at=created_at,
            expires_at=until,
        )


@runtime_checkable
class RememberedApprovals(Protocol):
    """Where remembered approvals are kept (a store's `remembered`)."""

    async def remember(
        self,
        *,
        scope: str,
        tool: str,
        arguments: Mapping[str, Any],
        rule: str,
        decided_by: str,
        person: str | None,
        approval_id: str,
        until: datetime,
    ) -> RememberedApproval:
        """Keep a new one until `until`. Raises `StoreError`."""
        ...

    async def find(self, scope: str) -> RememberedApproval | None:
        """The newest live one of `scope`, None when none is. Raises `StoreError`."""
        ...

    async def list(self, *, live: bool = True) -> Sequence[RememberedApproval]:
        """Newest first: the live ones, or all (`live=False`). Raises `StoreError`."""
        ...

    async def forget(self, remember_id: str, *, by: str | None = None) -> RememberedApproval:
        """Forget one (it covers no call from now on). Raises `RememberedNotFound`."""
        ...


class MemoryRememberedApprovals:
    """`RememberedApprovals` in this process's memory (`MemoryApprovalStore.remembered`)."""

    def __init__(self, *, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, RememberedApproval] = {}

    async def remember(
        self,
        *,
        scope: str,
        tool: str,
        arguments: Mapping[str, Any],
        rule: str,
        decided_by: str,
        person: str | None,
        approval_id: str,
        until: datetime,
    ) -> RememberedApproval:
        kept = RememberedApproval.new(
            scope=scope,
            tool=tool,
            arguments=arguments,
            rule=rule,
            decided_by=decided_by,
            person=person,
            approval_id=approval_id,
            created_at=self._clock(),
            until=until,
        )
        with self._lock:
            self._kept[kept.remember_id] = kept
        return kept

    async def find(self, scope: str) -> RememberedApproval | None:
        now = self._clock()
        with self._lock:
            found = [k for k in self._kept.values() if k.scope == scope and k.live(now)]
        return max(found, key=lambda k: k.created_at, default=None)

    async def list(self, *, live: bool = True) -> Sequence[RememberedApproval]:
        now = self._clock()
        with self._lock:
            kept = [k for k in self._kept.values() if not live or k.live(now)]
        return sorted(kept, key=lambda k: k.created_at, reverse=True)

    async def forget(self, remember_id: str, *, by: str | None = None) -> RememberedApproval:
        with self._lock:
            kept = self._kept.get(remember_id)
            if kept is None:
                raise RememberedNotFound(remember_id)
            if kept.forgotten_at is None:
                kept = replace(kept, forgotten_at=self._clock(), forgotten_by=by)
                self._kept[remember_id] = kept
        return kept
