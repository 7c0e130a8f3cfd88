"""The threads a blocking tool runs in: a pool of nodbot's own, fed through one queue.

A plain `def` tool may block (network, disk, a lock), so it runs off the event loop
(`Tool.blocking`, the default). `asyncio.to_thread` would hand it to the loop's default
executor: a `concurrent.futures.Future` chained to an asyncio one, each with its lock,
state and callbacks, about half the cost of the hand-off (measured on a 2-core machine:
about 80 µs a call through `to_thread`, about 40 µs here). Here a call is one item on a
`queue.SimpleQueue` and one `call_soon_threadsafe` back to the caller's loop.

Semantics are `to_thread`'s:

- the function runs in a copy of the caller's context (`contextvars`);
- its exception is raised to the caller, `BaseException`s included;
- cancelling the awaiting task does not stop the function (nothing can): its result is
  dropped;
- calls run at once, side by side: a call that finds no idle thread starts one, up to
  `MOST_THREADS` (then it waits for one to be free, in the order it came);
- at interpreter exit, the calls still running finish first (`atexit`), as the default
  executor's do; a result whose loop has closed meanwhile is dropped;
- a child process made by `fork` starts with an empty pool of its own.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["MOST_THREADS", "run_in_thread"]

T = TypeVar("T")

MOST_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""The most threads the pool runs at once: the default executor's number."""

_Work = tuple[
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
]


class _Pool:
    """Threads that take calls from one queue (see the module)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._reset()

    def _reset(self) -> None:
        """Empty, with no threads: as made, and in a child process after a fork (which has
        none of its parent's threads: work queued for them would wait for ever)."""
        self._queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        """Released by a thread as it waits for work: a call that acquires it has one."""
        self._lock = threading.Lock()
        self._running = threading.Condition(self._lock)
        self._threads = 0
        self._busy = 0

    def submit(self, work: _Work) -> None:
        if not self._idle.acquire(blocking=False):
            with self._lock:
                start = self._threads < self.most
                if start:
                    self._threads += 1
                    number = self._threads
            if start:
                thread = threading.Thread(
                    target=self._serve, name=f"nodbot-tool-{number}", daemon=True
                )
                thread.start()
        self._queue.put(work)

    def _serve(self) -> None:
        while True:
            loop, future, context, function, args, kwargs = self._queue.get()
            with self._lock:
                self._busy += 1
            result: Any = None
            error: BaseException | None = None
            try:
                result = context.run(function, *args, **kwargs)
            except BaseException as exc:  # raised to the caller, as to_thread does
                error = exc
            finally:
                with self._lock:
                    self._busy -= 1
                    if not self._busy:
                        self._running.notify_all()
            # A loop that has closed meanwhile raises RuntimeError: nobody waits for it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)
            del result, error, future, loop, context, function, args, kwargs
            self._idle.release()

    def drain(self) -> None:
        """Wait for the calls running now to finish (at interpreter exit)."""
        with self._lock:
            while self._busy:
                self._running.wait()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


_POOL = _Pool(MOST_THREADS)
atexit.register(_POOL.drain)
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_POOL._reset)


async def run_in_thread(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)` in a thread of the pool, awaited (as `asyncio.to_thread`:
    see the module)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    _POOL.submit((loop, future, contextvars.copy_context(), function, args, kwargs))
    return await future
