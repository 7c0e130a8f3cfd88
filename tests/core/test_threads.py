"""The threads a blocking tool runs in (`core.threads`): `asyncio.to_thread`'s semantics at
half its cost. The function's value and exception reach the caller; it runs in a copy of the
caller's context; calls run side by side; a cancelled caller drops the result without
harming the pool; a loop that closed before its result came drops it too; and a plain `def`
tool of an executor runs there, off the loop's thread."""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import threading
import time

import pytest

from nodbot.core import Executor, ToolCall, ToolRegistry, threads
from nodbot.core.threads import MOST_THREADS, run_in_thread

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


class Stop(BaseException):
    """Not an `Exception`: it must reach the caller all the same."""


async def test_the_value_and_the_exception_reach_the_caller() -> None:
    assert await run_in_thread(lambda a, b=0: a + b, 2, b=3) == 5

    def fails() -> None:
        raise ValueError("no")

    def stops() -> None:
        raise Stop

    with pytest.raises(ValueError, match="no"):
        await run_in_thread(fails)
    with pytest.raises(Stop):
        await run_in_thread(stops)


async def test_the_function_runs_off_the_loop_in_a_copy_of_the_callers_context() -> None:
    WHO.set("ana")
    loop_thread = threading.get_ident()

    def look() -> tuple[str, int]:
        seen = WHO.get()
        WHO.set("changed in the thread")
        return seen, threading.get_ident()

    seen, ran_on = await run_in_thread(look)

    assert seen == "ana"
    assert ran_on != loop_thread
    assert WHO.get() == "ana"  # the thread's change stays in its copy


async def test_calls_run_side_by_side() -> None:
    """Each call waits at a barrier for all the others: they finish only if they run at
    once (a pool that ran them one by one would break the barrier after its timeout)."""
    parties = min(8, MOST_THREADS)
    barrier = threading.Barrier(parties, timeout=10)

    def meet(n: int) -> int:
        barrier.wait()
        return n

    done = await asyncio.gather(*(run_in_thread(meet, n) for n in range(parties)))

    assert done == list(range(parties))


async def test_a_cancelled_caller_drops_the_result_and_the_pool_goes_on() -> None:
    release = threading.Event()
    finished = threading.Event()

    def slow() -> str:
        release.wait(10)
        finished.set()
        return "late"

    task = asyncio.ensure_future(run_in_thread(slow))
    await asyncio.sleep(0)  # the call is submitted
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await asyncio.to_thread(finished.wait, 10)  # the function ran to its end

    assert await run_in_thread(lambda: "next") == "next"


def test_a_loop_that_closed_before_the_result_drops_it() -> None:
    release = threading.Event()
    finished = threading.Event()
    ran_on: list[threading.Thread] = []

    def slow() -> str:
        ran_on.append(threading.current_thread())
        release.wait(10)
        finished.set()
        return "late"

    async def ask_then_give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(run_in_thread(slow)), 0.05)

    asyncio.run(ask_then_give_up())  # the loop is closed now
    release.set()
    assert finished.wait(10)

    assert asyncio.run(run_in_thread(lambda: "still serving")) == "still serving"
    # The thread that could not hand its result back lives on to serve others: had the
    # closed loop's RuntimeError escaped, it would have ended (join returns at once then).
    [thread] = ran_on
    thread.join(timeout=1)
    assert thread.is_alive()


async def test_a_plain_def_tool_runs_in_the_pool() -> None:
    registry = ToolRegistry()

    @registry.tool()
    def where() -> str:
        """Which thread runs the tool."""
        return threading.current_thread().name

    executor = Executor(registry)
    result = await executor.run_call(ToolCall(name="where"), executor.context())

    assert result.status == "ok"
    assert result.value.startswith("nodbot-tool-")


def _in_child() -> None:
    """A forked child's own call: it has none of its parent's threads."""
    assert asyncio.run(run_in_thread(lambda: "from the child")) == "from the child"


def test_a_forked_child_has_a_pool_of_its_own() -> None:
    assert asyncio.run(run_in_thread(lambda: "warm")) == "warm"  # the parent has threads now
    # Forked while a parent's thread waits for work (it says so once it has handed its
    # result back): the child must not count on that thread.
    deadline = time.monotonic() + 10
    while not threads._POOL._idle._value and time.monotonic() < deadline:
        time.sleep(0.001)
    child = multiprocessing.get_context("fork").Process(target=_in_child)
    child.start()
    child.join(30)
    if child.exitcode is None:  # waiting for a thread the child does not have
        child.kill()
        child.join()
    assert child.exitcode == 0
