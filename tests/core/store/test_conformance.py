"""The rules every `ApprovalStore` follows (003: first decision wins, one use, binding)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from nodbot.core import (
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalError,
    ApprovalNotDecided,
    ApprovalNotFound,
    ApprovalRequest,
    ApprovalStore,
    Decision,
    InvalidDecisionError,
    arguments_digest,
)

APPROVE = Decision(approved=True, decided_by="ana")
DENY = Decision(approved=False, reason="no", decided_by="bob")


def request(
    call_id: str = "call_1", run_id: str = "run_1", amount: float = 500.0
) -> ApprovalRequest:
    arguments = {"order_id": "o-7", "amount": amount}
    return ApprovalRequest(
        run_id=run_id,
        call_id=call_id,
        tool="refund",
        arguments=arguments,
        digest=arguments_digest(arguments),
        requested_by="carol",
    )


async def test_create_stores_a_pending_record(store: ApprovalStore) -> None:
    record = await store.create(request())
    assert record.status == "pending"
    assert not record.consumed and not record.finished
    assert record.request == request()
    assert await store.get(record.approval_id) == record
    assert await store.find("run_1", "call_1") == record


async def test_create_returns_the_active_record_of_the_same_call(store: ApprovalStore) -> None:
    first = await store.create(request())
    again = await store.create(request())
    assert again.approval_id == first.approval_id
    assert len(await store.list()) == 1


async def test_concurrent_creates_of_one_call_make_one_record(store: ApprovalStore) -> None:
    records = await asyncio.gather(*(store.create(request()) for _ in range(10)))
    assert len({record.approval_id for record in records}) == 1
    assert len(await store.list()) == 1


async def test_other_runs_and_calls_get_their_own_records(store: ApprovalStore) -> None:
    a = await store.create(request("call_1", "run_1"))
    b = await store.create(request("call_2", "run_1"))
    c = await store.create(request("call_1", "run_2"))
    assert len({a.approval_id, b.approval_id, c.approval_id}) == 3


async def test_get_unknown_id_raises(store: ApprovalStore) -> None:
    with pytest.raises(ApprovalNotFound, match="apr_missing"):
        await store.get("apr_missing")
    assert await store.find("run_1", "nope") is None


async def test_list_filters_by_run_and_status_in_creation_order(store: ApprovalStore) -> None:
    ids = [(await store.create(request(f"call_{i}"))).approval_id for i in range(4)]
    other = await store.create(request("call_0", run_id="run_2"))
    await store.decide(ids[1], APPROVE)
    await store.decide(ids[2], DENY)
    pending = await store.list(run_id="run_1", status="pending")
    assert [r.approval_id for r in pending] == [ids[0], ids[3]]
    assert [r.approval_id for r in await store.list(status="approved")] == [ids[1]]
    assert [r.approval_id for r in await store.list(status="denied")] == [ids[2]]
    assert [r.approval_id for r in await store.list(run_id="run_2")] == [other.approval_id]
    assert len(await store.list(limit=2)) == 2


async def test_list_newest_first_with_a_limit(store: ApprovalStore) -> None:
    ids = [(await store.create(request(f"call_{i}"))).approval_id for i in range(5)]
    newest = await store.list(status="pending", limit=2, newest_first=True)
    assert [r.approval_id for r in newest] == [ids[4], ids[3]]
    by_run = await store.list(run_id="run_1", newest_first=True)
    assert [r.approval_id for r in by_run] == ids[::-1]


async def test_a_refusal_by_a_channel_is_recorded(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.refuse(record.approval_id, actor="U0999", channel="slack", reason="not a reviewer")
    [_, refused] = await store.events(record.approval_id)
    assert (refused.kind, refused.actor, refused.channel) == ("refused", "U0999", "slack")
    assert refused.detail == {"reason": "not a reviewer"}
    assert (await store.get(record.approval_id)).decision is None
    with pytest.raises(ApprovalNotFound):
        await store.refuse("apr_missing", actor=None, channel=None, reason="x")


async def test_decide_records_the_decision(store: ApprovalStore) -> None:
    record = await store.create(request())
    decided = await store.decide(record.approval_id, APPROVE, channel="api")
    assert decided.status == "approved"
    assert decided.decision == APPROVE
    assert decided.decided_at is not None
    assert await store.get(record.approval_id) == decided


async def test_first_decision_wins(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    with pytest.raises(ApprovalAlreadyDecided, match="by ana") as raised:
        await store.decide(record.approval_id, DENY)
    assert raised.value.decided_by == "ana"
    assert (await store.get(record.approval_id)).decision == APPROVE


async def test_concurrent_decisions_exactly_one_wins(store: ApprovalStore) -> None:
    record = await store.create(request())
    deciders = [Decision(approved=i % 2 == 0, decided_by=f"user{i}") for i in range(10)]
    outcomes = await asyncio.gather(
        *(store.decide(record.approval_id, d) for d in deciders), return_exceptions=True
    )
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(o, ApprovalAlreadyDecided) for o in outcomes if o not in winners)
    assert (await store.get(record.approval_id)).decision == winners[0].decision


async def test_decide_unknown_id_raises_and_records_nothing(store: ApprovalStore) -> None:
    with pytest.raises(ApprovalNotFound):
        await store.decide("apr_missing", APPROVE)
    assert await store.list() == []


async def test_consume_spends_an_approval_once(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    consumed = await store.consume(record.approval_id)
    assert consumed.consumed and not consumed.finished
    with pytest.raises(ApprovalAlreadyConsumed):
        await store.consume(record.approval_id)


async def test_concurrent_consumes_exactly_one_wins(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    outcomes = await asyncio.gather(
        *(store.consume(record.approval_id) for _ in range(10)), return_exceptions=True
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
    assert sum(isinstance(o, ApprovalAlreadyConsumed) for o in outcomes) == 9


async def test_consume_of_a_pending_record_is_refused(store: ApprovalStore) -> None:
    record = await store.create(request())
    with pytest.raises(ApprovalNotDecided):
        await store.consume(record.approval_id)
    assert not (await store.get(record.approval_id)).consumed


async def test_a_consumed_denial_is_finished_at_once(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, DENY)
    consumed = await store.consume(record.approval_id)
    assert consumed.finished and consumed.outcome == "denied"


async def test_in_flight_record_stays_active_until_finished(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    await store.consume(record.approval_id)
    assert (await store.create(request())).approval_id == record.approval_id
    finished = await store.finish(record.approval_id, outcome="ok")
    assert finished.finished and finished.outcome == "ok"
    again = await store.finish(record.approval_id, outcome="error")
    assert again.outcome == "ok"  # finishing twice changes nothing


async def test_after_finish_the_same_call_opens_a_new_review(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    await store.consume(record.approval_id)
    await store.finish(record.approval_id, outcome="ok")
    fresh = await store.create(request())
    assert fresh.approval_id != record.approval_id
    assert fresh.status == "pending"
    assert (await store.find("run_1", "call_1")) == fresh
    assert (await store.get(record.approval_id)).consumed  # history is kept


async def test_finish_before_consume_is_refused(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    with pytest.raises(ApprovalError, match="no call has consumed it"):
        await store.finish(record.approval_id, outcome="ok")
    assert not (await store.get(record.approval_id)).finished


async def test_decision_after_consumption_is_refused(store: ApprovalStore) -> None:
    record = await store.create(request())
    await store.decide(record.approval_id, APPROVE)
    await store.consume(record.approval_id)
    with pytest.raises(ApprovalAlreadyDecided):
        await store.decide(record.approval_id, DENY)
    assert (await store.get(record.approval_id)).decision == APPROVE


async def test_claim_creates_the_review_and_waits_while_it_is_pending(
    store: ApprovalStore,
) -> None:
    first = await store.claim(request())
    assert first.outcome == "pending" and first.record.status == "pending"
    again = await store.claim(request())
    assert again.outcome == "pending"
    assert again.record.approval_id == first.record.approval_id
    assert [e.kind for e in await store.events()] == ["created"]


async def test_claim_takes_a_decision_once(store: ApprovalStore) -> None:
    record = (await store.claim(request())).record
    await store.decide(record.approval_id, APPROVE)
    taken = await store.claim(request(), actor="worker-1")
    assert taken.outcome == "taken"
    assert taken.record.consumed and taken.record.decision == APPROVE
    in_use = await store.claim(request(), actor="worker-2")
    assert in_use.outcome == "in_use" and in_use.record.approval_id == record.approval_id
    events = await store.events(record.approval_id)
    assert [e.kind for e in events] == ["created", "decided", "consumed", "refused"]
    assert (events[2].actor, events[2].channel) == ("worker-1", "executor")
    assert events[3].actor == "worker-2"
    assert events[3].detail["reason"] == "approval already used by a concurrent request"
    await store.finish(record.approval_id, outcome="ok")
    fresh = await store.claim(request())
    assert fresh.outcome == "pending" and fresh.record.approval_id != record.approval_id


async def test_claim_of_a_denial_finishes_it(store: ApprovalStore) -> None:
    record = (await store.claim(request())).record
    await store.decide(record.approval_id, DENY)
    taken = await store.claim(request())
    assert taken.outcome == "taken" and taken.record.decision == DENY
    assert taken.record.finished and taken.record.outcome == "denied"


async def test_claim_for_other_arguments_changes_nothing(store: ApprovalStore) -> None:
    record = (await store.claim(request())).record
    await store.decide(record.approval_id, APPROVE)
    other = await store.claim(request(amount=5000.0))
    assert other.outcome == "mismatch" and other.record.approval_id == record.approval_id
    assert not (await store.get(record.approval_id)).consumed
    assert [e.kind for e in await store.events()] == ["created", "decided"]


async def test_concurrent_claims_of_one_decision_take_it_once(store: ApprovalStore) -> None:
    record = (await store.claim(request())).record
    await store.decide(record.approval_id, APPROVE)
    claims = await asyncio.gather(*(store.claim(request()) for _ in range(10)))
    assert sorted(c.outcome for c in claims) == ["in_use"] * 9 + ["taken"]
    kinds = [e.kind for e in await store.events(record.approval_id)]
    assert kinds.count("consumed") == 1 and kinds.count("refused") == 9


async def test_events_tell_the_story_and_refusals(store: ApprovalStore) -> None:
    record = await store.create(request())
    approval_id = record.approval_id
    await store.decide(approval_id, APPROVE, channel="slack")
    with pytest.raises(ApprovalAlreadyDecided):
        await store.decide(approval_id, DENY, channel="email")
    await store.consume(approval_id, actor="worker-1")
    with pytest.raises(ApprovalAlreadyConsumed):
        await store.consume(approval_id, actor="worker-2")
    await store.finish(approval_id, outcome="ok")
    events = await store.events(approval_id)
    assert [e.kind for e in events] == [
        "created",
        "decided",
        "refused",
        "consumed",
        "refused",
        "finished",
    ]
    created, decided, refused_decide, consumed, refused_consume, finished = events
    assert created.actor == "carol"
    assert (decided.actor, decided.channel) == ("ana", "slack")
    assert (refused_decide.actor, refused_decide.channel) == ("bob", "email")
    assert refused_decide.detail["reason"] == "already decided"
    assert consumed.actor == "worker-1"
    assert refused_consume.actor == "worker-2"
    assert refused_consume.detail["reason"] == "approval already used by a concurrent request"
    assert finished.detail["outcome"] == "ok"
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert all(e.at.tzinfo is not None for e in events)


async def test_events_of_one_approval_only(store: ApprovalStore) -> None:
    a = await store.create(request("call_1"))
    b = await store.create(request("call_2"))
    assert [e.approval_id for e in await store.events(a.approval_id)] == [a.approval_id]
    assert {e.approval_id for e in await store.events()} == {a.approval_id, b.approval_id}


def due(call_id: str, seconds: float, on_timeout: str = "deny") -> ApprovalRequest:
    """A request whose deadline is `seconds` from now (negative: already passed)."""
    deadline = datetime.now(UTC) + timedelta(seconds=seconds)
    return replace(request(call_id), deadline=deadline, on_timeout=on_timeout)  # type: ignore[arg-type]


async def test_expire_due_decides_overdue_reviews_with_their_timeout_decision(
    store: ApprovalStore,
) -> None:
    late_deny = await store.create(due("call_1", -5))
    late_approve = await store.create(due("call_2", -5, on_timeout="approve"))
    not_yet = await store.create(due("call_3", 3600))
    no_deadline = await store.create(request("call_4"))
    decided = await store.create(due("call_5", -5))
    await store.decide(decided.approval_id, APPROVE)

    expired = {record.approval_id: record for record in await store.expire_due()}
    assert set(expired) == {late_deny.approval_id, late_approve.approval_id}
    denied, approved = expired[late_deny.approval_id], expired[late_approve.approval_id]
    assert denied.status == "denied" and approved.status == "approved"
    for record in (denied, approved):
        assert record.decision is not None
        assert record.decision.decided_by == "nodbot:timeout"
        assert record.decision.reason == "nobody decided before the deadline"
        assert record.request.deadline is not None
    assert (await store.get(not_yet.approval_id)).status == "pending"
    assert (await store.get(no_deadline.approval_id)).status == "pending"
    assert (await store.get(decided.approval_id)).decision == APPROVE
    [event] = [e for e in await store.events(late_deny.approval_id) if e.kind == "decided"]
    assert (event.actor, event.channel, event.detail) == (
        "nodbot:timeout",
        "timer",
        {
            "status": "denied",
            "action": "deny",
            "reason": "nobody decided before the deadline",
            "edited_args": None,
            "digest": late_deny.request.digest,
        },
    )
    [event] = [e for e in await store.events(late_approve.approval_id) if e.kind == "decided"]
    assert (event.detail["status"], event.detail["action"]) == ("approved", "approve")
    assert await store.expire_due() == []  # nothing twice


async def test_a_decision_after_the_timeout_is_refused(store: ApprovalStore) -> None:
    record = await store.create(due("call_1", -1))
    await store.expire_due()
    with pytest.raises(ApprovalAlreadyDecided, match="nodbot:timeout"):
        await store.decide(record.approval_id, APPROVE)


async def test_expire_due_takes_at_most_limit(store: ApprovalStore) -> None:
    for number in range(5):
        await store.create(due(f"call_{number}", -1))
    assert len(await store.expire_due(limit=2)) == 2
    assert len(await store.expire_due(limit=10)) == 3


async def test_deadline_and_timeout_decision_are_stored(store: ApprovalStore) -> None:
    made = await store.create(due("call_1", 60, on_timeout="approve"))
    stored = await store.get(made.approval_id)
    assert stored.request.on_timeout == "approve"
    assert stored.request.deadline is not None
    assert abs((stored.request.deadline - made.request.deadline).total_seconds()) < 0.001  # type: ignore[operator]


async def test_the_rules_policy_is_kept_with_the_review(store: ApprovalStore) -> None:
    policy = {"rule": 1, "reviewers": ["U0123ABCDE", "lead@example.com"], "editable": ["amount"]}
    made = await store.create(replace(request(), policy=policy))
    assert (await store.get(made.approval_id)).request.policy == policy
    assert (await store.create(request("call_2"))).request.policy == {}


def needing(approvals: int, call_id: str = "call_1") -> ApprovalRequest:
    return replace(request(call_id), approvals_required=approvals)


async def test_n_of_m_needs_distinct_approvers(store: ApprovalStore) -> None:
    record = await store.create(needing(2))
    first = await store.vote(record.approval_id, APPROVE, channel="slack")
    assert first.status == "pending"
    with pytest.raises(ApprovalAlreadyVoted, match="ana has already voted"):
        await store.vote(record.approval_id, APPROVE)
    second = await store.vote(
        record.approval_id, Decision(approved=True, decided_by="bob"), channel="web"
    )
    assert second.status == "approved"
    assert second.decision is not None
    assert second.decision.decided_by == "ana, bob"
    kinds = [(e.kind, e.actor) for e in await store.events(record.approval_id)]
    assert kinds == [
        ("created", "carol"),
        ("voted", "ana"),
        ("refused", "ana"),
        ("voted", "bob"),
        ("decided", "ana, bob"),
    ]
    with pytest.raises(ApprovalAlreadyDecided):
        await store.vote(record.approval_id, Decision(approved=False, decided_by="dan"))


async def test_any_deny_denies_at_once(store: ApprovalStore) -> None:
    record = await store.create(needing(3))
    await store.vote(record.approval_id, APPROVE)
    denied = await store.vote(record.approval_id, DENY)
    assert denied.status == "denied"
    assert denied.decision == DENY


async def test_votes_that_cannot_count_are_refused_and_record_nothing(
    store: ApprovalStore,
) -> None:
    record = await store.create(needing(2))
    with pytest.raises(InvalidDecisionError, match="needs decided_by"):
        await store.vote(record.approval_id, Decision(approved=True))
    edit = Decision(approved=True, edited_args={"amount": 1}, decided_by="ana")
    with pytest.raises(InvalidDecisionError, match="cannot be edited"):
        await store.vote(record.approval_id, edit)
    assert [e.kind for e in await store.events(record.approval_id)] == ["created"]
    with pytest.raises(ApprovalNotFound):
        await store.vote("apr_missing", APPROVE)


async def test_with_one_approval_required_a_vote_is_the_decision(store: ApprovalStore) -> None:
    record = await store.create(request())
    edit = Decision(approved=True, edited_args={"amount": 1}, decided_by="ana")
    decided = await store.vote(record.approval_id, edit)
    assert decided.decision == edit


async def test_concurrent_votes_reach_the_quorum_once(store: ApprovalStore) -> None:
    record = await store.create(needing(2))
    voters = [Decision(approved=True, decided_by=f"user{n}") for n in range(4)]
    outcomes = await asyncio.gather(
        *(store.vote(record.approval_id, vote) for vote in voters), return_exceptions=True
    )
    decided = await store.get(record.approval_id)
    assert decided.status == "approved"
    late = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, ApprovalAlreadyDecided) for o in late)
    assert len(late) == 2
    assert [e.kind for e in await store.events(record.approval_id)].count("decided") == 1


async def test_counts_by_status(store: ApprovalStore) -> None:
    assert await store.counts() == {"pending": 0, "approved": 0, "denied": 0}
    ids = [(await store.create(request(f"call_{n}"))).approval_id for n in range(4)]
    await store.decide(ids[0], APPROVE)
    await store.decide(ids[1], DENY)
    assert await store.counts() == {"pending": 2, "approved": 1, "denied": 1}


async def test_a_review_a_claim_opens_is_the_record_read_back(store: ApprovalStore) -> None:
    # The record a claim returns is made from the request; it must be what is stored.
    deadline = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    arguments = {"order_id": "o-7", "amount": 500.0, "note": "ünïcode"}
    request = ApprovalRequest(
        "run_1",
        "c1",
        "refund",
        arguments,
        arguments_digest(arguments),
        requested_by="ana",
        deadline=deadline,
        on_timeout="approve",
        approvals_required=2,
        policy={"reviewers": ["bob"]},
    )
    claim = await store.claim(request)
    assert claim.outcome == "pending"
    assert claim.record == await store.get(claim.record.approval_id)
    assert claim.record.request.deadline == deadline
