"""Rules judge the arguments the tool will run with, and fail closed by their outcome: under a
`decision: approve` rule with `when: {le: {amount: 100}}`, a model that writes the amount as
a string, a list, an object, null, or leaves it out never gets its call approved by the rule,
on every path a call reaches the rules by: the bot's own agents (`nodbot serve`), a hosted
pydantic-ai agent, the MCP gateway and `POST /approvals` (with the caller's schema, with a
tool of the bot's own, and with neither). The call goes on to the next rule (a review here),
and the tool does not run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nodbot.bot.serve import Served, serving
from nodbot.core import Agent, AssistantMessage, ChatResponse, Message, ToolCall, ToolRegistry
from nodbot.core.bridges.pydantic_ai import HostedPydanticAI
from nodbot.core.tools import ToolSpec
from tests.bot.test_mcp_gateway import WITHIN, gateway, runs, text
from tests.bridges.support import REVIEWER, bridged_bot, hosted_bot, review_rule

ROOT = Path(__file__).resolve().parents[2]
MISSING = object()
"""The argument left out of the call."""
UNJUDGEABLE: dict[str, object] = {
    "string": "5000",
    "list": [5000],
    "object": {"value": 5000},
    "null": None,
    "missing": MISSING,
}
"""What a model wrote for `amount` where a number was meant."""

APPROVE_SMALL = """  - tool: {tool}
    when: {{le: {{amount: 100}}}}
    decision: approve"""


def rules_for(tool: str) -> list[str]:
    """The small calls of `tool` approved at once; the rest reviewed."""
    return [APPROVE_SMALL.format(tool=tool), review_rule(tool)]


def with_amount(amount: object, **others: Any) -> dict[str, Any]:
    """The call's arguments, `amount` written as `amount` (left out for MISSING)."""
    return others if amount is MISSING else {**others, "amount": amount}


# --- the bot's own agent, served as `nodbot serve` serves it ---------------------------------

own_tools = ToolRegistry()
refunded: list[dict[str, Any]] = []
"""Every real run of the bot's own refund and send_email tools."""


@own_tools.tool(effects="destructive")
def refund(order_id: str, amount: float | None = None) -> str:
    """Refund an amount on an order; without one, the whole order."""
    refunded.append({"order_id": order_id, "amount": amount})
    return f"refunded {amount if amount is not None else 'everything'} on {order_id}"


@own_tools.tool(effects="destructive")
def send_email(subject: str, to: str | None = None) -> str:
    """Email one address; without one, every customer."""
    refunded.append({"subject": subject, "to": to})
    return f"sent to {to or 'every customer'}"


class CallsWhatItIsTold:
    """Calls the tool its input names with the arguments its input gives (`tool` and
    `arguments` as JSON), then says done."""

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        if any(isinstance(message, AssistantMessage) for message in messages):
            return ChatResponse(content="done")
        told = json.loads(str(messages[-1].content))
        call = ToolCall.model_construct(
            id="call_1", name=told["tool"], arguments=told["arguments"]
        )  # as a model wrote it: not validated here (the executor does)
        return ChatResponse(tool_calls=[call])


own_agent = Agent(CallsWhatItIsTold(), own_tools)

OWN_CONFIG = """
store: {{url: "sqlite:///{db}"}}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.1}}
api:
  tokens:
    - {{name: starter, token: token-of-the-starter-00000000000, scopes: [runs:write]}}
    - {{name: agent, token: token-of-the-agent-0000000000000, scopes: [approvals:request]}}
    - {{name: {reviewer}, token: token-of-the-lead-00000000000,
        scopes: [approvals:read, approvals:decide]}}
agents:
  shop: tests.bot.test_rules_judge_validated:own_agent
external_tools: [payout]
rules:
{rules}
  - tool: send_email
    when: {{matches: {{to: '@example\\.com$'}}}}
    decision: approve
  - tool: send_email
    reviewers: [{reviewer}]
"""
STARTER = {"Authorization": "Bearer token-of-the-starter-00000000000"}
AGENT = {"Authorization": "Bearer token-of-the-agent-0000000000000"}


@pytest.fixture
async def own_bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.chdir(ROOT)
    refunded.clear()
    path = tmp_path / "nodbot.yml"
    rules = "\n".join([*rules_for("refund"), *rules_for("payout")])
    path.write_text(OWN_CONFIG.format(db=tmp_path / "nodbot.db", reviewer=REVIEWER, rules=rules))
    async with serving(str(path)) as served:
        yield served


async def start(bot: Served, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=bot.url, timeout=30) as http:
        text = json.dumps({"tool": tool, "arguments": arguments})
        answer = await http.post("/runs", json={"agent": "shop", "input": text}, headers=STARTER)
    assert answer.status_code == 201, answer.text
    run: dict[str, Any] = answer.json()
    return run


@pytest.mark.parametrize("amount", ["5000", None, MISSING], ids=["string", "null", "missing"])
async def test_the_bots_own_agent_gets_a_review_not_the_approve_rule(
    own_bot: Served, amount: object
) -> None:
    """The tool's model coerces "5000" to 5000.0 (over the limit) and fills a left-out
    amount with its default, None, which the rule cannot judge: each goes to review."""
    run = await start(own_bot, "refund", with_amount(amount, order_id="o-7"))
    assert run["status"] == "waiting", run
    [pending] = run["pending"]
    assert pending["tool"] == "refund"
    assert refunded == []


@pytest.mark.parametrize("amount", [[5000], {"value": 5000}], ids=["list", "object"])
async def test_the_bots_own_agent_cannot_run_what_its_tool_refuses(
    own_bot: Served, amount: object
) -> None:
    run = await start(own_bot, "refund", with_amount(amount, order_id="o-7"))
    assert run["status"] == "finished", run  # the model was told the arguments are invalid
    assert run["pending"] == []
    assert refunded == []


async def test_an_email_without_its_address_is_not_approved_as_one_to_example_com(
    own_bot: Served,
) -> None:
    run = await start(own_bot, "send_email", {"subject": "Sale!"})
    assert run["status"] == "waiting", run
    assert refunded == []


async def test_a_judged_small_amount_is_still_approved_by_the_rule(own_bot: Served) -> None:
    """The positive case: "50" is 50.0 to the tool's model, within the rule."""
    run = await start(own_bot, "refund", {"order_id": "o-7", "amount": "50"})
    assert run["status"] == "finished", run
    assert refunded == [{"order_id": "o-7", "amount": 50.0}]


# --- POST /approvals -----------------------------------------------------------------------

PAYOUT_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id"],
}


async def ask(
    bot: Served, tool: str, arguments: dict[str, Any], schema: dict[str, Any] | None
) -> httpx.Response:
    body: dict[str, Any] = {
        "tool": tool,
        "arguments": arguments,
        "run_id": "thread-1",
        "call_id": "call_1",
    }
    if schema is not None:
        body["schema"] = schema
    async with httpx.AsyncClient(base_url=bot.url, timeout=30) as http:
        return await http.post("/approvals", json=body, headers=AGENT)


@pytest.mark.parametrize("amount", list(UNJUDGEABLE.values()), ids=list(UNJUDGEABLE))
@pytest.mark.parametrize("schema", [PAYOUT_SCHEMA, None], ids=["schema", "no-schema"])
async def test_an_external_call_is_reviewed_not_approved(
    own_bot: Served, amount: object, schema: dict[str, Any] | None
) -> None:
    answer = await ask(own_bot, "payout", with_amount(amount, order_id="o-7"), schema)
    assert answer.status_code == 201, answer.text
    assert answer.json()["status"] == "pending"


@pytest.mark.parametrize("amount", ["5000", None, MISSING], ids=["string", "null", "missing"])
async def test_a_call_of_the_bots_own_tool_asked_over_the_api_is_judged_by_its_model(
    own_bot: Served, amount: object
) -> None:
    answer = await ask(own_bot, "refund", with_amount(amount, order_id="o-7"), None)
    assert answer.status_code == 201, answer.text
    approval = answer.json()
    assert approval["status"] == "pending"
    assert approval["arguments"] == with_amount(amount, order_id="o-7")  # kept as asked


@pytest.mark.parametrize("amount", [[5000], {"value": 5000}], ids=["list", "object"])
async def test_a_call_its_tool_refuses_is_refused_over_the_api(
    own_bot: Served, amount: object
) -> None:
    answer = await ask(own_bot, "refund", {"order_id": "o-7", "amount": amount}, None)
    assert answer.status_code == 422, answer.text


async def test_a_small_external_amount_is_still_approved(own_bot: Served) -> None:
    answer = await ask(own_bot, "payout", {"order_id": "o-7", "amount": 50}, PAYOUT_SCHEMA)
    assert answer.status_code == 201 and answer.json()["status"] == "approved"


# --- a hosted pydantic-ai agent ----------------------------------------------------------------

hosted_refunds: list[dict[str, Any]] = []
"""Every real run of the hosted agent's refund tool."""


def _calls_what_it_is_told(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The first response calls refund with the arguments the prompt gives (JSON); the next
    ones answer."""
    if any(isinstance(message, ModelResponse) for message in messages):
        return ModelResponse(parts=[TextPart("done")])
    [prompt] = [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]
    arguments = json.loads(str(prompt))
    return ModelResponse(parts=[ToolCallPart("refund", arguments, tool_call_id="call_1")])


def hosted_shop() -> HostedPydanticAI:
    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(_calls_what_it_is_told))

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, amount: float | None = None) -> str:
        """Refund an amount on an order; without one, the whole order."""
        hosted_refunds.append({"order_id": order_id, "amount": amount})
        return f"refunded {amount} on {order_id}"

    return HostedPydanticAI(agent)


@pytest.mark.parametrize("amount", list(UNJUDGEABLE.values()), ids=list(UNJUDGEABLE))
async def test_a_hosted_pydantic_ai_agent_gets_a_review_not_the_approve_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, amount: object
) -> None:
    """pydantic-ai defers the call with the arguments as the model wrote them; the bot
    judges them by the tool's schema. A list or an object pydantic-ai refuses itself (the
    model is told, and answers): no review, and nothing runs either way."""
    monkeypatch.chdir(ROOT)
    hosted_refunds.clear()
    agents = {"shop": "tests.bot.test_rules_judge_validated:hosted_shop"}
    async with hosted_bot(tmp_path, agents, ["refund"], rules_for("refund")) as bot:
        run = await bot.start("shop", json.dumps(with_amount(amount, order_id="o-7")))
        if isinstance(amount, (list, dict)):
            assert (run["status"], run["pending"]) == ("finished", []), run
        else:
            assert run["status"] == "waiting", run
            [pending] = run["pending"]
            assert pending["status"] == "pending"
        assert hosted_refunds == []


async def test_a_hosted_agents_small_amount_is_still_approved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    hosted_refunds.clear()
    agents = {"shop": "tests.bot.test_rules_judge_validated:hosted_shop"}
    async with hosted_bot(tmp_path, agents, ["refund"], rules_for("refund")) as bot:
        run = await bot.start("shop", json.dumps({"order_id": "o-7", "amount": 50}))
        done = await bot.finished(run["run_id"])
        assert done["status"] == "finished", done
        assert hosted_refunds == [{"order_id": "o-7", "amount": 50.0}]


# --- the MCP gateway -----------------------------------------------------------------------------


async def test_the_mcp_gateway_gets_a_review_not_the_approve_rule(tmp_path: Path) -> None:
    """Through `nodbot mcp` in front of an upstream whose `refund(order_id: str, amount:
    float)` would coerce "5000" and pay it: every unjudgeable amount opens a review, which
    the reviewer denies; nothing runs upstream. A small amount still runs at once."""
    async with (
        bridged_bot(tmp_path, ["refund"], rules_for("refund")) as bot,
        gateway(tmp_path, bot, "--timeout", str(WITHIN)) as session,
    ):
        for number, amount in enumerate(UNJUDGEABLE.values(), start=1):
            call = asyncio.create_task(
                session.call_tool("refund", with_amount(amount, order_id="o-7"))
            )
            reviews = await bot.when_pending(1)
            assert [review["arguments"] for review in reviews] == [
                with_amount(amount, order_id="o-7")
            ], number
            await bot.decide(reviews[0]["approval_id"], "deny", reason="not like this")
            result = await asyncio.wait_for(call, WITHIN)
            assert result.is_error and "not like this" in text(result)
            assert runs(tmp_path) == []
        small = await asyncio.wait_for(
            session.call_tool("refund", {"order_id": "o-7", "amount": 50}), WITHIN
        )
        assert not small.is_error, text(small)
        assert runs(tmp_path) == [{"order_id": "o-7", "amount": 50.0}]
