"""The configuration's rules decide each call: no rule, automatic decisions, reviews."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodbot.bot.config import load_config
from nodbot.bot.policy.rules import authorize_by_rules, rules_executor
from nodbot.core import (
    ApprovalRecord,
    ApprovalRequest,
    Decision,
    MemoryApprovalStore,
    ToolCall,
    ToolRegistry,
    ToolResult,
    arguments_digest,
)
from nodbot.core.store import utc_now

RULES = r"""
rules:
  - tool: lookup_order
    decision: approve
    description: Reading an order is harmless.
  - tool: refund
    when: {gt: {amount: 100}}
    reviewers: [U0123ABCDE]
  - tool: send_email
    when: {matches: {to: '@(?!example\.com$)'}}
    decision: deny
    description: Mail leaves example.com only through the outbox.
  - tool: send_email
    decision: deny
"""


class Shop:
    def __init__(self, config_path: Path, clock: Callable[[], datetime] = utc_now) -> None:
        self.ran: list[str] = []
        registry = ToolRegistry()

        @registry.tool
        def lookup_order(order_id: str) -> str:
            self.ran.append("lookup_order")
            return "shipped"

        @registry.tool
        def refund(order_id: str, amount: float) -> str:
            self.ran.append(f"refund {amount}")
            return "refunded"

        @registry.tool
        def send_email(to: str, subject: str) -> str:
            self.ran.append(f"email {to}")
            return "sent"

        @registry.tool
        def ping() -> str:
            self.ran.append("ping")
            return "pong"

        self.store = MemoryApprovalStore()
        self.executor = rules_executor(registry, load_config(config_path), self.store, clock=clock)
        self.ctx = self.executor.context("run_1", requested_by="carol")

    async def call(self, name: str, call_id: str = "call_1", **arguments: object) -> ToolResult:
        return await self.executor.run_call(
            ToolCall(name=name, arguments=arguments, id=call_id), self.ctx
        )


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    path = tmp_path / "nodbot.yml"
    path.write_text(RULES)
    return Shop(path)


async def test_a_call_no_rule_covers_runs_without_review(shop: Shop) -> None:
    assert (await shop.call("ping")).value == "pong"
    assert await shop.store.list() == []


async def test_an_approve_rule_runs_the_call_without_a_person(shop: Shop) -> None:
    result = await shop.call("lookup_order", order_id="A-1")
    assert result.status == "ok"
    assert await shop.store.list() == []
    assert shop.ran == ["lookup_order"]


async def test_the_first_matching_rule_decides(shop: Shop) -> None:
    outside = await shop.call("send_email", to="x@evil.test", subject="hi")
    assert outside.error is not None
    assert outside.error.message == (
        "approval denied for tool 'send_email': Mail leaves example.com only through the outbox."
    )
    assert outside.error.details["decided_by"] == "nodbot:rules.2"
    inside = await shop.call("send_email", call_id="call_2", to="a@example.com", subject="hi")
    assert inside.error is not None
    assert inside.error.message.endswith("denied by rule 3 of the configuration")
    assert shop.ran == []


async def test_a_review_rule_waits_for_a_person_and_a_small_refund_does_not(shop: Shop) -> None:
    small = await shop.call("refund", order_id="A-1", amount=20)
    assert small.status == "ok"
    big = await shop.call("refund", call_id="call_2", order_id="A-1", amount=500)
    assert big.status == "pending" and big.error is not None
    approval_id = big.error.details["approval_id"]
    await shop.executor.decide(approval_id, True, decided_by="U0123ABCDE")
    resumed = await shop.call("refund", call_id="call_2", order_id="A-1", amount=500)
    assert resumed.status == "ok"
    assert shop.ran == ["refund 20.0", "refund 500.0"]
    [record] = await shop.store.list()
    assert record.decision is not None and record.decision.decided_by == "U0123ABCDE"


async def test_a_review_times_out_into_the_rules_timeout_decision(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "rules:\n"
        "  - tool: refund\n"
        "    reviewers: [U0123ABCDE]\n"
        "    timeout: 30m\n"
        "    timeout_decision: deny\n"
    )
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    shop = Shop(path, clock=lambda: an_hour_ago)  # the review was asked an hour ago
    pending = await shop.call("refund", order_id="A-1", amount=5)
    assert pending.status == "pending"
    [expired] = await shop.store.expire_due()
    assert expired.decision is not None
    assert expired.decision.decided_by == "nodbot:timeout"
    resumed = await shop.call("refund", order_id="A-1", amount=5)
    assert resumed.error is not None
    assert resumed.error.message == (
        "approval denied for tool 'refund': nobody decided before the deadline"
    )
    assert shop.ran == []


def reviewed(policy: dict[str, object], requested_by: str = "carol") -> ApprovalRecord:
    arguments = {"order_id": "A-1", "amount": 500.0}
    request = ApprovalRequest(
        "run_1", "call_1", "refund", arguments, arguments_digest(arguments),
        requested_by=requested_by, policy=policy,
    )  # fmt: skip
    return ApprovalRecord("apr_1", request, created_at=datetime.now(UTC))


APPROVE = Decision(approved=True)
DENY = Decision(approved=False)
EDIT = Decision(approved=True, edited_args={"amount": 100})
RAISE = Decision(approved=True, edited_args={"amount": 600})
BOUNDED = {"edit_bounds": [{"gt": {"amount": 0}}, {"le": {"amount": {"original": "amount"}}}]}


@pytest.mark.parametrize(
    ("policy", "principal", "decision", "refusal"),
    [
        ({}, "anyone", APPROVE, None),
        ({"reviewers": ["U0123ABCDE", "Lead@Example.com"]}, "lead@example.com", APPROVE, None),
        ({"reviewers": ["U0123ABCDE"]}, "U0999OTHER", APPROVE, "not one of the reviewers"),
        ({}, "carol", APPROVE, "you started this run"),
        ({}, "carol", DENY, None),
        ({"allow_self_approval": True}, "carol", APPROVE, None),
        ({"allowed_decisions": ["approve", "deny"]}, "ana", EDIT, "may not be decided with 'edit'"),
        ({"editable": ["amount"]}, "ana", EDIT, None),
        ({"editable": ["order_id"]}, "ana", EDIT, "amount may not be edited here"),
        ({"editable": []}, "ana", EDIT, "(editable: nothing)"),
        (BOUNDED, "ana", EDIT, None),
        (BOUNDED, "ana", RAISE, "amount must be at most the original amount (500.0); the edit"),
        (BOUNDED, "ana", Decision(approved=True, edited_args={"amount": -1}), "more than 0"),
        ({**BOUNDED, "editable": ["order_id"]}, "ana", RAISE, "amount may not be edited here"),
        ({"edit_bounds": [{"gt": {"amount": 1000}}]}, "ana", APPROVE, None),  # edits only
        ({"edit_bounds": "broken"}, "ana", EDIT, "cannot be read, so no edit is accepted"),
    ],
)
def test_decisions_are_authorized_by_the_rules_policy(
    policy: dict[str, object], principal: str, decision: Decision, refusal: str | None
) -> None:
    found = authorize_by_rules(principal, reviewed(policy), decision)
    if refusal is None:
        assert found is None
    else:
        assert found is not None and refusal in found


async def test_a_review_keeps_its_rules_policy(shop: Shop) -> None:
    big = await shop.call("refund", order_id="A-1", amount=500)
    assert big.error is not None
    record = await shop.store.get(big.error.details["approval_id"])
    assert record.request.policy == {
        "rule": 1,
        "description": None,
        "reviewers": ["U0123ABCDE"],
        "post_to": None,
        "allowed_decisions": ["approve", "edit", "deny"],
        "editable": None,
        "approvals_required": 1,
        "allow_self_approval": False,
    }


def test_escalation_lets_the_escalate_to_reviewers_decide_from_its_time() -> None:
    escalate_at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    policy = {
        "reviewers": ["U0123ABCDE"],
        "escalate_at": escalate_at.isoformat(),
        "escalate_to": ["finance@example.com"],
    }
    record = reviewed(policy)
    before = authorize_by_rules(
        "finance@example.com", record, APPROVE, now=escalate_at - timedelta(seconds=1)
    )
    assert before == "you are not one of the reviewers of this call"
    assert authorize_by_rules("finance@example.com", record, APPROVE, now=escalate_at) is None
    assert authorize_by_rules("U0123ABCDE", record, APPROVE, now=escalate_at) is None


async def test_a_review_keeps_its_escalation(tmp_path: Path) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "reviewer_groups:\n"
        "  finance: [finance@example.com, U0555FINANCE]\n"
        "rules:\n"
        "  - tool: refund\n"
        "    reviewers: [U0123ABCDE]\n"
        "    timeout: 1h\n"
        "    escalate_after: 15m\n"
        "    escalate_to: [group:finance]\n"
    )
    asked_at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    shop = Shop(path, clock=lambda: asked_at)
    pending = await shop.call("refund", order_id="A-1", amount=5)
    assert pending.error is not None
    record = await shop.store.get(pending.error.details["approval_id"])
    assert record.request.policy["escalate_at"] == (asked_at + timedelta(minutes=15)).isoformat()
    assert record.request.policy["escalate_to"] == ["finance@example.com", "U0555FINANCE"]
