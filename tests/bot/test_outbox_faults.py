"""The outbox through a database outage that falls between a webhook's send and its record:
the record is tried again until the database is back, the webhook goes out once, and no task
of the dispatcher ends in an exception nobody looks at ("Task exception was never
retrieved"). The outage is real: the receiver, as it is posted to, makes PostgreSQL refuse
connections and ends the store's sessions, and lets them in again a moment later."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging

import pytest
from starlette.requests import Request
from starlette.responses import Response

from nodbot.bot.config import Webhook
from nodbot.bot.outbox import Dispatcher
from nodbot.bot.webhooks import WebhookChannel
from nodbot.core import ApprovalRequest, SqlApprovalStore, StoreError, arguments_digest
from tests.bot.test_database_faults import Database, administered
from tests.bot.webhook_receiver import SECRET, Receiver, receiving
from tests.support import eventually, postgres_database

pytestmark = pytest.mark.postgres

LEASE = 3.0
"""Seconds the dispatcher's claim on a delivery lasts: a lost record would be sent again
once it runs out."""
OUTAGE = 1.0
"""Seconds the database refuses connections after the receiver has been posted to."""


class Outage:
    """The test database made unreachable (new sessions refused, the open ones ended), and
    reachable again `OUTAGE` seconds later (`over` is set then)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.over = asyncio.Event()

    async def begin(self) -> None:
        await self.database.allow_connections(False)
        await self.database.terminate()
        asyncio.get_running_loop().call_later(OUTAGE, lambda: asyncio.ensure_future(self.end()))

    async def end(self) -> None:
        await self.database.allow_connections(True)
        self.over.set()


class CuttingReceiver(Receiver):
    """A receiver that, at the first request, starts the outage before it answers 200: the
    webhook is sent, and its record cannot be written."""

    outage: Outage | None = None

    async def handle(self, request: Request) -> Response:
        if self.outage is not None and not self.received:
            await self.outage.begin()
        return await super().handle(request)


async def test_a_webhook_sent_before_an_outage_is_recorded_after_it_and_sent_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    receiver = CuttingReceiver()
    async with (
        postgres_database() as url,
        administered(url) as database,
        receiving(receiver) as receiver,
        SqlApprovalStore(url) as store,
    ):
        outage = receiver.outage = Outage(database)
        hook = Webhook.model_validate({"name": "ops", "url": receiver.url, "secret": SECRET})
        dispatcher = Dispatcher(
            store, [WebhookChannel([hook])], worker="w1", lease=LEASE, claim_every=0.05
        )
        try:
            arguments = {"order_id": "o-7", "amount": 500.0}
            request = ApprovalRequest(
                "run_1", "call_1", "refund", arguments, arguments_digest(arguments)
            )
            record = await store.create(request)
            # The workers' lane: the delivery goes in a task of its own. The same step may go
            # on to claim what else is due, and meet the outage the send has begun: the lane
            # would back off then, and the delivery goes on all the same.
            with contextlib.suppress(StoreError):
                await dispatcher.start_step()
            await receiver.wait_for(1)
            await asyncio.wait_for(outage.over.wait(), 10)

            async def recorded() -> bool:
                with contextlib.suppress(Exception):
                    [delivery] = await store.deliveries(record.approval_id)
                    return delivery.status == "sent"
                return False

            await eventually(recorded, "the delivery recorded sent", within=LEASE)
            await dispatcher.drain()
            # Past the claim's lease: had the record been lost, the delivery would be due and
            # claimed again here, and sent twice.
            loop = asyncio.get_running_loop()
            until = loop.time() + LEASE + 0.5
            while loop.time() < until:
                await dispatcher.start_step()
                await dispatcher.drain()
                await asyncio.sleep(0.1)
            assert len(receiver.received) == 1
            [delivery] = await store.deliveries(record.approval_id)
            assert (delivery.status, delivery.attempts) == ("sent", 1)
        finally:
            await dispatcher.close()
    gc.collect()  # a task that died unobserved says so when it is collected
    unobserved = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unobserved == []
