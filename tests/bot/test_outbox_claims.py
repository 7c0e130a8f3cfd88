"""The workers' outbox lane delivers what it announces without claiming it, or reading the
review again (`Dispatcher.start_step`): an announcement makes the deliveries due at once
claimed by the announcing worker. It claims only when something else may be due: a failed
attempt due again, a delivery a channel made while delivering, or, every `claim_every`
seconds, what other processes left due."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

import pytest

from nodbot.bot.outbox import DeliveryError, Dispatcher, Moment
from nodbot.core import (
    ApprovalRecord,
    ApprovalRequest,
    Delivery,
    NewDelivery,
    SqlApprovalStore,
    arguments_digest,
)
from tests.support import eventually

NEVER = 3600.0
"""A `claim_every` no test waits for."""


class Counted(SqlApprovalStore):
    """The SQL store, counting the claims of due deliveries, and the reads of one review,
    made through it."""

    claims = 0
    reads = 0

    async def get(self, approval_id: str) -> ApprovalRecord:
        self.reads += 1
        return await super().get(approval_id)

    async def claim_deliveries(
        self,
        *,
        worker: str,
        lease: float = 60.0,
        limit: int = 50,
        sending: Collection[int] | None = None,
    ) -> list[Delivery]:
        self.claims += 1
        return await super().claim_deliveries(
            worker=worker, lease=lease, limit=limit, sending=sending
        )


class Recording:
    """A channel that records what it delivers, fails each target's first `failures`
    attempts, and, when `group` is set, makes one delivery per member of it while delivering
    a request to `group:...` (as Slack's channel does for a user group)."""

    name = "rec"
    answers = False

    def __init__(self, store: SqlApprovalStore, *, failures: int = 0, group: bool = False) -> None:
        self.store = store
        self.failures = failures
        self.makes_deliveries = group
        self.tells_outcomes = False
        self.attempts: dict[str, int] = {}
        self.sent: list[str] = []

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        target = "rec:group:ops" if self.makes_deliveries else "rec:ops"
        return [NewDelivery("request", target)] if stage == "request" else []

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        tried = self.attempts[delivery.target] = self.attempts.get(delivery.target, 0) + 1
        if tried <= self.failures:
            raise DeliveryError("the receiver is down")
        if delivery.target == "rec:group:ops":
            members = [NewDelivery("request", f"rec:dm:{name}") for name in ("ana", "bo")]
            await self.store.announce(record.approval_id, "request", members)
        self.sent.append(delivery.target)
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Counted]:
    counted = Counted(f"sqlite:///{tmp_path / 'nodbot.db'}")
    async with counted:
        yield counted


def request(call_id: str) -> ApprovalRequest:
    arguments = {"order_id": call_id}
    return ApprovalRequest("run_1", call_id, "refund", arguments, arguments_digest(arguments))


async def drained(dispatcher: Dispatcher) -> None:
    async with asyncio.timeout(10):
        await dispatcher.drain()


async def test_the_lane_delivers_what_it_announces_without_claiming_it(store: Counted) -> None:
    channel = Recording(store)
    dispatcher = Dispatcher(store, [channel], worker="w1", claim_every=NEVER)
    first = await store.create(request("call_1"))
    assert await dispatcher.start_step() == 1
    await drained(dispatcher)
    assert store.claims == 1  # a lane's first step claims what may have been left due
    for number in range(2, 6):
        await store.create(request(f"call_{number}"))
        assert await dispatcher.start_step() == 1
        await drained(dispatcher)
    assert channel.sent == ["rec:ops"] * 5
    assert store.claims == 1
    assert store.reads == 0  # each delivered with its review as its announcement read it
    [delivery] = await store.deliveries(first.approval_id)
    assert (delivery.status, delivery.attempts, delivery.claimed_by) == ("sent", 1, None)


async def test_a_failed_attempt_is_claimed_again_once_due(store: Counted) -> None:
    channel = Recording(store, failures=1)
    dispatcher = Dispatcher(
        store, [channel], worker="w1", min_backoff=0.05, max_backoff=0.05, claim_every=NEVER
    )
    record = await store.create(request("call_1"))
    await dispatcher.start_step()
    await drained(dispatcher)
    assert channel.attempts == {"rec:ops": 1} and channel.sent == []

    async def sent() -> bool:
        await dispatcher.start_step()
        await drained(dispatcher)
        return channel.sent == ["rec:ops"]

    await eventually(sent, "the second attempt")
    [delivery] = await store.deliveries(record.approval_id)
    assert (delivery.status, delivery.attempts) == ("sent", 2)


async def test_what_a_channel_makes_while_delivering_is_claimed_at_the_next_step(
    store: Counted,
) -> None:
    channel = Recording(store, group=True)
    dispatcher = Dispatcher(store, [channel], worker="w1", claim_every=NEVER)
    await store.create(request("call_1"))
    await dispatcher.start_step()
    await drained(dispatcher)
    assert channel.sent == ["rec:group:ops"]
    claims = store.claims
    assert await dispatcher.start_step() == 2  # the members' deliveries, claimed
    await drained(dispatcher)
    assert store.claims == claims + 1
    assert sorted(channel.sent[1:]) == ["rec:dm:ana", "rec:dm:bo"]


async def test_what_another_process_left_due_is_claimed_within_claim_every(
    store: Counted,
) -> None:
    channel = Recording(store)
    dispatcher = Dispatcher(store, [channel], worker="w1", claim_every=0.05)
    await dispatcher.start_step()  # the first claim: nothing due yet
    claims = store.claims
    record = await store.create(request("call_1"))
    # Announced elsewhere (another replica that died before delivering, unclaimed here).
    await store.announce(record.approval_id, "request", [NewDelivery("request", "rec:ops")])

    async def sent() -> bool:
        await dispatcher.start_step()
        await drained(dispatcher)
        return channel.sent == ["rec:ops"]

    await eventually(sent, "the delivery another process left due")
    assert store.claims > claims
