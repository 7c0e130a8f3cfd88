"""The workers' outbox lane starts deliveries and goes on (`Dispatcher.start_step`): other
reviews' deliveries go side by side, but a review's outcome waits for its request still on
its way, as channels that answer in the request's thread need (email, Slack)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nodbot.bot.outbox import DeliveryError, Dispatcher, Moment
from nodbot.core import (
    ApprovalRecord,
    ApprovalRequest,
    Decision,
    Delivery,
    NewDelivery,
    SqlApprovalStore,
    arguments_digest,
)
from tests.support import eventually


class Threaded:
    """A channel whose outcome answers in its request's thread: it refuses an outcome whose
    request it has not sent yet. Requests wait for `release` before they are sent."""

    name = "threaded"
    answers = False
    makes_deliveries = False
    tells_outcomes = True

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent: list[tuple[str, str]] = []
        self.started: list[tuple[str, str]] = []

    def targets(self, record: ApprovalRecord, stage: Moment) -> list[NewDelivery]:
        return [NewDelivery(stage, "threaded:ops")] if stage in ("request", "outcome") else []

    async def deliver(self, delivery: Delivery, record: ApprovalRecord) -> dict[str, Any] | None:
        self.started.append((delivery.approval_id, delivery.kind))
        if delivery.kind == "request":
            await self.release.wait()
        elif (delivery.approval_id, "request") not in self.sent:
            raise DeliveryError("the request to this reviewer is not sent yet")
        self.sent.append((delivery.approval_id, delivery.kind))
        return None

    async def close(self) -> None:
        return None


def request(call_id: str) -> ApprovalRequest:
    arguments = {"order_id": call_id}
    return ApprovalRequest("run_1", call_id, "refund", arguments, arguments_digest(arguments))


async def test_an_outcome_waits_for_its_request_while_other_reviews_go_on(tmp_path: Path) -> None:
    channel = Threaded()
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        dispatcher = Dispatcher(store, [channel], worker="w1")
        slow = await store.create(request("call_1"))
        assert await dispatcher.start_step() == 1  # its request waits for `release`
        await store.decide(slow.approval_id, Decision(approved=True, decided_by="ana"))
        other = await store.create(request("call_2"))
        assert await dispatcher.start_step() == 2  # the outcome, and another review's request

        async def under_way() -> bool:
            return (other.approval_id, "request") in channel.started

        await eventually(under_way, "the other review's request under way")
        assert (slow.approval_id, "outcome") not in channel.started  # after its request
        channel.release.set()
        async with asyncio.timeout(10):
            await dispatcher.drain()
        assert channel.sent.index((slow.approval_id, "request")) < channel.sent.index(
            (slow.approval_id, "outcome")
        )
        deliveries = await store.deliveries(slow.approval_id)
        assert [(d.kind, d.status, d.attempts) for d in deliveries] == [
            ("request", "sent", 1),
            ("outcome", "sent", 1),
        ]
