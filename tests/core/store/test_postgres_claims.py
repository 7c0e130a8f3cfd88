"""A PostgreSQL claim sends only the part of the claim it most likely needs: a call new to the
store is made by a statement that only makes it (or finds its active record), and a call the
store claimed before is resumed by one that only takes it (or finds its active record). The
whole claim is the fallback when neither finds what it looks for. Whichever way, the outcome
is the one claim has always had (invariant 2: a decision runs at most one call)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from nodbot.core import Decision, SqlApprovalStore
from nodbot.core.sqlstore.audit import verify
from tests.core.store.conftest import ask

pytestmark = pytest.mark.postgres


def makes(query: str) -> bool:
    return "INSERT INTO approvals" in query


def takes(query: str) -> bool:
    return "SET consumed_at" in query


class Sent:
    """The statements the store's connections send from now on (asyncpg's query loggers on
    every connection open now; a test that runs one task at a time uses only those)."""

    def __init__(self, store: SqlApprovalStore) -> None:
        self.queries: list[str] = []
        pool = store._backend._pool  # type: ignore[union-attr]
        assert pool._idle, "the store has no connection open yet"
        for idle in pool._idle:  # each idle connection, as the pool keeps it (`_Heard`)
            idle.connection.add_query_logger(self._logged)

    def _logged(self, record: asyncpg.connection.LoggedQuery) -> None:
        self.queries.append(record.query)

    async def parts(self) -> list[tuple[bool, bool]]:
        """Whether each statement sent since the last call makes a record, and whether it
        takes one; and forgets them."""
        # asyncpg calls its loggers with call_soon once a statement is done: one turn of the
        # loop runs every call scheduled before it.
        await asyncio.sleep(0)
        parts = [(makes(query), takes(query)) for query in self.queries]
        self.queries.clear()
        return parts


async def kinds(store: SqlApprovalStore, approval_id: str) -> list[str]:
    return [event.kind for event in await store.events(approval_id)]


@pytest.mark.parametrize("approved", [True, False])
async def test_a_cycle_claims_with_one_part_each_time(postgres_url: str, approved: bool) -> None:
    async with SqlApprovalStore(postgres_url) as store:
        await store.counts()  # connected
        sent = Sent(store)
        made = await store.claim(ask("c1"))
        assert made.outcome == "pending"
        assert await sent.parts() == [(True, False)]
        approval_id = made.record.approval_id
        # Asked again before anyone decides: the same review, still pending, nothing made.
        again = await store.claim(ask("c1"))
        assert (again.outcome, again.record.approval_id) == ("pending", approval_id)
        assert await sent.parts() == [(False, True)]
        await store.decide(approval_id, Decision(approved=approved, decided_by="ana"))
        await sent.parts()  # the decision's
        taken = await store.claim(ask("c1"), actor="worker")
        assert (taken.outcome, taken.record.approval_id) == ("taken", approval_id)
        assert await sent.parts() == [(False, True)]
        assert (taken.record.outcome == "denied") is not approved
        expected = ["created", "decided", "consumed"] + ([] if approved else ["finished"])
        assert await kinds(store, approval_id) == expected
    assert (await verify(postgres_url)).ok


async def test_a_call_another_store_made_is_claimed_as_its_record_says(postgres_url: str) -> None:
    async with SqlApprovalStore(postgres_url) as one, SqlApprovalStore(postgres_url) as other:
        approval_id = (await other.claim(ask("c1"))).record.approval_id
        # New to `one`: its making statement meets the active record, pending.
        pending = await one.claim(ask("c1"))
        assert (pending.outcome, pending.record.approval_id) == ("pending", approval_id)
        assert (await one.claim(ask("c1", amount=9.0))).outcome == "mismatch"
        await other.decide(approval_id, Decision(approved=True, decided_by="ana"))
        taken = await one.claim(ask("c1"), actor="w1")
        assert (taken.outcome, taken.record.approval_id) == ("taken", approval_id)
        # `other` made it, so resumes it with the take alone: spent, so refused.
        in_use = await other.claim(ask("c1"), actor="w2")
        assert (in_use.outcome, in_use.record.approval_id) == ("in_use", approval_id)
        assert (await other.claim(ask("c1", amount=9.0))).outcome == "mismatch"
        await one.finish(approval_id, outcome="ok")
        assert await kinds(one, approval_id) == [
            "created",
            "decided",
            "consumed",
            "refused",
            "finished",
        ]
        assert await one.counts() == {"pending": 0, "approved": 1, "denied": 0}
    assert (await verify(postgres_url)).ok


async def test_a_finished_call_claimed_again_falls_back_to_the_whole_claim(
    postgres_url: str,
) -> None:
    async with SqlApprovalStore(postgres_url) as store:
        first = (await store.claim(ask("c1"))).record.approval_id
        await store.decide(first, Decision(approved=True, decided_by="ana"))
        await store.claim(ask("c1"), actor="worker")
        await store.finish(first, outcome="ok")
        sent = Sent(store)
        # The take finds no active record; the whole claim makes a new review.
        second = await store.claim(ask("c1"))
        assert second.outcome == "pending" and second.record.approval_id != first
        assert await sent.parts() == [(False, True), (True, True)]
        assert await store.counts() == {"pending": 1, "approved": 1, "denied": 0}
    assert (await verify(postgres_url)).ok
