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

__all__ = ["set_within", "wait_for_decision"]


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
            await set_within(woken, poll)  # a notice, or time to look again
    finally:
        if unlisten is not None:
            await unlisten()


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Until `event` is set or `seconds` pass; whether it is set.

    Every wait of nodbot's own for "this, or at most that long" goes through here, not
    through `asyncio.wait_for`: on Python 3.11 `wait_for` returns what it awaited when that
    completes just as the waiting task is cancelled, and the cancel is lost, so a wait its
    caller gave up on (an `asyncio.timeout` that expired, a request dropped, a task stopped)
    went on. `asyncio.timeout` keeps the cancel."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
