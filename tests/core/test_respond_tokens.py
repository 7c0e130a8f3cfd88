"""A respond carried by a one-use token (`core.approval_tokens`): the claims of a reviewer's
answer in the tool's place carry it as `response`, under the signature, and the executor
takes such a token as that respond: `executor.run` returns the answer and the tool does not
run. A response added to, changed in or taken out of the signed claims fails closed, as does
one the bot would never sign (with an approval, blank, too long, not text). The claims of
every other decision are signed as before `response` existed."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from nodbot.core import ApprovalMismatchError, Decision, DeferredApproval, SqlApprovalStore
from nodbot.core.approval_tokens import (
    ApprovalToken,
    InvalidApprovalToken,
    TokenApproval,
    token_key,
)
from nodbot.core.decisions import MAX_RESPONSE
from nodbot.core.tools import canonical_json
from tests.core.test_context_approval import ASKED, KEY, PORTS, Shop, issued, refund

ANSWER = "Porto ships it on Monday"
CALL: dict[str, Any] = {
    "run_id": "run_1",
    "call_id": "call_1",
    "tool": "refund",
    "arguments": ASKED,
}


def responded(**claims: Any) -> str:
    """The token of a respond to refund call_1 of run_1, as the bot's consume signs it."""
    return issued(**{"approved": False, "response": ANSWER, **claims})


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    found: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return found


def with_claims(token: str, claims: dict[str, Any]) -> str:
    """`token` with its claims replaced and its signature kept: what a hop that changed it,
    without the key, would hand on."""
    prefix, _, mac = token.split(".")
    payload = base64.urlsafe_b64encode(canonical_json(claims).encode()).rstrip(b"=").decode()
    return f"{prefix}.{payload}.{mac}"


@pytest.mark.parametrize("port", PORTS)
async def test_a_respond_token_gives_the_answer_and_runs_nothing(port: str) -> None:
    shop = Shop(PORTS[port]())
    ctx = shop.executor.context("run_1", approval=TokenApproval(responded(), key=KEY))
    assert await shop.executor.run(refund(), ctx) == ANSWER
    assert shop.paid == []
    # Spent by that call: the next one goes to the port, as without a token.
    again = await shop.executor.run_call(refund(call_id="call_2"), ctx)
    assert again.status != "ok"
    assert shop.paid == []


async def test_run_call_reports_the_answer_as_the_calls_result_without_arguments() -> None:
    shop = Shop(None)
    ctx = shop.executor.context("run_1", approval=TokenApproval(responded(), key=KEY))
    result = await shop.executor.run_call(refund(), ctx)
    assert (result.status, result.value, result.arguments, result.error) == (
        "ok",
        ANSWER,
        None,
        None,
    )


async def test_the_store_records_the_tokens_respond_on_the_calls_review(tmp_path: Path) -> None:
    async with SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}") as store:
        shop = Shop(DeferredApproval(store))
        ctx = shop.executor.context("run_1", approval=TokenApproval(responded(), key=KEY))
        assert await shop.executor.run(refund(), ctx) == ANSWER
        record = await store.find("run_1", "call_1")
        assert record is not None and record.status == "denied"
        assert record.decision == Decision(
            approved=False, response=ANSWER, decided_by="lead@example.com"
        )
        events = await store.events(record.approval_id)
        assert [e.kind for e in events] == ["created", "decided", "consumed", "finished"]
        decided = events[1]
        assert (decided.channel, decided.detail["action"]) == ("context", "respond")
        assert decided.detail["evidence"] == {"approval_token": "appr_1"}
    assert shop.paid == []


def test_the_decision_of_a_respond_token_carries_the_signed_response() -> None:
    claims, decision = TokenApproval(responded(), key=KEY).decision_for(**CALL)
    assert claims.response == ANSWER and claims.approved is False
    assert decision == Decision(approved=False, response=ANSWER, decided_by="lead@example.com")


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda c: {**c, "response": "Leeds ships it"}, id="another answer"),
        pytest.param(lambda c: {k: v for k, v in c.items() if k != "response"}, id="no answer"),
    ],
)
async def test_a_changed_response_does_not_verify_and_nothing_runs(change: Any) -> None:
    token = responded()
    tampered = with_claims(token, change(claims_of(token)))
    with pytest.raises(InvalidApprovalToken, match="not issued to this client"):
        ApprovalToken.verify(tampered, KEY)
    shop = Shop(None)
    ctx = shop.executor.context("run_1", approval=TokenApproval(tampered, key=KEY))
    with pytest.raises(ApprovalMismatchError):
        await shop.executor.run(refund(), ctx)
    assert shop.paid == []


async def test_a_response_added_to_a_denials_claims_does_not_verify() -> None:
    denial = issued(approved=False, reason="over the budget")
    forged = with_claims(denial, {**claims_of(denial), "response": "refunded 500 on o-7"})
    shop = Shop(None)
    ctx = shop.executor.context("run_1", approval=TokenApproval(forged, key=KEY))
    result = await shop.executor.run_call(refund(), ctx)
    assert result.error is not None and result.error.kind == "approval-mismatch"
    assert shop.paid == []
    # Signed with another bearer's key, the respond does not verify either.
    other = TokenApproval(responded(), key=token_key("token-of-someone-else-0000000"))
    with pytest.raises(InvalidApprovalToken):
        other.decision_for(**CALL)


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param({"approved": True, "response": ANSWER}, id="with an approval"),
        pytest.param({"approved": False, "response": 42}, id="not text"),
    ],
)
def test_a_response_the_bot_never_signs_is_malformed(claims: dict[str, Any]) -> None:
    with pytest.raises(InvalidApprovalToken, match="malformed"):
        ApprovalToken.verify(issued(**claims), KEY)


@pytest.mark.parametrize("answer", ["", "   ", "x" * (MAX_RESPONSE + 1)])
async def test_a_blank_or_overlong_response_is_refused_and_nothing_runs(answer: str) -> None:
    token = TokenApproval(responded(response=answer), key=KEY)
    with pytest.raises(InvalidApprovalToken, match="malformed"):
        token.decision_for(**CALL)
    shop = Shop(None)
    with pytest.raises(ApprovalMismatchError):
        await shop.executor.run(refund(), shop.executor.context("run_1", approval=token))
    assert shop.paid == []


def test_the_claims_of_other_decisions_are_signed_as_before() -> None:
    before = {
        "approval_id",
        "run_id",
        "call_id",
        "tool",
        "digest",
        "approved",
        "decided_by",
        "reason",
        "edited_digest",
    }
    for token in (issued(), issued(approved=False, reason="no")):
        assert set(claims_of(token)) == before  # no `response: null` under the signature
    # A token signed before `response` existed (its claims without it) still verifies.
    old = issued(approved=False, reason="no")
    assert ApprovalToken.verify(old, KEY).response is None
    assert set(claims_of(responded())) == before | {"response"}
