"""Writing down what has already happened, through a store that is briefly unavailable.

Most store operations that fail can simply fail: nothing happened yet, and the worker tries
the whole step again later. Two cannot: the record that a tool ran (its approval settled),
and the save of the run that holds the tool's result. The effect is done and its result is
only in memory; giving up would leave a decision spent with nothing to show for it, and a run
that must never run that call again. So these two are tried again, with backoff, for as long
as the caller may (a worker: while its lease on the run holds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nodbot.core.errors import StoreUnavailableError

__all__ = ["RETRY_FIRST", "RETRY_MOST", "until_written"]

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_FIRST = 0.05
RETRY_MOST = 2.0
"""Seconds between attempts: doubling from the first to the most."""


async def until_written(write: Callable[[], Awaitable[T]], *, what: str, within: float) -> T:
    """`await write()`, again after each `StoreUnavailableError` for up to `within` seconds;
    then the last error is raised. `write` must be safe to repeat: a conditional write whose
    first attempt may have landed before its answer was lost (the condition then tells)."""
    deadline = time.monotonic() + within
    wait = RETRY_FIRST
    while True:
        try:
            return await write()
        except StoreUnavailableError as exc:
            if time.monotonic() + wait > deadline:
                raise
            log.warning("%s: %s; trying again in %.2f s", what, exc, wait)
        await asyncio.sleep(wait)
        wait = min(wait * 2, RETRY_MOST)
