"""`nodbot rules explain|test|diff`: what the rules make of a call, told before the rules ship.

Explain is tied to the live path: its outcome comes from the `RulesPort` that decides the
bot's calls, and a property checks it against the record the port leaves in a real store
(and the executor's result) for random argument values. The example configuration's cases
file (`examples/rules_cases.yml`) covers every outcome of its rules, the fail-closed ones
included."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodbot.bot.cli import main
from nodbot.bot.config import load_agents, load_config
from nodbot.bot.policy.explain import explain
from nodbot.bot.policy.rules import RulesPort, rules_executor
from nodbot.core import (
    ApprovalRequest,
    MemoryApprovalStore,
    ToolCall,
    ToolRegistry,
    arguments_digest,
)
from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "nodbot.example.yml"
CASES = ROOT / "examples" / "rules_cases.yml"

# An approve rule before a review rule, a deny rule, a tool that runs elsewhere, no defaults.
RULES = """
external_tools: [payout, wipe]
reviewer_groups:
  finance: [fin@example.com, U0FINANCE1]
people:
  carol: [carol@example.com, U0CAROL001]
rules:
  - tool: payout
    when: {le: {amount: 100}}
    decision: approve
  - tool: payout
    when: {gt: {amount: 100000}}
    description: Payouts over 100000 are never made by an agent.
    decision: deny
  - tool: payout
    description: Payouts need finance.
    reviewers: [group:finance, carol@example.com]
    approvals_required: 2
    timeout: 2h
    timeout_decision: deny
  - tool: wipe
    decision: deny
"""


def run(*words: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(list(words))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(RULES)
    return path


def explained(
    config: Path, tool: str, arguments: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    status, out, err = run(
        "rules",
        "explain",
        "--config",
        str(config),
        "--tool",
        tool,
        "--arguments",
        json.dumps(arguments),
        "--json",
        capsys=capsys,
    )
    assert status == 0, err
    found: dict[str, Any] = json.loads(out)
    return found


# --- explain: every outcome kind --------------------------------------------------------------


def test_explain_an_approval_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(
        "rules",
        "explain",
        "--config",
        str(EXAMPLE),
        "--tool",
        "refund",
        "--arguments",
        '{"order_id": "A-1", "amount": 50}',
        capsys=capsys,
    )
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == 'refund {"amount": 50, "order_id": "A-1"}'
    assert (
        lines[1] == '  arguments: checked by the tool\'s model: {"amount": 50.0, "order_id": "A-1"}'
    )
    assert lines[2] == "  rules.0 (lookup_order, approve): names lookup_order"
    assert lines[3] == "  rules.1 (refund, review, when amount > 100): when is false: amount > 100"
    assert lines[4] == "  rules.2 (refund, approve): takes it"
    assert lines[5] == "outcome: approved at once by rules.2 (decided_by nodbot:rules.2)"


def test_explain_a_review_says_who_where_until_when_and_with_which_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(
        "rules",
        "explain",
        "--config",
        str(EXAMPLE),
        "--tool",
        "refund",
        "--arguments",
        '{"order_id": "A-1", "amount": 500}',
        "--requested-by",
        "lead@example.com",
        capsys=capsys,
    )
    assert status == 0, err
    text = out.split("outcome: ", 1)[1]
    assert "\n  rules.1 (refund, review, when amount > 100): takes it\noutcome: " in out
    assert text.splitlines() == [
        "reviewed under rules.1: Refunds over 100 need a support lead.",
        "  reviewers: U0123ABCDE, W0456FGHIJ, lead@example.com (as written: group:support-leads)",
        "  slack: not configured (the file has no slack:)",
        "  email: not configured (the file has no email:)",
        "  inbox: in each reviewer's web inbox (/inbox)",
        '  decisions: approve, edit, deny; editable: amount; edit bounds: {"gt": {"amount": 0}}, '
        '{"le": {"amount": {"original": "amount"}}}',
        "  approvals required: 1 (persons; any deny denies)",
        "  self-approval: not allowed (lead@example.com is a reviewer, but may not approve this "
        "call)",
        "  timeout: 30m, then deny (decided_by nodbot:timeout)",
        "  escalation: after 15m, also S0789KLMNO, finance@example.com",
    ]


def test_explain_a_review_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    found = explained(EXAMPLE, "refund", {"order_id": "A-1", "amount": 500}, capsys)
    assert sorted(found) == sorted(
        [
            "tool",
            "arguments",
            "judged_by",
            "judged",
            "errors",
            "passed",
            "outcome",
            "rule",
            "decided_by",
            "reason",
            "fails_closed",
            "description",
            "when",
            "requested_by",
            "review",
            "notes",
        ]
    )
    assert (found["outcome"], found["rule"], found["decided_by"]) == ("review", 1, None)
    assert found["judged_by"] == "model"
    assert found["judged"] == {"order_id": "A-1", "amount": 500.0}
    assert found["passed"] == [
        {
            "rule": 0,
            "tool": "lookup_order",
            "when": None,
            "kind": "approve",
            "verdict": "other-tool",
            "why": "names lookup_order",
        }
    ]
    review = found["review"]
    assert review["reviewers"] == ["U0123ABCDE", "W0456FGHIJ", "lead@example.com"]
    assert review["reviewers_as_written"] == ["group:support-leads"]
    assert (review["slack"], review["email"], review["inbox"]) == (None, None, True)
    assert (review["timeout"], review["timeout_decision"]) == (1800, "deny")
    assert (review["escalate_after"], review["escalate_to"]) == (
        900,
        ["S0789KLMNO", "finance@example.com"],
    )
    assert review["editable"] == ["amount"]
    assert review["approvals_required"] == 1
    assert review["allow_self_approval"] is False


def test_explain_a_denial_and_a_quorum(
    rules_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    denied = explained(rules_file, "payout", {"amount": 500000}, capsys)
    assert (denied["outcome"], denied["rule"]) == ("deny", 1)
    assert denied["decided_by"] == "nodbot:rules.1"
    assert denied["reason"] == "Payouts over 100000 are never made by an agent."
    assert [p["verdict"] for p in denied["passed"]] == ["false"]
    wiped = explained(rules_file, "wipe", {}, capsys)
    assert (wiped["outcome"], wiped["rule"], wiped["reason"]) == (
        "deny",
        3,
        "denied by rule 3 of the configuration",
    )
    reviewed = explained(rules_file, "payout", {"amount": 500}, capsys)
    assert reviewed["review"]["approvals_required"] == 2
    assert reviewed["review"]["reviewers"] == [
        "fin@example.com",
        "U0FINANCE1",
        "carol@example.com",
    ]


def test_an_approve_rule_passes_what_it_cannot_judge_and_the_next_rule_takes_it(
    rules_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A tool that runs elsewhere, no schema: "50" stays a string, which `le` cannot judge.
    found = explained(rules_file, "payout", {"amount": "50"}, capsys)
    assert found["judged_by"] == "as-given"
    [passed] = found["passed"]
    assert passed["verdict"] == "cannot-judge"
    assert passed["why"] == (
        "cannot judge (amount is str, not int): an approve rule never approves what it cannot "
        "judge, so the call is passed to the next rule (fails closed)"
    )
    # The deny rule takes what it cannot judge: it fails closed by its outcome.
    assert (found["outcome"], found["rule"], found["fails_closed"]) == ("deny", 1, True)
    missing = explained(rules_file, "payout", {}, capsys)
    assert (missing["outcome"], missing["rule"], missing["fails_closed"]) == ("deny", 1, True)
    assert "amount is missing" in missing["passed"][0]["why"]
    status, out, _ = run(
        "rules",
        "explain",
        "--config",
        str(rules_file),
        "--tool",
        "payout",
        "--arguments",
        "{}",
        capsys=capsys,
    )
    assert status == 0
    assert (
        "  rules.0 (payout, approve, when amount <= 100): cannot judge (amount is missing): an "
        "approve rule never approves what it cannot judge, so the call is passed to the next "
        "rule (fails closed)"
    ) in out.splitlines()
    assert (
        "  rules.1 (payout, deny, when amount > 100000): its when cannot judge the call: it "
        "takes it"
    ) in out.splitlines()
    assert (
        "outcome: denied at once by rules.1 (failing closed) (decided_by nodbot:rules.1): "
        "Payouts over 100000 are never made by an agent."
    ) in out.splitlines()


def test_arguments_the_model_refuses_are_reviewed_failing_closed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = explained(EXAMPLE, "refund", {"order_id": "A-1"}, capsys)
    assert (found["outcome"], found["rule"], found["fails_closed"]) == ("review", 1, True)
    assert found["judged"] is None
    assert found["errors"][0]["field"] == "amount"
    assert found["notes"] and "refused before any rule" in found["notes"][0]


def test_a_schema_checks_the_arguments_of_a_tool_that_runs_elsewhere(
    rules_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "payout.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"amount": {"type": "number"}}}))
    status, out, err = run(
        "rules",
        "explain",
        "--config",
        str(rules_file),
        "--tool",
        "payout",
        "--arguments",
        '{"amount": 50}',
        "--schema",
        str(schema),
        "--json",
        capsys=capsys,
    )
    assert status == 0, err
    found = json.loads(out)
    assert (found["judged_by"], found["outcome"], found["rule"]) == ("schema", "approve", 0)
    refused = run(
        "rules",
        "explain",
        "--config",
        str(rules_file),
        "--tool",
        "payout",
        "--arguments",
        '{"amount": "50"}',
        "--schema",
        str(schema),
        "--json",
        capsys=capsys,
    )
    found = json.loads(refused[1])
    assert found["judged"] is None and found["errors"]
    assert (found["outcome"], found["rule"], found["fails_closed"]) == ("deny", 1, True)


def test_no_rule_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    # The support agent's send_email asks for no review: no rule covers a mail inside.
    inside = {"to": "a@example.com", "subject": "Hi", "body": "Hello"}
    found = explained(EXAMPLE, "send_email", inside, capsys)
    assert (found["outcome"], found["rule"], found["decided_by"]) == (
        "approve",
        None,
        "nodbot:no-rule",
    )
    # A tool of no agent: its confirm cannot be read, so it is reviewed under defaults:.
    found = explained(EXAMPLE, "close_account", {"id": 7}, capsys)
    assert (found["outcome"], found["rule"]) == ("review", "defaults")
    assert found["review"]["timeout"] == 3600


def test_explain_refuses_bad_input_with_status_2(
    rules_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["rules", "explain", "--config", str(rules_file), "--tool", "payout"]
    status, _, err = run(*base, "--arguments", "[1]", capsys=capsys)
    assert (status, err) == (2, "nodbot: --arguments: a JSON object is needed, not list\n")
    status, _, err = run(*base, "--arguments", "{", capsys=capsys)
    assert status == 2 and "not valid JSON" in err
    status, _, err = run(*base, "--agent", "nobody", capsys=capsys)
    assert (status, err) == (2, "nodbot: no agent named 'nobody' in the file (agents: none)\n")


# --- test: a cases file -----------------------------------------------------------------------


def test_the_example_cases_hold(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run("rules", "test", "--config", str(EXAMPLE), str(CASES), capsys=capsys)
    assert status == 0, out + err
    lines = out.splitlines()
    assert all(line.startswith("ok   ") for line in lines[:-1]), out
    assert lines[-1].endswith(" ok, 0 failed")


def test_the_example_cases_cover_every_outcome_of_its_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from nodbot.bot.cli.rules import load_cases

    config = load_config(EXAMPLE)
    agents, _ = load_agents(config)
    registry = ToolRegistry.merged(agent.tools for agent in agents.values())
    seen = set()
    for loaded in load_cases(str(CASES)):
        case = loaded.case
        found = asyncio.run(explain(config, case.tool, case.arguments, registry=registry))
        seen.add((found.outcome, found.rule, found.fails_closed))
    every_rule = {(rule.decision or "review", n) for n, rule in enumerate(config.rules)}
    assert every_rule <= {(outcome, rule) for outcome, rule, _ in seen}
    assert ("review", "defaults", False) in seen
    assert ("approve", None, False) in seen  # no rule, the tool asks for no review
    assert {("review", 1, True), ("review", 3, True)} <= seen  # failing closed


def test_a_wrong_expectation_fails_with_status_1_and_a_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = tmp_path / "cases.yml"
    cases.write_text(
        """
- name: a big refund is approved at once
  tool: refund
  arguments: {order_id: A-1, amount: 500}
  expect: {outcome: approve, rule: 2}
- name: a small refund goes through
  tool: refund
  arguments: {order_id: A-1, amount: 5}
  expect: {outcome: approve, rule: 2}
- name: the leads review it
  tool: refund
  arguments: {order_id: A-1, amount: 500}
  expect: {outcome: review, reviewers: [ana@example.com]}
"""
    )
    status, out, _ = run("rules", "test", "--config", str(EXAMPLE), str(cases), capsys=capsys)
    assert status == 1
    reviewed = "review by rules.1: U0123ABCDE, W0456FGHIJ, lead@example.com"
    assert out.splitlines() == [
        f"FAIL a big refund is approved at once: expected approve by rules.2, got {reviewed}",
        "ok   a small refund goes through: approve by rules.2",
        "FAIL the leads review it: expected reviewers ana@example.com, got U0123ABCDE, "
        "W0456FGHIJ, lead@example.com",
        "3 cases: 1 ok, 2 failed",
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- name: x\n  tool: refund\n  expect: {outcome: maybe}\n", ":3: 0.expect.outcome: "),
        (
            "- name: x\n  tool: refund\n  expect: {outcome: review}\n  colour: red\n",
            ":4: 0.colour: ",
        ),
        ("- name: x\n  tool: refund\n", ":1: 0.expect: the required key 'expect' is missing"),
        ("name: x\n", ":1: (top level): expected a list of cases"),
        ("- name: x\n  tool: [refund\n", ":3: malformed YAML"),
        (
            "- {name: x, tool: refund, expect: {outcome: review}}\n"
            "- {name: x, tool: refund, expect: {outcome: review}}\n",
            ":2: 1.name: the name 'x' is taken by case 0",
        ),
        (
            "- {name: x, tool: refund, agent: shop, expect: {outcome: review}}\n",
            ":1: 0.agent: no agent named 'shop' in the file (agents: support)",
        ),
        (
            "- {name: x, tool: refund, arguments: {day: 2024-01-01}, expect: {outcome: review}}\n",
            ":1: 0.arguments.day: input was not a valid JSON value",
        ),
    ],
)
def test_a_bad_cases_file_exits_2_naming_the_line(
    tmp_path: Path, text: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = tmp_path / "cases.yml"
    cases.write_text(text)
    status, out, err = run("rules", "test", "--config", str(EXAMPLE), str(cases), capsys=capsys)
    assert (status, out) == (2, "")
    assert err.startswith(f"{cases}{problem}"), err


def test_an_alias_bomb_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 9)]
    cases = tmp_path / "cases.yml"
    cases.write_text("\n".join(lines) + "\n")
    status, _, err = run("rules", "test", "--config", str(EXAMPLE), str(cases), capsys=capsys)
    assert status == 2 and "more than" in err


# --- diff -------------------------------------------------------------------------------------


def test_diff_shows_the_cases_that_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = tmp_path / "new.yml"
    # The threshold goes up from 100 to 1000: a refund of 500 is no longer reviewed.
    new.write_text(
        EXAMPLE.read_text().replace("when: {gt: {amount: 100}}", "when: {gt: {amount: 1000}}")
    )
    status, out, err = run("rules", "diff", str(EXAMPLE), str(new), str(CASES), capsys=capsys)
    assert status == 1, err
    changed = [line for line in out.splitlines() if line.startswith("changed ")]
    assert (
        "changed a refund over 100 waits for a support lead: review by rules.1: U0123ABCDE, "
        "W0456FGHIJ, lead@example.com -> approve by rules.2"
    ) in changed
    assert (
        out.splitlines()[-1]
        == f"{len(out.splitlines()) - 1} cases: {len(changed)} change outcome or reviewers"
    )
    same = run("rules", "diff", str(EXAMPLE), str(EXAMPLE), str(CASES), capsys=capsys)
    assert same[0] == 0
    assert all(line.startswith("same ") for line in same[1].splitlines()[:-1])


# --- explain is the live path -----------------------------------------------------------------

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**7), max_value=10**7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["50", "500", "1e3", "nan", "100", "100.0", " 7 "]),
    st.lists(st.integers(), max_size=2),
)


async def live(
    config: Any, registry: ToolRegistry, tool: str, arguments: dict[str, Any]
) -> tuple[str, Any]:
    """What the bot's port records for the call asked from outside (`POST /approvals`)."""
    port = RulesPort(config, MemoryApprovalStore(), registry=registry)
    request = ApprovalRequest(
        run_id="r", call_id="c", tool=tool, arguments=arguments, digest=arguments_digest(arguments)
    )
    record, _ = await port.open_review(request)
    decision = record.decision
    if decision is None:
        return "review", record.request.policy["rule"]
    by = decision.decided_by or ""
    rule = int(by.removeprefix("nodbot:rules.")) if by.startswith("nodbot:rules.") else None
    return ("approve" if decision.approved else "deny"), rule


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(amount=ANY_VALUE, leave_out=st.booleans())
def test_explain_decides_as_the_live_port(rules_file: Path, amount: Any, leave_out: bool) -> None:
    example = load_config(EXAMPLE)
    agents, _ = load_agents(example)
    registry = ToolRegistry.merged(agent.tools for agent in agents.values())
    external = load_config(rules_file)
    for config, tool, tools in (
        (example, "refund", registry),
        (external, "payout", ToolRegistry()),
    ):
        arguments = {} if leave_out else {"amount": amount}
        if tool == "refund":
            arguments["order_id"] = "A-1"
        found = asyncio.run(explain(config, tool, arguments, registry=tools))
        assert (found.outcome, found.rule) == asyncio.run(live(config, tools, tool, arguments))
        if found.rule is not None and not found.fails_closed and found.judged is not None:
            rule = config.rules[found.rule]
            assert rule.judge(tool, found.judged) is True


@settings(max_examples=60, deadline=None)
@given(
    amount=st.one_of(
        st.integers(-1000, 1000), st.floats(-1000, 1000), st.sampled_from(["50", "500"])
    )
)
def test_explain_decides_as_the_executor_of_a_run(amount: Any) -> None:
    """A call the support agent makes in a run: the executor's result is what explain says."""
    config = load_config(EXAMPLE)
    agents, _ = load_agents(config)
    registry = agents["support"].tools
    arguments = {"order_id": "A-1", "amount": amount}
    found = asyncio.run(explain(config, "refund", arguments, registry=registry))

    async def in_a_run() -> str:
        executor = rules_executor(registry, config, MemoryApprovalStore())
        ctx = executor.context(run_id="run-1")
        result = await executor.run_call(ToolCall(name="refund", arguments=arguments, id="c1"), ctx)
        return {"ok": "approve", "pending": "review"}.get(result.status, "deny")

    assert found.outcome == asyncio.run(in_a_run())


def test_the_command_runs_as_a_process() -> None:
    done = subprocess.run(
        [nodbot(), "rules", "test", "--config", str(EXAMPLE), str(CASES)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
