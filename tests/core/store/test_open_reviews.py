"""Open reviews cost the worker steps nothing: `claim_ready` takes exactly the ready runs
among many that wait, and every query of a worker step is served by an index."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from nodbot.core import (
    ApprovalRequest,
    ApprovalStore,
    Decision,
    HumanMessage,
    MemoryApprovalStore,
    MemoryRunStore,
    RunRecord,
    RunStore,
    SqlApprovalStore,
    arguments_digest,
)
from nodbot.core.sqlstore import postgres, sqlite
from nodbot.core.sqlstore.migrate import _config
from tests.core.store.conftest import BACKENDS, database_url

UNRELATED = 150
"""Waiting runs with a pending review each, beside the runs the tests look at."""
MESSAGES = [HumanMessage(content="Refund order o-7")]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class Stores:
    """The approvals and the runs of one backend, on one clock."""

    def __init__(self, approvals: ApprovalStore, runs: RunStore, clock: Clock) -> None:
        self.approvals, self.runs, self.clock = approvals, runs, clock

    async def waiting(self, run_id: str, *reviews: ApprovalRequest) -> list[str]:
        """A run that made `reviews` and was saved waiting; their approval ids."""
        run = await self.runs.create_run(
            agent="support", messages=MESSAGES, worker="w1", run_id=run_id
        )
        ids = [(await self.approvals.create(review)).approval_id for review in reviews]
        await self.runs.save_run(run, status="waiting", messages=MESSAGES)
        return ids


def review(
    run_id: str,
    call_id: str = "call_1",
    *,
    deadline: datetime | None = None,
    approvals_required: int = 1,
) -> ApprovalRequest:
    arguments = {"order_id": "o-7", "amount": 500.0}
    digest = arguments_digest(arguments)
    return ApprovalRequest(
        run_id,
        call_id,
        "refund",
        arguments,
        digest,
        deadline=deadline,
        approvals_required=approvals_required,
    )


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    clock = Clock()
    if request.param == "memory":
        approvals = MemoryApprovalStore(clock=clock)
        yield Stores(approvals, MemoryRunStore(approvals, clock=clock), clock)
        return
    async with (
        database_url(request.param, tmp_path) as url,
        SqlApprovalStore(url, clock=clock) as store,
    ):
        yield Stores(store, store, clock)


async def test_only_the_ready_runs_are_claimed_among_many_waiting(stores: Stores) -> None:
    approve = Decision(approved=True, decided_by="ana")
    for number in range(UNRELATED):
        await stores.waiting(f"run_open_{number}", review(f"run_open_{number}"))
    # Two reviews: ready once both are decided.
    first, second = await stores.waiting("run_two", review("run_two"), review("run_two", "c2"))
    await stores.approvals.decide(first, approve)
    # Decided before the run was saved waiting: ready at once.
    run = await stores.runs.create_run(
        agent="support", messages=MESSAGES, worker="w1", run_id="run_early"
    )
    early = await stores.approvals.create(review("run_early"))
    await stores.approvals.decide(early.approval_id, approve)
    await stores.runs.save_run(run, status="waiting", messages=MESSAGES)
    # Two votes needed: ready after the second.
    [voted] = await stores.waiting("run_votes", review("run_votes", approvals_required=2))
    await stores.approvals.vote(voted, Decision(approved=True, decided_by="bob"))
    # Decided by its deadline.
    deadline = stores.clock.now + timedelta(seconds=30)
    await stores.waiting("run_timer", review("run_timer", deadline=deadline))
    # Claimed by a worker that died: its lease runs out; and one that is still working.
    await stores.runs.create_run(
        agent="support", messages=MESSAGES, worker="w1", run_id="run_dead", lease=10
    )
    await stores.runs.create_run(
        agent="support", messages=MESSAGES, worker="w1", run_id="run_alive", lease=600
    )

    assert ids(await stores.runs.claim_ready(worker="w2", limit=500)) == ["run_early"]
    await stores.approvals.decide(second, approve)
    await stores.approvals.vote(voted, Decision(approved=True, decided_by="cy"))
    stores.clock.now += timedelta(seconds=60)
    assert [r.request.run_id for r in await stores.approvals.expire_due()] == ["run_timer"]
    claimed = await stores.runs.claim_ready(worker="w2", limit=500)
    assert ids(claimed) == ["run_two", "run_votes", "run_timer", "run_dead"]
    assert {run.claimed_by for run in claimed} == {"w2"}
    assert {run.status for run in claimed} == {"running"}
    assert await stores.runs.claim_ready(worker="w3", limit=500) == []
    # A run waiting again on a new review of its own is not ready until that is decided.
    taken = claimed[0]
    again = await stores.approvals.create(review("run_two", "c3"))
    await stores.runs.save_run(taken, status="waiting", messages=MESSAGES)
    assert await stores.runs.claim_ready(worker="w3", limit=500) == []
    await stores.approvals.decide(again.approval_id, approve)
    assert ids(await stores.runs.claim_ready(worker="w3", limit=500)) == ["run_two"]
    still_open = await stores.approvals.list(status="pending")
    assert len(still_open) == UNRELATED


async def test_a_run_made_after_its_reviews_waits_for_them(stores: Stores) -> None:
    made = await stores.approvals.create(review("run_late"))
    await stores.waiting("run_late")
    assert await stores.runs.claim_ready(worker="w2") == []
    await stores.approvals.decide(made.approval_id, Decision(approved=False, decided_by="ana"))
    assert ids(await stores.runs.claim_ready(worker="w2")) == ["run_late"]


def ids(claimed: list[RunRecord]) -> list[str]:
    return [run.run_id for run in claimed]


# --- the plans -------------------------------------------------------------------------

AT = "2026-12-01 12:00:00.000000"
SQLITE_STEP = {
    "claim_ready": (sqlite._CLAIM_READY, (AT, "w", AT, AT, 10)),
    "any due": (sqlite._ANY_DUE, (AT,)),
    "expire_due": (sqlite._EXPIRE, ("{}", "{}", AT, AT, 10)),
    "unannounced": (sqlite._UNANNOUNCED, (10,)),
    "claim_deliveries": (sqlite._CLAIM_DELIVERIES, ("w", AT, AT, AT, 10)),
}


def sqlite_plan(path: Path, query: str, parameters: tuple[object, ...]) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {query}", parameters)]
    finally:
        db.close()


async def test_every_query_of_a_worker_step_uses_an_index_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.db"
    async with SqlApprovalStore(f"sqlite:///{path}") as store:
        for number in range(20):
            await store.create(review(f"run_open_{number}"))
    for name, (query, parameters) in SQLITE_STEP.items():
        plan = sqlite_plan(path, query, parameters)
        scans = [step for step in plan if step.startswith("SCAN") and "INDEX" not in step]
        assert scans == [], (name, plan)
        # Through the status index only by status: every pending review, sorted after.
        assert not any(step.endswith("approvals_status (status=?)") for step in plan), plan
        assert "USE TEMP B-TREE FOR ORDER BY" not in plan, (name, plan)
    claim = sqlite_plan(path, *SQLITE_STEP["claim_ready"])
    assert any("runs_claimable" in step for step in claim), claim
    assert not any("approvals" in step for step in claim), claim


@pytest.mark.postgres
async def test_every_query_of_a_worker_step_uses_an_index_on_postgresql(tmp_path: Path) -> None:
    import asyncpg

    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    step = {
        "claim_ready": (postgres._CLAIM_READY, (at, "w", at, 10)),
        "expire_due": (postgres._EXPIRE, ("{}", "{}", at, 10, "t", "a", "b", "c", "d", "s")),
        "unannounced": (postgres._UNANNOUNCED, (10,)),
        "claim_deliveries": (postgres._CLAIM_DELIVERIES, ("w", at, at, 10)),
    }
    async with database_url("postgresql", tmp_path) as url:
        async with SqlApprovalStore(url) as store:
            for number in range(20):
                await store.create(review(f"run_open_{number}"))
        connection = await asyncpg.connect(url)
        try:
            # Tiny tables are read whole whatever their indexes: forbid that, and any plan
            # that is left with a sequential scan has no index to serve it.
            await connection.execute("SET enable_seqscan = off")
            plans = {}
            for name, (query, arguments) in step.items():
                rows = await connection.fetch(f"EXPLAIN {query}", *arguments)
                plans[name] = "\n".join(row[0] for row in rows)
        finally:
            await connection.close()
    for name, plan in plans.items():
        # `listeners` holds a row per listening session, however many reviews there are.
        scans = [line for line in plan.splitlines() if "Seq Scan" in line]
        assert all("Seq Scan on listeners" in line for line in scans), (name, plan)
    assert "runs_claimable" in plans["claim_ready"], plans["claim_ready"]
    assert "approvals" not in plans["claim_ready"], plans["claim_ready"]
    assert "approvals_unannounced" in plans["unannounced"], plans["unannounced"]
    assert "approvals_deadline" in plans["expire_due"], plans["expire_due"]
    assert "deliveries_due" in plans["claim_deliveries"], plans["claim_deliveries"]


# --- the migration ---------------------------------------------------------------------


async def test_the_migration_counts_the_pending_reviews_of_runs_there(tmp_path: Path) -> None:
    from alembic import command

    path = tmp_path / "nodbot.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.upgrade(_config(connection), "0007")
    engine.dispose()
    db = sqlite3.connect(path)
    with db:
        for run_id in ("run_waits", "run_ready"):
            db.execute(
                "INSERT INTO runs (run_id, agent, status, messages, version, created_at, "
                "updated_at) VALUES (?, 'support', 'waiting', '[]', 2, ?, ?)",
                (run_id, AT, AT),
            )
        for number, (run_id, status) in enumerate(
            [("run_waits", "pending"), ("run_waits", "approved"), ("run_ready", "denied")]
        ):
            db.execute(
                "INSERT INTO approvals (approval_id, run_id, call_id, tool, arguments, digest, "
                "status, created_at) VALUES (?, ?, ?, 'refund', '{}', '', ?, ?)",
                (f"apr_{number}", run_id, f"call_{number}", status, AT),
            )
    db.close()
    async with SqlApprovalStore(f"sqlite:///{path}") as store:
        claimed = await store.claim_ready(worker="w1")
        assert [run.run_id for run in claimed] == ["run_ready"]
        await store.decide("apr_0", Decision(approved=True, decided_by="ana"))
        assert [run.run_id for run in await store.claim_ready(worker="w1")] == ["run_waits"]
