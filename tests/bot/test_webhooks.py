"""Webhooks through the outbox: a real store, the dispatcher, and a real HTTP receiver on a
loopback port that checks every signature."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodbot.bot.config import Webhook
from nodbot.bot.outbox import Dispatcher, backoff
from nodbot.bot.webhooks import InvalidSignature, WebhookChannel, sign, verify_signature
from nodbot.core import ApprovalRequest, Decision, SqlApprovalStore, arguments_digest
from tests.bot.webhook_receiver import SECRET, Receiver, receiving
from tests.core.store.conftest import database_url

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def hook(receiver: Receiver, **settings: Any) -> Webhook:
    return Webhook.model_validate(
        {"name": "ops", "url": receiver.url, "secret": SECRET, **settings}
    )


def request(call_id: str = "call_1", **policy: Any) -> ApprovalRequest:
    arguments = {"order_id": "o-7", "amount": 500.0, "note": "<script>alert(1)</script>"}
    return ApprovalRequest(
        "run_1", call_id, "refund", arguments, arguments_digest(arguments), policy=policy
    )


@contextlib.asynccontextmanager
async def outbox(
    tmp_path: Path, receiver: Receiver, backend: str = "sqlite", **settings: Any
) -> AsyncIterator[tuple[SqlApprovalStore, Dispatcher]]:
    async with database_url(backend, tmp_path) as url, SqlApprovalStore(url) as store:
        channel = WebhookChannel([hook(receiver, **settings)])
        dispatcher = Dispatcher(store, [channel], worker="w1", min_backoff=0.05, max_backoff=0.2)
        try:
            yield store, dispatcher
        finally:
            await dispatcher.close()


async def test_a_new_review_is_posted_signed_then_its_decision(tmp_path: Path) -> None:
    async with receiving() as receiver, outbox(tmp_path, receiver) as (store, dispatcher):
        record = await store.create(request())
        assert await dispatcher.step() == 1
        [pending] = receiver.received
        assert pending.signed and pending.event == "approval.pending"
        assert pending.body["event"] == "approval.pending"
        assert pending.body["approval"]["approval_id"] == record.approval_id
        assert pending.body["approval"]["arguments"]["note"] == "<script>alert(1)</script>"
        assert pending.body["delivery_id"] == int(pending.delivery)
        assert await dispatcher.step() == 0  # nothing new: nothing posted twice
        await store.decide(record.approval_id, Decision(approved=True, decided_by="ana"))
        assert await dispatcher.step() == 1
        decided = receiver.received[-1]
        assert decided.signed and decided.event == "approval.decided"
        assert decided.body["approval"]["decision"]["decided_by"] == "ana"
        [sent, _] = await store.deliveries(record.approval_id)
        assert (sent.status, sent.ref) == ("sent", {"status": 200})
        delivered = [e for e in await store.events(record.approval_id) if e.kind == "delivered"]
        assert [(e.channel, e.detail["kind"]) for e in delivered] == [
            ("webhook", "request"),
            ("webhook", "outcome"),
        ]


async def test_a_cookie_a_receiver_sets_is_never_sent_back(tmp_path: Path) -> None:
    # Each delivery says only what nodbot wrote: no state a receiver left in the sender.
    async with receiving() as receiver:
        # By name: aiohttp's default jar keeps no cookie of a host given as an IP address.
        receiver.url = receiver.url.replace("127.0.0.1", "localhost")
        async with outbox(tmp_path, receiver) as (store, dispatcher):
            receiver.answers = [(200, {"set-cookie": "tracked=1; Path=/"})]
            record = await store.create(request())
            assert await dispatcher.step() == 1
            await store.decide(record.approval_id, Decision(approved=True, decided_by="ana"))
            assert await dispatcher.step() == 1
    assert [r.event for r in receiver.received] == ["approval.pending", "approval.decided"]
    assert [r.cookie for r in receiver.received] == [None, None]


async def test_failures_are_retried_with_backoff_until_delivered(tmp_path: Path) -> None:
    async with receiving() as receiver, outbox(tmp_path, receiver) as (store, dispatcher):
        receiver.answers = [(503, {}), (500, {})]
        record = await store.create(request())
        assert await dispatcher.step() == 0
        [delivery] = await store.deliveries(record.approval_id)
        assert (delivery.status, delivery.attempts, delivery.error) == (
            "due",
            1,
            f"HTTP 503 from {receiver.url}",
        )
        deadline = time.monotonic() + 5
        while (await store.deliveries(record.approval_id))[0].status != "sent":
            assert time.monotonic() < deadline
            await dispatcher.step()
            await asyncio.sleep(0.02)
        [delivery] = await store.deliveries(record.approval_id)
        assert delivery.attempts == 3
        # Every attempt was the same delivery, so a receiver can drop repeats.
        assert {r.delivery for r in receiver.received} == {str(delivery.delivery_id)}


async def test_retry_after_is_honoured(tmp_path: Path) -> None:
    async with receiving() as receiver, outbox(tmp_path, receiver) as (store, dispatcher):
        receiver.answers = [(429, {"Retry-After": "30"})]
        record = await store.create(request())
        before = datetime.now(UTC)
        await dispatcher.step()
        [delivery] = await store.deliveries(record.approval_id)
        assert delivery.status == "due"
        assert delivery.due_at >= before + timedelta(seconds=30)
        assert len(receiver.received) == 1


async def test_an_endpoint_that_refuses_gives_the_delivery_up(tmp_path: Path) -> None:
    async with receiving() as receiver, outbox(tmp_path, receiver) as (store, dispatcher):
        receiver.answers = [(410, {})]
        record = await store.create(request())
        await dispatcher.step()
        await dispatcher.step()
        [delivery] = await store.deliveries(record.approval_id)
        assert delivery.status == "failed" and len(receiver.received) == 1
        [event] = [e for e in await store.events(record.approval_id) if e.kind == "undelivered"]
        assert event.detail["error"] == f"HTTP 410 from {receiver.url}"


async def test_an_unreachable_endpoint_keeps_the_delivery(tmp_path: Path) -> None:
    async with receiving() as receiver:
        url = receiver.url
    gone = Receiver(url=url)  # nothing listens there any more
    async with outbox(tmp_path, gone) as (store, dispatcher):
        record = await store.create(request())
        await dispatcher.step()
        [delivery] = await store.deliveries(record.approval_id)
        assert delivery.status == "due" and delivery.attempts == 1
        assert delivery.error is not None and "Connect" in delivery.error


async def test_only_the_events_asked_for_are_sent(tmp_path: Path) -> None:
    async with (
        receiving() as receiver,
        outbox(tmp_path, receiver, events=["approval.decided"]) as (store, dispatcher),
    ):
        record = await store.create(request())
        await dispatcher.step()
        assert receiver.received == []
        await store.decide(record.approval_id, Decision(approved=False, decided_by="ana"))
        await dispatcher.step()
        assert [r.event for r in receiver.received] == ["approval.decided"]


async def test_an_escalation_is_sent_when_due_unless_decided(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    async with receiving() as receiver, outbox(tmp_path, receiver) as (store, dispatcher):
        due = await store.create(request("c1", escalate_at=now.isoformat()))
        decided = await store.create(request("c2", escalate_at=now.isoformat()))
        later = await store.create(
            request("c3", escalate_at=(now + timedelta(hours=1)).isoformat())
        )
        await store.decide(decided.approval_id, Decision(approved=True, decided_by="ana"))
        for _ in range(3):
            await dispatcher.step()
        escalated = [
            r.body["approval"]["approval_id"] for r in receiver.events("approval.escalated")
        ]
        assert escalated == [due.approval_id]
        skipped = [d for d in await store.deliveries(decided.approval_id) if d.kind == "escalation"]
        assert [(d.status, d.ref) for d in skipped] == [
            ("sent", {"skipped": "decided before the escalation"})
        ]
        waiting = [d for d in await store.deliveries(later.approval_id) if d.kind == "escalation"]
        assert [d.status for d in waiting] == ["due"]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_replicas_post_each_review_once(tmp_path: Path, backend: str) -> None:
    async with (
        receiving() as receiver,
        database_url(backend, tmp_path) as url,
        SqlApprovalStore(url) as a,
        SqlApprovalStore(url) as b,
    ):
        dispatchers = [
            Dispatcher(store, [WebhookChannel([hook(receiver)])], worker=name)
            for store, name in ((a, "a"), (b, "b"))
        ]
        try:
            records = [await a.create(request(f"call_{i}")) for i in range(30)]
            await asyncio.gather(*(d.step() for d in dispatchers for _ in range(3)))
            posted = [r.body["approval"]["approval_id"] for r in receiver.received]
            assert sorted(posted) == sorted(r.approval_id for r in records)
            assert all(r.signed for r in receiver.received)
        finally:
            for dispatcher in dispatchers:
                await dispatcher.close()


def test_a_signature_checks_body_time_and_secret() -> None:
    body = b'{"event":"approval.pending"}'
    now = time.time()
    timestamp = str(int(now))
    headers = {"X-Nodbot-Timestamp": timestamp, "X-Nodbot-Signature": sign(SECRET, timestamp, body)}
    verify_signature(SECRET, headers, body, now=now)
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_signature(SECRET, headers, body + b" ", now=now)
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_signature("another-secret-000000", headers, body, now=now)
    with pytest.raises(InvalidSignature, match="more than 300 s"):
        verify_signature(SECRET, headers, body, now=now + 301)
    with pytest.raises(InvalidSignature, match="required"):
        verify_signature(SECRET, {"X-Nodbot-Timestamp": timestamp}, body, now=now)
    stale = replace_header(headers, "X-Nodbot-Timestamp", "yesterday")
    with pytest.raises(InvalidSignature, match="not a number"):
        verify_signature(SECRET, stale, body, now=now)


def replace_header(headers: dict[str, str], name: str, value: str) -> dict[str, str]:
    return {**headers, name: value}


def test_backoff_doubles_up_to_its_cap() -> None:
    waits = [backoff(n, base=1, cap=10) for n in range(1, 7)]
    assert [int(w) for w in waits] == [1, 2, 4, 8, 10, 10]
    assert all(w <= 11 for w in waits)


def test_a_webhook_needs_a_secret_and_an_address() -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        Webhook.model_validate({"name": "ops", "url": "http://127.0.0.1/h", "secret": "short"})
    with pytest.raises(ValueError, match="http:// or https://"):
        Webhook.model_validate({"name": "ops", "url": "ftp://x", "secret": SECRET})
    with pytest.raises(ValueError, match=r"approval\.pending"):
        Webhook.model_validate(
            {"name": "ops", "url": "http://127.0.0.1/h", "secret": SECRET, "events": ["nope"]}
        )
