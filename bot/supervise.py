"""The long-lived tasks of `nodbot serve` (the workers, the IMAP reader, the SMTP / LMTP
listener), each kept running: one that ends or fails before the bot stops is logged with
why, said down by `/healthz` (naming it) and started again after a backoff, 1 s doubling to
60 s (back to 1 s once an attempt has run for `STEADY` seconds).

```python
supervisor = Supervisor(stop, health.task_down)
supervisor.start("email reader", lambda: reader.run(stop))
...
stop.set()
await supervisor.wait()  # every task has seen `stop` and ended
```

A task is a coroutine function that runs until `stop` is set; the supervisor does not cancel
it (it ends itself, as each of the bot's tasks does once `stop` is set), except when the
supervisor itself is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nodbot.core.waiting import set_within

__all__ = ["FIRST_RESTART", "MOST_RESTART", "STEADY", "Supervisor"]

log = logging.getLogger(__name__)

FIRST_RESTART = 1.0
MOST_RESTART = 60.0
"""Seconds before a task that ended is started again: doubling from the first, at most the
most."""
STEADY = 60.0
"""Seconds an attempt must run for its next failure to count as a first one again."""


class Supervisor:
    """Runs tasks and starts each again when it ends before `stop` is set (see the module).
    `down(name, why)` is told when a task is down and why, and `down(name, None)` once it
    has been started again."""

    def __init__(
        self,
        stop: asyncio.Event,
        down: Callable[[str, str | None], None],
        *,
        first: float = FIRST_RESTART,
        most: float = MOST_RESTART,
    ) -> None:
        self.stop = stop
        self.down = down
        self.first = first
        self.most = most
        self.attempts: dict[str, asyncio.Task[None]] = {}
        """The attempt under way of each task, by name."""
        self.restarts: dict[str, int] = {}
        """How many times each task has been started again."""
        self._supervising: list[asyncio.Task[None]] = []

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run `run()` as the task `name`, and again whenever it ends before `stop`."""
        task = asyncio.get_running_loop().create_task(
            self._supervise(name, run), name=f"supervising {name}"
        )
        self._supervising.append(task)

    async def wait(self) -> None:
        """Until every task has ended (once `stop` is set)."""
        if self._supervising:
            await asyncio.gather(*self._supervising, return_exceptions=True)

    async def _supervise(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            began = loop.time()
            attempt = loop.create_task(_awaited(run), name=name)
            self.attempts[name] = attempt
            try:
                await asyncio.wait({attempt})
            except asyncio.CancelledError:
                attempt.cancel()
                await asyncio.wait({attempt})
                raise
            why = _why(attempt)
            if self.stop.is_set():
                if why is not None and not attempt.cancelled() and attempt.exception():
                    log.error("%s failed as the bot stopped: %s", name, why)
                return
            failures = 1 if loop.time() - began >= STEADY else failures + 1
            delay = min(self.most, self.first * 2.0 ** (failures - 1))
            said = why or "it ended"
            self.down(name, f"{said}; starting it again in {delay:g} s")
            log.error(
                "%s stopped (%s); starting it again in %g s",
                name,
                said,
                delay,
                exc_info=None if attempt.cancelled() else attempt.exception(),
            )
            await set_within(self.stop, delay)
            if self.stop.is_set():
                self.down(name, None)
                return
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self.down(name, None)
            log.warning("%s started again", name)


async def _awaited(run: Callable[[], Awaitable[None]]) -> None:
    await run()


def _why(attempt: asyncio.Task[None]) -> str | None:
    """Why an attempt ended, in words; None when it returned."""
    if attempt.cancelled():
        return "it was cancelled"
    error = attempt.exception()
    if error is None:
        return None
    return f"{type(error).__name__}: {error}".rstrip(": ")
