"""A SQLite connection that decided a review takes the call's next claim of it with one
statement, without reading the record first; a record changed since by another connection is
claimed as if nothing were known (invariant 2: a decision runs at most one call). A new call's
review is made without a read first, and a call a store took is finished without its record
read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodbot.core import ApprovalAlreadyDecided, Decision, SqlApprovalStore
from nodbot.core.sqlstore.audit import verify
from nodbot.core.sqlstore.backend import COLUMNS
from tests.core.store.conftest import ask, traced

RECORD_READ = "SELECT approval_id, run_id, call_id"
"""How a statement that reads a whole record begins (`SELECT {COLUMNS} FROM approvals`)."""


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'claims.db'}"


async def kinds(url: str, approval_id: str) -> list[str]:
    async with SqlApprovalStore(url) as store:
        return [event.kind for event in await store.events(approval_id)]


async def test_a_new_call_is_made_pending_without_reading_for_its_record(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        sent = traced(store)
        claim = await store.claim(ask("c1"))
        assert claim.outcome == "pending"
        # Asked again, undecided: the insert finds the active record, which is then read.
        again = await store.claim(ask("c1"))
        assert again.outcome == "pending"
        assert again.record.approval_id == claim.record.approval_id
        assert (await store.claim(ask("c1", amount=9999.0))).outcome == "mismatch"
    reads = [s for s in sent if s.startswith(RECORD_READ)]
    assert len(reads) == 2  # the second claim's and the third's, not the first's
    assert await kinds(url, claim.record.approval_id) == ["created"]


@pytest.mark.parametrize("how", ["decide", "vote"])
@pytest.mark.parametrize("approved", [True, False])
async def test_a_review_made_here_is_decided_without_reading_its_record(
    url: str, how: str, approved: bool
) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.claim(ask("c1"))).record.approval_id
        sent = traced(store)
        decision = Decision(approved=approved, decided_by="ana", reason="checked")
        decided = await getattr(store, how)(approval_id, decision, channel="api")
        reads = [s for s in sent if s.startswith(RECORD_READ) or f"RETURNING {COLUMNS}" in s]
        assert reads == []
        assert decided == await store.get(approval_id)
        assert decided.decision == decision and decided.decided_at is not None
        # The decision goes on to the call's claim, as any other.
        taken = await store.claim(ask("c1"))
        assert taken.outcome == "taken" and taken.record == await store.get(approval_id)
    voted = ["voted"] if how == "vote" else []
    expected = ["created", *voted, "decided", "consumed"] + ([] if approved else ["finished"])
    assert await kinds(url, approval_id) == expected
    assert (await verify(url)).ok


async def test_an_edit_decided_here_is_answered_as_stored(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.claim(ask("c1"))).record.approval_id
        edit = Decision(approved=True, edited_args={"amount": 5, "note": ("a", "b")})
        decided = await store.decide(approval_id, edit)
        assert decided == await store.get(approval_id)
        assert decided.decision is not None
        assert decided.decision.edited_args == {"amount": 5, "note": ["a", "b"]}


@pytest.mark.parametrize("how", ["decide", "vote"])
async def test_a_review_made_here_and_decided_by_another_store_is_not_decided_again(
    url: str, how: str
) -> None:
    async with SqlApprovalStore(url) as one, SqlApprovalStore(url) as other:
        approval_id = (await one.claim(ask("c1"))).record.approval_id
        await other.decide(approval_id, Decision(approved=False, decided_by="bo"))
        with pytest.raises(ApprovalAlreadyDecided) as raised:
            await getattr(one, how)(approval_id, Decision(approved=True, decided_by="ana"))
        assert raised.value.details()["decided_by"] == "bo"
        record = await one.get(approval_id)
        assert record.decision is not None and record.decision.decided_by == "bo"
    assert await kinds(url, approval_id) == ["created", "decided", "refused"]
    assert (await verify(url)).ok


async def test_a_vote_on_a_review_made_here_that_needs_two_is_counted(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.claim(ask("c1", approvals_required=2))).record.approval_id
        first = await store.vote(approval_id, Decision(approved=True, decided_by="ana"))
        assert first.decision is None
        second = await store.vote(approval_id, Decision(approved=True, decided_by="bo"))
        assert second.decision is not None and second.decision.approved
        assert second == await store.get(approval_id)
    assert await kinds(url, approval_id) == ["created", "voted", "voted", "decided"]


@pytest.mark.parametrize("approved", [True, False])
async def test_a_call_decided_here_is_taken_without_reading_its_record(
    url: str, approved: bool
) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.claim(ask("c1"))).record.approval_id
        await store.decide(approval_id, Decision(approved=approved, decided_by="ana"))
        sent = traced(store)
        claim = await store.claim(ask("c1"), actor="worker")
        assert claim.outcome == "taken"
        assert claim.record.consumed_at is not None
        # A denial runs nothing: it is finished the moment it is taken.
        assert (claim.record.finished_at is not None) is not approved
        assert claim.record.outcome == (None if approved else "denied")
        reads = [s for s in sent if s.startswith(RECORD_READ) or f"RETURNING {COLUMNS}" in s]
        # Nor read back: the record it answers is the decided one, taken, as stored.
        assert claim.record == await store.get(approval_id)
    assert reads == []
    expected = ["created", "decided", "consumed"] + ([] if approved else ["finished"])
    assert await kinds(url, approval_id) == expected
    assert (await verify(url)).ok


async def test_a_decision_taken_by_another_connection_since_is_in_use(url: str) -> None:
    async with SqlApprovalStore(url) as one, SqlApprovalStore(url) as other:
        approval_id = (await one.claim(ask("c1"))).record.approval_id
        await one.decide(approval_id, Decision(approved=True, decided_by="ana"))
        assert (await other.claim(ask("c1"), actor="w2")).outcome == "taken"
        # `one` decided it, but the decision is spent: the claim is refused.
        claim = await one.claim(ask("c1"), actor="w1")
        assert claim.outcome == "in_use"
        assert claim.record.approval_id == approval_id
        await other.finish(approval_id, outcome="ok")
        # Finished: history; the same call asked again opens a new review.
        again = await one.claim(ask("c1"), actor="w1")
        assert again.outcome == "pending"
        assert again.record.approval_id != approval_id
    assert await kinds(url, approval_id) == [
        "created",
        "decided",
        "consumed",
        "refused",
        "finished",
    ]
    assert (await verify(url)).ok


@pytest.mark.parametrize("outcome", ["ok", "tool-error"])
async def test_a_call_taken_here_is_finished_without_reading_its_record(
    url: str, outcome: str
) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.claim(ask("c1"))).record.approval_id
        await store.decide(approval_id, Decision(approved=True, decided_by="ana"))
        taken = (await store.claim(ask("c1"), actor="worker")).record
        sent = traced(store)
        finished = await store.finish(approval_id, outcome=outcome)
        reads = [s for s in sent if s.startswith(RECORD_READ) or f"RETURNING {COLUMNS}" in s]
        assert reads == []
        # What it answers is the record as stored: the taken one, finished.
        assert finished == await store.get(approval_id)
        assert finished.finished_at is not None and finished.outcome == outcome
        assert finished.consumed_at == taken.consumed_at
        assert finished.decision == taken.decision
        # Finishing twice changes nothing.
        assert await store.finish(approval_id, outcome="other") == finished
    assert await kinds(url, approval_id) == ["created", "decided", "consumed", "finished"]
    assert (await verify(url)).ok


async def test_a_call_taken_here_and_finished_by_another_store_is_not_finished_again(
    url: str,
) -> None:
    async with SqlApprovalStore(url) as one, SqlApprovalStore(url) as other:
        approval_id = (await one.claim(ask("c1"))).record.approval_id
        await one.decide(approval_id, Decision(approved=True, decided_by="ana"))
        assert (await one.claim(ask("c1"), actor="w1")).outcome == "taken"
        first = await other.finish(approval_id, outcome="cancelled")
        # `one` took it, but the record is finished: its finish says so, as stored.
        again = await one.finish(approval_id, outcome="ok")
        assert again == first and again.outcome == "cancelled"
    assert await kinds(url, approval_id) == ["created", "decided", "consumed", "finished"]
    assert (await verify(url)).ok


async def test_a_decided_call_asked_with_other_arguments_is_a_mismatch(url: str) -> None:
    async with SqlApprovalStore(url) as store:
        approval_id = (await store.claim(ask("c1"))).record.approval_id
        await store.decide(approval_id, Decision(approved=True, decided_by="ana"))
        assert (await store.claim(ask("c1", amount=9999.0))).outcome == "mismatch"
        # The decision is still there for the call it was made for.
        taken = await store.claim(ask("c1"))
        assert taken.outcome == "taken"
        assert taken.record.approval_id == approval_id


async def test_a_record_made_here_shows_its_request_as_stored(url: str) -> None:
    # Answered without a read, the record still shows what every read of it shows: its
    # arguments and policy as their stored JSON gives them, keys in order, lists for tuples.
    policy = {"reviewers": ("ana", "bob"), "allow_self_approval": False}
    async with SqlApprovalStore(url) as store:
        made = (await store.claim(ask("c1", policy=policy))).record
        stored = await store.get(made.approval_id)
        assert made == stored
        for mine, theirs in [
            (made.request.arguments, stored.request.arguments),
            (made.request.policy, stored.request.policy),
        ]:
            assert json.dumps(mine) == json.dumps(theirs)  # the same keys in the same order
