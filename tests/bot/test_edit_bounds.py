"""Edits stay within what the rule allows (`edit_bounds:`): the checker and its reasons, the
bounds kept with the review, and the real bot refusing an edit out of bounds on the API, in
the web inbox and in Slack, with nothing recorded but the refused attempt."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodbot.bot.config import load_config
from nodbot.bot.policy.bounds import edit_refusal, parse_bounds
from nodbot.bot.policy.rules import rules_executor
from nodbot.bot.serve import serving
from nodbot.core import MemoryApprovalStore, ToolCall, ToolRegistry
from tests.bot.test_slack import API, ROOT, TOKEN, Bot
from tests.bot.test_web_inbox import decide, text_of
from tests.fakes.slack import slack_fake

EXAMPLE = ROOT / "nodbot.example.yml"
ORIGINAL = {"order_id": "A-1001", "amount": 120.0}
BOUNDS = [{"gt": {"amount": 0}}, {"le": {"amount": {"original": "amount"}}}]
BELOW_ZERO = "amount must be more than 0; the edit asks for -5"
ABOVE_ORIGINAL = "amount must be at most the original amount (120.0); the edit asks for 500"


def refusal(edited: dict[str, Any], bounds: object = BOUNDS) -> str | None:
    return edit_refusal({"edit_bounds": bounds}, ORIGINAL, edited)


# --- the checker ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edited", "expected"),
    [
        ({"amount": -5}, BELOW_ZERO),
        ({"amount": 0}, "amount must be more than 0; the edit asks for 0"),
        ({"amount": 500}, ABOVE_ORIGINAL),
        ({"amount": 120.5}, ABOVE_ORIGINAL.replace("500", "120.5")),
        ({"amount": 100}, None),
        ({"amount": 120}, None),
        ({"amount": 0.01}, None),
        ({"order_id": "A-2"}, None),  # the amount is the call's: within its bounds
    ],
)
def test_an_edit_must_meet_every_bound(edited: dict[str, Any], expected: str | None) -> None:
    assert refusal(edited) == expected


@pytest.mark.parametrize(
    ("edited", "expected"),
    [
        ({"amount": "lots"}, 'the edit asks for "lots", which cannot be compared with it'),
        ({"amount": True}, "the edit asks for true, which cannot be compared with it"),
        ({"amount": None}, "the edit asks for null, which cannot be compared with it"),
        ({"amount": math.nan}, "the edit asks for NaN, which cannot be compared with it"),
        ({"amount": [1]}, "the edit asks for [1], which cannot be compared with it"),
    ],
)
def test_a_bound_that_cannot_be_tested_refuses_the_edit(
    edited: dict[str, Any], expected: str
) -> None:
    found = refusal(edited)
    assert found is not None and found.startswith("amount must be more than 0; ")
    assert found.endswith(expected)


def test_a_bound_on_an_argument_the_call_lacks_refuses() -> None:
    assert refusal({"amount": 1}, [{"le": {"amount": {"original": "total"}}}]) == (
        "amount is bounded by the original total, which this call does not have"
    )
    assert refusal({"amount": 1}, [{"gt": {"fee": 0}}]) == (
        "fee must be more than 0, and this call has no fee"
    )
    assert refusal({"amount": 1}, [{"matches": {"note": "^ok"}}]) == (
        "note must match '^ok', and this call has no note"
    )


def test_the_bound_names_what_the_call_has_when_the_edit_left_it() -> None:
    bounds = [{"eq": {"order_id": "A-1"}}]
    assert refusal({"amount": 1}, bounds) == (
        'order_id must be equal to "A-1"; the call has "A-1001"'
    )


def test_patterns_and_combinations() -> None:
    bounds = [
        {
            "any": [
                {"eq": {"order_id": {"original": "order_id"}}},
                {"matches": {"order_id": "^B-"}},
            ]
        },
        {"all": [{"ge": {"amount": 1}}, {"lt": {"amount": 100}}]},
    ]
    assert refusal({"order_id": "B-7", "amount": 5}, bounds) is None
    assert refusal({"amount": 5}, bounds) is None
    assert refusal({"order_id": "C-1", "amount": 5}, bounds) == (
        'the edit must meet one of: order_id must be equal to the original order_id ("A-1001"); '
        'the edit asks for "C-1"; or order_id must match \'^B-\'; the edit asks for "C-1"'
    )
    assert refusal({"amount": 100}, bounds) == "amount must be less than 100; the edit asks for 100"
    assert refusal({"amount": 0.5}, bounds) == "amount must be at least 1; the edit asks for 0.5"
    fields = [{"all_fields": {"order_id": "^A-", "note": "."}}]
    assert refusal({"order_id": "A-9", "note": ""}, fields) == (
        "note must match '.'; the edit asks for \"\""
    )
    any_field = [{"any_field": {"order_id": "^Z-", "note": "^ok$"}}]
    assert refusal({"note": "ok"}, any_field) is None
    assert refusal({"note": 3}, any_field) == (
        "the edit must meet one of: order_id must match '^Z-'; the call has \"A-1001\"; or note "
        "must match '^ok$'; the edit asks for 3, which is not a string"
    )


def test_a_policy_without_bounds_allows_every_edit() -> None:
    assert edit_refusal({}, ORIGINAL, {"amount": -1000}) is None
    assert edit_refusal({"edit_bounds": None}, ORIGINAL, {"amount": -1000}) is None


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("gt", "expected a list of bounds, not str"),
        ([{"below": {"amount": 0}}], "below: Extra inputs are not permitted"),
        ([{"gt": {"amount": 0}, "lt": {"amount": 1}}], "a predicate has exactly one key"),
        ([{"le": {"amount": {"original": 5}}}], "le: expected an argument name, not 5"),
    ],
)
def test_bounds_that_cannot_be_read_refuse_every_edit(stored: object, expected: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_bounds(stored)
    found = refusal({"amount": 1}, stored)
    assert found is not None
    assert found.startswith("the bounds of this call's edits cannot be read, so no edit is ")
    assert expected in found


def test_bounds_read_back_as_they_were_written() -> None:
    [positive, at_most] = parse_bounds(BOUNDS)
    assert (positive.name, at_most.name) == ("gt", "le")
    assert at_most.references() == {"amount"}
    assert [bound.to_json() for bound in (positive, at_most)] == BOUNDS


# --- the bounds are kept with the review ----------------------------------------------------


async def test_the_example_keeps_its_refund_bounds_with_the_review() -> None:
    registry = ToolRegistry()

    @registry.tool
    def refund(order_id: str, amount: float) -> str:
        return "refunded"

    store = MemoryApprovalStore()
    executor = rules_executor(registry, load_config(EXAMPLE), store)
    call = ToolCall(name="refund", arguments=ORIGINAL, id="c1")
    paused = await executor.run_call(call, executor.context("run_1"))
    assert paused.error is not None
    record = await store.get(paused.error.details["approval_id"])
    policy = record.request.policy
    assert (policy["rule"], policy["edit_bounds"]) == (1, BOUNDS)
    assert edit_refusal(policy, record.request.arguments, {"amount": 500}) == ABOVE_ORIGINAL
    assert edit_refusal(policy, record.request.arguments, {"amount": -5}) == BELOW_ZERO
    assert edit_refusal(policy, record.request.arguments, {"amount": 60}) is None


# --- the bot: every channel refuses an edit out of bounds -----------------------------------

CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
web: {{secret: web-secret-for-tests-0000}}
api:
  tokens:
    - {{name: api, token: {token}, scopes: [runs:write, runs:write-as, approvals:read]}}
    - {{name: {lead}, token: token-of-lead-000000, scopes: [approvals:read, approvals:decide]}}
agents:
  support: examples.support_agent:agent
slack:
  bot_token: {bot_token}
  signing_secret: {signing_secret}
  api_url: {api_url}
rules:
  - tool: refund
    description: Refunds need a lead, who may lower the amount.
    reviewers: [{lead}]
    editable: [amount]
    edit_bounds:
      - {{gt: {{amount: 0}}}}
      - {{le: {{amount: {{original: amount}}}}}}
"""
LEAD_API = {"Authorization": "Bearer token-of-lead-000000"}


@pytest.fixture
async def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bot]:
    """The bot serving the API, the inbox and Slack (a local fake), with the bounded rule."""
    monkeypatch.chdir(ROOT)  # where examples.support_agent is found
    async with contextlib.AsyncExitStack() as stack:
        slack = await stack.enter_async_context(slack_fake())
        people = [slack.add_user(name, email=f"{name}@example.com") for name in ("lead", "carol")]
        path = tmp_path / "nodbot.yml"
        path.write_text(
            CONFIG.format(
                db=tmp_path / "nodbot.db",
                token=TOKEN,
                lead=people[0].id,
                bot_token=slack.bot_token,
                signing_secret=slack.signing_secret,
                api_url=slack.api_url,
            )
        )
        served = await stack.enter_async_context(serving(str(path)))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=served.url))
        lead, carol = people
        yield Bot(served, slack, client, lead, lead, carol, carol)


async def refused_reasons(bot: Bot, approval_id: str) -> list[tuple[str | None, str | None, Any]]:
    events = await bot.served.service.store.events(approval_id)
    return [(e.actor, e.channel, e.detail.get("reason")) for e in events if e.kind == "refused"]


async def finished_amount(bot: Bot, approval_id: str) -> float:
    """The amount the refund ran with, once the run went on after the decision."""
    record = await bot.record(approval_id)
    run = (await bot.client.get(f"/runs/{record.request.run_id}?wait=10", headers=API)).json()
    assert run["status"] == "finished", run
    [result] = run["tool_results"]
    assert result["status"] == "ok", result
    return float(result["arguments"]["amount"])


async def test_the_api_refuses_an_edit_out_of_bounds_and_accepts_a_lowering(bot: Bot) -> None:
    approval_id = await bot.start()
    decide_url = f"/approvals/{approval_id}/decide"
    for amount, reason in ((-5, BELOW_ZERO), (500, ABOVE_ORIGINAL)):
        edit = {"action": "edit", "arguments": {"amount": amount}}
        answer = await bot.client.post(decide_url, json=edit, headers=LEAD_API)
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"] == reason
    assert (await bot.record(approval_id)).decision is None
    assert await refused_reasons(bot, approval_id) == [
        (bot.lead.id, "api", BELOW_ZERO),
        (bot.lead.id, "api", ABOVE_ORIGINAL),
    ]
    edit = {"action": "edit", "arguments": {"amount": 100}}
    accepted = await bot.client.post(decide_url, json=edit, headers=LEAD_API)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["decision"]["edited_args"] == {"amount": 100}
    assert await finished_amount(bot, approval_id) == 100.0


async def test_the_inbox_says_why_an_edit_out_of_bounds_is_refused(bot: Bot) -> None:
    approval_id = await bot.start()
    browser = await bot.client.get(bot.served.sign_in_link(bot.lead.id))
    assert browser.status_code == 303
    for amount, reason in (("-5", BELOW_ZERO), ("500", ABOVE_ORIGINAL)):
        page = await decide(bot.client, approval_id, "edit", **{"arg.amount": amount})
        assert page.status_code == 403, page.text
        assert f"The rule of this call refuses your decision: {reason}." in text_of(page)
        assert "Nothing was recorded." in text_of(page)
    assert (await bot.record(approval_id)).decision is None
    assert await refused_reasons(bot, approval_id) == [
        (bot.lead.id, "web", BELOW_ZERO),
        (bot.lead.id, "web", ABOVE_ORIGINAL),
    ]
    lowered = await decide(bot.client, approval_id, "edit", **{"arg.amount": "60"})
    assert lowered.status_code == 303, lowered.text
    assert await finished_amount(bot, approval_id) == 60.0


async def test_slack_answers_an_edit_out_of_bounds_in_the_modal(bot: Bot) -> None:
    approval_id = await bot.start()
    [message] = await bot.posted(bot.lead)
    await bot.click(message, "nodbot.edit", bot.lead)
    view = await bot.modal()
    for amount, reason in (("-5", BELOW_ZERO), ("500", ABOVE_ORIGINAL)):
        submitted = bot.slack.submit(view, bot.lead, {"arg.amount": {"value": amount}})
        answer = await bot.send(submitted)
        assert answer.json() == {"response_action": "errors", "errors": {"arg.amount": reason}}
    # The modal is answered once the refusal is recorded: read at once, not waited for.
    assert (await bot.record(approval_id)).decision is None
    assert await refused_reasons(bot, approval_id) == [
        (bot.lead.id, "slack", BELOW_ZERO),
        (bot.lead.id, "slack", ABOVE_ORIGINAL),
    ]
    submitted = bot.slack.submit(view, bot.lead, {"arg.amount": {"value": "100"}})
    accepted = await bot.send(submitted)
    assert accepted.status_code == 200 and not accepted.content
    record = await bot.record(approval_id)
    assert record.decision is not None and record.decision.edited_args == {"amount": 100}
    assert await finished_amount(bot, approval_id) == 100.0
