"""Many processes resume one approved call at once: the tool runs once, the rest are refused.

The parent makes the approval the way a run would (pause, then a reviewer approves); four
child processes, each with its own store on the same database, then fire 25 resumes each
at the same moment. The winner's tool stays in flight until every other resume has been
answered, so each of those is "concurrent" and must be denied: never run, never turned into
a new review. (A fixed sleep in the tool is not enough: under load some resumes come after
the winner finished, and those rightly open a new review.)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nodbot.core import ToolResult
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.sqlstore.audit import verify
from nodbot.core.store import CONCURRENT_USE_REASON
from tests.core.store.conftest import database_url
from tests.core.store.workers import CALL, RUN_ID, Child, build_executor, children, read_lines

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
PROCESSES = 4
CALLS_EACH = 25


def not_in_parent(to: str) -> str:
    raise AssertionError("the parent only pauses and decides; the tool must not run here")


def approval_id(result: ToolResult) -> str:
    assert result.status == "pending" and result.error is not None, result
    return str(result.error.details["approval_id"])


async def approved_call(url: str) -> str:
    """Pause the call and approve it, as a run and a reviewer would; the approval's id."""
    async with SqlApprovalStore(url) as store:
        executor = build_executor(store, not_in_parent)
        pending = approval_id(await executor.run_call(CALL, executor.context(RUN_ID)))
        await executor.decide(pending, True, decided_by="ana")
    return pending


def all_in(racers: list[Child], tool_file: Path) -> bool:
    """Whether every resume has been answered or is running the tool."""
    answered = sum(racer.lines_written() for racer in racers)
    return answered + len(read_lines(tool_file)) >= PROCESSES * CALLS_EACH


def results_of(child: Child) -> list[dict[str, Any]]:
    return [json.loads(line) for line in child.stdout_lines()]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_concurrent_resumes_from_many_processes_run_the_tool_once(
    backend: str, tmp_path: Path
) -> None:
    tool_file, barrier = tmp_path / "sent.txt", tmp_path / "barrier"
    barrier.mkdir()
    async with database_url(backend, tmp_path) as url:
        approval = await approved_call(url)
        with children(tmp_path) as started:
            racers = [
                started.start("race", url, tool_file, barrier, CALLS_EACH) for _ in range(PROCESSES)
            ]
            started.wait_for(
                "every racer is ready", lambda: len(list(barrier.glob("ready-*"))) == PROCESSES
            )
            (barrier / "go").touch()
            # Release the winner once every other resume is answered, or at once if a second
            # one got into the tool (the assertions below then say what went wrong).
            started.wait_for(
                "every resume is answered or running the tool",
                lambda: all_in(racers, tool_file) or len(read_lines(tool_file)) > 1,
            )
            (barrier / "release").touch()
            for racer in racers:
                started.finish(racer)
        results = [result for racer in racers for result in results_of(racer)]
        async with SqlApprovalStore(url) as store:
            record = await store.get(approval)
            events = await store.events(approval)
            everything = await store.list()
        # Refusals from four processes at once still make one unbroken chain.
        audit = await verify(url)

    pids = {str(racer.process.pid) for racer in racers}
    sent = read_lines(tool_file)
    assert len(sent) == 1 and sent[0] in pids, sent

    assert len(results) == PROCESSES * CALLS_EACH
    statuses = Counter(result["status"] for result in results)
    assert statuses == {"ok": 1, "error": PROCESSES * CALLS_EACH - 1}, statuses
    refused = [result for result in results if result["status"] == "error"]
    assert {result["kind"] for result in refused} == {"approval-denied"}
    assert all(result["message"].endswith(CONCURRENT_USE_REASON) for result in refused)

    assert record.consumed and record.finished and record.outcome == "ok"
    assert [r.approval_id for r in everything] == [approval], "no resume opened a new review"
    kinds = Counter(event.kind for event in events)
    assert kinds == {
        "created": 1,
        "voted": 1,
        "decided": 1,
        "consumed": 1,
        "finished": 1,
        "refused": PROCESSES * CALLS_EACH - 1,
    }
    [finished] = [event for event in events if event.kind == "finished"]
    assert finished.detail == {"outcome": "ok"}
    reasons = {event.detail["reason"] for event in events if event.kind == "refused"}
    assert reasons == {CONCURRENT_USE_REASON}
    assert audit.ok, audit.problems
    assert audit.summary() == f"ok: {len(events)} events in 1 review"
