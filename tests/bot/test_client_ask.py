"""The Python client and questions, against a bot served in-process: `ask` returns the answer
a reviewer gives over the API (`decide` with a respond), raises `QuestionPending` after its
wait (asking again waits on the same question) and `QuestionUnanswered` when the question is
declined, times out or has nobody to ask; `SyncApprovalClient.ask` does the same blocking; a
question `ctx.ask` would refuse is refused before anything is sent. `guard` returns a
respond's text as the call's result, without running the function, and through a real
proxy that rewrites the consume answer (`tests.bot.test_signed_decisions`) runs nothing and
returns nothing when a respond's text, or whether it is one, was changed on its way."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodbot.core.client import (
    ApprovalClient,
    ApprovalClientError,
    QuestionPending,
    QuestionUnanswered,
    SyncApprovalClient,
    UntrustedDecision,
)
from nodbot.core.errors import InvalidQuestionError
from tests.bot.test_signed_decisions import Rewrite, tampering
from tests.bridges.support import AGENT_TOKEN, REVIEWER_TOKEN, Bridged, bridged_bot, review_rule

CHOICES = ["Leeds", "Porto"]
RULES = [
    review_rule("refund", allowed_decisions="[approve, deny, respond]"),
    review_rule("ask"),
]


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bridged]:
    async with bridged_bot(tmp_path, ["refund"], RULES) as served:
        yield served


async def answer(bot: Bridged, body: dict[str, Any]) -> dict[str, Any]:
    """Decide the one pending question as the reviewer, once it is asked."""
    [question] = await bot.when_pending(1)
    assert question["kind"] == "question"
    decided = await bot.reviewer.post(f"/approvals/{question['approval_id']}/decide", json=body)
    assert decided.status_code == 200, decided.text
    found: dict[str, Any] = decided.json()
    return found


async def test_ask_returns_the_answer_a_reviewer_gives(bot: Bridged, run_id: str) -> None:
    asking = asyncio.create_task(
        bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=20)
    )
    decided = await answer(bot, {"action": "respond", "message": "2"})  # the 2nd choice
    assert decided["answer"] == "Porto"
    assert await asking == "Porto"


async def test_ask_raises_pending_after_its_wait_and_asking_again_waits_on(
    bot: Bridged, run_id: str
) -> None:
    with pytest.raises(QuestionPending) as pending:
        await bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=0.2)
    first = pending.value
    assert (first.key, first.question) == (first.key, "Which warehouse?")
    with pytest.raises(QuestionPending) as again:
        await bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=0)
    assert again.value.approval_id == first.approval_id  # the same question
    asking = asyncio.create_task(
        bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=20)
    )
    async with ApprovalClient(bot.served.url, token=REVIEWER_TOKEN) as reviewer:
        assert first.approval_id is not None
        decided = await reviewer.decide(first.approval_id, {"type": "respond", "message": "leeds"})
    assert (decided.kind, decided.answer, decided.status) == ("question", "Leeds", "denied")
    assert decided.question is not None and decided.question.choices == ("Leeds", "Porto")
    assert await asking == "Leeds"
    # Answered, it stays answered: asking once more gives the answer at once.
    assert await bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES) == "Leeds"


async def test_a_declined_question_raises_unanswered_with_the_reason(
    bot: Bridged, run_id: str
) -> None:
    asking = asyncio.create_task(bot.client.ask("What should the parcel say?", run_id=run_id))
    await answer(bot, {"action": "deny", "reason": "ask the customer"})
    with pytest.raises(QuestionUnanswered) as declined:
        await asking
    assert declined.value.reason == "ask the customer"
    assert declined.value.decided_by == "lead@example.com"


async def test_a_bad_answer_is_refused_and_the_question_waits_on(bot: Bridged, run_id: str) -> None:
    with pytest.raises(QuestionPending) as pending:
        await bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=0)
    approval_id = pending.value.approval_id
    assert approval_id is not None
    async with ApprovalClient(bot.served.url, token=REVIEWER_TOKEN) as reviewer:
        with pytest.raises(ApprovalClientError) as refused:
            await reviewer.decide(approval_id, {"action": "respond", "message": "Lisbon"})
        assert refused.value.status == 422
        assert refused.value.details()["errors"][0]["field"] == "response"
        assert (await reviewer.get(approval_id)).status == "pending"


async def test_a_timed_out_question_and_one_with_nobody_to_ask_raise_unanswered(
    tmp_path: Path, run_id: str
) -> None:
    rules = [review_rule("ask", timeout="1s")]
    for folder in ("timed", "nobody"):
        (tmp_path / folder).mkdir()
    async with bridged_bot(tmp_path / "timed", ["refund"], rules) as bot:
        with pytest.raises(QuestionUnanswered) as timed_out:
            await bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=20)
        assert timed_out.value.decided_by == "nodbot:timeout"
    async with bridged_bot(tmp_path / "nobody", ["refund"]) as bot:
        with pytest.raises(QuestionUnanswered) as nobody:
            await bot.client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, wait=20)
        assert nobody.value.decided_by == "nodbot:no-rule"
        assert nobody.value.reason is not None and "nobody can be asked" in nobody.value.reason


async def test_a_question_that_cannot_be_asked_is_refused_before_sending(
    bot: Bridged, run_id: str
) -> None:
    for question, choices, key in (
        ("  ", None, None),
        ("Which?", ["only one"], None),
        ("Which?", CHOICES, "a/b"),
        ("Which?", ["Leeds", "x" * 80], None),
    ):
        with pytest.raises(InvalidQuestionError):
            await bot.client.ask(question, run_id=run_id, choices=choices, id=key)
    assert await bot.pending() == []


async def test_the_sync_client_asks_and_blocks_until_answered(bot: Bridged, run_id: str) -> None:
    def ask() -> str:
        with SyncApprovalClient(bot.served.url, token=AGENT_TOKEN) as client:
            return client.ask("Which warehouse?", run_id=run_id, choices=CHOICES, id="w", wait=20)

    asking = asyncio.create_task(asyncio.to_thread(ask))
    await answer(bot, {"action": "respond", "message": "Porto"})
    assert await asking == "Porto"


# --- guard and respond ---------------------------------------------------------------------------


async def test_guard_returns_a_respond_as_the_result_without_running(
    bot: Bridged, run_id: str
) -> None:
    ran: list[str] = []

    @bot.client.guard(run_id=run_id, within=20)
    async def refund(order_id: str, amount: float) -> str:
        ran.append(order_id)
        return f"refunded {amount} on {order_id}"

    called = asyncio.create_task(refund("o-7", amount=500))
    [review] = await bot.when_pending(1)
    assert review["kind"] == "review"
    body = {"action": "respond", "message": "refunded by hand already: nothing to do"}
    decided = await bot.reviewer.post(f"/approvals/{review['approval_id']}/decide", json=body)
    assert decided.status_code == 200, decided.text
    assert await called == "refunded by hand already: nothing to do"
    assert ran == []


# Each case: the reviewer's decision, the proxy's rewrite of the consume answer, the field the
# client names. The token is the bot's, which the proxy cannot sign anew.
TAMPERED: dict[str, tuple[dict[str, Any], Rewrite, str]] = {
    "a respond's text changed": (
        {"action": "respond", "message": "refunded by hand already"},
        lambda answer: {**answer, "response": "refund it twice"},
        "response",
    ),
    "a denial made a respond": (
        {"action": "deny", "reason": "no"},
        lambda answer: {**answer, "response": "refunded: tell the customer so"},
        "response",
    ),
    "a respond made an approval": (
        {"action": "respond", "message": "refunded by hand already"},
        lambda answer: {**answer, "approved": True, "response": None},
        "approved",
    ),
}


@pytest.mark.parametrize("case", TAMPERED)
async def test_guard_runs_nothing_and_returns_nothing_on_a_changed_answer(
    tmp_path: Path, run_id: str, case: str
) -> None:
    decision, rewrite, disagreeing = TAMPERED[case]
    ran: list[str] = []
    async with (
        bridged_bot(tmp_path, ["refund"], RULES) as bot,
        tampering(bot, rewrite) as proxy,
        ApprovalClient(proxy.url, token=AGENT_TOKEN) as client,
    ):

        @client.guard(run_id=run_id, within=20)
        async def refund(order_id: str, amount: float) -> str:
            ran.append(order_id)
            return "refunded"

        called = asyncio.create_task(refund("o-7", amount=500))
        [review] = await bot.when_pending(1)
        decided = await bot.reviewer.post(
            f"/approvals/{review['approval_id']}/decide", json=decision
        )
        assert decided.status_code == 200, decided.text
        with pytest.raises(UntrustedDecision) as refused:
            await called
        assert len(proxy.rewritten) == 1
    assert f"says {disagreeing} is" in str(refused.value)
    assert ran == []
