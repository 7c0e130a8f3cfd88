"""Rules fail closed by their outcome (`bot.policy.RulesPort`): a `when` that cannot judge a
call makes a review or deny rule match and an approve rule not match (the call goes on to the
next rule, `defaults:` or a review), and lets no remembered approval decide it; arguments that
fail validation are approved by no rule, even one without `when`. And a property: for random
JSON values of every argument the rules' predicates read, no approve rule ever approves a call
the tool's model rejects, or coerces to a value outside the rule, on every way a call reaches
the rules (the executor, a call of the bot's own tool asked from outside, a call checked by its
caller's schema)."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.config import Config, load_config
from nodbot.bot.policy.remember import remember_decision
from nodbot.bot.policy.rules import RulesPort, rules_executor
from nodbot.core import (
    ApprovalRequest,
    Decision,
    InvalidArgumentsError,
    MemoryApprovalStore,
    ToolCall,
    ToolRegistry,
    arguments_digest,
)
from tests.bot.test_defaults_policy import check_config

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(
    order_id: str, amount: float | None = None, currency: str = "EUR", vip: bool = False
) -> str:
    """Refund an amount of an order; without one, the whole order."""
    return "refunded"


REFUND = tools.get("refund")

RULES = r"""
external_tools: [payout]
rules:
  - tool: refund
    when: {le: {amount: 100}}
    decision: approve
  - tool: refund
    when: {all: [{le: {amount: 500}}, {eq: {currency: EUR}}, {matches: {order_id: '^o-\d+$'}}]}
    decision: approve
  - tool: refund
    when: {any: [{eq: {vip: true}}, {lt: {amount: 1}}]}
    decision: approve
  - tool: refund
    when: {gt: {amount: 100000}}
    decision: deny
  - tool: refund
    reviewers: [lead@example.com]
  - tool: payout
    decision: approve
  - tool: payout
    reviewers: [lead@example.com]
"""


def oracle(rule: int, values: Mapping[str, Any]) -> bool:
    """Whether approve rule `rule` holds for the values the tool runs with, written out in
    plain Python (not with the rules' predicates)."""
    amount = values["amount"]
    number = isinstance(amount, (int, float)) and not isinstance(amount, bool)
    if rule == 0:
        return number and amount <= 100
    if rule == 1:
        order = values["order_id"]
        return (
            number
            and amount <= 500
            and values["currency"] == "EUR"
            and isinstance(order, str)
            and re.search(r"^o-\d+$", order) is not None
        )
    if rule == 2:
        return values["vip"] is True or (number and amount < 1)
    raise AssertionError(f"rule {rule} does not approve")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    path = tmp_path_factory.mktemp("rules") / "nodbot.yml"
    path.write_text(RULES)
    return load_config(path)


def request(tool: str, arguments: dict[str, Any], **policy: Any) -> ApprovalRequest:
    return ApprovalRequest(
        run_id="run_1",
        call_id="call_1",
        tool=tool,
        arguments=arguments,
        digest=arguments_digest(arguments),
        requested_by="agent",
        policy=policy,
    )


async def ruled(
    config: Config, tool: str, arguments: dict[str, Any], **policy: Any
) -> Decision | None:
    """What the rules decide at once of a call asked from outside (None: a review)."""
    port = RulesPort(config, MemoryApprovalStore(), registry=tools)
    return (await port.rule(request(tool, arguments, **policy))).decision


# --- fail closed by the outcome ---------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        {"order_id": "o-1"},  # amount defaults to None: no rule can compare it
        {"order_id": "o-1", "amount": None},
        {"order_id": "x-1", "amount": None, "vip": False},
    ],
)
async def test_an_approve_rule_that_cannot_judge_passes_the_call_on(
    config: Config, arguments: dict[str, Any]
) -> None:
    """None of the three approve rules can judge the amount: the call goes on to the next
    rule, a deny rule that cannot judge it either, and so denies it."""
    decision = await ruled(config, "refund", arguments)
    assert decision is not None and not decision.approved
    assert decision.decided_by == "nodbot:rules.3"


@pytest.mark.parametrize(
    ("outcome", "approved"), [("decision: deny", False), ("reviewers: [lead@example.com]", None)]
)
async def test_a_deny_or_review_rule_that_cannot_judge_takes_the_call(
    tmp_path: Path, outcome: str, approved: bool | None
) -> None:
    """The first rule cannot judge a call without an amount: it takes it, denied or
    reviewed, and the approve rule after it never sees it."""
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "rules:\n"
        f"  - {{tool: refund, when: {{gt: {{amount: 1000}}}}, {outcome}}}\n"
        "  - {tool: refund, decision: approve}\n"
    )
    decision = await ruled(load_config(path), "refund", {"order_id": "o-1"})
    if approved is None:
        assert decision is None
    else:
        assert decision is not None and decision.approved is approved
        assert decision.decided_by == "nodbot:rules.0"


async def test_with_no_rule_left_an_approve_rule_passes_the_call_to_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "external_tools: [payout]\n"
        "rules:\n"
        "  - {tool: payout, when: {le: {amount: 100}}, decision: approve}\n"
        "defaults: {reviewers: [lead@example.com]}\n"
    )
    port = RulesPort(load_config(path), MemoryApprovalStore())
    outcome = await port.rule(request("payout", {"amount": "50"}))
    assert outcome.decision is None
    assert outcome.request.policy["rule"] == "defaults"


async def test_arguments_that_break_the_callers_schema_are_approved_by_no_rule(
    config: Config,
) -> None:
    """`payout`'s first rule approves every call, without `when`: not one whose arguments
    break the schema its caller sent."""
    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    assert await ruled(config, "payout", {"amount": "5000"}, schema=schema) is None
    decision = await ruled(config, "payout", {"amount": 5000}, schema=schema)
    assert decision is not None and decision.approved


async def test_the_callers_schema_fills_defaults_in_before_the_rules_judge(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "external_tools: [payout]\n"
        "rules:\n"
        "  - {tool: payout, when: {eq: {dry_run: true}}, decision: approve}\n"
        "  - {tool: payout, reviewers: [lead@example.com]}\n"
    )
    schema = {
        "type": "object",
        "properties": {"dry_run": {"type": "boolean", "default": True}},
    }
    config = load_config(path)
    decision = await ruled(config, "payout", {}, schema=schema)
    assert decision is not None and decision.approved
    assert await ruled(config, "payout", {"dry_run": False}, schema=schema) is None


async def test_a_remembered_approval_does_not_decide_a_call_its_rule_cannot_judge(
    tmp_path: Path,
) -> None:
    """The remember rule holds a call without an amount only by failing closed: it is
    reviewed again though the very same call was approved and remembered. A call the rule
    judges (an amount within it) is decided by its remembered approval."""
    path = tmp_path / "nodbot.yml"
    path.write_text(
        "rules:\n"
        "  - {tool: refund, when: {le: {amount: 100}}, reviewers: [lead@example.com],"
        " remember: 1d}\n"
    )
    store = MemoryApprovalStore()
    executor = rules_executor(tools, load_config(path), store)
    ctx = executor.context("run_1", requested_by="ana")

    async def remembered(call_id: str, arguments: dict[str, Any]) -> str:
        """Call, approve and remember; then the same call again: its status."""
        first = await executor.run_call(
            ToolCall(name="refund", arguments=arguments, id=call_id), ctx
        )
        assert first.status == "pending"
        [record] = await store.list(status="pending")
        decided = await store.decide(
            record.approval_id, Decision(approved=True, decided_by="lead@example.com")
        )
        await remember_decision(store, decided, person="email:lead@example.com")
        again = ToolCall(name="refund", arguments=arguments, id=f"{call_id}-again")
        return (await executor.run_call(again, ctx)).status

    assert await remembered("call_1", {"order_id": "o-1", "amount": 50}) == "ok"
    assert await remembered("call_2", {"order_id": "o-2"}) == "pending"


# --- the property ----------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["5000", "50", "0.5", "EUR", "o-12", "o-1\n", "true", "1e3", ""]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
MISSING = object()
"""An argument left out of the call."""


def argument(typical: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Values of one argument: often of the kind the tool takes (so that many calls pass
    its model and reach the approve rules), else any JSON value, or left out."""
    return typical | JSON | st.just(MISSING)


CALLS = st.fixed_dictionaries(
    {
        "order_id": argument(st.sampled_from(["o-1", "o-12", "x-9", "o-1\n", "o-"])),
        "amount": argument(
            st.none() | st.integers(-10, 10**6) | st.floats(-10, 10**6) | st.just("50")
        ),
        "currency": argument(st.sampled_from(["EUR", "USD", "eur"])),
        "vip": argument(st.booleans() | st.sampled_from(["true", 1, 0])),
    }
).map(lambda drawn: {name: value for name, value in drawn.items() if value is not MISSING})


async def through_the_executor(config: Config, arguments: dict[str, Any]) -> Decision | None:
    """The bot's own agent's path: what the executor ran the call under, None when it did
    not run it at once."""
    store = MemoryApprovalStore()
    executor = rules_executor(tools, config, store)
    result = await executor.run_call(
        ToolCall.model_construct(name="refund", arguments=arguments, id="call_1"),
        executor.context("run_1", requested_by="ana"),
    )
    if result.status != "ok":
        return None
    records = await store.list()
    assert records == []  # a rule's approval opens no review
    return Decision(approved=True, decided_by=_approving_rule(config, result.arguments or {}))


def _approving_rule(config: Config, canonical: dict[str, Any]) -> str:
    found = config.first_matching_rule("refund", canonical)
    assert found is not None and found.decision == "approve"
    return f"nodbot:rules.{config.rules.index(found)}"


async def asked_of_the_bots_tool(config: Config, arguments: dict[str, Any]) -> Decision | None:
    """`POST /approvals` for a tool of the bot's own, before its 422 check."""
    return await ruled(config, "refund", arguments)


async def asked_with_a_schema(config: Config, arguments: dict[str, Any]) -> Decision | None:
    """`POST /approvals`, a hosted agent or the MCP gateway: a tool the bot does not have,
    with its caller's JSON schema of the arguments (the tool's model's own)."""
    port = RulesPort(config, MemoryApprovalStore(), registry=ToolRegistry())
    schema = REFUND.model.model_json_schema(by_alias=True)
    return (await port.rule(request("refund", arguments, schema=schema))).decision


@pytest.mark.parametrize(
    "path", [through_the_executor, asked_of_the_bots_tool, asked_with_a_schema]
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=CALLS)
def test_no_approve_rule_approves_what_the_tools_model_rejects_or_coerces_outside_it(
    config: Config, path: Callable[..., Any], arguments: dict[str, Any]
) -> None:
    decision = asyncio.run(path(config, arguments))
    if decision is None or not decision.approved:
        return
    assert decision.decided_by is not None and decision.decided_by.startswith("nodbot:rules.")
    rule = int(decision.decided_by.rsplit(".", 1)[1])
    try:
        values = REFUND.validate(arguments).values  # what the tool would run with
    except InvalidArgumentsError as exc:
        pytest.fail(f"rule {rule} approved arguments the tool refuses: {arguments!r}: {exc}")
    assert oracle(rule, values), f"rule {rule} approved {arguments!r}, run as {values!r}"
    amount = values["amount"]
    assert amount is None or math.isfinite(amount)


# --- nodbot check-config ----------------------------------------------------------------------

OPTIONAL_MODULE = '''
from nodbot.core import Agent, ScriptedChat, ToolRegistry

tools = ToolRegistry()


@tools.tool(effects="destructive")
def refund(order_id: str, amount: float | None = None) -> str:
    """Refund an amount of an order; without one, the whole order."""
    return "refunded"


agent = Agent(ScriptedChat(["done"]), tools)
'''


def test_check_config_warns_of_an_approve_rule_on_an_argument_the_tool_may_omit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "optional_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{module}.py").write_text(OPTIONAL_MODULE)
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"agents:\n  shop: {module}:agent\n"
        "rules:\n"
        "  - tool: refund\n"
        "    when: {all: [{le: {amount: 100}}, {matches: {order_id: '^o-'}}]}\n"
        "    decision: approve\n"
        "  - tool: refund\n"
        "    when: {gt: {amount: 100}}\n"
        "    reviewers: [lead@example.com]\n"
    )
    completed = check_config(path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr.splitlines() == [
        f"{path}:5: rules.0.when: warning: refund may be called without amount (it then takes "
        "its default, None): this approve rule judges such a call by the default, and one it "
        "cannot judge by it (a missing or null value, another type) is not approved by it but "
        "goes on to the next rule, defaults: or a review; say in when what the default means, "
        "or make the argument required"
    ]
    assert completed.stdout.strip().endswith("1 warning)")


# --- the docs' example -------------------------------------------------------------------------


def readme_example() -> str:
    """The YAML block of docs/rules.md's "Rules judge validated arguments, and fail closed"."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()
    section = readme.split("### Rules judge validated arguments, and fail closed\n", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    ("arguments", "with_schema", "approved"),
    [
        ({"amount": 40}, True, True),
        ({"amount": 40}, False, True),
        ({"amount": 400}, True, False),
        ({"amount": "40"}, True, False),
        ({"amount": "40"}, False, False),
        ({"amount": None}, True, False),
        ({}, True, False),
        ({}, False, False),
    ],
)
async def test_the_readmes_example_does_what_the_readme_says(
    tmp_path: Path, arguments: dict[str, Any], with_schema: bool, approved: bool
) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(readme_example())
    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    policy = {"schema": schema} if with_schema else {}
    port = RulesPort(load_config(path), MemoryApprovalStore())
    outcome = await port.rule(request("refund", arguments, **policy))
    if approved:
        assert outcome.decision is not None and outcome.decision.approved
        assert outcome.decision.decided_by == "nodbot:rules.0"
    else:
        assert outcome.decision is None
        assert outcome.request.policy["reviewers"] == ["lead@example.com"]
