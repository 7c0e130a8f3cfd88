"""A tool's own `confirm=` holds under the bot: a call whose tool asks for review and that no
rule covers is reviewed under `defaults:`, or denied without them; `nodbot check-config`
warns about such tools. Through `rules_executor` (the executor `nodbot serve` gives each
agent) and end to end through `nodbot serve`'s HTTP API."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from nodbot.bot.config import load_config
from nodbot.bot.config.agents import report_agents
from nodbot.bot.policy.rules import RulesPort, authorize_by_rules, rules_executor
from nodbot.core import (
    Decision,
    Executor,
    InterruptRule,
    MemoryApprovalStore,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from tests.bot.processes import nodbot_serve
from tests.bot.test_cli import nodbot
from tests.bot.test_serve import TOKENS, as_, until_finished

ASKED_AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@dataclass
class Shop:
    """A registry's tools behind the rules of a file, as `nodbot serve` runs an agent's."""

    path: Path
    ran: list[str] = field(default_factory=list)
    store: MemoryApprovalStore = field(default_factory=MemoryApprovalStore)

    def __post_init__(self) -> None:
        registry = ToolRegistry()

        @registry.tool(confirm=True, effects="destructive")
        def refund(order_id: str, amount: float) -> str:
            self.ran.append(f"refund {amount}")
            return "refunded"

        @registry.tool
        def ping() -> str:
            self.ran.append("ping")
            return "pong"

        def large(call: ToolCall, ctx: ToolContext) -> bool:
            return float(call.arguments["amount"]) > 1000

        @registry.tool(confirm=large, effects="write")
        def wire(to: str, amount: float) -> str:
            self.ran.append(f"wire {amount}")
            return "wired"

        def broken(call: ToolCall, ctx: ToolContext) -> bool:
            raise RuntimeError("the limits service is down")

        @registry.tool(confirm=broken)
        def transfer(amount: float) -> str:
            self.ran.append(f"transfer {amount}")
            return "moved"

        self.config = load_config(self.path)
        self.executor: Executor = rules_executor(
            registry, self.config, self.store, clock=lambda: ASKED_AT
        )
        self.ctx = self.executor.context("run_1", requested_by="carol")

    async def call(self, name: str, call_id: str = "call_1", **arguments: object) -> ToolResult:
        call = ToolCall(name=name, arguments=arguments, id=call_id)
        return await self.executor.run_call(call, self.ctx)


def shop(tmp_path: Path, text: str) -> Shop:
    path = tmp_path / "nodbot.yml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return Shop(path)


def missing_rule(shop: Shop, tool: str, why: str = "confirm=True") -> str:
    return (
        f"approval denied for tool '{tool}': {tool} asks for review ({why}) and no rule of "
        f"{shop.path} covers it: add a rule for {tool} or a defaults: section"
    )


# --- without defaults: denied ---------------------------------------------------------------


async def test_a_confirm_tool_no_rule_covers_is_denied_naming_the_missing_rule(
    tmp_path: Path,
) -> None:
    bot = shop(tmp_path, "rules:\n  - tool: ping\n    decision: approve\n")
    result = await bot.call("refund", order_id="A-1", amount=120.0)
    assert result.status == "error" and result.error is not None
    assert result.error.kind == "approval-denied"
    assert result.error.message == missing_rule(bot, "refund")
    assert result.error.details["decided_by"] == "nodbot:no-rule"
    assert bot.ran == [] and await bot.store.list() == []


async def test_a_tool_without_confirm_and_without_a_rule_still_runs(tmp_path: Path) -> None:
    bot = shop(tmp_path, "rules: []\n")
    assert (await bot.call("ping")).value == "pong"
    assert bot.ran == ["ping"] and await bot.store.list() == []


async def test_a_confirm_rule_is_asked_and_one_that_raises_asks_for_review(
    tmp_path: Path,
) -> None:
    bot = shop(tmp_path, "rules: []\n")
    small = await bot.call("wire", to="ana", amount=10)
    large = await bot.call("wire", call_id="call_2", to="ana", amount=5000)
    broken = await bot.call("transfer", call_id="call_3", amount=1)
    assert small.status == "ok"
    assert large.error is not None
    assert large.error.message == missing_rule(bot, "wire", "its confirm rule asks for this call")
    assert broken.error is not None and broken.error.kind == "approval-denied"
    assert bot.ran == ["wire 10.0"]


async def test_a_rule_with_when_covers_only_its_calls_the_others_are_denied(
    tmp_path: Path,
) -> None:
    bot = shop(
        tmp_path,
        """
        rules:
          - tool: refund
            when: {gt: {amount: 100}}
            reviewers: [U0123ABCDE]
        """,
    )
    big = await bot.call("refund", order_id="A-1", amount=500)
    small = await bot.call("refund", call_id="call_2", order_id="A-1", amount=5)
    assert big.status == "pending"
    assert small.error is not None and small.error.message == missing_rule(bot, "refund")
    assert bot.ran == []


async def test_a_rule_without_when_decides_as_it_says(tmp_path: Path) -> None:
    bot = shop(tmp_path, "rules:\n  - tool: refund\n    decision: approve\n")
    result = await bot.call("refund", order_id="A-1", amount=5)
    assert result.status == "ok" and bot.ran == ["refund 5.0"]


async def test_a_port_without_the_registry_fails_closed(tmp_path: Path) -> None:
    bot = shop(tmp_path, "rules: []\n")
    port = RulesPort(bot.config, bot.store)  # it cannot read the tools' confirm
    blind = Executor(bot.executor.registry, approval=port, rules=[InterruptRule(tool="*")])
    result = await blind.run_call(ToolCall(name="ping", arguments={}, id="c1"), bot.ctx)
    assert result.error is not None
    assert result.error.message == missing_rule(bot, "ping", "its confirm cannot be read here")
    assert bot.ran == []


# --- with defaults: reviewed ----------------------------------------------------------------

DEFAULTS = """
reviewer_groups:
  leads: [U0123ABCDE, lead@example.com]
rules:
  - tool: ping
    decision: approve
defaults:
  description: Tools that ask for review, when no rule names them.
  reviewers: [group:leads]
  timeout: 1h
  timeout_decision: deny
  allowed_decisions: [approve, deny]
"""


async def test_with_defaults_the_call_waits_for_the_default_reviewers(tmp_path: Path) -> None:
    bot = shop(tmp_path, DEFAULTS)
    paused = await bot.call("refund", order_id="A-1", amount=120.0)
    assert paused.status == "pending" and paused.error is not None
    record = await bot.store.get(paused.error.details["approval_id"])
    assert record.request.policy == {
        "rule": "defaults",
        "description": "Tools that ask for review, when no rule names them.",
        "reviewers": ["U0123ABCDE", "lead@example.com"],
        "post_to": None,
        "allowed_decisions": ["approve", "deny"],
        "editable": None,
        "approvals_required": 1,
        "allow_self_approval": False,
    }
    assert record.request.deadline == ASKED_AT + timedelta(hours=1)
    assert record.request.on_timeout == "deny"
    approve = Decision(approved=True)
    assert authorize_by_rules("U0999OTHER", record, approve) == (
        "you are not one of the reviewers of this call"
    )
    assert authorize_by_rules("carol", record, approve) is not None  # the requester
    assert authorize_by_rules("lead@example.com", record, approve) is None

    await bot.executor.decide(record.approval_id, True, decided_by="lead@example.com")
    resumed = await bot.call("refund", order_id="A-1", amount=120.0)
    assert resumed.status == "ok" and bot.ran == ["refund 120.0"]
    again = await bot.call("ping", call_id="call_2")
    assert again.status == "ok"  # a tool without confirm still runs, defaults or not


async def test_defaults_never_take_a_call_a_rule_covers(tmp_path: Path) -> None:
    deny_refunds = "rules:\n  - tool: refund\n    decision: deny\n"
    bot = shop(tmp_path, DEFAULTS.replace("rules:\n", deny_refunds))
    denied = await bot.call("refund", order_id="A-1", amount=1)
    assert denied.error is not None and denied.error.details["decided_by"] == "nodbot:rules.0"
    assert await bot.store.list() == [] and bot.ran == []


# --- nodbot check-config ----------------------------------------------------------------------

AGENT_MODULE = '''
"""A shop whose refund asks for review itself (confirm=True)."""

import os

from nodbot.core import Agent, ChatResponse, ScriptedChat, ToolCall, ToolRegistry

tools = ToolRegistry()


@tools.tool(confirm=True, effects="destructive")
def refund(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    with open(os.environ["NODBOT_TEST_LEDGER"], "a") as ledger:
        ledger.write(f"{order_id} {amount}\\n")
    return f"refunded {amount} on {order_id}"


def limit(call, ctx):
    return call.arguments["amount"] > 1000


@tools.tool(confirm=limit, effects="write")
def wire(to: str, amount: float) -> str:
    """Wire money."""
    return "wired"


@tools.tool(effects="read")
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return "delivered"


def agent() -> Agent:
    """A fresh script for each load: ask for a refund, then answer."""
    call = ToolCall(id="call_1", name="refund", arguments={"order_id": "A-1", "amount": 120.0})
    return Agent(ScriptedChat([ChatResponse(tool_calls=[call]), "done"]), tools)
'''


@pytest.fixture
def shop_module(tmp_path: Path) -> Iterator[str]:
    """The agent module beside the configuration file, under a name unique to the test."""
    name = "shop_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{name}.py").write_text(AGENT_MODULE)
    yield name
    sys.modules.pop(name, None)


def write(tmp_path: Path, module: str, rest: str) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(f"agents:\n  shop: {module}:agent\n" + textwrap.dedent(rest).lstrip("\n"))
    return path


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nodbot(), "check-config", str(path)], capture_output=True, text=True, cwd=path.parent
    )


def test_check_config_warns_of_each_tool_that_asks_for_review_and_no_rule_covers(
    tmp_path: Path, shop_module: str
) -> None:
    path = write(tmp_path, shop_module, "rules:\n  - tool: lookup_order\n    decision: approve\n")
    completed = check_config(path)
    assert completed.returncode == 0
    assert completed.stderr.splitlines() == [
        f"{path}:2: agents.shop: warning: refund asks for review (confirm=True) and no rule "
        "covers it: its calls are denied (add a rule for refund, or a defaults: section)",
        f"{path}:2: agents.shop: warning: wire asks for review (through its confirm rule) and "
        "no rule covers it: its calls are denied (add a rule for wire, or a defaults: section)",
    ]
    assert completed.stdout == f"{path}: ok (1 rule, 1 agent, 2 warnings)\n"


def test_check_config_warns_that_calls_outside_a_rules_when_are_denied(
    tmp_path: Path, shop_module: str
) -> None:
    path = write(
        tmp_path,
        shop_module,
        """
        rules:
          - tool: refund
            when: {gt: {amount: 100}}
            reviewers: [U0123ABCDE]
          - tool: "*"
            when: {eq: {to: boss}}
            decision: deny
          - tool: wire
            decision: approve
        """,
    )
    completed = check_config(path)
    assert completed.returncode == 0
    assert completed.stderr.splitlines() == [
        f"{path}:2: agents.shop: warning: refund asks for review (confirm=True) and only "
        "rules.0, rules.1 cover it, with when: the calls that match no when are denied (add a "
        "rule for refund without when, or a defaults: section)",
    ]
    assert completed.stdout == f"{path}: ok (3 rules, 1 agent, 1 warning)\n"


def test_with_defaults_the_warning_says_the_calls_go_to_them(
    tmp_path: Path, shop_module: str
) -> None:
    path = write(tmp_path, shop_module, "defaults:\n  reviewers: [U0123ABCDE]\n")
    report = report_agents(load_config(path))
    assert report.problems == []
    assert report.warnings == [
        f"{path}:2: agents.shop: warning: refund asks for review (confirm=True) and no rule "
        "covers it: its calls are reviewed under defaults:",
        f"{path}:2: agents.shop: warning: wire asks for review (through its confirm rule) and "
        "no rule covers it: its calls are reviewed under defaults:",
    ]


def test_a_rule_for_every_call_leaves_nothing_to_warn_of(tmp_path: Path, shop_module: str) -> None:
    path = write(tmp_path, shop_module, 'rules:\n  - tool: "*"\n    reviewers: [U0123ABCDE]\n')
    completed = check_config(path)
    assert (completed.returncode, completed.stderr) == (0, "")
    assert completed.stdout == f"{path}: ok (1 rule, 1 agent)\n"


# --- end to end: nodbot serve ---------------------------------------------------------------

SERVED = """
store:
  url: sqlite:///{db}
server: {{host: 127.0.0.1, port: 0}}
workers: {{poll: 0.2}}
api:
  tokens:
    - name: ana
      token: ${{NODBOT_TOKEN_ANA}}
      scopes: [runs:write, runs:write-as, approvals:read]
    - name: U0123LEADS
      token: ${{NODBOT_TOKEN_LEAD}}
      scopes: [approvals:read, approvals:decide]
    - name: U0777OTHER
      token: ${{NODBOT_TOKEN_OTHER}}
      scopes: [approvals:read, approvals:decide]
rules:
  - tool: lookup_order
    decision: approve
"""


def served_config(tmp_path: Path, module: str, defaults: str = "") -> Path:
    return write(tmp_path, module, SERVED.format(db=tmp_path / "nodbot.db") + defaults)


async def test_nodbot_serve_denies_a_confirm_tool_no_rule_covers(
    tmp_path: Path, shop_module: str
) -> None:
    ledger = tmp_path / "ledger.txt"
    path = served_config(tmp_path, shop_module)
    async with (
        nodbot_serve(path, NODBOT_TEST_LEDGER=str(ledger), **TOKENS) as bot,
        httpx.AsyncClient(base_url=bot.url) as client,
    ):
        body = {"agent": "shop", "input": "Refund order A-1", "requested_by": "carol"}
        started = await client.post("/runs", json=body, headers=as_("ana"))
        assert started.status_code == 201, started.text
        run = await until_finished(client, started.json()["run_id"])
        assert (run["status"], run["pending"], run["final_text"]) == ("finished", [], "done")
        [result] = run["tool_results"]
        assert result["status"] == "error"
        assert (
            f"refund asks for review (confirm=True) and no rule of {path} covers it: add a rule "
            "for refund or a defaults: section"
        ) in result["content"]
        assert (await client.get("/approvals", headers=as_("ana"))).json() == []
    assert not ledger.exists()  # the refund never ran


async def test_nodbot_serve_with_defaults_waits_for_the_default_reviewers(
    tmp_path: Path, shop_module: str
) -> None:
    ledger = tmp_path / "ledger.txt"
    defaults = "defaults:\n  reviewers: [U0123LEADS]\n  timeout: 1h\n"
    path = served_config(tmp_path, shop_module, defaults)
    async with (
        nodbot_serve(path, NODBOT_TEST_LEDGER=str(ledger), **TOKENS) as bot,
        httpx.AsyncClient(base_url=bot.url) as client,
    ):
        body = {"agent": "shop", "input": "Refund order A-1", "requested_by": "carol"}
        run = (await client.post("/runs", json=body, headers=as_("ana"))).json()
        assert run["status"] == "waiting"
        [pending] = run["pending"]
        assert (pending["tool"], pending["arguments"]) == (
            "refund",
            {"order_id": "A-1", "amount": 120.0},
        )
        assert not ledger.exists()
        decide = f"/approvals/{pending['approval_id']}/decide"
        stranger = await client.post(decide, json={"action": "approve"}, headers=as_("other"))
        assert stranger.status_code == 403
        assert stranger.json()["error"] == "you are not one of the reviewers of this call"
        lead = await client.post(decide, json={"action": "approve"}, headers=as_("lead"))
        assert lead.status_code == 200, lead.text
        finished = await until_finished(client, run["run_id"])
        assert finished["status"] == "finished"
        assert [r["status"] for r in finished["tool_results"]] == ["ok"]
    assert ledger.read_text() == "A-1 120.0\n"  # it ran once, after the default reviewer said so
