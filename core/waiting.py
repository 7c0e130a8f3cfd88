"""Waiting for a decision from another process: what an app that runs the executor itself
(not as a bot-hosted run) does between `run_call` returning pending and resuming.

```python
first = await executor.run_call(call, ctx)                     # pending
async with asyncio.timeout(3600):                               # as long as you will wait
    record = await wait_for_decision(store, first.error.details["approval_id"])
resumed = await executor.run_call(call, ctx)                  # same run, same call id
```

On PostgreSQL the wait wakes on the database's notice of the decision (at once when `store`
itself decided it); elsewhere it looks at the store every `poll` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from nodbot.core.store import ApprovalRecord, ApprovalStore

__all__ = ["wait_for_decision"]


async def wait_for_decision(
    store: ApprovalStore, approval_id: str, *, poll: float = 0.5
) -> ApprovalRecord:
    """The approval once it is decided (by a reviewer, a rule or its deadline). Bound the
    wait with `asyncio.timeout(...)`. Raises `ApprovalNotFound`."""
    woken = asyncio.Event()
    listen: Callable[[Callable[[], None]], Awaitable[Callable[[], Awaitable[None]]]] | None
    listen = getattr(store, "listen", None)
    unlisten = await listen(woken.set) if listen is not None else None
    try:
        while True:
            woken.clear()
            record = await store.get(approval_id)
            if record.decision is not None:
                return record
            with contextlib.suppress(TimeoutError):  # a notice, or time to look again
                await asyncio.wait_for(woken.wait(), poll)
    finally:
        if unlisten is not None:
            await unlisten()
