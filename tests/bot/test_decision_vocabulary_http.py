"""The seeds' forms of answer through `POST /approvals/{id}/decide` and through the Python
client's `decide`, against the API served by uvicorn on a real SQLite store.

Over HTTP a body says its decision in nodbot's form (`action`, with `arguments` or seed 003's
`edited_arguments`, and `reason` or `message`) or in LangChain's (`type`, `edited_action`,
`message`); the client takes every form `as_decision` takes. An edit naming another tool
and bodies of no known form are refused (422) and record nothing. A `respond` (`action` or
LangChain's `type`, with its answer as `message` or `reason`) is taken where the call's rule
lists it, and refused (403, the refusal recorded) where it does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nodbot.core import (
    ApprovalRequest,
    Decision,
    InvalidDecisionError,
    ToolCall,
    ToolContext,
    ToolDecision,
    arguments_digest,
)
from nodbot.core.client import ApprovalClient, ApprovalClientError, SyncApprovalClient
from tests.bot.test_http_approvals import SECRETS, Harness, served

ORDER = {"order_id": "o-7", "amount": 500.0}
EDITED = {"order_id": "o-7", "amount": 450.0}
LANGCHAIN_EDIT = {"type": "edit", "edited_action": {"name": "refund", "args": EDITED}}
OTHER_TOOL = {"type": "edit", "edited_action": {"name": "wire_money", "args": EDITED}}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with served("sqlite", tmp_path) as harness:
        yield harness


@pytest.fixture
async def client(api: Harness) -> AsyncIterator[ApprovalClient]:
    async with ApprovalClient(str(api.client.base_url), token=SECRETS["ana"]) as ana:
        yield ana


def view(approved: bool, edited_args: Any = None, reason: str | None = None) -> dict[str, Any]:
    """The decision as the API shows it, made by the token `ana`."""
    return {
        "approved": approved,
        "edited_args": edited_args,
        "reason": reason,
        "decided_by": "ana",
        "response": None,
    }


ANSWER = "Refunds are paused today; the order is queued."
ANSWERED = {**view(False), "response": ANSWER}
"""A respond as the API shows it."""


async def answerable(api: Harness, run_id: str) -> tuple[ToolCall, ToolContext, str]:
    """A refund call of a new run that waits for a review whose rule allows `respond`."""
    call = ToolCall(name="refund", arguments=ORDER, id="c1")
    asked = ApprovalRequest(
        run_id,
        call.id,
        "refund",
        ORDER,
        arguments_digest(ORDER),
        requested_by="carl",
        policy={"allowed_decisions": ["approve", "deny", "respond"]},
    )
    record = await api.store.create(asked)
    ctx = api.executor.context(run_id=run_id, requested_by="carl")
    waiting = await api.executor.run_call(call, ctx)  # the call takes its place in that review
    assert waiting.status == "pending" and waiting.error is not None
    assert waiting.error.details["approval_id"] == record.approval_id
    return call, ctx, record.approval_id


async def answered_with(api: Harness, call: ToolCall, ctx: ToolContext, text: str) -> None:
    """The call, resumed in its run, is answered with `text`; the tool did not run."""
    result = await api.executor.run_call(call, ctx)
    assert (result.status, result.value, result.arguments) == ("ok", text, None)
    assert api.refunds == []


async def untouched(api: Harness, approval_id: str, events: int) -> bool:
    """Whether the review is still pending with no event added."""
    record = await api.store.get(approval_id)
    return record.status == "pending" and len(await api.store.events(approval_id)) == events


async def resumed_as(
    api: Harness, call: ToolCall, ctx: ToolContext, decided: dict[str, Any]
) -> None:
    """The call, resumed in its run, ran (with the edit) or was denied as `decided` says."""
    result = await api.executor.run_call(call, ctx)
    if decided["approved"]:
        amount = (decided["edited_args"] or {}).get("amount", ORDER["amount"])
        assert (result.status, api.refunds) == ("ok", [("o-7", amount)])
    else:
        assert result.status == "error" and result.error is not None
        assert result.error.details.get("reason") == decided["reason"]
        assert api.refunds == []


# --- POST /approvals/{id}/decide ------------------------------------------------------------

BODIES = [
    pytest.param({"action": "approve"}, view(True), id="action-approve"),
    pytest.param(
        {"action": "edit", "arguments": {"amount": 450}},
        view(True, {"amount": 450}),
        id="action-edit",
    ),
    pytest.param(
        {"action": "edit", "edited_arguments": {"amount": 450}},
        view(True, {"amount": 450}),
        id="seed-003-edited_arguments",
    ),
    pytest.param(
        {"action": "edit", "arguments": {"amount": 450}, "edited_arguments": {"amount": 450}},
        view(True, {"amount": 450}),
        id="arguments-and-the-same-edited_arguments",
    ),
    pytest.param({"action": "deny", "reason": "no"}, view(False, reason="no"), id="deny-reason"),
    pytest.param({"action": "deny", "message": "no"}, view(False, reason="no"), id="deny-message"),
    pytest.param({"type": "approve"}, view(True), id="langchain-approve"),
    pytest.param(LANGCHAIN_EDIT, view(True, EDITED), id="langchain-edit"),
    pytest.param({"type": "reject"}, view(False), id="langchain-reject"),
    pytest.param(
        {"type": "reject", "message": "User rejected this action."},
        view(False, reason="User rejected this action."),
        id="langchain-reject-message",
    ),
]


@pytest.mark.parametrize(("body", "decided"), BODIES)
async def test_each_form_over_http_is_recorded_as_its_decision(
    api: Harness, body: dict[str, Any], decided: dict[str, Any]
) -> None:
    call, ctx, approval_id = await api.pending("run_a")

    response = await api.decide(approval_id, "ana", **body)

    assert response.status_code == 200, response.text
    assert response.json()["decision"] == decided
    await resumed_as(api, call, ctx, decided)


REFUSED = [
    pytest.param(OTHER_TOOL, "edited_action.name", id="edit-of-another-tool"),
    pytest.param({"type": "respond"}, "message", id="respond-without-answer"),
    pytest.param({"action": "respond", "message": "  "}, "message", id="respond-blank"),
    pytest.param({"action": "respond", "reason": "x" * 2_001}, "reason", id="respond-too-long"),
    pytest.param(
        {"action": "edit", "arguments": {"amount": 1}, "edited_arguments": {"amount": 2}},
        "edited_arguments",
        id="arguments-and-other-edited_arguments",
    ),
    pytest.param(
        {"action": "deny", "reason": "a", "message": "b"}, "message", id="reason-and-other-message"
    ),
    pytest.param({"decision": "yes"}, "decision", id="decision-yes"),
    pytest.param({}, "(body)", id="empty"),
    pytest.param({"action": "approve", "type": "approve"}, "(body)", id="two-forms"),
    pytest.param({"type": "edit"}, "edited_action", id="langchain-edit-without-edited_action"),
    pytest.param(
        {"type": "approve", "arguments": {"amount": 1}}, "arguments", id="langchain-with-arguments"
    ),
    pytest.param(
        {"action": "edit", "edited_action": {"name": "refund", "args": EDITED}},
        "edited_action",
        id="action-with-edited_action",
    ),
    pytest.param({"action": "edit"}, "arguments", id="edit-without-arguments"),
]


@pytest.mark.parametrize(("body", "field"), REFUSED)
async def test_a_refused_form_over_http_is_422_naming_the_field_and_records_nothing(
    api: Harness, body: dict[str, Any], field: str
) -> None:
    _, _, approval_id = await api.pending("run_a")
    events = len(await api.store.events(approval_id))

    response = await api.decide(approval_id, "ana", **body)

    assert response.status_code == 422, response.text
    assert field in [e["field"] for e in response.json()["details"]["errors"]]
    assert await untouched(api, approval_id, events)


RESPONDS = [
    pytest.param({"type": "respond", "message": ANSWER}, id="langchain-respond"),
    pytest.param({"action": "respond", "message": ANSWER}, id="action-respond-message"),
    pytest.param({"action": "respond", "reason": ANSWER}, id="action-respond-reason"),
]


@pytest.mark.parametrize("body", RESPONDS)
async def test_a_respond_over_http_answers_in_the_tools_place_where_the_rule_allows_it(
    api: Harness, body: dict[str, Any]
) -> None:
    call, ctx, approval_id = await answerable(api, "run_a")

    response = await api.decide(approval_id, "ana", **body)

    assert response.status_code == 200, response.text
    assert response.json()["decision"] == ANSWERED
    assert response.json()["status"] == "denied"  # nothing ran
    await answered_with(api, call, ctx, ANSWER)


async def test_a_respond_is_refused_where_the_rule_does_not_list_it(api: Harness) -> None:
    """A review made without a rule (no `allowed_decisions`) refuses it too: a rule must
    allow it."""
    _, _, approval_id = await api.pending("run_a")

    response = await api.decide(approval_id, "ana", type="respond", message=ANSWER)

    assert response.status_code == 403, response.text
    assert "may not be decided with 'respond'" in response.json()["error"]
    record = await api.store.get(approval_id)
    assert record.status == "pending"
    [refused] = [e for e in await api.store.events(approval_id) if e.kind == "refused"]
    assert refused.actor == "ana" and "'respond'" in refused.detail["reason"]


async def test_an_edit_of_another_tool_says_which_tools(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")

    response = await api.decide(approval_id, "ana", **OTHER_TOOL)

    [error] = response.json()["details"]["errors"]
    assert "'wire_money'" in error["message"] and "'refund'" in error["message"]


async def test_remember_counts_a_langchain_approve_as_an_approve(api: Harness) -> None:
    _, _, approval_id = await api.pending("run_a")

    # No rule of this API remembers: an approve is refused for that, a reject for being one.
    approve = await api.decide(approval_id, "ana", type="approve", remember=True)
    reject = await api.decide(approval_id, "ana", type="reject", remember=True)

    assert approve.status_code == reject.status_code == 422
    assert "only an approve" not in approve.json()["error"]
    assert reject.json()["error"] == "only an approve is remembered"
    assert (await api.store.get(approval_id)).status == "pending"


async def test_the_openapi_document_describes_both_forms(api: Harness) -> None:
    schemas = (await api.client.get("/openapi.json")).json()["components"]["schemas"]

    body = schemas["DecideBody"]["properties"]
    assert {"action", "type", "arguments", "edited_arguments", "edited_action"} <= set(body)
    assert {"reason", "message", "remember"} <= set(body)
    assert set(schemas["EditedAction"]["properties"]) == {"name", "args"}


# --- the client -----------------------------------------------------------------------------

ANSWERS = [
    pytest.param(True, view(True), id="True"),
    pytest.param(False, view(False), id="False"),
    pytest.param(None, view(False), id="None"),
    pytest.param(ToolDecision(action="approve"), view(True), id="ToolDecision-approve"),
    pytest.param(
        ToolDecision(action="edit", arguments={"amount": 450.0}),
        view(True, {"amount": 450.0}),
        id="ToolDecision-edit",
    ),
    pytest.param(
        ToolDecision(action="deny", message="too much"),
        view(False, reason="too much"),
        id="ToolDecision-deny",
    ),
    pytest.param(
        Decision(approved=True, edited_args={"amount": 450.0}, reason="checked"),
        view(True, {"amount": 450.0}, "checked"),
        id="Decision",
    ),
    pytest.param({"approved": False, "reason": "policy"}, view(False, reason="policy"), id="dict"),
    pytest.param(
        {"action": "edit", "edited_arguments": {"amount": 450.0}},
        view(True, {"amount": 450.0}),
        id="edited_arguments",
    ),
    pytest.param({"type": "approve"}, view(True), id="langchain-approve"),
    pytest.param(LANGCHAIN_EDIT, view(True, EDITED), id="langchain-edit"),
    pytest.param(
        {"type": "reject", "message": "User rejected this action."},
        view(False, reason="User rejected this action."),
        id="langchain-reject",
    ),
]


@pytest.mark.parametrize(("answer", "decided"), ANSWERS)
async def test_each_form_through_the_client_is_recorded_as_its_decision(
    api: Harness, client: ApprovalClient, answer: object, decided: dict[str, Any]
) -> None:
    call, ctx, approval_id = await api.pending("run_a")

    approval = await client.decide(approval_id, answer)

    assert approval.status == ("approved" if decided["approved"] else "denied")
    assert (approval.decided_by, approval.reason) == ("ana", decided["reason"])
    record = await api.store.get(approval_id)
    assert record.decision == Decision(**decided)
    await resumed_as(api, call, ctx, decided)


CLIENT_RESPONDS = [
    pytest.param({"type": "respond", "message": ANSWER}, id="langchain-respond"),
    pytest.param({"action": "respond", "message": ANSWER}, id="action-respond"),
    pytest.param(ToolDecision(action="respond", message=ANSWER), id="ToolDecision-respond"),
    pytest.param(Decision(approved=False, response=ANSWER), id="Decision-respond"),
]


@pytest.mark.parametrize("answer", CLIENT_RESPONDS)
async def test_a_respond_through_the_client_answers_in_the_tools_place(
    api: Harness, client: ApprovalClient, answer: object
) -> None:
    call, ctx, approval_id = await answerable(api, "run_a")

    approval = await client.decide(approval_id, answer)

    assert (approval.status, approval.response, approval.decided_by) == ("denied", ANSWER, "ana")
    assert (await client.get(approval_id)).response == ANSWER
    await answered_with(api, call, ctx, ANSWER)


NOT_SENT = [
    pytest.param({"decision": "yes"}, "(decision)", id="decision-yes"),
    pytest.param("yes", "(decision)", id="'yes'"),
    pytest.param(1, "(decision)", id="1"),
    pytest.param({"type": "respond"}, "message", id="respond-without-answer"),
    pytest.param(
        Decision(approved=False, response="it is Tuesday", reason="why"),
        "reason",
        id="respond-with-a-reason-too",
    ),
    pytest.param(Decision(approved=True, decided_by="bob"), "decided_by", id="decided_by"),
    pytest.param({"approved": True, "decided_by": "bob"}, "decided_by", id="decided_by-dict"),
]


@pytest.mark.parametrize(("answer", "field"), NOT_SENT)
async def test_the_client_refuses_an_answer_it_cannot_send_and_records_nothing(
    api: Harness, client: ApprovalClient, answer: object, field: str
) -> None:
    _, _, approval_id = await api.pending("run_a")
    events = len(await api.store.events(approval_id))

    with pytest.raises(InvalidDecisionError) as caught:
        await client.decide(approval_id, answer)

    assert field in [e["field"] for e in caught.value.errors]
    assert await untouched(api, approval_id, events)


async def test_the_bot_refuses_a_client_edit_of_another_tool(
    api: Harness, client: ApprovalClient
) -> None:
    _, _, approval_id = await api.pending("run_a")
    events = len(await api.store.events(approval_id))

    with pytest.raises(ApprovalClientError) as caught:
        await client.decide(approval_id, OTHER_TOOL)

    assert caught.value.status == 422
    assert [e["field"] for e in caught.value.details()["errors"]] == ["edited_action.name"]
    assert await untouched(api, approval_id, events)


async def test_the_sync_client_decides_in_every_form_too(api: Harness) -> None:
    ids = [(await api.pending(f"run_{n}"))[2] for n in range(3)]

    def decide_all() -> list[str]:
        with SyncApprovalClient(str(api.client.base_url), token=SECRETS["ana"]) as ana:
            made = [
                ana.decide(ids[0], {"type": "reject", "message": "no"}),
                ana.decide(ids[1], LANGCHAIN_EDIT),
                ana.decide(ids[2], True),
            ]
            with pytest.raises(InvalidDecisionError):
                ana.decide(ids[0], {"decision": "yes"})
            return [approval.status for approval in made]

    # In a thread: the served API answers on this event loop meanwhile.
    assert await asyncio.to_thread(decide_all) == ["denied", "approved", "approved"]
    edited = (await api.store.get(ids[1])).decision
    assert edited is not None and edited.edited_args == EDITED
