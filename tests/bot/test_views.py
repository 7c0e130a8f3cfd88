"""The API's view of a review (`ApprovalView`): its deadline, what it becomes then, and the
approvals so far and needed, as every store records them (the memory store here; the SQL
stores over HTTP in test_http_approvals.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from nodbot.bot.http.schemas import ApprovalView
from nodbot.core import ApprovalRequest, Decision, MemoryApprovalStore
from nodbot.core.tools import arguments_digest

ARGUMENTS = {"to": "acme", "amount": 900.0}


def request(
    run_id: str = "run_v",
    *,
    approvals_required: int = 1,
    deadline: datetime | None = None,
    on_timeout: Literal["approve", "deny"] = "deny",
) -> ApprovalRequest:
    digest = arguments_digest(ARGUMENTS)
    return ApprovalRequest(
        run_id, "c1", "pay", ARGUMENTS, digest, deadline=deadline, on_timeout=on_timeout,
        approvals_required=approvals_required,
    )  # fmt: skip


async def test_votes_are_counted_until_they_decide() -> None:
    store = MemoryApprovalStore()
    record = await store.create(request(approvals_required=3))
    views = [await ApprovalView.read(store, record)]
    for voter in ("ana", "bob"):
        record = await store.vote(record.approval_id, Decision(approved=True, decided_by=voter))
        views.append(await ApprovalView.read(store, record))
    record = await store.vote(record.approval_id, Decision(approved=False, decided_by="cy"))
    views.append(await ApprovalView.read(store, record))
    seen = [(v.status, v.approvals, v.approvals_required) for v in views]
    assert seen == [("pending", 0, 3), ("pending", 1, 3), ("pending", 2, 3), ("denied", 2, 3)]


async def test_a_view_made_without_the_votes_says_it_did_not_count_them() -> None:
    store = MemoryApprovalStore()
    several = await store.create(request(approvals_required=2))
    assert ApprovalView.of(several).approvals is None  # a run's pending list, a webhook
    one = await store.create(request("run_w"))
    assert ApprovalView.of(one).approvals == 0  # its status says: nothing to read
    approved = await store.decide(one.approval_id, Decision(approved=True, decided_by="ana"))
    assert ApprovalView.of(approved).approvals == 1


async def test_the_deadline_and_what_then_happens_until_it_does() -> None:
    now = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    clock = [now]
    store = MemoryApprovalStore(clock=lambda: clock[0])
    deadline = now + timedelta(minutes=30)
    record = await store.create(request(deadline=deadline, on_timeout="approve"))
    view = await ApprovalView.read(store, record)
    assert (view.deadline, view.timeout_decision) == (deadline, "approve")
    clock[0] = deadline
    [expired] = await store.expire_due()
    after = await ApprovalView.read(store, expired)
    assert after.status == "approved" and after.decision is not None
    assert after.decision.decided_by == "nodbot:timeout"
    assert (after.deadline, after.timeout_decision) == (deadline, "approve")
    plain = ApprovalView.of(await store.create(request("run_x", on_timeout="approve")))
    assert (plain.deadline, plain.timeout_decision) == (None, None)
