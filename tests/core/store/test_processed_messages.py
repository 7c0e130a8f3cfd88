"""A message a reviewer acted by is processed once, whatever review it names: the first vote,
decision or refusal whose evidence carries its id (`core.store.MESSAGE_ID`) records it in
the same transaction; any later act by the same message, on that review or another, in this
store or another on the same database, decides nothing and is refused on the review it
names, with the reason and the message's id."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalNotFound,
    ApprovalStore,
    Decision,
    InvalidDecisionError,
)
from nodbot.core.sqlstore import SqlApprovalStore
from nodbot.core.store import MESSAGE_ID, MessageAlreadyProcessed
from tests.core.store.conftest import ask, database_url
from tests.core.store.test_audit import Database, at_revision

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
MESSAGE = "<CAF3q9xk1Yp=once@mail.gmail.com>"
BY_MAIL = {MESSAGE_ID: MESSAGE}
ANA = Decision(approved=True, decided_by="ana@example.com")


async def two_reviews(store: ApprovalStore) -> tuple[str, str]:
    first = await store.create(ask("c1"))
    second = await store.create(ask("c2"))
    return first.approval_id, second.approval_id


async def refusals(store: ApprovalStore, approval_id: str) -> list[dict[str, object]]:
    return [e.detail for e in await store.events(approval_id) if e.kind == "refused"]


async def test_a_message_that_decided_one_review_decides_no_other(store: ApprovalStore) -> None:
    first, second = await two_reviews(store)
    decided = await store.vote(first, ANA, channel="email", evidence=BY_MAIL)
    assert decided.status == "approved"
    with pytest.raises(MessageAlreadyProcessed) as repeated:
        await store.vote(second, ANA, channel="email", evidence=BY_MAIL)
    assert repeated.value.approval_id == second
    assert repeated.value.message_id == MESSAGE and repeated.value.first == first
    assert (await store.get(second)).status == "pending"
    [refused] = await refusals(store, second)
    assert refused == {
        "reason": f"the message {MESSAGE} was processed already, on review {first}",
        "evidence": BY_MAIL,
    }
    [event] = [e for e in await store.events(second) if e.kind == "refused"]
    assert (event.actor, event.channel) == ("ana@example.com", "email")


async def test_every_kind_of_act_uses_a_message_up(store: ApprovalStore) -> None:
    """A decision, a vote that does not decide yet, and a recorded refusal each use it."""
    one, two = await two_reviews(store)
    three = (await store.create(ask("c3", approvals_required=2))).approval_id
    await store.vote(three, ANA, channel="email", evidence={MESSAGE_ID: "<vote@x>"})
    await store.decide(one, ANA, channel="email", evidence={MESSAGE_ID: "<decision@x>"})
    await store.refuse(
        two,
        actor="ana@example.com",
        channel="email",
        reason="the reply names no decision",
        evidence={MESSAGE_ID: "<refusal@x>"},
        record_message=True,
    )
    for message_id in ("<vote@x>", "<decision@x>", "<refusal@x>"):
        with pytest.raises(MessageAlreadyProcessed):
            await store.vote(two, ANA, channel="email", evidence={MESSAGE_ID: message_id})
        with pytest.raises(MessageAlreadyProcessed):
            await store.decide(two, ANA, channel="email", evidence={MESSAGE_ID: message_id})
        with pytest.raises(MessageAlreadyProcessed):
            await store.refuse(
                two,
                actor="ana@example.com",
                channel="email",
                reason="unclear",
                evidence={MESSAGE_ID: message_id},
                record_message=True,
            )
    assert (await store.get(two)).status == "pending"
    reasons = [str(detail["reason"]) for detail in await refusals(store, two)]
    assert reasons[0] == "the reply names no decision"
    assert len(reasons) == 10 and all("was processed already" in r for r in reasons[1:])


async def test_a_refusal_records_the_message_only_when_asked(store: ApprovalStore) -> None:
    """A message whose sender could not be verified must not use up the id of a genuine one."""
    first, second = await two_reviews(store)
    await store.refuse(first, actor="mallory", channel="email", reason="forged", evidence=BY_MAIL)
    decided = await store.vote(second, ANA, channel="email", evidence=BY_MAIL)
    assert decided.status == "approved"


async def test_a_refusal_asked_to_record_a_message_needs_one(store: ApprovalStore) -> None:
    first, _ = await two_reviews(store)
    with pytest.raises(ValueError, match="needs evidence with a message id"):
        await store.refuse(
            first, actor="ana", channel="email", reason="x", evidence={}, record_message=True
        )
    assert [e.kind for e in await store.events(first)] == ["created"]


async def test_a_refused_act_keeps_its_message_and_a_failed_one_does_not(
    store: ApprovalStore,
) -> None:
    """Refused by the store (decided already): processed, so a copy decides nothing
    elsewhere. Failed before anything was recorded (an unknown review, a malformed vote):
    not processed, so the message may still decide."""
    first, second = await two_reviews(store)
    await store.decide(first, Decision(approved=False, decided_by="bob"))
    with pytest.raises(ApprovalAlreadyDecided):
        await store.vote(first, ANA, channel="email", evidence=BY_MAIL)
    with pytest.raises(MessageAlreadyProcessed):
        await store.vote(second, ANA, channel="email", evidence=BY_MAIL)

    three = (await store.create(ask("c3", approvals_required=2))).approval_id
    four = (await store.create(ask("c4"))).approval_id
    unnamed = Decision(approved=True)  # a vote on a review that needs two must name its voter
    with pytest.raises(InvalidDecisionError):
        await store.vote(three, unnamed, channel="email", evidence={MESSAGE_ID: "<bad@x>"})
    with pytest.raises(ApprovalNotFound):
        await store.vote("apr_missing", ANA, channel="email", evidence={MESSAGE_ID: "<bad@x>"})
    decided = await store.vote(four, ANA, channel="email", evidence={MESSAGE_ID: "<bad@x>"})
    assert decided.status == "approved"


async def test_concurrent_copies_of_one_message_decide_at_most_once(
    store: ApprovalStore,
) -> None:
    reviews = [(await store.create(ask(f"c{n}"))).approval_id for n in range(6)]
    acts = [store.vote(review, ANA, channel="email", evidence=BY_MAIL) for review in reviews * 2]
    outcomes = await asyncio.gather(*acts, return_exceptions=True)
    decided = [o for o in outcomes if not isinstance(o, BaseException)]
    repeats = [o for o in outcomes if isinstance(o, MessageAlreadyProcessed)]
    assert len(decided) == 1 and len(repeats) == len(acts) - 1
    assert [(await store.get(r)).status for r in reviews].count("approved") == 1


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_replicas_on_one_database_process_a_message_once(
    backend: str, tmp_path: Path
) -> None:
    async with (
        database_url(backend, tmp_path) as url,
        SqlApprovalStore(url) as one,
        SqlApprovalStore(url) as other,
    ):
        reviews = [(await one.create(ask(f"c{n}"))).approval_id for n in range(8)]
        acts = [
            store.vote(review, ANA, channel="email", evidence=BY_MAIL)
            for review in reviews
            for store in (one, other)
        ]
        outcomes = await asyncio.gather(*acts, return_exceptions=True)
        assert [isinstance(o, MessageAlreadyProcessed) for o in outcomes].count(False) == 1
        assert all(
            isinstance(o, MessageAlreadyProcessed) or not isinstance(o, BaseException)
            for o in outcomes
        ), outcomes
        statuses = [(await other.get(review)).status for review in reviews]
        assert statuses.count("approved") == 1 and statuses.count("pending") == 7


OLD_REVIEW = (
    "INSERT INTO approvals (approval_id, run_id, call_id, tool, arguments, digest, status, "
    "created_at) VALUES (?, 'run_old', ?, 'refund', '{}', 'd', ?, ?)"
)
OLD_EVENT = (
    "INSERT INTO events (approval_id, kind, at, actor, channel, detail) VALUES (?, ?, ?, ?, ?, ?)"
)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_messages_processed_before_the_upgrade_stay_processed(
    backend: str, tmp_path: Path
) -> None:
    """Before migration 0016 the events were the only record: the upgrade takes the
    Message-IDs from them (and leaves alone what is not JSON or not email's)."""
    at = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    async with database_url(backend, tmp_path) as url:
        await at_revision(url, "0015")
        async with Database(url) as db:
            await db.fetch(OLD_REVIEW, "apr_old", "c_old", "approved", at)
            email = f'{{"action":"approve","evidence":{{"message_id":"{MESSAGE}"}}}}'
            for kind, channel, detail in (
                ("decided", "email", email),
                ("refused", "email", '{"evidence":{"message_id":"<refused@x>"},"reason":"x"}'),
                ("refused", "email", "not JSON"),
                ("refused", "slack", '{"evidence":{"message_id":"<slack@x>"},"reason":"x"}'),
            ):
                await db.fetch(OLD_EVENT, "apr_old", kind, at, "ana", channel, detail)
        async with SqlApprovalStore(url) as store:
            new = (await store.create(ask("c_new"))).approval_id
            for message_id in (MESSAGE, "<refused@x>"):
                with pytest.raises(MessageAlreadyProcessed, match="on review apr_old"):
                    await store.vote(new, ANA, channel="email", evidence={MESSAGE_ID: message_id})
            decided = await store.vote(
                new, ANA, channel="email", evidence={MESSAGE_ID: "<slack@x>"}
            )
            assert decided.status == "approved"
