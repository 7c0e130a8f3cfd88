"""The PostgreSQL store chains the events of its busiest statements itself, after the link it
last wrote for the review, instead of leaving every event to the events_chain trigger
(migration 0014); a link another writer chained to since is refused by the chain's unique
index, and the statement is made again with the chain left to the trigger (invariant 6)."""

from __future__ import annotations

import asyncio
import importlib

import asyncpg
import pytest

from nodbot.core import (
    ApprovalRequest,
    Decision,
    HumanMessage,
    NewDelivery,
    SqlApprovalStore,
    arguments_digest,
)
from nodbot.core.sqlstore.audit import verify
from nodbot.core.sqlstore.postgres import CHAIN_LOCK_CLASS

pytestmark = pytest.mark.postgres

KEY = "the audit key, long enough to count"
REFUSING_TRIGGER = """
CREATE OR REPLACE FUNCTION nodbot_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the events_chain trigger ran for a % event', NEW.kind;
END $$"""


def ask(call_id: str, approvals_required: int = 1, run_id: str = "run_1") -> ApprovalRequest:
    arguments = {"order_id": "o-7", "amount": 500.0}
    return ApprovalRequest(
        run_id,
        call_id,
        "refund",
        arguments,
        arguments_digest(arguments),
        requested_by="carol",
        approvals_required=approvals_required,
    )


async def kinds(store: SqlApprovalStore, approval_id: str) -> list[str]:
    return [event.kind for event in await store.events(approval_id)]


async def refuse_the_trigger(url: str) -> None:
    """From now on the events_chain trigger fails the statement of any row it would chain."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(REFUSING_TRIGGER)
    finally:
        await connection.close()


async def test_an_approval_cycle_chains_its_events_without_the_trigger(postgres_url: str) -> None:
    async with SqlApprovalStore(postgres_url, audit_key=KEY) as store:
        await refuse_the_trigger(postgres_url)
        approved = (await store.claim(ask("c1"))).record.approval_id
        await store.decide(approved, Decision(approved=True, decided_by="ana"))
        assert (await store.claim(ask("c1"), actor="worker")).outcome == "taken"
        await store.finish(approved, outcome="ok")
        denied = (await store.create(ask("c2"))).approval_id
        await store.vote(denied, Decision(approved=False, decided_by="bob"), channel="api")
        await store.consume(denied, actor="worker")
        assert await kinds(store, approved) == ["created", "decided", "consumed", "finished"]
        assert await kinds(store, denied) == ["created", "voted", "decided", "consumed", "finished"]
    assert (await verify(postgres_url, KEY)).ok


async def test_a_link_another_store_chained_to_since_is_left_to_the_trigger(
    postgres_url: str,
) -> None:
    async with (
        SqlApprovalStore(postgres_url, audit_key=KEY) as one,
        SqlApprovalStore(postgres_url, audit_key=KEY) as other,
    ):
        approval_id = (await one.claim(ask("c1"))).record.approval_id
        # `one` remembers the `created` link; `other` chains two events after it.
        await other.refuse(approval_id, actor="eve", channel="api", reason="no")
        await other.refuse(approval_id, actor="eve", channel="api", reason="again")
        await one.decide(approval_id, Decision(approved=True, decided_by="ana"), channel="api")
        assert (await one.claim(ask("c1"), actor="worker")).outcome == "taken"
        await one.finish(approval_id, outcome="ok")
        assert await kinds(one, approval_id) == [
            "created",
            "refused",
            "refused",
            "decided",
            "consumed",
            "finished",
        ]
    assert (await verify(postgres_url, KEY)).ok


async def test_a_call_claimed_again_after_it_finished_gets_a_chain_of_its_own(
    postgres_url: str,
) -> None:
    async with SqlApprovalStore(postgres_url) as store:
        first = (await store.claim(ask("c1"))).record.approval_id
        await store.decide(first, Decision(approved=False, decided_by="ana"))
        assert (await store.claim(ask("c1"), actor="worker")).record.finished
        # The call is known here as `first`, which is finished: a new review is made.
        second = (await store.claim(ask("c1"))).record.approval_id
        assert second != first
        await store.decide(second, Decision(approved=True, decided_by="ana"))
        assert (await store.claim(ask("c1"), actor="worker")).outcome == "taken"
        await store.finish(second, outcome="ok")
        assert await kinds(store, second) == ["created", "decided", "consumed", "finished"]
    assert (await verify(postgres_url)).ok


async def test_a_delivery_chained_by_the_trigger_is_the_link_the_next_decision_follows(
    postgres_url: str,
) -> None:
    """The bot's way: a run's first save writes it with its review, a delivery of the review
    is settled (its event chained by the trigger, whose link the statement returns), then
    the review is decided and taken, chained here."""
    async with SqlApprovalStore(postgres_url, audit_key=KEY) as store:
        run = await store.draft_run(
            agent="support", messages=[HumanMessage(content="refund o-7")], worker="w1"
        )
        approval_id = (await store.claim(ask("c1", run_id=run.run_id))).record.approval_id
        await store.save_run(run, status="waiting", messages=run.messages)
        await store.announce(approval_id, "request", [NewDelivery("request", "webhook:ops")])
        [delivery] = await store.claim_deliveries(worker="w1")
        await store.delivered(delivery.delivery_id, worker="w1", ref={"ts": "1.5"})
        await refuse_the_trigger(postgres_url)
        await store.vote(approval_id, Decision(approved=True, decided_by="ana"), channel="api")
        assert (await store.claim(ask("c1", run_id=run.run_id))).outcome == "taken"
        assert await kinds(store, approval_id) == [
            "created",
            "delivered",
            "voted",
            "decided",
            "consumed",
        ]
    assert (await verify(postgres_url, KEY)).ok


async def test_a_run_s_first_save_chains_its_reviews_without_the_trigger(
    postgres_url: str,
) -> None:
    async with SqlApprovalStore(postgres_url, audit_key=KEY) as store:
        run = await store.draft_run(
            agent="support", messages=[HumanMessage(content="refund o-7")], worker="w1"
        )
        ids = [
            (await store.claim(ask(call_id, run_id=run.run_id))).record.approval_id
            for call_id in ("c1", "c2")
        ]
        await refuse_the_trigger(postgres_url)
        await store.save_run(run, status="waiting", messages=run.messages)
        for approval_id in ids:
            assert await kinds(store, approval_id) == ["created"]
    assert (await verify(postgres_url, KEY)).ok


async def test_statements_of_one_store_on_one_review_at_once_keep_one_chain(
    postgres_url: str,
) -> None:
    """A delivery settled while the review is decided, then taken while its outcome is
    delivered: the second statement of each pair leaves its chain to the trigger, which
    waits for the first."""
    async with SqlApprovalStore(postgres_url, audit_key=KEY) as store:
        approval_id = (await store.claim(ask("c1"))).record.approval_id
        targets = [NewDelivery("request", f"webhook:ops{i}") for i in range(3)]
        await store.announce(approval_id, "request", targets)
        deliveries = await store.claim_deliveries(worker="w1")
        vote = store.vote(approval_id, Decision(approved=True, decided_by="ana"), channel="api")
        settled = [store.delivered(d.delivery_id, worker="w1", ref={}) for d in deliveries]
        await asyncio.gather(*settled, vote)
        await store.announce(approval_id, "outcome", [NewDelivery("outcome", "webhook:ops")])
        [outcome] = await store.claim_deliveries(worker="w1")
        taken, _ = await asyncio.gather(
            store.claim(ask("c1")), store.delivered(outcome.delivery_id, worker="w1", ref={})
        )
        assert taken.outcome == "taken"
        await store.finish(approval_id, outcome="ok")
    # In the chain's order (an event's seq is drawn before it waits for its place).
    connection = await asyncpg.connect(postgres_url)
    try:
        rows = await connection.fetch(
            "SELECT kind FROM events WHERE approval_id = $1 ORDER BY n", approval_id
        )
    finally:
        await connection.close()
    chain = [row["kind"] for row in rows]
    assert sorted(chain) == sorted(
        ["created", *["delivered"] * 4, "voted", "decided", "consumed", "finished"]
    )
    assert chain.index("voted") + 1 == chain.index("decided")
    assert chain[-1] == "finished"
    assert (await verify(postgres_url, KEY)).ok


def test_the_statements_take_the_trigger_s_lock() -> None:
    trigger = importlib.import_module("nodbot.core.sqlstore.migrations.versions.0007_audit_chain")
    assert CHAIN_LOCK_CLASS == trigger.CHAIN_LOCK_CLASS
    assert f"pg_advisory_xact_lock({CHAIN_LOCK_CLASS}, hashtext(NEW.approval_id))" in (
        trigger.POSTGRESQL_CHAIN
    )
