"""The outbox kept in the SQL store: announce each review once per stage, deliver each
delivery once per target, retry what failed, and let only the claimant settle a delivery."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodbot.core import (
    ApprovalRequest,
    Decision,
    DeliveryLost,
    NewDelivery,
    Outbox,
    SqlApprovalStore,
    StoreUnavailableError,
    arguments_digest,
)
from nodbot.core.outbox import ORPHANED
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=SQL_BACKENDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[SqlApprovalStore]:
    async with (
        database_url(request.param, tmp_path) as url,
        SqlApprovalStore(url, clock=clock) as sql,
    ):
        yield sql


def request(call_id: str = "call_1") -> ApprovalRequest:
    arguments = {"order_id": "o-7", "amount": 500.0}
    return ApprovalRequest("run_1", call_id, "refund", arguments, arguments_digest(arguments))


HOOK = NewDelivery("request", "webhook:ops")


async def test_the_store_is_an_outbox(store: SqlApprovalStore) -> None:
    assert isinstance(store, Outbox)


async def test_a_new_review_is_to_be_announced_once(store: SqlApprovalStore) -> None:
    record = await store.create(request())
    [announcement] = await store.unannounced()
    assert (announcement.record.approval_id, announcement.stage) == (record.approval_id, "request")
    made = await store.announce(record.approval_id, "request", [HOOK])
    assert [(d.kind, d.target, d.status, d.attempts) for d in made] == [
        ("request", "webhook:ops", "due", 0)
    ]
    assert await store.unannounced() == []
    # Announcing again (another replica, a retry) makes nothing twice.
    assert await store.announce(record.approval_id, "request", [HOOK]) == []
    assert len(await store.deliveries(record.approval_id)) == 1


async def test_the_outcome_is_announced_after_the_decision(store: SqlApprovalStore) -> None:
    record = await store.create(request())
    await store.announce(record.approval_id, "request", [HOOK])
    await store.decide(record.approval_id, Decision(approved=True, decided_by="ana"))
    [announcement] = await store.unannounced()
    assert announcement.stage == "outcome"
    assert announcement.record.decision is not None
    await store.announce(record.approval_id, "outcome", [NewDelivery("outcome", "webhook:ops")])
    assert await store.unannounced() == []
    kinds = [d.kind for d in await store.deliveries(record.approval_id)]
    assert kinds == ["request", "outcome"]


async def test_a_review_decided_before_announcing_announces_request_then_outcome(
    store: SqlApprovalStore,
) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, Decision(approved=False, decided_by="ana"))
    assert [a.stage for a in await store.unannounced()] == ["request"]
    await store.announce(record.approval_id, "request", [])
    assert [a.stage for a in await store.unannounced()] == ["outcome"]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_without_an_outcome_stage_a_deciding_vote_leaves_nothing_to_announce(
    backend: str, tmp_path: Path, clock: Clock
) -> None:
    """A store told that no channel tells outcomes (`outcome_stage=False`) marks the outcome
    announced in the statement of the vote that decides the review: nothing is left for the
    outbox's second stage, and no outcome delivery is made."""
    async with (
        database_url(backend, tmp_path) as url,
        SqlApprovalStore(url, clock=clock, outcome_stage=False) as quiet,
    ):
        record = await quiet.create(request())
        await quiet.announce(record.approval_id, "request", [HOOK])
        decided = await quiet.vote(record.approval_id, Decision(approved=True, decided_by="ana"))
        assert decided.status == "approved"
        assert await quiet.unannounced() == []
        assert [d.kind for d in await quiet.deliveries(record.approval_id)] == ["request"]
        # A review decided before its request went out still has its request announced,
        # and then its outcome, as any other store does (the vote cannot skip a stage that
        # has not begun).
        early = await quiet.create(request("call_2"))
        await quiet.vote(early.approval_id, Decision(approved=False, decided_by="ana"))
        assert [a.stage for a in await quiet.unannounced()] == ["request"]
        await quiet.announce(early.approval_id, "request", [])
        assert [a.stage for a in await quiet.unannounced()] == ["outcome"]


async def test_a_deciding_vote_leaves_the_outcome_to_announce_by_default(
    store: SqlApprovalStore,
) -> None:
    assert store.outcome_stage is True
    record = await store.create(request())
    await store.announce(record.approval_id, "request", [HOOK])
    await store.vote(record.approval_id, Decision(approved=True, decided_by="ana"))
    assert [a.stage for a in await store.unannounced()] == ["outcome"]


async def test_concurrent_announcers_make_each_delivery_once(
    store: SqlApprovalStore,
) -> None:
    record = await store.create(request())
    wanted = [HOOK, NewDelivery("request", "webhook:audit")]
    made = await asyncio.gather(
        *(store.announce(record.approval_id, "request", wanted) for _ in range(5))
    )
    assert sorted(d.target for batch in made for d in batch) == ["webhook:audit", "webhook:ops"]
    assert len(await store.deliveries(record.approval_id)) == 2


async def test_a_claimed_delivery_is_settled_by_its_claimant_only(
    store: SqlApprovalStore,
) -> None:
    record = await store.create(request())
    [made] = await store.announce(record.approval_id, "request", [HOOK])
    [claimed] = await store.claim_deliveries(worker="w1", lease=30)
    assert claimed.delivery_id == made.delivery_id and claimed.claimed_by == "w1"
    assert await store.claim_deliveries(worker="w2", lease=30) == []  # held by w1
    with pytest.raises(DeliveryLost, match="held by w1, not w2"):
        await store.delivered(made.delivery_id, worker="w2")
    sent = await store.delivered(made.delivery_id, worker="w1", ref={"ts": "1.2"})
    assert (sent.status, sent.attempts, sent.ref) == ("sent", 1, {"ts": "1.2"})
    assert sent.sent_at is not None and sent.claimed_by is None
    with pytest.raises(DeliveryLost, match="sent already"):
        await store.delivered(made.delivery_id, worker="w1")
    assert await store.claim_deliveries(worker="w1", lease=30) == []
    events = [e for e in await store.events(record.approval_id) if e.kind == "delivered"]
    assert [(e.actor, e.channel, e.detail) for e in events] == [
        ("w1", "webhook", {"kind": "request", "target": "webhook:ops"})
    ]


async def test_a_claim_its_worker_lost_track_of_is_taken_back_by_it_only(
    store: SqlApprovalStore, clock: Clock
) -> None:
    """A worker that holds a delivery it is not sending (its claim's answer was lost, or the
    announcement that claimed it failed beside another) takes it back at its next claim
    once `ORPHANED` seconds have passed, not before, and never one it is sending; another
    worker waits for the lease as ever."""
    record = await store.create(request())
    [made] = await store.announce(record.approval_id, "request", [HOOK])
    [claimed] = await store.claim_deliveries(worker="w1", lease=30)
    assert await store.claim_deliveries(worker="w1", lease=30, sending=set()) == []  # just now
    clock.advance(ORPHANED)
    held = {claimed.delivery_id}
    assert await store.claim_deliveries(worker="w1", lease=30, sending=held) == []  # sending
    assert await store.claim_deliveries(worker="w2", lease=30, sending=set()) == []  # w1's
    [back] = await store.claim_deliveries(worker="w1", lease=30, sending=set())
    assert (back.delivery_id, back.claimed_by) == (made.delivery_id, "w1")
    sent = await store.delivered(made.delivery_id, worker="w1")
    assert (sent.status, sent.attempts) == ("sent", 1)


async def test_a_failed_delivery_is_due_again_later(store: SqlApprovalStore, clock: Clock) -> None:
    record = await store.create(request())
    [made] = await store.announce(record.approval_id, "request", [HOOK])
    await store.claim_deliveries(worker="w1", lease=30)
    retry_at = clock.now + timedelta(seconds=10)
    failed = await store.delivery_failed(
        made.delivery_id, worker="w1", error="HTTP 503", retry_at=retry_at
    )
    assert (failed.status, failed.attempts, failed.error) == ("due", 1, "HTTP 503")
    assert await store.claim_deliveries(worker="w1", lease=30) == []  # not due yet
    clock.advance(10)
    [again] = await store.claim_deliveries(worker="w2", lease=30)
    assert again.delivery_id == made.delivery_id
    sent = await store.delivered(made.delivery_id, worker="w2")
    assert (sent.status, sent.attempts) == ("sent", 2)


async def test_a_delivery_given_up_is_recorded(store: SqlApprovalStore) -> None:
    record = await store.create(request())
    [made] = await store.announce(record.approval_id, "request", [HOOK])
    await store.claim_deliveries(worker="w1", lease=30)
    error = 'HTTP 410 "Gone" \\ ünï\ncode'  # quoted, escaped and not ASCII: JSON all the same
    gone = await store.delivery_failed(made.delivery_id, worker="w1", error=error, retry_at=None)
    assert gone.status == "failed"
    [event] = [e for e in await store.events(record.approval_id) if e.kind == "undelivered"]
    assert event.detail == {"kind": "request", "target": "webhook:ops", "error": error}
    assert (event.actor, event.channel) == ("w1", "webhook")


async def test_a_delivery_made_is_recorded(store: SqlApprovalStore) -> None:
    record = await store.create(request())
    [made] = await store.announce(record.approval_id, "request", [HOOK])
    await store.claim_deliveries(worker="w1", lease=30)
    await store.delivered(made.delivery_id, worker="w1", ref={"ts": "1.5"})
    [event] = [e for e in await store.events(record.approval_id) if e.kind == "delivered"]
    assert event.detail == {"kind": "request", "target": "webhook:ops"}
    assert (event.actor, event.channel) == ("w1", "webhook")


async def test_a_dead_claimants_delivery_is_claimed_again_after_its_lease(
    store: SqlApprovalStore, clock: Clock
) -> None:
    record = await store.create(request())
    await store.announce(record.approval_id, "request", [HOOK])
    await store.claim_deliveries(worker="dead", lease=30)
    clock.advance(29)
    assert await store.claim_deliveries(worker="w2", lease=30) == []
    clock.advance(1)
    [taken] = await store.claim_deliveries(worker="w2", lease=30)
    with pytest.raises(DeliveryLost):
        await store.delivered(taken.delivery_id, worker="dead")
    assert (await store.delivered(taken.delivery_id, worker="w2")).status == "sent"


async def test_a_delivery_due_later_waits(store: SqlApprovalStore, clock: Clock) -> None:
    record = await store.create(request())
    later = NewDelivery("escalation", "webhook:ops", due_at=clock.now + timedelta(minutes=5))
    await store.announce(record.approval_id, "request", [HOOK, later])
    [now] = await store.claim_deliveries(worker="w", lease=30)
    assert now.kind == "request"
    await store.delivered(now.delivery_id, worker="w")
    clock.advance(299)
    assert await store.claim_deliveries(worker="w", lease=30) == []
    clock.advance(1)
    assert [d.kind for d in await store.claim_deliveries(worker="w", lease=30)] == ["escalation"]


async def test_an_announcer_gets_the_deliveries_due_at_once_already_claimed(
    store: SqlApprovalStore, clock: Clock
) -> None:
    record = await store.create(request())
    later = NewDelivery("escalation", "webhook:ops", due_at=clock.now + timedelta(minutes=5))
    made = await store.announce(record.approval_id, "request", [HOOK, later], worker="w", lease=30)
    by_kind = {d.kind: d for d in made}
    assert by_kind["request"].claimed_by == "w"
    assert by_kind["request"].lease_until == clock.now + timedelta(seconds=30)
    assert by_kind["escalation"].claimed_by is None  # not due yet: whoever claims it then
    assert by_kind["escalation"].lease_until is None
    # Nobody else claims what the announcer holds, and it settles it without a claim.
    assert await store.claim_deliveries(worker="w2", lease=30) == []
    sent = await store.delivered(by_kind["request"].delivery_id, worker="w")
    assert sent.status == "sent"
    clock.advance(300)
    assert [d.kind for d in await store.claim_deliveries(worker="w2", lease=30)] == ["escalation"]


async def test_an_announcer_that_dies_leaves_its_deliveries_to_others_after_the_lease(
    store: SqlApprovalStore, clock: Clock
) -> None:
    record = await store.create(request())
    [held] = await store.announce(record.approval_id, "request", [HOOK], worker="dead", lease=30)
    clock.advance(29)
    assert await store.claim_deliveries(worker="w2", lease=30) == []
    clock.advance(1)
    [taken] = await store.claim_deliveries(worker="w2", lease=30)
    assert taken.delivery_id == held.delivery_id
    with pytest.raises(DeliveryLost):
        await store.delivered(held.delivery_id, worker="dead")


async def test_concurrent_claimants_share_the_deliveries(store: SqlApprovalStore) -> None:
    for i in range(20):
        record = await store.create(request(f"call_{i}"))
        await store.announce(record.approval_id, "request", [HOOK])
    batches = await asyncio.gather(
        *(store.claim_deliveries(worker=f"w{i}", lease=30, limit=3) for i in range(10))
    )
    claimed = [d.delivery_id for batch in batches for d in batch]
    assert len(claimed) == len(set(claimed)) == 20


async def test_settling_an_unknown_delivery_is_refused(store: SqlApprovalStore) -> None:
    with pytest.raises(DeliveryLost, match="no such delivery"):
        await store.delivered(12345, worker="w1")


async def test_a_claimed_deliverys_progress_is_kept_without_settling_it(
    store: SqlApprovalStore, clock: Clock
) -> None:
    record = await store.create(request())
    [made] = await store.announce(record.approval_id, "request", [HOOK])
    await store.claim_deliveries(worker="w1", lease=30)
    with pytest.raises(DeliveryLost, match="held by w1, not w2"):
        await store.delivery_progress(made.delivery_id, worker="w2", ref={"step": 1})
    kept = await store.delivery_progress(made.delivery_id, worker="w1", ref={"step": 1})
    assert (kept.status, kept.attempts, kept.claimed_by, kept.ref) == ("due", 0, "w1", {"step": 1})
    # A failed attempt keeps the progress: the next one goes on from there.
    await store.delivery_failed(made.delivery_id, worker="w1", error="HTTP 503", retry_at=clock.now)
    [again] = await store.claim_deliveries(worker="w2", lease=30)
    assert (again.attempts, again.ref) == (1, {"step": 1})
    await store.delivery_progress(made.delivery_id, worker="w2", ref={"step": 2})
    # A dead claimant's progress is there for whoever claims the delivery after its lease.
    clock.advance(30)
    [taken] = await store.claim_deliveries(worker="w3", lease=30)
    assert (taken.attempts, taken.ref) == (1, {"step": 2})
    with pytest.raises(DeliveryLost):
        await store.delivery_progress(made.delivery_id, worker="w2", ref={"step": 3})
    sent = await store.delivered(made.delivery_id, worker="w3", ref={"step": 4})
    assert sent.ref == {"step": 4}
    with pytest.raises(DeliveryLost, match="sent already"):
        await store.delivery_progress(made.delivery_id, worker="w3", ref={"step": 5})
    # Given up, the delivery keeps what it got done (the messages a later update needs).
    other = await store.create(request("call_2"))
    [failing] = await store.announce(other.approval_id, "request", [HOOK])
    await store.claim_deliveries(worker="w1", lease=30)
    await store.delivery_progress(failing.delivery_id, worker="w1", ref={"step": 1})
    gone = await store.delivery_failed(
        failing.delivery_id, worker="w1", error="HTTP 410", retry_at=None
    )
    assert (gone.status, gone.ref) == ("failed", {"step": 1})


async def test_asking_for_work_when_there_is_none_takes_no_write_lock(tmp_path: Path) -> None:
    """The workers ask for ready runs and due deliveries at every step, most often finding
    none: on SQLite a read answers that, so another process holding the write lock (a CLI
    command's decision, a replica) does not make them wait, nor fail once `lock_timeout`
    runs out."""
    path = tmp_path / "nodbot.db"
    async with SqlApprovalStore(f"sqlite:///{path}", lock_timeout=0.05) as store:
        record = await store.create(request("call_1"))
        await store.announce(record.approval_id, "request", [NewDelivery("request", "webhook:a")])
        [claimed] = await store.claim_deliveries(worker="w1")
        await store.delivered(claimed.delivery_id, worker="w1")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert await store.claim_deliveries(worker="w1") == []
            assert await store.claim_ready(worker="w1") == []
            with pytest.raises(StoreUnavailableError):  # a write still waits, and says so
                await store.announce(record.approval_id, "outcome", [])
        finally:
            holder.execute("ROLLBACK")
            holder.close()


async def test_deliveries_waiting_to_be_tried_again_are_made_due_now(
    store: SqlApprovalStore, clock: Clock
) -> None:
    """What a channel learns can be delivered now (Slack: the bot was invited to a channel
    that refused its post) is tried at the outbox's next claim instead of after the rest of
    its backoff: the deliveries to those targets that failed and wait for their next
    attempt, and only those. Nothing else changes: one due later that was never tried (an
    escalation), one claimed now (its worker may be sending it), one sent, one given up,
    one to another target."""
    room, by_name = "slack:channel:C0000000001", "slack:channel:#refunds"
    names = ("waiting", "named", "held", "sent", "gone", "elsewhere", "later")
    ids = {name: (await store.create(request(f"call_{name}"))).approval_id for name in names}
    targets = {"named": by_name, "elsewhere": "slack:channel:#other"}
    for name in names[:-1]:
        await store.announce(
            ids[name], "request", [NewDelivery("request", targets.get(name, room))]
        )
    ten = clock.now + timedelta(minutes=10)
    await store.announce(ids["later"], "request", [NewDelivery("escalation", room, due_at=ten)])
    made = {d.approval_id: d for d in await store.claim_deliveries(worker="w1", lease=30)}
    assert len(made) == 6
    five = clock.now + timedelta(minutes=5)
    for name, retry_at in [("waiting", five), ("named", five), ("elsewhere", five)]:
        await store.delivery_failed(
            made[ids[name]].delivery_id, worker="w1", error="not_in_channel", retry_at=retry_at
        )
    await store.delivery_failed(
        made[ids["held"]].delivery_id, worker="w1", error="HTTP 503", retry_at=clock.now
    )
    await store.delivered(made[ids["sent"]].delivery_id, worker="w1")
    await store.delivery_failed(
        made[ids["gone"]].delivery_id, worker="w1", error="is_archived", retry_at=None
    )
    clock.advance(1)
    [held] = await store.claim_deliveries(worker="w2", lease=30)  # tried again now: held by w2
    assert held.approval_id == ids["held"]

    async def state() -> dict[str, tuple[object, ...]]:
        found = {}
        for name in names:
            [d] = await store.deliveries(ids[name])
            found[name] = (d.status, d.attempts, d.due_at, d.claimed_by, d.lease_until, d.error)
        return found

    before = await state()
    assert await store.retry_deliveries_now([room, by_name]) == 2
    after = await state()
    assert {name for name in names if after[name] != before[name]} == {"waiting", "named"}
    for name in ("waiting", "named"):  # due now, as they were otherwise
        assert after[name] == ("due", 1, clock.now, None, None, "not_in_channel")
    claimed = await store.claim_deliveries(worker="w3", lease=30)
    assert {d.approval_id for d in claimed} == {ids["waiting"], ids["named"]}
    # Claimed now, they are not made due again (nor is anything else): nothing to do.
    assert await store.retry_deliveries_now([room, by_name]) == 0
    assert await store.retry_deliveries_now([]) == 0
